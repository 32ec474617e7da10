"""Builds prefixgate's Grafana dashboards as code: `python dashboards/build.py`.

Writes dashboards/<uid>.json (committed) and dashboards/PANELS.md, the reader's guide generated
from the same panel descriptions. `--check` exits 1 when any output is out of date (the tests run
it). `python deploy/sync.py` then copies the dashboards into the Helm chart.

Hand-written JSON through a small builder rather than the Grafana SDK: the classic dashboard model
is small, the output is validated against Grafana's own schema (dashboards/schema/, from npm
@grafana/schema) and every PromQL expression is checked against a real scrape and a real
Prometheus in the tests. Metric names come from app/telemetry/metrics.py only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "dashboards"
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
SEL_MB = 'model=~"$model",backend=~"$backend"'
SEL_B = 'backend=~"$backend"'
SEL_T = 'tenant=~"$tenant"'
SEL_MT = 'model=~"$model",tenant=~"$tenant"'
# per-request metrics carry `route` (app/telemetry/metrics.py ROUTE_LABELS): the dashboards that
# have a $route variable filter on it; every query still sums whatever routes it selects
SEL_R = 'route=~"$route"'
SEL_RMB = f"{SEL_R},{SEL_MB}"
SEL_RT = f"{SEL_R},{SEL_T}"
SEL_RMT = f"{SEL_R},{SEL_MT}"


@dataclass
class Target:
    expr: str
    legend: str = ""


@dataclass
class Panel:
    """One panel: `kind` is a Grafana panel type (timeseries | stat)."""

    title: str
    description: str
    targets: list[Target]
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])
    mappings: list[dict[str, Any]] = field(default_factory=list)
    stack: bool = False


@dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[Row]
    variables: tuple[str, ...] = ("model", "backend", "tenant")


def quantile(q: float, metric: str, selector: str = "", by: str = "") -> str:
    """histogram_quantile over a prefixgate histogram, summed across proxy pods."""
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({keep}) (rate({metric}_bucket{{{selector}}}[{RATE}])))"


def _thresholds(steps: list[tuple[float | None, str]]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit, "thresholds": _thresholds(p.thresholds),
                                "mappings": p.mappings, "color": {"mode": "palette-classic"}}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    if p.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                              "showPoints": "never", "spanNulls": False,
                              "stacking": {"mode": "normal" if p.stack else "none", "group": "A"}}
        options: dict[str, Any] = {
            "legend": {"calcs": ["mean", "max", "lastNotNull"], "displayMode": "table",
                       "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"}}
    else:
        defaults["color"] = {"mode": "thresholds"}
        options = {"colorMode": "background", "graphMode": "area", "justifyMode": "auto",
                   "orientation": "auto", "percentChangeColorMode": "standard",
                   "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "showPercentChange": False, "textMode": "auto", "wideLayout": True}
    return {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description,
        "datasource": DS, "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": t.expr,
                     "legendFormat": t.legend or "__auto", "range": True}
                    for i, t in enumerate(p.targets)],
    }


def _variable(name: str, metric: str) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "datasource": DS,
            "query": f"label_values({metric}, {name})", "refresh": 2, "sort": 1,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


VARIABLE_SOURCES = {
    "route": "prefixgate_requests_total",
    "model": "prefixgate_ttft_seconds_count",
    "backend": "prefixgate_backend_healthy",
    "tenant": "prefixgate_prompt_tokens_total",
}


def render(d: Dashboard) -> dict[str, Any]:
    """The Grafana classic dashboard JSON model: rows stacked, panels flowed left to right."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in d.rows:
        panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False,
                       "panels": [], "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        x, row_h = 0, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            panels.append(_panel_json(p, pid, x, y))
            pid, x, row_h = pid + 1, x + p.width, max(row_h, p.height)
        y += row_h
    templating = [{"name": "datasource", "label": "Data source", "type": "datasource",
                   "query": "prometheus", "refresh": 1,
                   "current": {"selected": False, "text": "Prometheus", "value": "prometheus"}}]
    templating += [_variable(v, VARIABLE_SOURCES[v]) for v in d.variables]
    return {
        "uid": d.uid, "title": d.title, "description": d.description,
        "tags": ["prefixgate", "llm", "prefix-cache"], "editable": True, "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "30s", "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"}, "timepicker": {},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "prefixgate dashboards", "type": "dashboards", "tags": ["prefixgate"],
                   "asDropdown": True, "includeVars": True, "keepTime": True, "icon": "external link",
                   "targetBlank": False, "tooltip": "", "url": ""}],
        "templating": {"list": templating},
        "panels": panels,
    }


