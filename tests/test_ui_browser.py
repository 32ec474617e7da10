"""The /ui explorer in a real browser (headless Debian chromium, tests/browser.py).

The proxy runs in front of the simulator; a tenant with `Current time: …` on top of its system
prompt and a clean tenant send streamed requests through the real `openai` client; the page is
loaded and its DOM, after the scripts ran, must show each tenant's continuity and sparkline, the
break's cause, block index, location and highlighted value, and the fix the Store holds. With
`hygiene.show_text: false` no word of any prompt may appear anywhere in the DOM. A screenshot is
written as an artefact (tmp dir; also to $PREFIXGATE_UI_ARTEFACTS when set).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from browser import Node, dump_dom, screenshot
from openai import OpenAI

from app.cli import main
from app.demo import run_workload
from app.prefix.breakview import POD
from app.telemetry.funnel import STAGES

CLOCK_STATIC = "You are the Quokka freight desk. Pallets leave Zanzibar on weekdays; refunds need a waybill.\n" * 30
CLEAN_SYSTEM = "Marmoset archive helper. Quote catalogue shelfmarks verbatim and cite the vellum.\n" * 30
# words only the prompts contain (not role names, kinds or the page's own labels)
PROMPT_WORDS = ("quokka", "zanzibar", "pallets", "waybill", "weekdays", "marmoset", "shelfmark", "vellum",
                "catalogue", "verbatim", "crate", "2026-04-14", "t09:")
GRAFANA = "https://grafana.example.net/d/prefixgate/overview"
TURNS = 6


def stamp(i: int) -> str:
    return f"2026-04-14T09:{10 + i:02d}:{(7 * i) % 60:02d}Z"


def chat(client: OpenAI, tenant: str, messages: list[dict[str, str]]) -> str:
    stream = client.chat.completions.create(model="sim", messages=messages, max_tokens=16, stream=True,
                                            extra_headers={"x-tenant-id": tenant})
    return "".join((c.choices[0].delta.content or "") for c in stream if c.choices)


def wait_processed(hook: Any, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def send_workload(entry: Any, observers: list[Any] | None = None, clock_tenant: str = "clock",
                  clock_system: str = CLOCK_STATIC) -> None:
    """TURNS timestamp-on-top requests and TURNS turns of a clean conversation, through `entry`."""
    client = OpenAI(base_url=entry.base_url, api_key="x", max_retries=0, timeout=30)
    hook = entry.services.prefix
    clean = [{"role": "system", "content": CLEAN_SYSTEM}]
    for i in range(TURNS):
        chat(client, clock_tenant, [{"role": "system", "content": f"Current time: {stamp(i)}\n{clock_system}"},
                                    {"role": "user", "content": f"Where is crate {i}?"}])
        clean.append({"role": "user", "content": f"Find shelfmark {i}"})
        clean.append({"role": "assistant", "content": chat(client, "clean", clean)})
        wait_processed(hook, 2 * (i + 1))


def wait_caching_verdict(url: str, timeout: float = 20.0) -> bool | None:
    """The single backend's `caching_enabled` once the scraper decided it (its first scrape may
    come late on a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        views = list(httpx.get(url + "/hygiene/engines").json()["backends"].values())
        if views and views[0]["caching_enabled"] is not None or time.monotonic() > deadline:
            return views[0]["caching_enabled"] if views else None
        time.sleep(0.1)


