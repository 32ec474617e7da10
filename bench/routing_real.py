"""Routing on real engines (issue 11): the same agent-style trace through prefixgate and peer routers
in front of two real vLLM 0.32 CPU replicas serving the tiny random Llama (tests/e2e/tiny_model.py).

    .venv/bin/python bench/routing_real.py            # ~4 min on 2 cores, after the 30-60 s start-up
    .venv/bin/python bench/routing_real.py --targets prefixgate:prefix_affinity,prefixgate:round_robin

Needs .venv-vllm (`make e2e` creates it) and, for sglang-router, ROUTERS_VENV (default
.venv-routers: `pip install sglang-router==0.3.2`). The two replicas start once (block 32, one core
each, dev mode) and their prefix caches are emptied between targets (POST /reset_prefix_cache), so
every target starts cold on the same engines. The trace is bench/routing_trace.py's generator with
prefixes sized for `--max-model-len 4096`.

Reported per target, from each replica's *own* /metrics (Δ over the run): hits/queries per replica
and overall, requests per replica; client-side TTFT p50/p95 (first content chunk). Optional
`--kv-blocks N` caps each replica's KV cache (`--num-gpu-blocks-override`) to add eviction pressure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.serving import free_port, stop_process  # noqa: E402
from app.sim.tokens import load_tokenizer  # noqa: E402
from bench._common import (  # noqa: E402
    COUNTERS,
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
from tests.e2e.vllm_server import (  # noqa: E402
    SERVED_MODEL,
    ReplicaSpec,
    VllmReplica,
    build_tiny_model,
    missing_reason,
    start_replicas,
    stop_all,
)

ALL_TARGETS = ("prefixgate:prefix_affinity", "sglang-router:cache_aware", "prefixgate:round_robin",
               "sglang-router:round_robin")
OUTPUT_TOKENS = 16
BLOCK_SIZE = 32
REQUEST = {"model": SERVED_MODEL, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0}


def trace_config(args: argparse.Namespace) -> TraceConfig:
    """The issue-5 trace shape, scaled to 4k-token contexts (prefix + turns stay under 4096)."""
    return TraceConfig(tenants=args.tenants, min_turns=3, max_turns=5, prefix_median_tokens=1200,
                       prefix_sigma=0.5, prefix_min_tokens=500, prefix_max_tokens=2200, shared_prompts=2,
                       shared_share=0.5, shared_tokens=400, user_tokens=(40, 160), reply_tokens=(20, 60),
                       think_mean_s=1.0, session_rate_per_s=args.session_rate, seed=args.seed)


# ------------------------------------------------------------------ targets
def start_target(target: str, replicas: list[VllmReplica], model_dir: Path, args: argparse.Namespace,
                 tmp: Path) -> tuple[subprocess.Popen, str, list[str]]:
    kind, policy = target.split(":", 1)
    port, prom = free_port(), free_port()
    urls = [r.url for r in replicas]
    if kind == "prefixgate":
        cfg = {"backends": [{"url": r.url, "name": r.name} for r in replicas], "tokenizer": str(model_dir),
               "routing": {"policy": policy, "health_interval_s": 2.0}, "scrape": {"interval_s": 1.0}}
        cmd = prefixgate_command(cfg, tmp / f"{policy}.yaml", port)
    elif kind == "sglang-router":
        cmd = sglang_router_command(args.routers_venv, port, prom, urls, policy)
    else:
        raise ValueError(f"unknown target {target}")
    return launch(target, cmd, tmp), f"http://127.0.0.1:{port}", cmd


async def proxy_overhead(session: aiohttp.ClientSession, base: str) -> tuple[float, float] | None:
    """prefixgate's own arrival -> upstream-sent histogram: (p50, p95) upper bucket bounds, seconds."""
    buckets: list[tuple[float, float]] = []
    async with session.get(base + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("prefixgate_proxy_overhead_seconds_bucket{"):
                le = re.search(r'le="([^"]+)"', line)
                if le:
                    buckets.append((float(le.group(1)), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    buckets.sort()
    total = buckets[-1][1]
    return tuple(next(b for b, c in buckets if c >= q * total) for q in (0.5, 0.95))  # type: ignore[return-value]


async def run_target(target: str, tenants: list[Tenant], replicas: list[VllmReplica], model_dir: Path,
                     args: argparse.Namespace, tmp: Path) -> dict:
    for replica in replicas:
        replica.reset_prefix_cache()
    proc, base, cmd = start_target(target, replicas, model_dir, args, tmp)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=600)) as session:
            await wait_ready(session, base, "/v1/completions", {"model": SERVED_MODEL, "prompt": "ready", "max_tokens": 1})
            before = [await counters(session, r.url) for r in replicas]
            results, wall = await replay(session, base, tenants, args.time_scale, REQUEST)
            after = [await counters(session, r.url) for r in replicas]
            overhead = await proxy_overhead(session, base) if target.startswith("prefixgate:") else None
    finally:
        stop_process(proc)
    delta = [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in COUNTERS} for a, b in zip(after, before, strict=True)]
    per_replica = []
    for replica, d in zip(replicas, delta, strict=True):
        q, h = d["vllm:prefix_cache_queries_total"], d["vllm:prefix_cache_hits_total"]
        per_replica.append((replica.name, h / q if q else 0.0, int(d["vllm:request_success_total"])))
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    return {"target": target, "command": shlex.join(cmd), "requests": len(results), "errors": len(results) - len(ok),
            "hit_ratio": hits / queries if queries else 0.0, "per_replica": per_replica,
            "p50": pct([r.ttft_s for r in ok], 0.5), "p95": pct([r.ttft_s for r in ok], 0.95),
            "usage_ratio": (sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok))),
            "overhead": overhead, "wall": wall}


