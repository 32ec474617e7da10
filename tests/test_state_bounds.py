"""Redis memory stays bounded: over a long random run every key has a TTL, sizes stay under the
configured bounds (residency capacity, history length, tenant count), and the bytes stop growing
once the bounds are reached (DBSIZE-style key counts and MEMORY USAGE per key)."""

from __future__ import annotations

import random

import redis.asyncio as aioredis

from app.state.keys import KeySpace
from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.state.resilient import ResilientStore
from tests.redis_server import RedisServer

REPLICAS = ["r0", "r1", "r2"]
CAPACITY = 300
HISTORY = 8
MAX_TENANTS = 20
SESSIONS = 40
TENANTS = 100  # five times the bound
BYTES_PER_MEMBER = 128  # generous: an 8-byte member in a skiplist zset costs ~60-70 B


async def footprint(client: aioredis.Redis, keys: KeySpace) -> dict:
    out: dict = {"keys": 0, "bytes": 0, "no_ttl": [], "residency": {}, "history": {}, "tenants": 0}
    async for key in client.scan_iter(match=keys.pattern(), count=500):
        name = key.decode()
        out["keys"] += 1
        out["bytes"] += int(await client.memory_usage(key) or 0)
        if await client.pttl(key) < 0:
            out["no_ttl"].append(name)
        if "{res}" in name:
            out["residency"][name] = int(await client.zcard(key))
        elif ":hist:" in name:
            out["history"][name] = int(await client.llen(key))
        elif name == keys.tenants():
            out["tenants"] = int(await client.zcard(key))
    return out


async def run_phase(store: ResilientStore, rng: random.Random, n: int) -> None:
    trunks = [[(t << 40) | i for i in range(400)] for t in range(12)]
    for _ in range(n):
        roll = rng.random()
        if roll < 0.5:
            trunk = rng.choice(trunks)
            await store.residency_add(rng.choice(REPLICAS), trunk[:rng.randint(1, 120)])
        elif roll < 0.7:
            await store.history_append(f"tenant-{rng.randrange(TENANTS)}",
                                       {"blocks": rng.randint(0, 500), "cause": "other", "pad": "x" * 40})
        elif roll < 0.9:
            await store.counter_incr(f"tenant-{rng.randrange(TENANTS)}", rng.choice(["requests", "breaks"]))
        else:
            await store.binding_set(f"session:{rng.randrange(SESSIONS)}", rng.choice(REPLICAS))
    await store.flush()


async def test_keys_and_bytes_stay_under_the_bounds(redis_server: RedisServer, redis_namespace: str) -> None:
    remote = RedisStore(redis_server.url, namespace=redis_namespace, capacity_blocks=CAPACITY,
                        history_len=HISTORY, max_tenants=MAX_TENANTS, ttl_s=600, key_ttl_s=600)
    store = ResilientStore(remote, MemoryStore(capacity_blocks=CAPACITY, history_len=HISTORY,
                                               max_tenants=MAX_TENANTS), timeout_s=1.0, control_timeout_s=5.0)
    await store.start()
    rng = random.Random(3)
    try:
        await run_phase(store, rng, 3000)
        first = await footprint(remote.client, remote.keys)
        await run_phase(store, rng, 9000)
        second = await footprint(remote.client, remote.keys)
    finally:
        await store.close()

    for snap in (first, second):
        assert snap["no_ttl"] == []
        assert snap["keys"] <= len(REPLICAS) + SESSIONS + 2 * MAX_TENANTS + 1
        assert len(snap["residency"]) == len(REPLICAS)
        assert max(snap["residency"].values()) <= CAPACITY
        assert max(snap["history"].values()) <= HISTORY
        assert snap["tenants"] <= MAX_TENANTS
    assert min(second["residency"].values()) == CAPACITY  # the bound was reached, not just unused
    residency_bytes_bound = len(REPLICAS) * CAPACITY * BYTES_PER_MEMBER
    assert second["bytes"] < residency_bytes_bound + 64 * 1024
    assert second["bytes"] <= 1.2 * first["bytes"]  # three times the writes, no growth