ONOFF = [{"type": "value", "options": {"0": {"text": "OFF", "color": "red", "index": 0},
                                      "1": {"text": "ON", "color": "green", "index": 1}}}]


def ttft_by_bucket(q: float) -> Panel:
    return Panel(f"TTFT p{round(q * 100)} by prompt bucket",
                 f"Client-side time to first token, {round(q * 100)}th percentile per prompt-length "
                 "bucket (request arrival at the proxy to the first chunk with generated text). "
                 "Compare each line with its alert threshold; long prompts are expected to be slower "
                 "unless their prefix is cached.",
                 [Target(quantile(q, "prefixgate_ttft_seconds", SEL_RMB, "prompt_bucket"),
                         "{{prompt_bucket}}")], unit="s", width=8)


def ttft_ledger(q: float) -> Panel:
    return Panel(f"TTFT ledger p{round(q * 100)} by prompt bucket",
                 f"{round(q * 100)}th percentile of each part of the client TTFT per prompt-length bucket "
                 "(docs/ttft-ledger.md), stacked: percentiles of parts do not add up to the TTFT's "
                 "percentile exactly, but show which part grows with the prompt or the load.",
                 [Target(quantile(q, "prefixgate_ttft_part_seconds", SEL_R, "prompt_bucket, part"),
                         "{{prompt_bucket}} {{part}}")], unit="s", width=8, stack=True)


