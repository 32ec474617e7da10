"""`prefixgate demo`: two simulated replicas, the proxy, a short multi-tenant workload, a report.

The workload is chosen to show what prefixgate is for: one tenant with a stable system prompt
(its prefix keeps hitting the cache), one whose long system prompt starts with `Current time:
<now>` (every request breaks the prefix at block 0), a chatty multi-turn tenant, and a few long
prompts so more than one TTFT bucket fills. The report reads the proxy's own /metrics (TTFT
p50/p95 by prompt bucket, histogram interpolation as Prometheus' histogram_quantile does) and
GET /hygiene/tenants (per-tenant continuity), then the URLs stay up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import time
from collections import defaultdict
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.prefix.diagnose import NOT_A_PROBLEM
from app.proxy.ledger import PARTS as LEDGER_PARTS
from app.serving import ServerThread, free_port
from app.telemetry.metrics import PROMPT_BUCKET_MAX, PROMPT_BUCKETS

BUCKET_ORDER = [label for label, _ in PROMPT_BUCKETS] + [PROMPT_BUCKET_MAX, "unknown"]

STABLE_SYSTEM = ("You are the support assistant of Acme Corp. Answer briefly and politely. "
                 "Policies follow. " + " ".join(f"Policy {i}: refunds within {i % 30 + 1} days of purchase "
                                                f"for product line {i}." for i in range(120)))
HELPDESK_SYSTEM = ("You are Initech's IT helpdesk. Ask for the asset tag first. " + " ".join(
    f"Step {i}: for printer model {i}, restart the spooler and wait {i % 7 + 1} minutes." for i in range(120)))
CLOCK_SYSTEM_TAIL = ("You are Globex's scheduling assistant. " + " ".join(
    f"Rule {i}: meetings in room {i} need {i % 5 + 1} attendees." for i in range(120)))
QUESTIONS = ["How do refunds work?", "Can I return a gift?", "What about damaged items?",
             "Is shipping refunded?", "How long does it take?", "Who do I contact?"]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus-style quantile from cumulative (upper bound, count) pairs, sorted by bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def ttft_by_bucket(metrics_text: str) -> dict[str, dict[str, float | None]]:
    """{prompt_bucket: {count, p50, p95}} over all models and backends."""
    cumulative: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "prefixgate_ttft_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                cumulative[sample.labels["prompt_bucket"]][float(sample.labels["le"])] += sample.value
    out: dict[str, dict[str, float | None]] = {}
    for bucket, counts in cumulative.items():
        pairs = sorted(counts.items())
        out[bucket] = {"count": pairs[-1][1] if pairs else 0.0, "p50": histogram_quantile(0.5, pairs),
                       "p95": histogram_quantile(0.95, pairs)}
    return out


def ledger_by_bucket(metrics_text: str) -> dict[str, dict[str, float]]:
    """{prompt_bucket: {part: mean seconds}} of the TTFT ledger (docs/ttft-ledger.md), all routes."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "prefixgate_ttft_part_seconds":
            continue
        for sample in family.samples:
            key = (sample.labels["prompt_bucket"], sample.labels["part"])
            if sample.name.endswith("_sum"):
                sums[key][0] += sample.value
            elif sample.name.endswith("_count"):
                sums[key][1] += sample.value
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (bucket, part), (total, count) in sums.items():
        if count:
            out[bucket][part] = total / count
    return dict(out)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f} ms"


def _ms2(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f} ms"