def print_table(rows: list[dict], bound: float, command: str, replicas: list[VllmReplica]) -> None:
    print(f"\n$ {command}")
    print(f"engines: {len(replicas)} x real vLLM 0.32 (CPU, tiny random Llama, block {BLOCK_SIZE}); "
          f"upper bound (one infinite cache) = {bound:.3f}\n")
    names = [r.name for r in replicas]
    head = ("| target | req | err | hits/queries (all) | "
            + " | ".join(f"{n} hits/queries (req)" for n in names) + " | TTFT p50 ms | TTFT p95 ms | proxy overhead p50/p95 ms |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        reps = " | ".join(f"{ratio:.3f} ({n})" for _, ratio, n in r["per_replica"])
        over = "≤{:g}/≤{:g}".format(*(1000 * x for x in r["overhead"])) if r["overhead"] else "-"
        print(f"| {r['target']} | {r['requests']} | {r['errors']} | {r['hit_ratio']:.3f} | {reps} | "
              f"{1000 * r['p50']:.1f} | {1000 * r['p95']:.1f} | {over} |")
    print("\nproxy overhead = prefixgate_proxy_overhead_seconds (arrival -> upstream request sent), bucket bounds")
    print_commands(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=",".join(ALL_TARGETS))
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--session-rate", type=float, default=1.0, help="session starts per trace second")
    p.add_argument("--time-scale", type=float, default=1.0, help="real seconds per trace second")
    p.add_argument("--kv-blocks", type=int, default=None, help="cap each replica's KV blocks (eviction pressure)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", default=None, help="prebuilt tiny model (default: build into a temp dir)")
    p.add_argument("--routers-venv", default=os.environ.get("ROUTERS_VENV", str(ROOT / ".venv-routers")))
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = missing_reason()
    if reason:
        print(reason)
        return 0
    tenants = build_trace(trace_config(args))
    bound = upper_bound(tenants, load_tokenizer(None), BLOCK_SIZE)
    print(f"trace: {len(tenants)} tenants, {sum(len(t.users) for t in tenants)} requests, "
          f"{bound.prompt_tokens} prompt tokens", flush=True)
    extra = ["--num-gpu-blocks-override", str(args.kv_blocks)] if args.kv_blocks else []
    specs = [ReplicaSpec(f"vllm-{i}", block_size=BLOCK_SIZE, cpu=str(i % 2), extra_args=extra) for i in range(2)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-routing-real-") as tmpdir:
        tmp = Path(tmpdir)
        model_dir = build_tiny_model(Path(args.model_dir) if args.model_dir else tmp / "model")
        replicas = start_replicas(specs, model_dir, tmp / "logs")
        try:
            for target in args.targets.split(","):
                row = await run_target(target.strip(), tenants, replicas, model_dir, args, tmp)
                print(f"  {row['target']}: hit {row['hit_ratio']:.3f}, p50 {1000 * row['p50']:.1f} ms, "
                      f"p95 {1000 * row['p95']:.1f} ms, errors {row['errors']}, {row['wall']:.0f}s", flush=True)
                rows.append(row)
        finally:
            stop_all(replicas)
    command = "python bench/routing_real.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print_table(rows, bound.ratio, command.strip(), replicas)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