def gateway() -> Dashboard:
    req = f"sum(rate(prefixgate_requests_total{{{SEL_R}}}[{RATE}]))"
    return Dashboard("prefixgate-gateway", "prefixgate / Gateway",
                     "Traffic, errors and latency as the client sees it through prefixgate.", [
        Row("Overview", [
            Panel("Request rate", "Requests per second received by all proxy pods.",
                  [Target(req)], kind="stat", unit="reqps", width=6, height=4),
            Panel("Error ratio", "Share of requests answered with a 5xx status.",
                  [Target(f'sum(rate(prefixgate_requests_total{{{SEL_R},status=~"5.."}}[{RATE}])) / {req}')],
                  kind="stat", unit="percentunit", width=6, height=4,
                  thresholds=[(None, "green"), (0.01, "orange"), (0.05, "red")]),
            Panel("Healthy backends", "Backends passing health checks (max over proxy pods).",
                  [Target(f"sum(max by (backend) (prefixgate_backend_healthy{{{SEL_B}}}))")],
                  kind="stat", width=6, height=4, thresholds=[(None, "red"), (1, "green")]),
            Panel("TTFT p95", "Client-side TTFT, 95th percentile over all prompt buckets.",
                  [Target(quantile(0.95, "prefixgate_ttft_seconds", SEL_RMB))], kind="stat", unit="s", width=6, height=4,
                  thresholds=[(None, "green"), (2, "orange"), (5, "red")]),
        ]),
        Row("Traffic and errors", [
            Panel("Requests by route and status", "Request rate per API route and HTTP status.",
                  [Target(f"sum by (route, status) (rate(prefixgate_requests_total{{{SEL_R}}}[{RATE}]))",
                          "{{route}} {{status}}")], unit="reqps", stack=True),
            Panel("Upstream errors by backend and kind",
                  "Failures talking to engines: connect, status_5xx, timeout, midstream. Retries "
                  "before the first byte hide some of them from clients.",
                  [Target(f"sum by (backend, kind) (rate(prefixgate_upstream_errors_total{{{SEL_B}}}[{RATE}]))",
                          "{{backend}} {{kind}}")], unit="reqps"),
            Panel("Mid-stream migrations",
                  "Streams whose replica broke mid-answer (routing.migrate_midstream): continued on another "
                  "replica, failed, or skipped (reason says why).",
                  [Target(f"sum by (reason, outcome) (rate(prefixgate_migrations_total{{{SEL_R}}}[{RATE}]))",
                          "{{outcome}} {{reason}}")], unit="reqps"),
            Panel("Migration pause p50 / p95",
                  "Client-visible pause of a continued stream: the last event before the break to the "
                  "continuation's first event.",
                  [Target(quantile(0.5, "prefixgate_migration_pause_seconds", SEL_R), "p50"),
                   Target(quantile(0.95, "prefixgate_migration_pause_seconds", SEL_R), "p95")], unit="s"),
            Panel("Request duration p95 by status", "End-to-end request time at the proxy per outcome.",
                  [Target(quantile(0.95, "prefixgate_request_duration_seconds", SEL_RMB, "status"),
                          "{{status}}")], unit="s"),
            Panel("Hygiene rejections and rewrites",
                  "Requests rejected (auth, hygiene policy) and prompts rewritten to keep the prefix stable.",
                  [Target(f"sum by (reason) (rate(prefixgate_rejections_total{{{SEL_RT}}}[{RATE}]))",
                          "rejected: {{reason}}"),
                   Target(f"sum by (kind) (rate(prefixgate_rewrites_total{{{SEL_RT}}}[{RATE}]))",
                          "rewritten: {{kind}}")], unit="reqps"),
        ]),
        Row("Latency", [
            ttft_by_bucket(0.5), ttft_by_bucket(0.95), ttft_by_bucket(0.99),
            Panel("TTFT p95 by backend", "Which replica is slow to start answering.",
                  [Target(quantile(0.95, "prefixgate_ttft_seconds", SEL_RMB, "backend"), "{{backend}}")],
                  unit="s", width=8),
            Panel("Upstream first byte p95 by backend",
                  "Arrival to the first upstream byte (about the engine's own TTFT): the gap to "
                  "client TTFT is role-only chunks and relay.",
                  [Target(quantile(0.95, "prefixgate_upstream_first_byte_seconds", SEL_RMB, "backend"),
                          "{{backend}}")], unit="s", width=8),
            Panel("Proxy overhead", "Arrival to the upstream request being sent: prefixgate's own cost "
                  "on the critical path (parsing, hygiene, fingerprint, routing).",
                  [Target(quantile(0.5, "prefixgate_proxy_overhead_seconds", SEL_R), "p50"),
                   Target(quantile(0.99, "prefixgate_proxy_overhead_seconds", SEL_R), "p99")], unit="s", width=8),
            Panel("TTFT p95 by route",
                  "Client-side TTFT per API route (chat, completions, responses, messages): an agent "
                  "API slower than chat on the same replicas points at its prompts (hygiene), not at "
                  "the engines.",
                  [Target(quantile(0.95, "prefixgate_ttft_seconds", SEL_RMB, "route"), "{{route}}")],
                  unit="s", width=8),
            Panel("Decode rate p50 by backend",
                  "Per-request decode tokens per second (completion tokens over the decode span).",
                  [Target(quantile(0.5, "prefixgate_decode_tokens_per_second", SEL_RMB, "backend"),
                          "{{backend}}")], unit="short", width=8),
            Panel("Inter-token latency p95 by backend", "Gaps between consecutive content chunks.",
                  [Target(quantile(0.95, "prefixgate_inter_token_seconds", SEL_RMB, "backend"),
                          "{{backend}}")], unit="s", width=8),
        ]),
        Row("TTFT ledger", [
            ttft_ledger(0.5), ttft_ledger(0.95),
            Panel("Mean TTFT by part",
                  "Where the average streamed request's first-token time went (docs/ttft-ledger.md): "
                  "gateway (arrival to request written upstream), retries (failed attempts), queue and "
                  "prefill (the engine's own report, vLLM --enable-per-request-metrics), rest (network, "
                  "the engine's front end and tokenisation, flush). Means stack to the mean TTFT of the "
                  "requests with every part; an engine that does not report shows only the gateway.",
                  [Target(f"sum by (part) (rate(prefixgate_ttft_part_seconds_sum{{{SEL_R}}}[{RATE}])) / "
                          f"sum by (part) (rate(prefixgate_ttft_part_seconds_count{{{SEL_R}}}[{RATE}]))",
                          "{{part}}")], unit="s", width=8, stack=True),
        ]),
        Row("Prefill model", [
            Panel("Cold prefill rate by backend",
                  "Fitted prompt tokens per second of a cold prefill on each replica, learned online from "
                  "the engine's own prefill times: prefill = fixed + new/rate + per_cached x cached + "
                  "attention x new x cached (least squares, recent requests weigh most).",
                  [Target(f"max by (backend) (prefixgate_prefill_model_cold_tokens_per_second{{{SEL_B}}})",
                          "{{backend}}")], unit="short", width=8),
            Panel("Attention coefficient by backend",
                  "Fitted prefill seconds per (new token x cached token): what a long cached context "
                  "still costs each new token. Absent until requests with cached tokens were seen.",
                  [Target(f"max by (backend) (prefixgate_prefill_model_attention_seconds{{{SEL_B}}})",
                          "{{backend}}")], unit="s", width=8),
            Panel("Prefill model samples by backend",
                  "Requests behind each replica's fit (exponentially forgotten weight): a fit over a "
                  "handful of requests is a rough one.",
                  [Target(f"max by (backend) (prefixgate_prefill_model_samples{{{SEL_B}}})", "{{backend}}")],
                  unit="short", width=8),
        ]),
        Row("Admission", [
            Panel("Admission rejections by tenant and reason",
                  "429s (requests_per_s, prompt_tokens_per_min, concurrent: over a tenant's limit) and "
                  "503 sheds (queue_full, queue_ttl: every replica saturated).",
                  [Target(f"sum by (tenant, reason) (rate(prefixgate_admission_rejections_total{{{SEL_T}}}[{RATE}]))",
                          "{{tenant}} {{reason}}")], unit="reqps", width=8),
            Panel("Gateway queue depth", "Requests waiting in the gateway queue, summed over proxy pods.",
                  [Target("sum(prefixgate_admission_queue_depth)", "waiting")], unit="short", width=8),
            Panel("Gateway queue wait", "Time queued requests waited before being forwarded or shed.",
                  [Target(quantile(0.5, "prefixgate_admission_wait_seconds"), "p50"),
                   Target(quantile(0.95, "prefixgate_admission_wait_seconds"), "p95")], unit="s", width=8),
            Panel("Predicted prefill tokens p95 by tenant",
                  "Uncached prompt tokens per routed request (prompt minus the prefix predicted resident): "
                  "the prefill cost each tenant puts on the engines.",
                  [Target(quantile(0.95, "prefixgate_prefill_tokens", SEL_RT, "tenant"), "{{tenant}}")],
                  unit="short", width=24),
        ]),
    ], variables=("route", "model", "backend", "tenant"))