def format_report(ttft: dict[str, dict[str, float | None]], hygiene: dict[str, Any] | None,
                  ledger: dict[str, dict[str, float]] | None = None) -> str:
    order = lambda b: BUCKET_ORDER.index(b) if b in BUCKET_ORDER else 99  # noqa: E731
    lines = ["", "TTFT at the proxy (client-side), by prompt length",
             f"  {'bucket':<10} {'requests':>8} {'p50':>10} {'p95':>10}"]
    for bucket in sorted(ttft, key=order):
        row = ttft[bucket]
        lines.append(f"  {bucket:<10} {int(row['count'] or 0):>8} {_ms(row['p50']):>10} {_ms(row['p95']):>10}")
    lines.append("")
    if ledger:
        parts = [p for p in LEDGER_PARTS if any(p in row for row in ledger.values())]  # the ledger's order
        lines += ["Where the first token's time went (TTFT ledger, mean per request; engine parts from "
                  "vLLM's per-request metrics)",
                  f"  {'bucket':<10} " + " ".join(f"{p:>10}" for p in parts)]
        for bucket in sorted(ledger, key=order):
            lines.append(f"  {bucket:<10} " + " ".join(f"{_ms2(ledger[bucket].get(p)):>10}" for p in parts))
        lines.append("")
    if hygiene is None:
        lines.append("Per-tenant continuity: not available (GET /hygiene/tenants did not answer)")
        return "\n".join(lines)
    lines += ["Per-tenant prefix continuity (share of each prompt's blocks continuing an earlier one)",
              f"  {'tenant':<12} {'requests':>8} {'continuity':>11} {'new conv':>8} {'breaks':>7}  break causes"]
    for t in hygiene.get("tenants", []):
        cont = t.get("continuity")
        causes = ", ".join(f"{k}={v}" for k, v in sorted((t.get("breaks_by_cause") or {}).items())
                           if k not in NOT_A_PROBLEM) or "-"  # a new conversation or a compaction is no break to fix
        cont_s = "–" if cont is None else f"{100 * cont:.0f}%"
        lines.append(f"  {t.get('tenant', '?'):<12} {t.get('requests', 0):>8} {cont_s:>11} "
                     f"{t.get('new_sessions', 0):>8} {t.get('breaks', 0):>7}  {causes}")
    return "\n".join(lines + format_bill(hygiene))


def format_bill(hygiene: dict[str, Any]) -> list[str]:
    """Per tenant and cause, what its breaks cost so far (the tenant report's `bill`): recomputed
    tokens, their prefill seconds by the replicas' fitted models and the TTFT one break added;
    seconds only over the breaks a model could price ("–": none could)."""
    lines = ["", "The bill for prefix breaks (recomputed tokens; prefill seconds from each replica's fitted "
             "prefill model; new conversations and compactions are not billed)",
             f"  {'tenant':<12} {'cause':<16} {'breaks':>6} {'recomputed':>11} {'prefill':>9} {'TTFT/break':>11}  priced"]
    rows = 0
    for t in hygiene.get("tenants", []):
        for cause, b in sorted((t.get("bill") or {}).items()):
            rows += 1
            seconds, added = b.get("seconds"), b.get("added_ttft_s")
            lines.append(f"  {t.get('tenant', '?'):<12} {cause:<16} {b.get('breaks', 0):>6} {b.get('tokens', 0):>11,} "
                         f"{'–' if seconds is None else f'{seconds:.3f} s':>9} {_ms(added):>11}  "
                         f"{b.get('timed', 0)} of {b.get('breaks', 0)}")
    if not rows:
        lines.append("  no break billed")
    return lines


def format_configured_cost(hygiene: dict[str, Any] | None, prefill_tps: float, cached_tps: float,
                           time_scale: float) -> list[str]:
    """What a break costs by the simulated replicas' own configuration, to hold the fitted models'
    bill against: a recomputed token is computed at `prefill_tps` instead of read at `cached_tps`,
    in wall seconds at `time_scale` (the simulator's batching and chunking make a real step
    longer: this is the floor)."""
    per_token = (1.0 / prefill_tps - (1.0 / cached_tps if cached_tps > 0 else 0.0)) * time_scale
    lines = [f"  (the simulated replicas compute {prefill_tps:,.0f} prompt tokens/s and read cached ones at "
             f"{cached_tps:,.0f}/s, time scale {time_scale:g}: a recomputed token costs them "
             f"{1000 * per_token:.3f} ms)"]
    for t in (hygiene or {}).get("tenants", []):
        for cause, b in sorted((t.get("bill") or {}).items()):
            if b.get("breaks"):
                per_break = b.get("tokens", 0) / b["breaks"] * per_token
                lines.append(f"  by that configuration one {t.get('tenant', '?')} {cause} break costs "
                             f"{1000 * per_break:.0f} ms of prefill")
    return lines


async def _chat(client: httpx.AsyncClient, tenant: str, messages: list[dict[str, str]], max_tokens: int = 12) -> str:
    body = {"model": "sim", "messages": messages, "max_tokens": max_tokens, "stream": True}
    text = []
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-tenant-id": tenant}) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


