/* prefixgate explorer (docs/ui.md). Vanilla JS, no dependencies, no build step.
 *
 * Live (served at /ui): fetches /hygiene/overview, /hygiene/engines, /hygiene/tenants and the
 * selected tenant's /hygiene/tenants/{tenant} from this origin, every `refresh_s` seconds.
 * Offline (`prefixgate lint --html`): reads the same shapes from <script id="pg-data">.
 * Every string reaches the DOM through textContent or an attribute set by setAttribute on a
 * fixed name: nothing is parsed as HTML, so prompt text, tenants and values cannot inject markup.
 */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var REASONS = {
    config: "engine config",
    queries: "cache queried in the window",
    no_queries: "0 cache queries while prompts flowed",
    assumed: "assumed: exports cache counters, no traffic yet"
  };
  // the funnel's stages (app/telemetry/funnel.py); beyond_available is no share of available
  var STAGES = [
    ["available", "available", "resident anywhere in the fleet when the prompt's chain was known"],
    ["captured", "captured", "predicted resident on the replica the request was sent to"],
    ["delivered", "delivered", "reported cached by the engine, up to what was available"],
    ["beyond_available", "beyond available", "reported cached by the engine past what was available: " +
      "cached after the proxy looked (an earlier request with the same head still in flight)"]
  ];

  var state = {
    embedded: null, overview: null, engines: null, tenants: [], details: {}, lint: null,
    selected: null, breakIndex: 0, sort: { key: "continuity", dir: 1 }, timer: null, loaded: false, renders: 0
  };
  var SORT_KEYS = ["tenant", "requests", "continuity", "breaks"];

  // ------------------------------------------------------------------ helpers
  function $(id) { return document.getElementById(id); }

  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === "text") node.textContent = attrs[k];
        else if (k === "cls") node.className = attrs[k];
        else node.setAttribute(k, attrs[k]);
      });
    }
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  function known(v) { return v !== null && v !== undefined; }
  function pct(v) { return known(v) ? Math.round(v * 100) + "%" : "–"; }
  function num(v, digits) { return known(v) ? Number(v).toFixed(digits || 0) : "–"; }
  function tokens(v) { return known(v) ? Math.round(v).toLocaleString("en-US") : "–"; }
  function secs(v) {
    if (!known(v)) return "–";
    return v < 1 ? Math.round(v * 1000) + " ms" : v.toFixed(2) + " s";
  }

  function bar(ratio, cls) {
    var wrap = el("span", { cls: "bar" + (cls ? " " + cls : "") });
    var fill = el("span");
    fill.style.width = Math.max(0, Math.min(1, ratio || 0)) * 100 + "%";
    wrap.appendChild(fill);
    return wrap;
  }

  function fact(key, value, attrs) {
    var v = el("span", Object.assign({ cls: "v", text: value }, attrs || {}));
    return el("div", { cls: "fact" }, el("span", { cls: "k", text: key }), v);
  }

  // ------------------------------------------------------------------ data
  function getJSON(path) {
    return fetch(path, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(path + ": HTTP " + r.status);
        return r.json();
      });
  }

  function load() {
    if (state.embedded) { render(); return Promise.resolve(); }
    return Promise.all([getJSON("/hygiene/overview"), getJSON("/hygiene/engines"), getJSON("/hygiene/tenants")])
      .then(function (res) {
        state.overview = res[0];
        state.engines = res[1];
        state.tenants = res[2].tenants || [];
        chooseTenant();
        if (!state.selected) return null;
        return getJSON("/hygiene/tenants/" + encodeURIComponent(state.selected))
          .then(function (rep) { state.details[state.selected] = rep; })
          .catch(function () { delete state.details[state.selected]; });
      })
      .then(function () { $("error").hidden = true; render(); })
      .catch(function (err) {
        var box = $("error");
        box.textContent = "Could not read the hygiene JSON (" + err.message + "). Showing the last data.";
        box.hidden = false;
        if (!state.loaded) render();
      })
      .then(schedule);
  }

  function schedule() {
    clearTimeout(state.timer);
    var every = state.overview && state.overview.refresh_s;
    if (!state.embedded && every > 0 && $("auto").checked) state.timer = setTimeout(load, every * 1000);
  }

  function sortedTenants() {
    var key = state.sort.key, dir = state.sort.dir;
    return state.tenants.slice().sort(function (a, b) {
      var x = a[key], y = b[key];
      if (!known(x) && !known(y)) return a.tenant < b.tenant ? -1 : 1;
      if (!known(x)) return 1; // unknown last, whatever the direction
      if (!known(y)) return -1;
      if (x < y) return -dir;
      if (x > y) return dir;
      if ((b.breaks || 0) !== (a.breaks || 0)) return (b.breaks || 0) - (a.breaks || 0);
      return a.tenant < b.tenant ? -1 : 1;
    });
  }

  function chooseTenant() {
    var names = state.tenants.map(function (t) { return t.tenant; });
    if (state.selected && names.indexOf(state.selected) >= 0) return;
    var withBreak = sortedTenants().filter(function (t) { return t.last_break; });
    state.selected = withBreak.length ? withBreak[0].tenant : (names[0] || null);
    state.breakIndex = 0;
  }

  // ------------------------------------------------------------------ header
  function renderHeader() {
    var o = state.overview || {};
    $("pod").textContent = o.source === "lint" ? "lint · " + (o.file || "") : "pod " + (o.pod || "?");
    $("mode").textContent = "fingerprint " + (o.fingerprint_mode || "unknown");
    var privacy = $("privacy");
    privacy.textContent = o.show_text ? "prompt text shown (hygiene.show_text: true)"
      : "prompt text hidden (hygiene.show_text: false)";
    privacy.className = "chip " + (o.show_text ? "public" : "private");
    var g = $("grafana");
    if (o.grafana_url) { g.setAttribute("href", o.grafana_url); g.hidden = false; } else { g.hidden = true; }
    $("auto").parentNode.hidden = !!state.embedded;
    $("updated").textContent = state.embedded ? "" : "updated " + new Date().toLocaleTimeString();
  }

  // ------------------------------------------------------------------ fleet
  function renderFleet() {
    var section = $("fleet-section");
    if (!state.engines) { section.hidden = true; return; }
    section.hidden = false;
    var body = clear($("fleet").tBodies[0]);
    var backends = state.engines.backends || {};
    var names = Object.keys(backends).sort();
    if (!names.length) body.appendChild(el("tr", null, el("td", { colspan: "8", cls: "empty", text: "no backends" })));
    names.forEach(function (name) {
      var v = backends[name];
      var on = v.caching_enabled;
      var badge = el("span", { cls: "badge " + (on === true ? "on" : on === false ? "off" : "unknown"),
        text: on === true ? "ON" : on === false ? "OFF" : "unknown" });
      var cache = el("td", { "data-caching": String(on) }, badge,
        el("span", { cls: "reason", text: v.caching_reason ? REASONS[v.caching_reason] || v.caching_reason : "no evidence yet" }));
      if (on === false && v.likely_causes && v.likely_causes.length) {
        cache.appendChild(el("div", { cls: "reason", text: "likely: " + v.likely_causes[0] }));
      }
      var kvCls = known(v.kv_usage) && v.kv_usage >= 0.85 ? "high" : "";
      body.appendChild(el("tr", { "data-backend": name },
        el("td", null, name, v.stale ? el("div", { cls: "stale", text: "metrics stale" }) : null),
        el("td", { text: v.engine || "–" }),
        cache,
        el("td", { cls: "num" }, known(v.hit_ratio) ? bar(v.hit_ratio, "good") : null, pct(v.hit_ratio)),
        el("td", { cls: "num", text: known(v.spec_acceptance_length) ? num(v.spec_acceptance_length, 2) + " tokens/step" : "–" }),
        el("td", { cls: "num" }, known(v.kv_usage) ? bar(v.kv_usage, kvCls) : null, pct(v.kv_usage)),
        el("td", { cls: "num", text: num(v.waiting) + " / " + num(v.running) }),
        el("td", { text: v.verdict || "" })));
    });
    renderFunnel((state.overview || {}).reuse || {});
  }

  function renderFunnel(reuse) {
    var box = clear($("funnel"));
    $("funnel-scope").textContent = "reusable prompt tokens counted by pod " + (reuse.pod || "?") +
      " since it started (Prometheus sums the pods)";
    var values = STAGES.map(function (s) { return reuse[s[0]]; });
    var max = Math.max.apply(null, values.filter(known).concat([0]));
    var first = reuse.available;
    STAGES.forEach(function (s, i) {
      var v = values[i];
      var fill = el("div", { cls: "fill " + s[0] });
      fill.style.width = (max > 0 && known(v) ? (v / max) * 100 : 0) + "%";
      var share = "";
      if (s[0] === "beyond_available") share = known(v) ? " (past available, counted apart)" : "";
      else if (known(v) && known(first) && first > 0 && i > 0) share = " (" + pct(v / first) + " of available)";
      box.appendChild(el("div", { title: s[2] }, s[1]));
      box.appendChild(el("div", { cls: "track", "data-stage": s[0] }, fill));
      box.appendChild(el("div", { cls: "num", text: (known(v) ? tokens(v) + " tokens" : "not counted yet") + share }));
    });
  }

  // ------------------------------------------------------------------ tenants
  // causes that are no break (app/prefix/diagnose.py NOT_A_PROBLEM): a new conversation, a compaction
  var EXPECTED = { new_session: true, compaction: true };
  function broke(r) { return !!r.cause && !EXPECTED[r.cause]; }

  function sparkline(recent) {
    var w = 4, gap = 1, h = 22, n = recent.length;
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", String(Math.max(1, n) * (w + gap)));
    svg.setAttribute("height", String(h));
    svg.setAttribute("role", "img");
    var breaks = recent.filter(broke).length;
    svg.setAttribute("aria-label", "continuity of the last " + n + " requests, " + breaks + " breaks");
    recent.forEach(function (r, i) {
      var base = document.createElementNS(SVG, "rect");
      base.setAttribute("class", broke(r) ? "base broke" : "base");
      base.setAttribute("x", String(i * (w + gap)));
      base.setAttribute("y", "0");
      base.setAttribute("width", String(w));
      base.setAttribute("height", String(h));
      svg.appendChild(base);
      var c = r.continuity;
      var rect = document.createElementNS(SVG, "rect");
      var height = known(c) ? Math.max(2, c * h) : h;
      rect.setAttribute("class", !known(c) ? "none" : broke(r) ? "break" : "ok");
      rect.setAttribute("x", String(i * (w + gap)));
      rect.setAttribute("y", String(h - height));
      rect.setAttribute("width", String(w));
      rect.setAttribute("height", String(height));
      rect.setAttribute("data-continuity", known(c) ? c.toFixed(3) : "");
      var title = document.createElementNS(SVG, "title");
      title.textContent = "request " + r.seq + ": continuity " + pct(c) +
        (broke(r) ? ", break: " + r.cause : r.cause ? ", " + r.cause + " (expected)" : "");
      rect.appendChild(title);
      svg.appendChild(rect);
    });
    return svg;
  }

  function ttftCell(buckets) {
    var cell = el("td", { cls: "ttft" });
    var names = Object.keys(buckets || {});
    if (!names.length) { cell.textContent = "–"; return cell; }
    names.forEach(function (b) {
      var q = buckets[b];
      cell.appendChild(el("div", { "data-bucket": b,
        text: b + ": " + secs(q.p50) + " / " + secs(q.p95) + " (n=" + q.n + ")" }));
    });
    return cell;
  }

  function billCell(bill) {
    // per cause: recomputed tokens, their prefill seconds and the mean TTFT a break added
    // (seconds only where a replica's prefill model could price them: "–" is unknown, not zero)
    var cell = el("td", { cls: "bill" });
    var causes = Object.keys(bill || {}).sort();
    if (!causes.length) { cell.appendChild(el("span", { cls: "muted", text: "none" })); return cell; }
    causes.forEach(function (c) {
      var b = bill[c];
      var priced = known(b.seconds) ? secs(b.seconds) + " prefill, +" + secs(b.added_ttft_s) + " TTFT a break" +
        (b.timed < b.breaks ? " (" + b.timed + " of " + b.breaks + " priced)" : "") : "seconds unknown";
      cell.appendChild(el("div", { "data-bill-cause": c, "data-tokens": String(b.tokens),
        "data-seconds": known(b.seconds) ? String(b.seconds) : "",
        text: c + ": " + tokens(b.tokens) + " tokens, " + priced }));
    });
    return cell;
  }

  function renderTenants() {
    var table = $("tenants");
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      var key = th.getAttribute("data-key");
      th.className = key && key === state.sort.key ? (state.sort.dir > 0 ? "asc" : "desc") : "";
    });
    var body = clear(table.tBodies[0]);
    var rows = sortedTenants();
    if (!rows.length) body.appendChild(el("tr", null, el("td", { colspan: "8", cls: "empty", text: "no tenant traffic yet" })));
    rows.forEach(function (t) {
      var causes = el("div", { cls: "chips" });
      Object.keys(t.breaks_by_cause || {}).sort().forEach(function (c) {
        causes.appendChild(el("span", { cls: "cause-chip " + c, "data-cause": c, text: c + " " + t.breaks_by_cause[c] }));
      });
      if (!causes.firstChild) causes.appendChild(el("span", { cls: "muted", text: "none" }));
      var tr = el("tr", { "data-tenant": t.tenant, cls: t.tenant === state.selected ? "selected" : "" },
        el("td", { text: t.tenant }),
        el("td", { cls: "num", text: String(t.requests) }),
        el("td", { cls: "num continuity", "data-continuity": known(t.continuity) ? t.continuity.toFixed(3) : "",
          title: "matched / total full blocks over the last " + (t.window || 0) + " requests", text: pct(t.continuity) }),
        el("td", null, sparkline(t.recent || [])),
        el("td", { cls: "num", text: String(t.breaks) }),
        el("td", null, causes),
        billCell(t.bill),
        ttftCell(t.ttft_by_bucket));
      tr.addEventListener("click", function () {
        state.selected = t.tenant;
        state.breakIndex = 0;
        saveHash();
        if (state.embedded || state.details[t.tenant]) render(); else load();
      });
      body.appendChild(tr);
    });
  }

  // ------------------------------------------------------------------ a break
  function breaksOf(tenant) {
    var rep = state.details[tenant];
    if (rep && rep.last_breaks) return rep.last_breaks;
    var row = state.tenants.filter(function (t) { return t.tenant === tenant; })[0];
    return row && row.last_break ? [row.last_break] : [];
  }

  function renderBreak() {
    var tabs = clear($("break-tabs"));
    var box = clear($("break"));
    var tenant = state.selected;
    $("break-tenant").textContent = tenant ? "tenant " + tenant : "";
    var list = tenant ? breaksOf(tenant) : [];
    if (!list.length) {
      box.appendChild(el("p", { cls: "empty", text: tenant ? "No break recorded for this tenant in its window." : "No tenant yet." }));
      return;
    }
    if (state.breakIndex >= list.length) state.breakIndex = 0;
    list.forEach(function (b, i) {
      var btn = el("button", { type: "button", cls: i === state.breakIndex ? "active" : "",
        text: requestName(b) + " · " + b.cause });
      btn.addEventListener("click", function () { state.breakIndex = i; renderBreak(); });
      tabs.appendChild(btn);
    });
    box.appendChild(breakView(list[state.breakIndex]));
  }

  function requestName(b) {
    // lint: the request's index in the file; gateway: the diagnosing pod's sequence number
    return known(b.request) ? "request " + b.request : "request #" + b.seq;
  }

  function whereText(b) {
    var m = b.message;
    if (!m) return "the template's own text, after the last message";
    var name = "message #" + m.index + " (" + m.role + ")";
    return m.where === "content" ? name + ", line " + m.line : "template text before " + name;
  }

  function breakView(b) {
    var root = el("div", { cls: "break", "data-cause": b.cause, "data-block-index": String(b.block_index) });
    var view = b.view || null;
    root.appendChild(el("div", { cls: "headline" },
      el("span", { cls: "badge cause " + b.cause, id: "break-cause", text: b.cause }), " ",
      el("span", { text: b.detail || "" })));
    var facts = el("div", { cls: "facts" },
      fact("first divergent block", known(b.block_index) ? String(b.block_index) : "–", { id: "break-block" }),
      fact("token offset", known(b.token_offset) ? tokens(b.token_offset) : "–"),
      fact("character offset", known(b.char_offset) ? tokens(b.char_offset) : "–"),
      fact("where", whereText(b), { id: "break-where" }),
      fact("prompt line", known(b.line) ? String(b.line) : "–"),
      fact("value kind", (b.span_kinds && b.span_kinds.length) ? b.span_kinds.join(", ") : "no dynamic value", { id: "break-kind" }),
      fact("continuity", known(b.blocks) && b.blocks ? b.matched + " of " + b.blocks + " blocks" : "–"),
      fact("diagnosed by", b.pod ? "pod " + b.pod : "–"),
      fact("recomputed", known(b.bill_tokens) ? tokens(b.bill_tokens) + " tokens" +
        (known(b.bill_s) ? ", +" + secs(b.bill_s) + " TTFT" : "") : "–", { id: "break-bill" }));
    root.appendChild(facts);
    if (b.fix) root.appendChild(el("div", { cls: "fix", id: "break-fix" }, el("span", { cls: "k", text: "Fix:" }), b.fix));
    if (!view) {
      root.appendChild(el("p", { cls: "empty", text: "This record holds no break view (written by an older gateway)." }));
      return root;
    }
    var shown = !!view.text_shown;
    var o = state.overview || {};
    var origin = o.source === "lint" ? "from " + (o.file || "the linted file")
      : "rendered from the memory of pod " + (b.pod || "?") + " when it diagnosed the request, and kept in the shared Store";
    root.appendChild(el("div", { cls: "privacy-note " + (shown ? "public" : "private"), id: "privacy-note",
      text: shown
        ? "Prompt text shown (hygiene.show_text: true): the text below is " + origin + "."
        : "Prompt text is hidden (hygiene.show_text: false): structure only. Letters show as x, digits as 9, " +
          "each dynamic value as <kind>; no prompt text reaches this page." }));
    var sides = el("div", { cls: "sides" });
    var structure = b.structure || {};
    sides.appendChild(side("previous request", view.prev, structure.prev, b));
    sides.appendChild(side("current " + requestName(b), view.cur, structure.cur, b));
    root.appendChild(sides);
    return root;
  }

  function side(title, win, struct, b) {
    var box = el("div", { cls: "side", "data-side": title.indexOf("previous") === 0 ? "prev" : "cur" });
    box.appendChild(el("h4", { text: title + (struct ? " · " + tokens(struct.chars) + " chars, " + struct.messages + " messages" : "") }));
    if (struct) box.appendChild(structureList(struct, b.message ? b.message.index : -1));
    if (!win) { box.appendChild(el("p", { cls: "empty", text: "not available" })); return box; }
    var pre = el("pre", { cls: "window" });
    if (win.cut_before) pre.appendChild(el("span", { cls: "cut", text: "… " }));
    var text = win.text, cursor = 0;
    (win.marks || []).slice().sort(function (x, y) { return x[0] - y[0]; }).forEach(function (m) {
      var a = Math.max(cursor, m[0]), z = Math.max(a, m[1]);
      if (a > cursor) pre.appendChild(document.createTextNode(text.slice(cursor, a)));
      var kind = m[2];
      var mark = el("mark", { cls: kind === "diff" ? "diff" : "dyn", "data-kind": kind,
        title: kind === "diff" ? "first difference" : "dynamic value: " + kind });
      mark.appendChild(document.createTextNode(text.slice(a, z) || "\u2038"));
      if (kind !== "diff" && text.slice(a, z) !== "<" + kind + ">") mark.appendChild(el("span", { cls: "kind", text: kind }));
      pre.appendChild(mark);
      cursor = z;
    });
    if (cursor < text.length) pre.appendChild(document.createTextNode(text.slice(cursor)));
    if (win.cut_after) pre.appendChild(el("span", { cls: "cut", text: " …" }));
    box.appendChild(pre);
    return box;
  }

  function structureList(struct, divIndex) {
    var list = el("div", { cls: "structure" });
    var regions = struct.regions || [];
    var longest = Math.max.apply(null, regions.map(function (r) { return r[2]; }).concat([1]));
    if (regions.length && regions[0][0] > 0) list.appendChild(el("div", { cls: "skip", text: "… " + regions[0][0] + " earlier messages" }));
    regions.forEach(function (r) {
      var len = el("div", { cls: "len" });
      len.style.width = Math.max(2, (r[2] / longest) * 100) + "%";
      list.appendChild(el("div", { cls: "msg" + (r[0] === divIndex ? " div" : ""), "data-index": String(r[0]) },
        el("span", { text: "#" + r[0] }), el("span", { text: r[1] }), el("div", null, len),
        el("span", { cls: "num", text: tokens(r[2]) + " chars" })));
    });
    var last = regions.length ? regions[regions.length - 1][0] : -1;
    if (struct.messages > 0 && last < struct.messages - 1) {
      list.appendChild(el("div", { cls: "skip", text: "… more messages after #" + last }));
    }
    return list;
  }

  // ------------------------------------------------------------------ lint (offline report)
  function renderLint() {
    var section = $("lint-section");
    if (!state.lint) { section.hidden = true; return; }
    section.hidden = false;
    var list = clear($("lint"));
    state.lint.forEach(function (r) {
      var head = "request " + r.index + ": " + (r.tokens || 0) + " tokens, continuity " +
        (known(r.continuity) ? r.continuity.toFixed(2) : "–") + ": ";
      list.appendChild(el("li", { "data-cause": r.cause || "" }, head,
        r.error ? r.error : r.cause ? el("b", { text: r.cause + (r.static ? " (suspected, single request)" : "") }) : "ok",
        r.fix ? " — fix: " + r.fix : ""));
    });
  }

  // ------------------------------------------------------------------ deep links: #tenant=T&sort=-breaks
  function readHash() {
    var params = new URLSearchParams(location.hash.replace(/^#/, ""));
    var sort = params.get("sort") || "";
    var key = sort.replace(/^-/, "");
    if (SORT_KEYS.indexOf(key) >= 0) state.sort = { key: key, dir: sort.charAt(0) === "-" ? -1 : 1 };
    if (params.get("tenant")) state.selected = params.get("tenant");
  }

  function saveHash() {
    var params = new URLSearchParams();
    if (state.selected) params.set("tenant", state.selected);
    params.set("sort", (state.sort.dir < 0 ? "-" : "") + state.sort.key);
    history.replaceState(null, "", "#" + params.toString());
  }

  function render() {
    renderHeader();
    renderFleet();
    renderTenants();
    renderBreak();
    renderLint();
    state.loaded = true;
    state.renders += 1;
    document.body.setAttribute("data-ready", "1");
    document.body.setAttribute("data-renders", String(state.renders));
  }

  // ------------------------------------------------------------------ start
  function start() {
    readHash();
    var data = $("pg-data");
    if (data) {
      var payload = JSON.parse(data.textContent);
      state.embedded = true;
      state.overview = payload.overview || {};
      state.engines = payload.engines || null;
      state.tenants = (payload.tenants && payload.tenants.tenants) || [];
      state.details = payload.details || {};
      state.lint = payload.lint || null;
      chooseTenant();
    }
    Array.prototype.forEach.call($("tenants").tHead.rows[0].cells, function (th) {
      var key = th.getAttribute("data-key");
      if (!key) return;
      th.addEventListener("click", function () {
        state.sort = { key: key, dir: state.sort.key === key ? -state.sort.dir : (key === "breaks" || key === "requests" ? -1 : 1) };
        saveHash();
        render();
      });
    });
    $("auto").addEventListener("change", schedule);
    load();
  }

  start();
})();