def prefix_cache() -> Dashboard:
    reuse = f"sum by (stage) (rate(prefixgate_prefix_reuse_tokens_total[{RATE}]))"
    return Dashboard("prefixgate-prefix-cache", "prefixgate / Prefix cache",
                     "Is the engines' prefix cache on, hit, and used by each tenant's prompts?", [
        Row("Engines", [
            Panel("Prefix caching enabled", "0 = the engine's prefix cache is off (by config, or "
                  "prompts flow with zero cache queries). Every replica should say ON.",
                  [Target(f"max by (backend) (prefixgate_engine_prefix_caching_enabled{{{SEL_B}}})",
                          "{{backend}}")], kind="stat", width=24, height=4, mappings=ONOFF,
                  thresholds=[(None, "red"), (1, "green")]),
            Panel("Engine prefix-cache hit ratio", "Tokens hit / tokens queried per backend over the "
                  "engine scrape window, as the engine reports it.",
                  [Target(f"max by (backend) (prefixgate_engine_prefix_cache_hit_ratio{{{SEL_B}}})",
                          "{{backend}}")], unit="percentunit", min=0, max=1),
            Panel("Prediction fidelity", "Engine-delivered / proxy-predicted cached tokens. Near 1: "
                  "the proxy's block model matches the engine. Well below 1: eviction pressure or a "
                  "wrong block size.",
                  [Target(f"max by (backend) (prefixgate_prediction_fidelity_ratio{{{SEL_B}}})",
                          "{{backend}}")], unit="percentunit", min=0),
            Panel("KV cache usage", "Engine KV-cache usage; near 1 means evictions and lost prefixes.",
                  [Target(f"max by (backend) (prefixgate_engine_kv_usage_ratio{{{SEL_B}}})",
                          "{{backend}}")], unit="percentunit", min=0, max=1),
            Panel("Engine metrics stale", "1 when prefixgate's last scrape of the engine failed: "
                  "the gauges on this dashboard are old for that backend.",
                  [Target(f"max by (backend) (prefixgate_engine_metrics_stale{{{SEL_B}}})",
                          "{{backend}}")], min=0, max=1),
        ]),
        Row("Reuse funnel", [
            Panel("Reusable tokens: available / captured / delivered",
                  "Counted once per answered request on its full chain. available = cached somewhere "
                  "in the fleet; captured = predicted resident on the replica chosen; delivered = "
                  "reported cached by the engine, up to available; beyond_available = what the engine "
                  "reported past it (a request in flight with the same head). Gaps show what routing "
                  "and eviction lose.", [Target(reuse, "{{stage}}")], unit="short"),
            Panel("Cached share of prompt tokens",
                  "Cached prompt tokens over all prompt tokens, as the engine reports (engine) and as "
                  "the proxy predicts (predicted).",
                  [Target(f"sum by (source) (rate(prefixgate_cached_tokens_total{{{SEL_RMT}}}[{RATE}])) "
                          f"/ ignoring (source) group_left sum(rate(prefixgate_prompt_tokens_total"
                          f"{{{SEL_RMT}}}[{RATE}]))", "{{source}}")], unit="percentunit", min=0),
            Panel("Engine-cached share of prompt tokens by route",
                  "Cached prompt tokens over all prompt tokens per API route, as the engine reports: "
                  "an agent API near 0 while chat hits means its prompts change at the head (see "
                  "hygiene findings by kind).",
                  [Target(f'sum by (route) (rate(prefixgate_cached_tokens_total{{{SEL_RMT},source="engine"}}[{RATE}])) '
                          f"/ sum by (route) (rate(prefixgate_prompt_tokens_total{{{SEL_RMT}}}[{RATE}]))",
                          "{{route}}")], unit="percentunit", min=0, width=24),
        ]),
        Row("Tenants", [
            Panel("Prefix continuity per tenant", "Share of the tenant's last prompt's full blocks that "
                  "continue an earlier prompt. Chat and agent traffic should sit near 1.",
                  [Target(f"min by (tenant) (prefixgate_prefix_continuity_ratio{{{SEL_T}}})",
                          "{{tenant}}")], unit="percentunit", min=0, max=1),
            Panel("Prefix breaks by cause", "Why prompts stopped continuing their prefix: "
                  "dynamic_head, tool_order, front_trim, template_change, history_edit, question_first; "
                  "and the two that are no break: new_session (a new conversation) and compaction (an "
                  "agent replaced its history with a summary: expected, one cold turn).",
                  [Target(f"sum by (cause) (rate(prefixgate_prefix_breaks_total{{{SEL_RT}}}[{RATE}]))",
                          "{{cause}}")], unit="short", stack=True),
            Panel("Prefix breaks by tenant (excluding new sessions and compactions)",
                  "Tenants whose prompts break their own prefix; open /hygiene/tenants/<tenant>.",
                  [Target(f'topk(10, sum by (tenant) (rate(prefixgate_prefix_breaks_total{{{SEL_RT},'
                          f'cause!~"new_session|compaction"}}[{RATE}])))', "{{tenant}}")], unit="short"),
            Panel("Compactions by tenant",
                  "Agents that compacted their context (the history replaced by a summary, the system "
                  "prompt and tools kept). Expected: one cold turn each, then the session continues "
                  "from the new prefix; not a break.",
                  [Target(f'sum by (tenant) (rate(prefixgate_prefix_breaks_total{{{SEL_RT},'
                          f'cause="compaction"}}[{RATE}]))', "{{tenant}}")], unit="short"),
            Panel("Hygiene findings by kind", "Prompt patterns that defeat prefix caching (any policy).",
                  [Target(f"sum by (kind) (rate(prefixgate_hygiene_findings_total{{{SEL_RT}}}[{RATE}]))",
                          "{{kind}}")], unit="short"),
            Panel("Diagnoses by outcome",
                  "Requests diagnosed because they did not continue their conversation's latest request "
                  "in full (a stateless client: every request). diagnosed; recorded undiagnosed: skipped "
                  "(the diagnosis queue was full), over_budget (prefix.diagnosis_cpu_share was spent).",
                  [Target(f"sum by (outcome) (rate(prefixgate_diagnoses_total[{RATE}]))", "{{outcome}}")],
                  unit="short", stack=True),
            Panel("Diagnosis CPU (share of a core)",
                  "What diagnosing breaks costs the gateway, on the event loop (small prompt pairs, inline) "
                  "and in the diagnosis thread; prefix.diagnosis_cpu_share bounds it per process.",
                  [Target(f"sum by (where) (rate(prefixgate_diagnosis_cpu_seconds_total[{RATE}]))",
                          "{{where}}")], unit="percentunit", min=0, stack=True),
        ]),
        Row("What hygiene costs", [
            Panel("Recomputed tokens by tenant and cause",
                  "Prompt tokens per second the replicas recomputed because a request broke its tenant's "
                  "previous chain (docs/ttft-ledger.md): the whole blocks that chain held past the break "
                  "point, up to the prompt's length. Compactions and new sessions are not billed.",
                  [Target(f"topk(10, sum by (tenant, cause) (rate(prefixgate_break_recomputed_tokens_total"
                          f"{{{SEL_T}}}[{RATE}])))", "{{tenant}} {{cause}}")], unit="short", width=8),
            Panel("Break prefill seconds by tenant and cause",
                  "Prefill seconds per second those recomputed tokens cost, by each serving replica's "
                  "fitted prefill model (the Prefill model row of the Gateway dashboard). Breaks on a "
                  "replica without a full fit are not priced: this line can be below the true cost, "
                  "never above what the model says.",
                  [Target(f"topk(10, sum by (tenant, cause) (rate(prefixgate_break_prefill_seconds_total"
                          f"{{{SEL_T}}}[{RATE}])))", "{{tenant}} {{cause}}")], unit="s", width=8),
            Panel("Break share of prefill seconds by tenant",
                  "Break prefill seconds (modelled) over the prefill seconds the engines reported for the "
                  "tenant's requests (vLLM --enable-per-request-metrics): what the alert "
                  "PrefixgateBreakPrefillShareHigh compares with its share. Absent for a tenant without "
                  "reported prefill (SGLang, vLLM without the flag, the Messages and Responses APIs).",
                  [Target(f"sum by (tenant) (rate(prefixgate_break_prefill_seconds_total{{{SEL_T}}}[{RATE}])) "
                          f"/ (sum by (tenant) (rate(prefixgate_tenant_prefill_seconds_total{{{SEL_T}}}"
                          f"[{RATE}])) > 0)", "{{tenant}}")], unit="percentunit", min=0, width=8),
        ]),
    ], variables=("route", "model", "backend", "tenant"))