async def run_workload(base_url: str, rounds: int = 6) -> int:
    """The multi-tenant workload; returns the number of requests sent."""
    sent = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        history: list[dict[str, str]] = [{"role": "system", "content": HELPDESK_SYSTEM}]
        for i in range(rounds):
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            clock_system = f"Current time: {now}\n{CLOCK_SYSTEM_TAIL}"
            question = QUESTIONS[i % len(QUESTIONS)]
            jobs = [
                _chat(client, "acme", [{"role": "system", "content": STABLE_SYSTEM},
                                       {"role": "user", "content": question}]),
                _chat(client, "globex", [{"role": "system", "content": clock_system},
                                         {"role": "user", "content": question}]),
                _chat(client, "initech", history + [{"role": "user", "content": question}]),
                _chat(client, "hooli", [{"role": "user", "content": f"Short question {i}: {question}"}]),
            ]
            if i % 3 == 0:  # a long document for a bigger bucket
                doc = " ".join(f"Clause {k} of contract {i}: the party shall deliver item {k}." for k in range(900))
                jobs.append(_chat(client, "umbrella", [{"role": "user", "content": doc + "\nSummarise."}]))
            results = await asyncio.gather(*jobs)
            sent += len(jobs)
            history += [{"role": "user", "content": question}, {"role": "assistant", "content": results[2]}]
    return sent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="proxy port (default: a free port)")
    parser.add_argument("--rounds", type=int, default=10, help="workload rounds (4-5 requests each)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="simulator time scale (0 = no simulated delays)")
    parser.add_argument("--once", action="store_true", help="exit after the report (for tests and CI)")


def run(args: argparse.Namespace) -> int:
    from app.server import create_app
    from app.sim.testing import SimCluster

    sim = SimCluster(replicas=2, time_scale=args.time_scale, decode_tps=200.0,
                     enable_per_request_metrics=True).start()
    proxy_server: ServerThread | None = None
    try:
        settings = Settings(backends=[{"url": u, "name": f"sim-{i}"} for i, u in enumerate(sim.urls)])
        app = create_app(settings)
        proxy_server = ServerThread(app, port=args.port or free_port()).start()
        url = proxy_server.url
        print(f"prefixgate demo: proxy {url} in front of {', '.join(sim.urls)}")
        started = time.perf_counter()
        sent = asyncio.run(run_workload(url, args.rounds))
        deadline = time.monotonic() + 10
        while app.openai.active and time.monotonic() < deadline:
            time.sleep(0.01)
        if app.services.prefix is not None:  # the last turns' continuity and diagnosis, off the loop
            assert proxy_server.loop is not None
            asyncio.run_coroutine_threadsafe(app.services.prefix.drain(), proxy_server.loop).result(30)
        print(f"workload: {sent} streamed requests from 5 tenants in {time.perf_counter() - started:.1f} s")
        metrics_text = httpx.get(url + "/metrics").text
        hygiene = _get_json(url + "/hygiene/tenants")
        print(format_report(ttft_by_bucket(metrics_text), hygiene, ledger_by_bucket(metrics_text)))
        if hygiene is not None and args.time_scale > 0:
            print("\n".join(format_configured_cost(hygiene, sim.options.prefill_tps, sim.options.cached_tps,
                                                    args.time_scale)))
        print("\nEndpoints:")
        for path, what in (("/v1/chat/completions", "OpenAI API (point your client here)"),
                           ("/metrics", "Prometheus metrics"), ("/hygiene/tenants", "per-tenant continuity"),
                           ("/ui", "the same, for people"), ("/readyz", "readiness")):
            print(f"  {url}{path:<24} {what}")
        for i, sim_url in enumerate(sim.urls):
            print(f"  {sim_url}/metrics{'':<10} simulated replica sim-{i} (vLLM-shaped)")
        if args.once:
            return 0
        print("\nUp until Ctrl-C.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("\nstopping")
        return 0
    finally:
        if proxy_server is not None:
            proxy_server.stop()
        sim.stop()


def _get_json(url: str) -> dict[str, Any] | None:
    try:
        resp = httpx.get(url, timeout=10)
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None
