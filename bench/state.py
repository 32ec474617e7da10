"""Shared state cost: Redis vs in-memory, at concurrency 16.

    .venv/bin/python bench/state.py [--requests 800] [--skip-proxy] [--skip-store]

1. Store level: `residency_lookup` over 4 replicas (the one pre-forward round trip) for chains of
   64, 1024 and 16384 blocks: MemoryStore, ResilientStore on Redis (the Lua binary search), and
   the design it replaced on paper, ZMSCORE of every block per replica (pipelined), as a baseline.
2. Through the proxy: simulated replicas (time_scale 0, so the engine adds ~nothing), prefix
   affinity routing, multi-turn chats from 16 concurrent clients; client-side latency of
   non-streamed requests with `--state memory` vs `--state redis://…`, interleaved in rounds so
   machine noise hits both alike. The added latency is the difference of the percentiles.

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

from app.state.keys import pack_hashes  # noqa: E402
from app.state.memory import MemoryStore  # noqa: E402
from app.state.redis import RedisStore  # noqa: E402
from app.state.resilient import ResilientStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

CONCURRENCY = 16
REPLICAS = ["r0", "r1", "r2", "r3"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed_concurrently(call: Callable[[int], Awaitable[object]], n: int,
                             concurrency: int = CONCURRENCY) -> list[float]:
    """Latency of n calls with `concurrency` in flight, in milliseconds."""
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
    rows = []
    for name, call in calls.items():
        k = n if blocks < 16384 or "ZMSCORE" not in name else max(32, n // 8)
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


def proxy_level(url: str, n: int, rounds: int) -> list[tuple[str, float, float, int]]:
    import httpx

    from app.config import Settings
    from app.server import create_app
    from app.serving import ServerThread
    from app.sim.testing import SimCluster

    sim = SimCluster(replicas=4, time_scale=0.0).start()
    servers = {}
    try:
        for state in ("memory", url):
            settings = Settings(backends=[{"url": u, "name": f"r{i}"} for i, u in enumerate(sim.urls)],
                                state=state, routing={"policy": "prefix_affinity"})
            servers[state] = ServerThread(create_app(settings)).start()
        lat: dict[str, list[float]] = {s: [] for s in servers}
        failures = dict.fromkeys(servers, 0)
        for rnd in range(rounds):
            order = list(servers) if rnd % 2 == 0 else list(reversed(list(servers)))
            for state in order:
                bodies = chat_turns(n // rounds, seed=rnd)

                async def drive(state: str = state, bodies: list[dict] = bodies) -> list[float]:
                    async with httpx.AsyncClient(base_url=servers[state].url, timeout=30,
                                                 limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
                        async def one(i: int) -> None:
                            r = await client.post("/v1/chat/completions", json=bodies[i])
                            if r.status_code != 200:
                                failures[state] += 1
                        await timed_concurrently(one, 16)  # warm connections
                        return await timed_concurrently(one, len(bodies))

                lat[state] += asyncio.run(drive())
        return [("memory" if s == "memory" else "redis", pct(v, 0.5), pct(v, 0.99), failures[s])
                for s, v in lat.items()]
    finally:
        for server in servers.values():
            server.stop()
        sim.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800, help="per state, through the proxy")
    parser.add_argument("--lookups", type=int, default=2000, help="per store and chain length")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--skip-store", action="store_true")
    parser.add_argument("--skip-proxy", action="store_true")
    args = parser.parse_args()
    cmd = "python bench/state.py " + " ".join(sys.argv[1:])
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
            print("| state | p50 ms | p99 ms | failed |")
            print("|---|---:|---:|---:|")
            for name, p50, p99, failed in rows2:
                print(f"| {name} | {p50:.2f} | {p99:.2f} | {failed} |")
            base = {name: (p50, p99) for name, p50, p99, _ in rows2}
            d50 = base["redis"][0] - base["memory"][0]
            d99 = base["redis"][1] - base["memory"][1]
            print(f"\nadded by Redis state: p50 {d50:+.2f} ms, p99 {d99:+.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