def speculative() -> Dashboard:
    return Dashboard("prefixgate-speculative", "prefixgate / Speculative decoding",
                     "Speculative decoding acceptance next to the decode rate clients get.", [
        Row("Acceptance and decode", [
            Panel("Mean acceptance length", "Tokens accepted per verify step (bonus token included) "
                  "per backend. A drop means the draft model or n-gram drafts stopped matching the "
                  "traffic.",
                  [Target(f"max by (backend) (prefixgate_engine_spec_acceptance_length{{{SEL_B}}})",
                          "{{backend}}")], unit="short", min=0),
            Panel("Decode rate p50 by backend", "Per-request decode tokens per second; should move "
                  "with acceptance length.",
                  [Target(quantile(0.5, "prefixgate_decode_tokens_per_second", SEL_MB, "backend"),
                          "{{backend}}")], unit="short"),
            Panel("Inter-token latency p50 by backend", "Gaps between content chunks.",
                  [Target(quantile(0.5, "prefixgate_inter_token_seconds", SEL_MB, "backend"),
                          "{{backend}}")], unit="s"),
            Panel("Engine running requests", "Batch size per backend: acceptance falls with larger "
                  "batches on some engines.",
                  [Target(f"max by (backend) (prefixgate_engine_requests_running{{{SEL_B}}})",
                          "{{backend}}")], unit="short"),
        ]),
    ], variables=("model", "backend"))