def save_artefact(path: Path) -> None:
    target = os.environ.get("PREFIXGATE_UI_ARTEFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


def tenant_row(dom: Node, tenant: str) -> Node:
    return dom.one("tr", data_tenant=tenant)


def highlighted(dom: Node, side: str) -> list[Node]:
    box = dom.one("div", cls="side", data_side=side)
    return box.find_all("mark", cls="dyn")


def test_ui_shows_continuity_break_and_highlight_without_prompt_text(sim_factory, proxy_factory, tmp_path) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, ui={"grafana_url": GRAFANA})
    send_workload(proxy)
    report = httpx.get(proxy.url + "/hygiene/tenants/clock").json()
    record = report["last_breaks"][0]
    caching = wait_caching_verdict(proxy.url)

    html, dom = dump_dom(proxy.url + "/ui")
    assert dom.one("body").attrs.get("data-ready") == "1", "the page never rendered its data"

    # tenants: worst first, continuity and the per-request sparkline
    rows = dom.one("table", id="tenants").find_all("tr", where=lambda n: "data-tenant" in n.attrs)
    assert [r.attrs["data-tenant"] for r in rows] == ["clock", "clean"]
    clock, clean = tenant_row(dom, "clock"), tenant_row(dom, "clean")
    assert float(clock.one("td", cls="continuity").attrs["data-continuity"]) < 0.05
    assert float(clean.one("td", cls="continuity").attrs["data-continuity"]) > 0.75
    assert clock.one("td", cls="continuity").text() in ("0%", "1%", "2%", "3%", "4%")
    bars = [r for r in clock.find_all("rect") if "base" not in r.classes()]
    assert len(bars) == TURNS and sum("break" in r.classes() for r in bars) == TURNS - 1
    assert not [r for r in clean.find_all("rect") if "break" in r.classes()]
    assert clock.one("span", data_cause="dynamic_head").text() == f"dynamic_head {TURNS - 1}"
    # cost so far: the tokens its breaks made the replica recompute; no prefill model (the simulator
    # reports no per-request metrics here), so the seconds are unknown, not zero
    cost = clock.one("div", data_bill_cause="dynamic_head")
    assert cost.attrs["data-tokens"] == str(report["bill"]["dynamic_head"]["tokens"]) != "0"
    assert cost.attrs["data-seconds"] == "" and cost.text().endswith("tokens, seconds unknown")
    assert clean.one("td", cls="bill").text() == "none"
    for row in (clock, clean):  # streamed requests: TTFT p50/p95 in their prompt bucket
        buckets = row.find_all("div", where=lambda n: "data-bucket" in n.attrs)
        assert buckets and all(re.search(r"p?\d.* / .*\(n=\d+\)", b.text()) for b in buckets)

    # the break: cause, block index, where, highlighted and classified value, the fix
    view = dom.one("div", cls="break")
    assert view.attrs["data-cause"] == "dynamic_head" and dom.by_id("break-cause").text() == "dynamic_head"
    assert view.attrs["data-block-index"] == str(record["block_index"]) == dom.by_id("break-block").text()
    assert record["block_index"] <= 1
    assert dom.by_id("break-where").text() == "message #0 (system), line 1"
    assert dom.by_id("break-bill").text() == f"{record['bill_tokens']:,} tokens"
    assert dom.by_id("break-kind").text() == "timestamp"
    for side in ("prev", "cur"):
        marks = highlighted(dom, side)
        assert [(m.attrs["data-kind"], m.text()) for m in marks] == [("timestamp", "<timestamp>")]
    assert dom.by_id("break-fix").text() == "Fix:" + record["fix"]
    assert "below the static content" in record["fix"]
    assert "hygiene.show_text: false" in dom.by_id("privacy-note").text()

    # fleet and header
    backend = dom.one("table", id="fleet").find_all("tr", where=lambda n: "data-backend" in n.attrs)
    assert caching is True  # the simulator's cache_config_info says so
    assert len(backend) == 1 and backend[0].one("span", cls="badge").text() == "ON"
    assert {t.attrs["data-stage"] for t in dom.find_all("div", cls="track")} == set(STAGES)
    assert dom.by_id("grafana").attrs["href"] == GRAFANA

    # private by default: not one prompt word anywhere in the DOM
    lowered = html.lower()
    assert [w for w in PROMPT_WORDS if w in lowered] == []

    shot = screenshot(proxy.url + "/ui", tmp_path / "ui-show-text-false.png")
    save_artefact(shot)


def test_show_text_true_shows_the_text_and_which_pod_rendered_it(sim_factory, proxy_factory, tmp_path) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, hygiene={"show_text": True})
    send_workload(proxy)
    html, dom = dump_dom(proxy.url + "/ui")
    cur, prev = highlighted(dom, "cur"), highlighted(dom, "prev")
    assert [m.text() for m in cur] == [stamp(TURNS - 1) + "timestamp"]  # value + its kind label
    assert [m.text() for m in prev] == [stamp(TURNS - 2) + "timestamp"]
    assert "Quokka freight desk" in dom.one("div", cls="side", data_side="cur").text()
    note = dom.by_id("privacy-note").text()
    assert "hygiene.show_text: true" in note and f"memory of pod {POD}" in note
    save_artefact(screenshot(proxy.url + "/ui", tmp_path / "ui-show-text-true.png"))


def test_any_pod_shows_the_break_from_the_store(sim_factory, proxy_factory, redis_server, redis_namespace) -> None:
    """Traffic through pod A only; pod B, which never saw a prompt, renders the same break."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    pods = [proxy_factory(sim, state=redis_server.url, state_options={"namespace": redis_namespace})
            for _ in range(2)]
    send_workload(pods[0])
    b_tracker = pods[1].services.prefix.tracker
    assert b_tracker.hash_count == 0  # pod B holds no prompt of its own
    record = httpx.get(pods[0].url + "/hygiene/tenants/clock").json()["last_breaks"][0]
    deadline = time.monotonic() + 10
    while httpx.get(pods[1].url + "/hygiene/tenants/clock").json().get("breaks", 0) < TURNS - 1:
        assert time.monotonic() < deadline, "pod B never saw pod A's breaks in the Store"
        time.sleep(0.05)
    html, dom = dump_dom(pods[1].url + "/ui")
    assert dom.by_id("break-cause").text() == "dynamic_head"
    assert dom.by_id("break-block").text() == str(record["block_index"])
    assert dom.by_id("break-where").text() == "message #0 (system), line 1"
    assert [m.text() for m in highlighted(dom, "cur")] == ["<timestamp>"]
    assert float(tenant_row(dom, "clock").one("td", cls="continuity").attrs["data-continuity"]) < 0.05
    assert "quokka" not in html.lower()


def test_names_and_prompt_markup_stay_text(sim_factory, proxy_factory) -> None:
    """A tenant id and prompt text full of markup are shown as text: no element is created."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, hygiene={"show_text": True})
    evil = '<img src=x onerror="document.title=1">'
    send_workload(proxy, clock_tenant=evil, clock_system='<b id="injected">bold</b> <script>x()</script>\n' + CLOCK_STATIC)
    html, dom = dump_dom(proxy.url + "/ui")
    assert dom.find_all("img") == [] and dom.find_all("b", id="injected") == []
    assert len(dom.find_all("script")) == 1  # the page's own
    assert tenant_row(dom, evil).find_all("td")[0].text() == evil
    assert '<b id="injected">bold</b>' in dom.one("div", cls="side", data_side="cur").text()


