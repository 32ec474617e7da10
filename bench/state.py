"""Shared state cost: Redis vs in-memory, at concurrency 16.

    .venv/bin/python bench/state.py [--requests 800] [--skip-proxy] [--skip-store]

1. Store level: `residency_lookup` over 4 replicas (the one pre-forward round trip) for chains of
   64, 1024 and 16384 blocks: MemoryStore, ResilientStore on Redis (the Lua binary search), and
   the design it replaced on paper, ZMSCORE of every block per replica (pipelined), as a baseline.
2. Through the proxy: `prefixgate sim` (4 replicas, time_scale 0, so the engine adds ~nothing)
   and two `prefixgate serve` processes, prefix_affinity, one with `--state memory` and one with
   `--state redis://…`; multi-turn chats from 16 concurrent clients, client-side latency of
   non-streamed requests, the two proxies interleaved in rounds so machine noise hits both
   alike. The added latency is the difference of the percentiles.

Starts its own redis-server on a free loopback port and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from overhead import pct, start, stop, wait_ready  # noqa: E402  (bench/overhead.py)

from app.state.keys import pack_hashes  # noqa: E402
from app.state.memory import MemoryStore  # noqa: E402
from app.state.redis import RedisStore  # noqa: E402
from app.state.resilient import ResilientStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

CONCURRENCY = 16
REPLICAS = ["r0", "r1", "r2", "r3"]


async def timed_concurrently(call: Callable[[int], Awaitable[object]], n: int,
                             concurrency: int | None = None) -> list[float]:
    """Latency of n calls with `concurrency` in flight (default: --concurrency), in milliseconds."""
    concurrency = concurrency or CONCURRENCY
    out: list[float] = []
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            t0 = time.perf_counter()
            await call(i)
            out.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


# ---------------------------------------------------------------- 1. store level
async def zmscore_all(remote: RedisStore, hashes: list[int], replicas: list[str]) -> dict[str, int]:
    """Baseline: every block's score per replica, one pipeline; leading run counted client-side."""
    blob = pack_hashes(hashes)
    members = [blob[i:i + 8] for i in range(0, len(blob), 8)]
    pipe = remote.client.pipeline(transaction=False)
    for r in replicas:
        pipe.zmscore(remote.keys.residency(r), members)
    out = {}
    for r, scores in zip(replicas, await pipe.execute(), strict=True):
        n = 0
        for s in scores:
            if s is None:
                break
            n += 1
        out[r] = n
    return out