def routing() -> Dashboard:
    return Dashboard("prefixgate-routing", "prefixgate / Routing",
                     "Where requests go, why, and how loaded each replica is.", [
        Row("Decisions", [
            Panel("Decisions by reason", "prefix_hit, load_override, cold_spread, session, failover, "
                  "round_robin, least_load.",
                  [Target(f"sum by (reason) (rate(prefixgate_route_decisions_total{{{SEL_B}}}[{RATE}]))",
                          "{{reason}}")], unit="reqps", stack=True),
            Panel("Decisions by backend", "Traffic share per replica.",
                  [Target(f"sum by (backend) (rate(prefixgate_route_decisions_total{{{SEL_B}}}[{RATE}]))",
                          "{{backend}}")], unit="reqps", stack=True),
        ]),
        Row("Load per replica", [
            Panel("In-flight requests (proxy)", "Requests prefixgate has in flight per backend, "
                  "summed over proxy pods.",
                  [Target(f"sum by (backend) (prefixgate_backend_inflight_requests{{{SEL_B}}})",
                          "{{backend}}")], unit="short", width=8),
            Panel("Engine queue (waiting)", "Requests queued in each engine.",
                  [Target(f"max by (backend) (prefixgate_engine_requests_waiting{{{SEL_B}}})",
                          "{{backend}}")], unit="short", width=8),
            Panel("Engine KV usage", "KV-cache usage per backend.",
                  [Target(f"max by (backend) (prefixgate_engine_kv_usage_ratio{{{SEL_B}}})",
                          "{{backend}}")], unit="percentunit", min=0, max=1, width=8),
            Panel("Backend health", "1 = passes health checks (min over proxy pods).",
                  [Target(f"min by (backend) (prefixgate_backend_healthy{{{SEL_B}}})", "{{backend}}")],
                  min=0, max=1),
            Panel("State backend up", "1 when each proxy pod reaches the shared state (Redis).",
                  [Target("min(prefixgate_state_backend_up)", "state")], kind="stat", mappings=ONOFF,
                  thresholds=[(None, "red"), (1, "green")]),
        ]),
    ], variables=("backend",))