def test_lint_html_report_is_the_same_break_view_offline(tmp_path, capsys) -> None:
    bodies = [{"model": "m", "messages": [{"role": "system", "content": f"Current time: {stamp(i)}\n{CLOCK_STATIC}"},
                                          {"role": "user", "content": f"Where is crate {i}?"}]} for i in range(3)]
    src = tmp_path / "agent.jsonl"
    src.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    report = tmp_path / "report.html"
    assert main(["lint", str(src), "--html", str(report)]) == 1
    fixes = [ln.split("fix: ", 1)[1] for ln in capsys.readouterr().out.splitlines() if "fix: " in ln]
    page = report.read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    html, dom = dump_dom(report.as_uri())
    assert dom.one("body").attrs.get("data-ready") == "1"
    assert dom.one("body").attrs["data-renders"] == "1"  # a report never refreshes
    assert dom.by_id("fleet-section").attrs.get("hidden") is not None  # no engines offline
    assert dom.by_id("break-cause").text() == "dynamic_head"
    assert dom.by_id("break-block").text() == "1"
    assert [b.text() for b in dom.one("div", id="break-tabs").find_all("button")] == \
        ["request 2 · dynamic_head", "request 1 · dynamic_head"]
    assert [m.text() for m in highlighted(dom, "cur")] == [stamp(2) + "timestamp"]
    assert dom.by_id("break-fix").text() == "Fix:" + fixes[-1]  # the sentence lint printed
    assert "from agent.jsonl" in dom.by_id("privacy-note").text()


def test_deep_link_sorts_and_selects_and_the_page_refreshes(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, ui={"refresh_s": 0.5})
    send_workload(proxy)
    _, dom = dump_dom(proxy.url + "/ui#tenant=clean&sort=-continuity", budget_ms=4000)
    rows = dom.one("table", id="tenants").find_all("tr", where=lambda n: "data-tenant" in n.attrs)
    assert [r.attrs["data-tenant"] for r in rows] == ["clean", "clock"]  # best first, as linked
    assert "selected" in tenant_row(dom, "clean").classes()
    assert dom.by_id("break-tenant").text() == "tenant clean"
    assert "No break recorded" in dom.by_id("break").text()
    assert int(dom.one("body").attrs["data-renders"]) >= 3  # re-read every 0.5 s of (virtual) time


def test_the_funnel_after_demo_traffic_has_no_share_above_available(sim_factory, proxy_factory, tmp_path) -> None:
    """`make demo`'s fleet and workload (two replicas, five tenants' requests sent at once each
    round, some with the same head); the page's funnel: no stage above 100% of available, the
    engine's surplus in its own row. Its screenshot is docs/ui-explorer.png (docs/ui.md)."""
    sim = sim_factory(replicas=2, time_scale=1.0, decode_tps=200.0)
    proxy = proxy_factory(sim, ui={"grafana_url": GRAFANA})
    sent = asyncio.run(run_workload(proxy.url, rounds=6))
    proxy.settle()
    wait_processed(proxy.services.prefix, sent)
    wait_caching_verdict(proxy.url)
    reuse = httpx.get(proxy.url + "/hygiene/overview").json()["reuse"]
    engine = sum(s.value for f in proxy.services.metrics.registry.collect() if f.name == "prefixgate_cached_tokens"
                 for s in f.samples if s.name.endswith("_total") and s.labels["source"] == "engine")
    assert reuse["captured"] <= reuse["available"] and reuse["delivered"] <= reuse["available"]
    assert reuse["delivered"] + reuse["beyond_available"] == engine > 0

    _, dom = dump_dom(proxy.url + "/ui")
    rows = {t.attrs["data-stage"] for t in dom.find_all("div", cls="track")}
    assert rows == set(STAGES)
    shares = [int(m) for m in re.findall(r"\((\d+)% of available\)", dom.by_id("funnel").text())]
    assert len(shares) == 2 and all(s <= 100 for s in shares), shares
    assert "past available, counted apart" in dom.by_id("funnel").text()
    save_artefact(screenshot(proxy.url + "/ui", tmp_path / "ui-explorer.png", size=(1400, 1080)))