async def store_level_one(url: str, blocks: int, n: int) -> list[tuple[str, int, float, float]]:
    chains = [[(c << 40) | i for i in range(blocks)] for c in range(8)]
    memory = MemoryStore(capacity_blocks=200_000)
    remote = RedisStore(url, namespace=f"bench{blocks}", capacity_blocks=200_000)
    writer = ResilientStore(remote, MemoryStore(capacity_blocks=200_000), timeout_s=1.0)
    await writer.start()
    for i, c in enumerate(chains):  # replicas hold a third, two thirds or all of a chain
        await memory.residency_add(REPLICAS[i % 4], c[: blocks * (i % 3 + 1) // 3])
        await writer.residency_add(REPLICAS[i % 4], c[: blocks * (i % 3 + 1) // 3])
    await writer.flush()
    reader = ResilientStore(RedisStore(url, namespace=f"bench{blocks}"), MemoryStore(), timeout_s=1.0)
    await reader.start()  # an empty mirror: every answer comes from Redis
    calls = {
        "memory": lambda i: memory.residency_lookup(chains[i % 8], REPLICAS),
        "redis (Lua binary search)": lambda i: reader.residency_lookup(chains[i % 8], REPLICAS),
        "redis (ZMSCORE every block)": lambda i: zmscore_all(remote, chains[i % 8], REPLICAS),
    }
    want = await memory.residency_lookup(chains[1], REPLICAS)
    assert await reader.residency_lookup(chains[1], REPLICAS) == want
    assert await zmscore_all(remote, chains[1], REPLICAS) == want
    if blocks > 4096:  # ~3 s a call at 16k blocks: it times the test machine out, not the design
        del calls["redis (ZMSCORE every block)"]
    rows = []
    for name, call in calls.items():
        k = n
        await timed_concurrently(call, 2 * CONCURRENCY)  # warm: one connection per worker
        ms = await timed_concurrently(call, k)
        rows.append((name, blocks, pct(ms, 0.5), pct(ms, 0.99)))
    await remote.client.delete(*[remote.keys.residency(r) for r in REPLICAS])
    await reader.close()
    await writer.close()
    return rows


async def store_level(url: str, n: int) -> list[tuple[str, int, float, float]]:
    return [row for blocks in (64, 1024, 16384) for row in await store_level_one(url, blocks, n)]


# ---------------------------------------------------------------- 2. through the proxy
def chat_turns(n: int, seed: int) -> list[dict]:
    """n chat requests from 64 conversations over 8 shared system prompts (a turn grows its
    conversation, so consecutive turns share their prefix)."""
    rng = random.Random(seed)
    systems = [f"You are assistant #{i}. " + "Follow the house style guide carefully. " * 40 for i in range(8)]
    convs = [[{"role": "system", "content": systems[c % 8]}] for c in range(64)]
    out = []
    for _ in range(n):
        conv = convs[rng.randrange(64)]
        conv.append({"role": "user", "content": f"question {len(conv)}: " + "details " * rng.randint(5, 60)})
        out.append({"model": "sim", "messages": list(conv), "max_tokens": 4})
        conv.append({"role": "assistant", "content": "ok " * 4})
    return out


def free_port_run(n: int) -> int:
    """A base port with n free consecutive ports (the simulator takes BASE..BASE+n-1)."""
    import socket

    from app.serving import free_port

    for _ in range(50):
        base = free_port()
        try:
            for i in range(n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


async def drive(url: str, bodies: list[dict]) -> tuple[list[float], int]:
    import aiohttp

    failures = 0
    async with aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> None:
            nonlocal failures
            async with session.post("/v1/chat/completions", json=bodies[i % len(bodies)]) as r:
                await r.read()
                failures += r.status != 200

        await timed_concurrently(one, 2 * CONCURRENCY)  # warm connections
        return await timed_concurrently(one, len(bodies)), failures


def proxy_figures(url: str) -> tuple[float, int]:
    """Mean proxy overhead (arrival -> upstream sent, ms) and state fallbacks, from /metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    fallbacks = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name.startswith("prefixgate_proxy_overhead_seconds_"):
                values[sample.name.rsplit("_", 1)[1]] = sample.value
            elif sample.name == "prefixgate_state_fallbacks_total":
                fallbacks += sample.value
    mean = values.get("sum", 0.0) / values["count"] * 1000 if values.get("count") else float("nan")
    return mean, int(fallbacks)


def proxy_level(url: str, n: int, rounds: int) -> list[tuple[str, float, float, int, float, int]]:
    """Simulator and two proxies as their own processes (`prefixgate sim`, `prefixgate serve`);
    this process only drives the load."""
    from app.serving import free_port

    py = sys.executable
    base = free_port_run(4)
    procs = [start([py, "-m", "app", "sim", "--replicas", "4", "--port", str(base), "--time-scale", "0"])]
    backends = [a for i in range(4) for a in ("--backend", f"http://127.0.0.1:{base + i}")]
    proxies = {}
    try:
        for i in range(4):
            wait_ready(f"http://127.0.0.1:{base + i}/health")
        for state in ("memory", url):
            port = free_port()
            procs.append(start([py, "-m", "app", "serve", *backends, "--port", str(port), "--host", "127.0.0.1",
                                "--state", state, "--policy", "prefix_affinity", "--log-level", "warning"]))
            proxies["memory" if state == "memory" else "redis"] = f"http://127.0.0.1:{port}"
        for proxy_url in proxies.values():
            wait_ready(proxy_url + "/readyz")
        lat: dict[str, list[float]] = {s: [] for s in proxies}
        failures = dict.fromkeys(proxies, 0)
        for rnd in range(rounds):
            order = list(proxies) if rnd % 2 == 0 else list(reversed(list(proxies)))
            for name in order:
                ms, failed = asyncio.run(drive(proxies[name], chat_turns(n // rounds, seed=rnd)))
                lat[name] += ms
                failures[name] += failed
        return [(s, pct(v, 0.5), pct(v, 0.99), failures[s], *proxy_figures(proxies[s])) for s, v in lat.items()]
    finally:
        for proc in reversed(procs):
            stop(proc)


def main(argv: list[str] | None = None) -> int:
    global CONCURRENCY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800, help="per state, through the proxy")
    parser.add_argument("--lookups", type=int, default=2000, help="per store and chain length")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--skip-store", action="store_true")
    parser.add_argument("--skip-proxy", action="store_true")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    CONCURRENCY = args.concurrency
    cmd = "python bench/state.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with RedisServer() as server:
        if not args.skip_store:
            rows = asyncio.run(store_level(server.url, args.lookups))
            print(f"\n## residency_lookup, 4 replicas, concurrency {CONCURRENCY}  (`{cmd}`)\n")
            print("| store | chain blocks | p50 ms | p99 ms |")
            print("|---|---:|---:|---:|")
            for name, blocks, p50, p99 in rows:
                print(f"| {name} | {blocks} | {p50:.3f} | {p99:.3f} |")
        if not args.skip_proxy:
            rows2 = proxy_level(server.url, args.requests, args.rounds)
            print(f"\n## through the proxy: chat requests, concurrency {CONCURRENCY}, 4 sim replicas "
                  f"(time_scale 0), prefix_affinity  (`{cmd}`)\n")
            print("| state | p50 ms | p99 ms | failed | mean proxy overhead ms | state fallbacks |")
            print("|---|---:|---:|---:|---:|---:|")
            for name, p50, p99, failed, overhead, fallbacks in rows2:
                print(f"| {name} | {p50:.2f} | {p99:.2f} | {failed} | {overhead:.3f} | {fallbacks} |")
            base = {row[0]: (row[1], row[2]) for row in rows2}
            d50 = base["redis"][0] - base["memory"][0]
            d99 = base["redis"][1] - base["memory"][1]
            print(f"\nadded by Redis state: p50 {d50:+.2f} ms, p99 {d99:+.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