DASHBOARDS = (gateway, prefix_cache, speculative, routing)


def panels_markdown(boards: list[Dashboard]) -> str:
    lines = ["# prefixgate dashboards: what each panel means", "",
             "Generated by `python dashboards/build.py` from the panel descriptions; do not edit.", ""]
    for d in boards:
        lines += [f"## {d.title} (`dashboards/{d.uid}.json`)", "", d.description, ""]
        for row in d.rows:
            for p in row.panels:
                lines.append(f"- **{p.title}** — {p.description}")
        lines.append("")
    return "\n".join(lines)


def outputs() -> dict[Path, str]:
    """Every file the build writes, path -> content."""
    boards = [make() for make in DASHBOARDS]
    out: dict[Path, str] = {}
    for d in boards:
        text = json.dumps(render(d), indent=2, sort_keys=False) + "\n"
        out[DASHBOARD_DIR / f"{d.uid}.json"] = text
    out[DASHBOARD_DIR / "PANELS.md"] = panels_markdown(boards)
    return out


def write_outputs(files: dict[Path, str], check: bool) -> int:
    """Write (or with `check`, only compare) generated files; 1 when `check` finds one stale."""
    stale = []
    for path, text in files.items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(("stale: " if check else "wrote: ") + str(path.relative_to(ROOT)))
    return 1 if (check and stale) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if any output is out of date")
    return write_outputs(outputs(), parser.parse_args(argv).check)


if __name__ == "__main__":
    sys.exit(main())
