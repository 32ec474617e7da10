"""Admission / long-lane benchmark (issue 17): the seeds' mix on 4 simulated vLLM replicas with a
2048-token chunked-prefill budget, one fresh fleet and gateway per cell, the same trace per row.

    .venv/bin/python bench/admission.py                 # the table + noisy neighbour (< 5 min)
    .venv/bin/python bench/admission.py --loads 0.7 --n 120

Trace: 80% 2k-token and 20% 16k-token prompts, mostly cold (a quarter of the short ones open with
one of four shared 1k-token system prompts), Poisson arrivals at a share of the fleet's prefill
capacity (4 x prefill_tps tokens/s over the mean uncached prompt). The simulator runs at
`--time-scale` (all its costs scaled by the same factor, so ratios hold); the TTFTs printed are
divided back by it, i.e. simulated seconds (the gateway's own overhead is magnified the same way).

Rows: prefixgate round_robin, prefix_affinity, the self-tuning rows (`routing.lanes: {}`: threshold
and long share derived from the recent requests, nothing from the trace; the second also sets the
queue's room to the engine's step budget), prefix_affinity + long lane (shared fleet, hand-tuned
to this trace: threshold between its two sizes, max_share from its mix), + admission (that lane +
queue at one step), the dedicated lane as an extra row, and
sglang-router 0.3.2 / vllm-router 0.1.17 `cache_aware`, started from ROUTERS_VENV (default
.venv-routers) by bench/routing.py's `start_target`, on the same simulated fleet and trace (skipped
when that venv is missing). The "queued" column is read from the gateway's own
prefixgate_admission_wait_seconds: how many requests waited in its queue, and their mean wait
(simulated seconds); "gateway's own ms/request" from prefixgate_proxy_overhead_seconds minus that
wait: its mean time from arrival to sending upstream, in real milliseconds (a Rust router's is not
measured).
Noisy neighbour: three tenants of 2k agent prompts at 35% load plus one tenant sending cold 32k
prompts, at its usual rate and then bursting 10x; the three tenants' p95 TTFT with prefix_affinity
alone and with fairness (lane + the noisy tenant's prompt_tokens_per_min limit + queue).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.serving import free_port, stop_process  # noqa: E402
from bench._common import Result, counters, launch, one_request, pct, prefixgate_command, wait_ready  # noqa: E402
from bench.routing import start_sims, start_target  # noqa: E402
from bench.routing_trace import Tenant, _text  # noqa: E402

MODEL = "sim"
SHORT, LONG, HUGE, SHARED = 2000, 16000, 32000, 1000
REQUEST = {"model": MODEL, "max_tokens": 8, "ignore_eos": True}
# max_share 0.75: three of four replicas may hold a long prefill at once. The long requests carry
# ~67% of this mix's prefill tokens; with 0.5 the replicas they may use run at 0.7 x 0.67 / 0.5 =
# 0.94 utilisation at 70% load, and their backlog grows with the trace's length (README)
LANE = {"long_prefill_tokens": 8192, "max_share": 0.75}
# saturated: more than one prefill chunk (the step budget) routed there and not yet past its first
# token. A request leaves the gateway queue only for a replica that will start it within about a
# step (late binding), cheapest prefill first; one chunk rather than 0 so that the replica has its
# next request before the current one's prefill ends (the handoff costs a gateway round trip)
QUEUE = {"queue": {"max_depth": 512, "ttl_s": 60.0}, "saturated_prefill_tokens": 2048}
# the routing weights in prompt tokens (app/config.py RoutingWeights defaults), scaled with the
# prompts by --token-scale so the scaled fleet routes as the full-size one would
WEIGHTS = {"waiting_request_tokens": 2048.0, "decode_tokens_per_running": 256.0, "cold_slack_tokens": 2048.0}

# The self-tuning rows know nothing of the trace: `lanes: {}` is threshold and long share `auto`
# (derived from the recent requests' predicted prefill, app/routing/lanes.py) and the gateway
# queue keeps its defaults (max_depth 256, ttl_s 10). The second also sets the queue's room to the
# engine's own step budget (max_num_batched_tokens, an engine flag the operator set, not a
# property of the trace)
AUTO = "+ auto lanes (defaults only)"
AUTO_STEP = "+ auto lanes + queue at the engine step"


def auto_lanes() -> dict[str, Any]:
    """`{}` at full size; under --token-scale the engine-step floor of `auto` scales with the step."""
    return {} if ENGINE_STEP[0] == 2048 else {"min_long_prefill_tokens": ENGINE_STEP[0]}


def rows_config() -> dict[str, dict[str, Any]]:
    return {
        "round_robin": {"routing": {"policy": "round_robin"}},
        "prefix_affinity": {"routing": {"policy": "prefix_affinity"}},
        AUTO: {"routing": {"policy": "prefix_affinity", "lanes": auto_lanes()}},
        AUTO_STEP: {"routing": {"policy": "prefix_affinity", "lanes": auto_lanes()},
                    "admission": {"saturated_prefill_tokens": ENGINE_STEP[0]}},
        f"+ long lane (max_share {LANE['max_share']:g})": {"routing": {"policy": "prefix_affinity", "lanes": LANE}},
        "+ admission (lane + queue)": {"routing": {"policy": "prefix_affinity", "lanes": LANE}, "admission": QUEUE},
        "dedicated lane r3 (extra)": {"routing": {"policy": "prefix_affinity",
                                                  "lanes": {**LANE, "replicas": ["r3"]}}},
        **{label: {"target": target} for label, target in ROUTER_ROWS.items()},
    }


# the Rust routers, launched from ROUTERS_VENV exactly as bench/routing.py launches them
ROUTER_ROWS = {"sglang-router 0.3.2 cache_aware": "sglang-router:cache_aware",
               "vllm-router 0.1.17 cache_aware": "vllm-router:cache_aware"}


def apply_token_scale(args: argparse.Namespace) -> None:
    """Every token count (prompts, lane threshold, step budget, prefill rate) times the same factor:
    step counts and seconds per request stay the same, the CPU spent on text shrinks."""
    global SHORT, LONG, HUGE, SHARED
    QUEUE["saturated_prefill_tokens"] = args.saturated_prefill_tokens
    LANE["max_share"] = args.max_share
    s = args.token_scale
    SHORT, LONG, HUGE, SHARED = int(SHORT * s), int(LONG * s), int(HUGE * s), int(SHARED * s)
    LANE["long_prefill_tokens"] = int(LANE["long_prefill_tokens"] * s)
    for name in WEIGHTS:
        WEIGHTS[name] *= s
    QUEUE["saturated_prefill_tokens"] = int(QUEUE["saturated_prefill_tokens"] * s)
    args.prefill_tps *= s
    args.max_batch_tokens = int(args.max_batch_tokens * s)
    ENGINE_STEP[0] = args.max_batch_tokens


ROWS: dict[str, dict[str, Any]] = {}
ENGINE_STEP = [2048]  # the simulated engine's max_num_batched_tokens, after --token-scale


def build_trace(rng: random.Random, n: int, rate: float, tenants: list[str], long_share: float = 0.2,
                long_tokens: int | None = None, start: float = 0.0) -> list[Tenant]:
    """`n` one-turn requests with Poisson arrivals at `rate`/s (simulated seconds)."""
    long_tokens = long_tokens or LONG
    shared = [_text(random.Random(1000 + i), SHARED) for i in range(4)]
    out, t = [], start
    for i in range(n):
        t += rng.expovariate(rate)
        long = rng.random() < long_share
        if long:
            system = _text(rng, long_tokens)
        elif rng.random() < 0.25:
            system = rng.choice(shared) + " " + _text(rng, SHORT - SHARED)
        else:
            system = _text(rng, SHORT)
        name = rng.choice(tenants)
        out.append(Tenant(name=name, start_s=t, system=system, static_tokens=long_tokens if long else SHORT,
                          users=[f"question {i}: " + _text(rng, 30)], replies=[], think_s=[0.0]))
    return out


async def fire(session: aiohttp.ClientSession, base: str, trace: list[Tenant], scale: float) -> tuple[list, float]:
    t0 = time.perf_counter()

    async def one(req: Tenant) -> tuple[Tenant, Result]:
        await asyncio.sleep(max(0.0, t0 + req.start_s * scale - time.perf_counter()))
        return req, await one_request(session, base, req, 0, REQUEST)

    results = await asyncio.gather(*(one(r) for r in trace))
    return results, time.perf_counter() - t0


async def run_cell(config: dict[str, Any], trace: list[Tenant], args: argparse.Namespace, tmp: Path) -> dict:
    sims, urls = start_sims(args)
    proc, queue = None, None
    try:
        if "target" in config:  # a Rust router
            proc, base, _ = start_target(config["target"], urls, args, tmp)
        else:
            port = free_port()
            cfg = {"backends": [{"url": u, "name": f"r{i}"} for i, u in enumerate(urls)],
                   "scrape": {"interval_s": 1.0}, **config}
            cfg["routing"] = {"block_size": args.block_size, "kv_blocks": args.kv_blocks,
                              "health_interval_s": 2.0, "weights": dict(WEIGHTS), **config.get("routing", {})}
            proc = launch("prefixgate", prefixgate_command(cfg, tmp / "gw.yaml", port), tmp)
            base = f"http://127.0.0.1:{port}"
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as session:
            await wait_ready(session, base, "/v1/chat/completions",
                             {"model": MODEL, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1})
            results, wall = await fire(session, base, trace, args.time_scale)
            queue = None if "target" in config else await queue_numbers(session, base)
    finally:
        if proc is not None:
            stop_process(proc)
        stop_process(sims)
    out = summarize(results, wall, args.time_scale)
    if queue is not None and queue[0]:
        out["queued"] = (int(queue[0]), queue[1] / queue[0] / args.time_scale)
    if queue is not None and queue[2] is not None:
        out["own_ms"] = queue[2] * 1000
    return out


QUEUE_METRICS = ("prefixgate_admission_wait_seconds_count", "prefixgate_admission_wait_seconds_sum",
                 "prefixgate_proxy_overhead_seconds_count", "prefixgate_proxy_overhead_seconds_sum",
                 "prefixgate_admission_rejections_total")


async def queue_numbers(session: aiohttp.ClientSession, base: str) -> tuple[float, float, float | None]:
    """From the gateway's /metrics: requests that waited in its queue, their summed wait (s), and
    the gateway's own mean time per request before it sent it upstream, queue wait excluded
    (prefixgate_proxy_overhead_seconds over every route, real seconds; None when it counted nothing,
    or when the gateway refused some requests: a shed request's wait is in the wait histogram but it
    has no overhead sample, so the difference is no per-request figure)."""
    found = await counters(session, base, QUEUE_METRICS)
    wait_count, wait_sum, own_count, own_sum, refused = (found.get(name, 0.0) for name in QUEUE_METRICS)
    own = (own_sum - wait_sum) / own_count if own_count and not refused else None
    return wait_count, wait_sum, own


def summarize(results: list[tuple[Tenant, Result]], wall: float, scale: float) -> dict:
    ok = [(t, r) for t, r in results if r.ok and r.ttft_s is not None]

    def ttfts(pred) -> list[float]:
        return [r.ttft_s / scale for t, r in ok if pred(t)]

    short = ttfts(lambda t: t.static_tokens <= SHORT)
    long = ttfts(lambda t: t.static_tokens > SHORT)
    by_tenant = {name: ttfts(lambda t, n=name: t.name == n) for name in {t.name for t, _ in results}}
    return {"short": [pct(short, q) for q in (0.5, 0.95, 0.99)], "long": [pct(long, q) for q in (0.5, 0.95, 0.99)],
            "throughput": len(ok) / (wall / scale), "rejects": len(results) - len(ok), "n": len(results),
            "tenant_p95": {k: pct(v, 0.95) for k, v in by_tenant.items()}}


def fmt(v: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in v)


async def main(args: argparse.Namespace) -> None:
    apply_token_scale(args)
    started, load_before = time.perf_counter(), os.getloadavg()
    ROWS.update(rows_config())
    capacity_rps = args.replicas * args.prefill_tps / (0.8 * SHORT + 0.2 * LONG)
    rows = [r for r in ROWS if not args.rows or r in args.rows.split(",")]
    if not Path(args.routers_venv, "bin").is_dir():
        rows = [r for r in rows if "target" not in ROWS[r]]
    results: dict[tuple[str, float], dict] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for load in args.loads:
            trace = build_trace(random.Random(args.seed), args.n, load * capacity_rps, ["t0"])
            for row in rows:
                results[(row, load)] = await run_cell(ROWS[row], trace, args, tmp)
                r = results[(row, load)]
                print(f"  done {row} @ {load:.0%}: short {fmt(r['short'])} long {fmt(r['long'])}", flush=True)
        noisy = await noisy_neighbour(args, tmp, capacity_rps) if args.noisy else None
    print_table(results, rows, args)
    print(f"took {time.perf_counter() - started:.0f} s; load average (1/5/15 min) before "
          + "/".join(f"{x:.1f}" for x in load_before) + ", after " + "/".join(f"{x:.1f}" for x in os.getloadavg()))
    if args.routers_venv and not Path(args.routers_venv).exists():
        print(f"\nsglang-router / vllm-router cache_aware: skipped, {args.routers_venv} does not exist "
              "(pip install sglang-router==0.3.2 vllm-router==0.1.17 into it, as bench/routing.py says)")
    if noisy:
        print_noisy(noisy)


async def noisy_neighbour(args: argparse.Namespace, tmp: Path, capacity_rps: float) -> dict:
    normal = ["agent-a", "agent-b", "agent-c"]
    quiet_rate = 0.35 * args.replicas * args.prefill_tps / SHORT
    noisy_usual = 0.03 * args.replicas * args.prefill_tps / HUGE  # its usual rate: 3% of capacity

    def trace(burst: float) -> list[Tenant]:
        rng = random.Random(args.seed + 1)
        base = build_trace(rng, args.n, quiet_rate, normal, long_share=0.0)
        horizon = base[-1].start_s
        n_noisy = max(1, int(horizon * noisy_usual * burst))
        noisy = build_trace(random.Random(args.seed + 2), n_noisy, noisy_usual * burst, ["noisy"],
                            long_share=1.0, long_tokens=HUGE)
        return sorted(base + noisy, key=lambda t: t.start_s)

    fair = {"routing": {"policy": "prefix_affinity", "lanes": LANE}, "admission": QUEUE,
            "tenants": {"overrides": {"noisy": {"limits": {
                "prompt_tokens_per_min": int(0.25 * args.replicas * args.prefill_tps * 60)}}}}}
    plain = {"routing": {"policy": "prefix_affinity"}}
    out = {}
    for label, burst, cfg in [("quiet fleet, prefix_affinity", 1.0, plain),
                              ("noisy 10x, prefix_affinity", 10.0, plain),
                              ("noisy 10x, fairness (lane + noisy tenant's token limit + queue)", 10.0, fair)]:
        out[label] = await run_cell(cfg, trace(burst), args, tmp)
        print(f"  done noisy: {label}", flush=True)
    return out


def print_table(results: dict, rows: list[str], args: argparse.Namespace) -> None:
    print(f"\n$ python bench/admission.py {shlex.join(sys.argv[1:])}")
    print(f"4 replicas x {args.prefill_tps:g} prefill tokens/s, max_batch_tokens {args.max_batch_tokens}, "
          f"prompts {SHORT}/{LONG} tokens (noisy {HUGE}), token_scale {args.token_scale}, "
          f"time_scale {args.time_scale}; {args.n} requests per cell; TTFT in simulated seconds\n")
    print("| load | row | short TTFT p50/p95/p99 s | long TTFT p50/p95/p99 s | throughput req/s | rejects "
          "| queued (mean wait s) | gateway's own ms/request |")
    print("|---|---|---|---|---|---|---|---|")
    for load in args.loads:
        for row in rows:
            r = results[(row, load)]
            queued = f"{r['queued'][0]} ({r['queued'][1]:.2f})" if "queued" in r else "-"
            own = f"{r['own_ms']:.1f}" if "own_ms" in r else "-"
            print(f"| {load:.0%} | {row} | {fmt(r['short'])} | {fmt(r['long'])} | {r['throughput']:.2f} | "
                  f"{r['rejects']}/{r['n']} | {queued} | {own} |")
    ours = [r for r in rows if r.startswith(("+", "dedicated"))]
    refs = [r for r in ("prefix_affinity", *ROUTER_ROWS) if r in rows]
    for load in args.loads:
        for row in ours:
            r = results[(row, load)]
            vs = [f"{results[(ref, load)]['short'][1] / r['short'][1]:.2f}x lower than {ref}" for ref in refs]
            if not vs:
                continue
            line = f"@{load:.0%} {row}: short p95 " + ", ".join(vs)
            if "prefix_affinity" in refs:
                line += f"; long p50 {r['long'][0] / results[('prefix_affinity', load)]['long'][0]:.2f}x prefix_affinity's"
            print(line)
    print("goals at 70%: short p95 >= 2x lower than prefix_affinity and >= 2.5x lower than both Rust routers' "
          "cache_aware; long p50 <= 1.5x prefix_affinity's")


def print_noisy(noisy: dict) -> None:
    print("\nnoisy neighbour: p95 TTFT (s) of the three normal tenants, and the noisy one")
    print("| case | agent-a | agent-b | agent-c | noisy | rejects |")
    print("|---|---|---|---|---|---|")
    quiet = None
    for label, r in noisy.items():
        p = r["tenant_p95"]
        print(f"| {label} | {p.get('agent-a', float('nan')):.2f} | {p.get('agent-b', float('nan')):.2f} | "
              f"{p.get('agent-c', float('nan')):.2f} | {p.get('noisy', float('nan')):.2f} | {r['rejects']} |")
        quiet = quiet or p
    for label, r in list(noisy.items())[1:]:
        ratios = [r["tenant_p95"][t] / quiet[t] for t in ("agent-a", "agent-b", "agent-c")]
        print(f"{label}: normal tenants' p95 / quiet p95 = " + ", ".join(f"{x:.2f}" for x in ratios)
              + " (goal <= 1.5)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.3, 0.5, 0.7, 0.85])
    p.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    p.add_argument("--n", type=int, default=60, help="requests per cell")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=12000)
    p.add_argument("--prefill-tps", type=float, default=8000.0)
    p.add_argument("--decode-tps", type=float, default=60.0)
    p.add_argument("--max-batch-tokens", type=int, default=2048)
    p.add_argument("--time-scale", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--token-scale", type=float, default=1.0,
                   help="scale every token count and the prefill rate alike (less CPU on a busy box)")
    p.add_argument("--max-share", type=float, default=LANE["max_share"], help="the lane rows' routing.lanes.max_share")
    p.add_argument("--saturated-prefill-tokens", type=int, default=QUEUE["saturated_prefill_tokens"],
                   help="the queue row's saturation backlog per replica, before --token-scale")
    p.add_argument("--no-noisy", dest="noisy", action="store_false")
    p.add_argument("--routers-venv", default=os.environ.get("ROUTERS_VENV", str(ROOT / ".venv-routers")))
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
