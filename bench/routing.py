"""Routing benchmark (issue 5): one agent-style trace replayed against each router in front of the
same 4 simulated vLLM replicas with a finite KV pool, fresh replicas per target.

    .venv/bin/python bench/routing.py                      # all targets (~12 min on 2 cores)
    .venv/bin/python bench/routing.py --targets prefixgate:prefix_affinity,sglang-router:cache_aware

Targets: prefixgate with each policy (a `prefixgate serve` subprocess), sglang-router 0.3.2
(cache_aware, round_robin) and vllm-router 0.1.17 (cache_aware) from ROUTERS_VENV
(default .venv-routers: `pip install sglang-router==0.3.2 vllm-router==0.1.17`). The replicas run in
their own process (`SimCluster`), the load generator here, so no router shares a GIL with them.

Reported per target: engine-delivered hit ratio (replicas' own /metrics: delta hits / delta
queries), TTFT p50/p95 (client-side, first content chunk, real seconds) overall and by prompt
bucket, imbalance max/mean of requests and of prefill (uncached) tokens per replica, fleet busy
share (simulated engine time / wall time), and the upper bound: the reuse available with one
infinite cache over the same trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.serving import free_port, stop_process  # noqa: E402
from app.sim.tokens import load_tokenizer  # noqa: E402
from app.telemetry.metrics import prompt_bucket  # noqa: E402
from bench._common import (  # noqa: E402
    counters,
    launch,
    pct,
    prefixgate_command,
    print_commands,
    replay,
    sglang_router_command,
    wait_ready,
)
from bench.routing_trace import Tenant, TraceConfig, build_trace, upper_bound  # noqa: E402

ALL_TARGETS = ("prefixgate:prefix_affinity", "prefixgate:session", "prefixgate:least_load",
               "prefixgate:round_robin", "sglang-router:cache_aware", "sglang-router:round_robin",
               "vllm-router:cache_aware")
BUCKETS = ("1k-4k", "4k-16k", "16k-64k", "64k-128k")
MODEL = "sim"
OUTPUT_TOKENS = 24
REQUEST = {"model": MODEL, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}

_SIM_SERVER = """
import json, sys
from app.sim.testing import SimCluster
cluster = SimCluster(**json.loads(sys.argv[1])).start()
print(json.dumps(cluster.urls), flush=True)
sys.stdin.read()
cluster.stop()
"""


# ------------------------------------------------------------------ processes
def start_sims(args: argparse.Namespace) -> tuple[subprocess.Popen, list[str]]:
    options = {"replicas": args.replicas, "block_size": args.block_size, "kv_blocks": args.kv_blocks,
               "prefill_tps": args.prefill_tps, "decode_tps": args.decode_tps, "time_scale": args.time_scale,
               "max_batch_tokens": args.max_batch_tokens, "output_tokens": OUTPUT_TOKENS, "model": MODEL}
    proc = subprocess.Popen([sys.executable, "-c", _SIM_SERVER, json.dumps(options)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise RuntimeError("simulated replicas did not start")
    return proc, json.loads(line)


def start_target(target: str, urls: list[str], args: argparse.Namespace,
                 tmp: Path) -> tuple[subprocess.Popen, str, list[str]]:
    kind, policy = target.split(":", 1)
    port, prom = free_port(), free_port()
    if kind == "prefixgate":
        cfg = {"backends": [{"url": u, "name": f"r{i}"} for i, u in enumerate(urls)],
               "routing": {"policy": policy, "block_size": args.block_size, "kv_blocks": args.kv_blocks,
                           "health_interval_s": 2.0},
               "scrape": {"interval_s": 1.0}}
        cmd = prefixgate_command(cfg, tmp / f"{policy}.yaml", port)
    elif kind == "sglang-router":
        cmd = sglang_router_command(args.routers_venv, port, prom, urls, policy)
    elif kind == "vllm-router":
        cmd = [str(Path(args.routers_venv) / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--worker-urls", *urls,
               "--policy", policy, "--worker-startup-check-interval", "1"]
    else:
        raise ValueError(f"unknown target {target}")
    return launch(target, cmd, tmp), f"http://127.0.0.1:{port}", cmd


# ------------------------------------------------------------------ replicas' own numbers
async def replica_numbers(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    out = await counters(session, url)
    async with session.get(url + "/sim/state") as resp:
        out["clock"] = float((await resp.json())["virtual_clock_s"])
    return out


async def route_reasons(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """prefixgate's own decision counts by reason (prefixgate_route_decisions_total)."""
    out: dict[str, float] = {}
    async with session.get(base + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("prefixgate_route_decisions_total{"):
                m = re.search(r'reason="([^"]+)"', line)
                if m:
                    out[m.group(1)] = out.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def imbalance(values: list[float]) -> float:
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean else float("nan")


async def run_target(target: str, tenants: list[Tenant], args: argparse.Namespace, tmp: Path) -> dict:
    sims, urls = start_sims(args)
    proc = None
    try:
        proc, base, cmd = start_target(target, urls, args, tmp)
        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            await wait_ready(session, base, "/v1/chat/completions",
                             {"model": MODEL, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1})
            before = [await replica_numbers(session, u) for u in urls]
            results, wall = await replay(session, base, tenants, args.time_scale, REQUEST)
            after = [await replica_numbers(session, u) for u in urls]
            reasons = await route_reasons(session, base) if target.startswith("prefixgate:") else {}
    finally:
        if proc is not None:
            stop_process(proc)
        stop_process(sims)
    delta = [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]
    hits = sum(d.get("vllm:prefix_cache_hits_total", 0.0) for d in delta)
    queries = sum(d.get("vllm:prefix_cache_queries_total", 0.0) for d in delta)
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    by_bucket = {b: [r.ttft_s for r in ok if prompt_bucket(r.prompt_tokens) == b] for b in BUCKETS}
    if args.dump:
        with open(args.dump, "a") as f:
            for r in results:
                f.write(json.dumps({"target": target, **r.__dict__}) + "\n")
    return {
        "target": target, "command": shlex.join(cmd), "requests": len(results), "errors": len(results) - len(ok),
        "hit_ratio": hits / queries if queries else 0.0,
        "p50": pct([r.ttft_s for r in ok], 0.5), "p95": pct([r.ttft_s for r in ok], 0.95),
        "buckets": {b: (pct(v, 0.5), pct(v, 0.95), len(v)) for b, v in by_bucket.items()},
        "imb_requests": imbalance([d.get("vllm:request_success_total", 0.0) for d in delta]),
        "imb_prefill": imbalance([d.get("vllm:prefix_cache_queries_total", 0.0)
                                  - d.get("vllm:prefix_cache_hits_total", 0.0) for d in delta]),
        "reasons": reasons,
        "busy": statistics.fmean(d["clock"] * args.time_scale / wall for d in delta), "wall": wall,
    }


def print_table(rows: list[dict], bound_ratio: float, command: str) -> None:
    print(f"\n$ {command}")
    print(f"upper bound (one infinite cache): reusable share of prompt tokens = {bound_ratio:.3f}\n")
    head = ("| target | req | err | hit ratio | hit/bound | TTFT p50 s | TTFT p95 s | "
            + " | ".join(f"p50/p95 {b}" for b in BUCKETS) + " | imb req | imb prefill | busy |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        buckets = " | ".join(f"{p50:.2f}/{p95:.2f} (n={n})" if n else "-" for p50, p95, n in r["buckets"].values())
        print(f"| {r['target']} | {r['requests']} | {r['errors']} | {r['hit_ratio']:.3f} | "
              f"{r['hit_ratio'] / bound_ratio if bound_ratio else 0:.2f} | {r['p50']:.3f} | {r['p95']:.3f} | "
              f"{buckets} | {r['imb_requests']:.2f} | {r['imb_prefill']:.2f} | {r['busy']:.2f} |")
    ref = next((r for r in rows if r["target"] == "sglang-router:cache_aware"), None)
    ours = next((r for r in rows if r["target"] == "prefixgate:prefix_affinity"), None)
    if ref and ours:
        print(f"\nprefix_affinity vs sglang-router cache_aware: p95 TTFT {ours['p95'] / ref['p95'] - 1:+.0%}, "
              f"hit ratio {ours['hit_ratio']:.3f} vs {ref['hit_ratio']:.3f}")
    print("\nprefixgate route decisions by reason (includes the readiness probe):")
    for r in rows:
        if r["reasons"]:
            print(f"  {r['target']}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["reasons"].items())))
    print_commands(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=",".join(ALL_TARGETS))
    p.add_argument("--tenants", type=int, default=48)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=12000, help="per replica (x block size = KV tokens)")
    p.add_argument("--prefill-tps", type=float, default=4000.0)
    p.add_argument("--decode-tps", type=float, default=60.0)
    p.add_argument("--max-batch-tokens", type=int, default=2048)
    p.add_argument("--time-scale", type=float, default=0.5, help="real seconds per simulated second")
    p.add_argument("--session-rate", type=float, default=0.5, help="session starts per simulated second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dump", default=None, metavar="JSONL", help="append per-request results here")
    p.add_argument("--routers-venv", default=os.environ.get("ROUTERS_VENV", str(ROOT / ".venv-routers")))
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = TraceConfig(tenants=args.tenants, session_rate_per_s=args.session_rate, seed=args.seed)
    tenants = build_trace(cfg)
    bound = upper_bound(tenants, load_tokenizer(None), args.block_size)
    print(f"trace: {len(tenants)} tenants, {sum(len(t.users) for t in tenants)} requests, "
          f"{bound.prompt_tokens} prompt tokens, static prefixes "
          f"{min(t.static_tokens for t in tenants)}-{max(t.static_tokens for t in tenants)} tokens", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmpdir:
        for target in args.targets.split(","):
            row = await run_target(target.strip(), tenants, args, Path(tmpdir))
            print(f"  {row['target']}: hit {row['hit_ratio']:.3f}, p95 {row['p95']:.3f}s, "
                  f"imb {row['imb_requests']:.2f}/{row['imb_prefill']:.2f}, busy {row['busy']:.2f}, "
                  f"errors {row['errors']}, {row['wall']:.0f}s", flush=True)
            rows.append(row)
    command = "python bench/routing.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print_table(rows, bound.ratio, command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
