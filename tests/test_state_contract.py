"""One contract suite for every Store: MemoryStore (the reference semantics), RedisStore on a real
redis-server, and ResilientStore (Redis + local mirror) with Redis up. Plus a randomised
comparison of MemoryStore and RedisStore over long op sequences."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.state.resilient import ResilientStore
from tests.redis_server import RedisServer

CAPACITY = 8
HISTORY = 4
MAX_TENANTS = 3
TTL_S = 30.0


def chain(tag: int, n: int, start: int = 0) -> list[int]:
    """n distinct fake block hashes; chains with the same tag share their leading blocks."""
    return [(tag << 32) | i for i in range(start, start + n)]


def make_store(kind: str, server: RedisServer, namespace: str, ttl_s: float = TTL_S):
    if kind == "memory":
        return MemoryStore(capacity_blocks=CAPACITY, ttl_s=ttl_s, history_len=HISTORY, max_tenants=MAX_TENANTS)
    remote = RedisStore(server.url, namespace=namespace, capacity_blocks=CAPACITY, ttl_s=ttl_s,
                        key_ttl_s=ttl_s, history_len=HISTORY, max_tenants=MAX_TENANTS)
    if kind == "redis":
        return remote
    local = MemoryStore(capacity_blocks=CAPACITY, ttl_s=ttl_s, history_len=HISTORY, max_tenants=MAX_TENANTS)
    return ResilientStore(remote, local, timeout_s=1.0, control_timeout_s=2.0)


KINDS = ["memory", "redis", "resilient"]


@pytest.fixture(params=KINDS)
async def store(request, redis_server: RedisServer, redis_namespace: str) -> AsyncIterator:
    s = make_store(request.param, redis_server, redis_namespace)
    await s.start()
    yield s
    await s.close()


async def settle(store) -> None:
    """Resilient writes are queued: send them so the remote side is exercised too."""
    if isinstance(store, ResilientStore):
        await store.flush()


async def test_lookup_unknown_replicas_and_empty_chain(store) -> None:
    assert await store.residency_lookup(chain(1, 4), ["a", "b"]) == {"a": 0, "b": 0}
    await store.residency_add("a", chain(1, 4))
    await settle(store)
    assert await store.residency_lookup([], ["a"]) == {"a": 0}
    assert await store.residency_lookup(chain(1, 4), []) == {}


async def test_leading_run_per_replica_in_one_call(store) -> None:
    await store.residency_add("a", chain(1, 5))
    await store.residency_add("b", chain(1, 2))
    await settle(store)
    longer = chain(1, 7)  # same head, two more blocks
    assert await store.residency_lookup(longer, ["a", "b", "c"]) == {"a": 5, "b": 2, "c": 0}
    diverged = chain(1, 3) + chain(9, 3)
    assert await store.residency_lookup(diverged, ["a", "b"]) == {"a": 3, "b": 2}
    assert await store.residency_lookup(chain(2, 3), ["a"]) == {"a": 0}


async def test_capacity_evicts_tails_least_recent_first(store) -> None:
    await store.residency_add("r", chain(1, 6))
    await store.residency_add("r", chain(2, 4))  # 10 > 8: two tail blocks of chain 1 go
    await settle(store)
    assert await store.residency_lookup(chain(1, 6), ["r"]) == {"r": 4}
    assert await store.residency_lookup(chain(2, 4), ["r"]) == {"r": 4}


async def test_readding_a_prefix_refreshes_its_lru_position(store) -> None:
    await store.residency_add("r", chain(1, 4))
    await store.residency_add("r", chain(2, 4))  # full at 8
    await store.residency_add("r", chain(1, 2))  # chain 1's head is now the most recent
    await store.residency_add("r", chain(3, 2))  # evicts the two least recent: chain 1's tail
    await settle(store)
    assert (await store.residency_lookup(chain(1, 4), ["r"]))["r"] == 2
    assert (await store.residency_lookup(chain(2, 4), ["r"]))["r"] == 4
    assert (await store.residency_lookup(chain(3, 2), ["r"]))["r"] == 2


async def test_touch_refreshes_present_blocks_and_inserts_none(store) -> None:
    await store.residency_add("r", chain(1, 4))
    await store.residency_add("r", chain(2, 4))  # full at 8; chain 1 is the least recent
    await store.residency_touch("r", chain(1, 2) + chain(9, 2))  # a hit on chain 1's head
    await store.residency_add("r", chain(3, 4))  # evicts the 4 least recent: both chains' tails
    await settle(store)
    assert (await store.residency_lookup(chain(1, 4), ["r"]))["r"] == 2  # untouched, it would be 0
    assert (await store.residency_lookup(chain(2, 4), ["r"]))["r"] == 2
    assert (await store.residency_lookup(chain(9, 2), ["r"]))["r"] == 0  # touched, never inserted
    await store.residency_touch("nobody", chain(1, 2))
    assert (await store.residency_lookup(chain(1, 2), ["nobody"]))["nobody"] == 0


async def test_remove_and_clear(store) -> None:
    await store.residency_add("r", chain(1, 5))
    await store.residency_remove("r", [chain(1, 5)[2]])
    await settle(store)
    assert await store.residency_lookup(chain(1, 5), ["r"]) == {"r": 2}
    await store.residency_clear("r")
    await settle(store)
    assert await store.residency_lookup(chain(1, 5), ["r"]) == {"r": 0}


async def test_set_capacity_shrinks_at_the_next_write(store) -> None:
    await store.residency_add("r", chain(1, 6))
    store.set_capacity("r", 3)
    await store.residency_add("r", chain(2, 1))
    await settle(store)
    assert await store.residency_lookup(chain(1, 6), ["r"]) == {"r": 2}
    assert await store.residency_lookup(chain(2, 1), ["r"]) == {"r": 1}


async def test_long_chain_lookup_is_exact(store) -> None:
    store.set_capacity("r", 20_000)
    await store.residency_add("r", chain(7, 3000))
    await settle(store)
    probe = chain(7, 2345) + chain(8, 1000)
    assert await store.residency_lookup(probe, ["r"]) == {"r": 2345}
    assert await store.residency_lookup(chain(7, 5000), ["r"]) == {"r": 3000}


async def test_bindings(store) -> None:
    assert await store.binding_get("s1") is None
    await store.binding_set("s1", "a")
    await settle(store)
    assert await store.binding_get("s1") == "a"
    await store.binding_set("s1", "b")  # read-your-writes, flushed or not
    assert await store.binding_get("s1") == "b"


async def test_history_is_bounded_and_ordered(store) -> None:
    for i in range(6):
        await store.history_append("t", {"turn": i, "blocks": [i, i + 1], "cause": None})
    assert await store.history_recent("t", 10) == [
        {"turn": i, "blocks": [i, i + 1], "cause": None} for i in range(2, 6)]
    assert [r["turn"] for r in await store.history_recent("t", 2)] == [4, 5]
    assert await store.history_recent("nobody", 5) == []


async def test_counters(store) -> None:
    await store.counter_incr("t", "requests")
    await store.counter_incr("t", "requests")
    await store.counter_incr("t", "breaks.dynamic_head", 0.5)
    assert await store.counters("t") == {"requests": 2.0, "breaks.dynamic_head": 0.5}
    assert await store.counters("nobody") == {}


async def test_tenants_are_bounded_with_their_data(store) -> None:
    for t in ["t1", "t2", "t3"]:
        await store.history_append(t, {"n": 1})
        await store.counter_incr(t, "requests")
    await store.history_append("t4", {"n": 1})  # the oldest tenant goes, counters and all
    assert sorted(await store.tenants()) == ["t2", "t3", "t4"]
    assert await store.history_recent("t1", 5) == []
    assert await store.counters("t1") == {}
    assert await store.counters("t2") == {"requests": 1.0}


@pytest.mark.parametrize("kind", KINDS)
async def test_residency_and_bindings_expire(kind, redis_server: RedisServer, redis_namespace: str) -> None:
    store = make_store(kind, redis_server, redis_namespace, ttl_s=0.3)
    await store.start()
    try:
        await store.residency_add("r", chain(1, 3))
        await store.binding_set("s", "r")
        await settle(store)
        assert await store.residency_lookup(chain(1, 3), ["r"]) == {"r": 3}
        await asyncio.sleep(0.5)
        assert await store.residency_lookup(chain(1, 3), ["r"]) == {"r": 0}
        assert await store.binding_get("s") is None
    finally:
        await store.close()


async def test_random_sequences_match_memory_store(redis_server: RedisServer, redis_namespace: str) -> None:
    """Random adds (chains branching off shared heads), touches, removals, clears and capacity changes over
    three replicas: RedisStore answers every lookup exactly as MemoryStore does. The sequences keep
    the Store protocol's contract, as its one writer does (app/routing/residency.py): a hash names
    its whole prefix (chained hashes), and a block is removed with every block after it."""
    rng = random.Random(8)
    memory = make_store("memory", redis_server, redis_namespace)
    redis = make_store("redis", redis_server, redis_namespace)
    await redis.start()
    replicas = ["a", "b", "c"]
    capacity = dict.fromkeys(replicas, 40)
    for r in replicas:
        memory.set_capacity(r, 40)
        redis.set_capacity(r, 40)
    trunks = [chain(t, 30) for t in range(4)]

    known: list[list[int]] = []

    def random_chain() -> list[int]:
        t = rng.randrange(len(trunks))
        keep = rng.randint(0, len(trunks[t]))
        tag = 100 + (t * 31 + keep) * 10 + rng.randint(0, 9)  # the suffix's hashes name its prefix
        out = trunks[t][:keep] + chain(tag, rng.randint(0, 8), start=keep)
        known.append(out)
        return out

    def with_descendants(block: int) -> list[int]:
        return sorted({h for c in known if block in c for h in c[c.index(block):]})

    try:
        for step in range(300):
            roll = rng.random()
            r = rng.choice(replicas)
            if roll < 0.67:
                c = random_chain()
                await memory.residency_add(r, c)
                await redis.residency_add(r, c)
            elif roll < 0.75:
                c = random_chain()
                await memory.residency_touch(r, c)
                await redis.residency_touch(r, c)
            elif roll < 0.85:
                victims = with_descendants(rng.choice(random_chain() or [0]))
                await memory.residency_remove(r, victims)
                await redis.residency_remove(r, victims)
            elif roll < 0.88:
                await memory.residency_clear(r)
                await redis.residency_clear(r)
                memory.set_capacity(r, capacity[r])  # MemoryStore.residency_clear forgets it
            else:
                cap = capacity[r] = rng.randint(10, 60)
                memory.set_capacity(r, cap)
                redis.set_capacity(r, cap)
                await memory.residency_add(r, [])
                await redis.residency_add(r, [])
            probe = random_chain()
            want = await memory.residency_lookup(probe, replicas)
            assert await redis.residency_lookup(probe, replicas) == want, f"step {step}"
        for r in replicas:
            assert await redis.residency_count(r) == memory.residency_size(r)
    finally:
        await redis.close()
