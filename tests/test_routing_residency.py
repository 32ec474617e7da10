"""The residency owner keeps every replica's set prefix-closed, on MemoryStore, on RedisStore
(a real redis-server) and on ResilientStore: no block is ever reported without its parent, KV
events that carry only new tail blocks included, and a routed hit marks its head as used."""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator

import msgspec
import pytest

from app.engines.kv_events import KVEventSubscriber
from app.prefix.blocks import proxy_chain
from app.routing.residency import ReplicaIndex
from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.state.resilient import ResilientStore
from tests.redis_server import RedisServer

B = 4
KINDS = ["memory", "redis", "resilient"]


def make_store(kind: str, server: RedisServer, namespace: str, capacity: int):
    if kind == "memory":
        return MemoryStore(capacity_blocks=capacity)
    remote = RedisStore(server.url, namespace=namespace, capacity_blocks=capacity, refresh_s=0.0)  # exact LRU
    if kind == "redis":
        return remote
    return ResilientStore(remote, MemoryStore(capacity_blocks=capacity), timeout_s=1.0, control_timeout_s=2.0)


@pytest.fixture(params=KINDS)
async def small_store(request, redis_server: RedisServer, redis_namespace: str) -> AsyncIterator:
    store = make_store(request.param, redis_server, redis_namespace, capacity=3)
    await store.start()
    yield store
    await store.close()


async def members(store, replica: str) -> set[int]:
    """What the store really holds for a replica (Redis: the sorted set itself)."""
    if isinstance(store, ResilientStore):
        await store.flush()
        store = store.remote
    if isinstance(store, MemoryStore):
        return store.residency_hashes(replica)
    raw = await store.client.zrange(store.keys.residency(replica), 0, -1)
    return {struct.unpack(">Q", m)[0] for m in raw}


def stored(hashes, parent, tokens):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": B, "medium": "GPU"}


def message(seq: int, events) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), msgspec.msgpack.encode([float(seq), events, 0])]


async def test_tail_only_block_stored_events_keep_the_set_prefix_closed(small_store) -> None:
    """The issue's case: capacity 3, BlockStored [1], [2] (parent 1), [3], [4] one by one. The
    engine holds 1..4's chain; the index may hold three blocks, and they must be the head."""
    sub = KVEventSubscriber({"r": "tcp://127.0.0.1:1"}, ReplicaIndex(small_store, True))  # handle() only
    tokens = list(range(16))
    chain = proxy_chain(tokens, B)
    for i in range(4):
        await sub.handle("r", message(i + 1, [stored([i + 1], i or None, tokens[i * B:(i + 1) * B])]))
    assert await small_store.residency_lookup(chain, ["r"]) == {"r": 3}
    assert await members(small_store, "r") == set(chain[:3])


async def test_a_removed_block_takes_its_descendants_with_it(small_store) -> None:
    small_store.set_capacity("r", 100)
    index = ReplicaIndex(small_store, events_own_presence=True)
    chain = list(range(1000, 1016))  # 16 blocks: a binary search would jump over a hole
    assert await index.learn_stored("r", chain[:8], None)
    assert await index.learn_stored("r", chain[8:], chain[7])
    branch = [2000, 2001]
    assert await index.learn_stored("r", branch, chain[2])
    await index.learn_removed("r", [chain[3]])
    assert await small_store.residency_lookup(chain, ["r"]) == {"r": 3}
    assert await members(small_store, "r") == set(chain[:3]) | set(branch)
    assert not await index.learn_stored("r", [3000], chain[10])  # its parent is gone: left out
    assert await members(small_store, "r") == set(chain[:3]) | set(branch)


async def test_a_routed_hit_marks_the_resident_head_as_used(small_store) -> None:
    """KV-event mode: a hit emits no event, yet the engine touches the blocks it hit, so a hot
    head outlives colder chains stored after it."""
    small_store.set_capacity("r", 4)
    index = ReplicaIndex(small_store, events_own_presence=True)
    hot, cold, new = [1, 2], [10, 11], [20, 21]
    await index.learn_stored("r", hot, None)
    await index.learn_stored("r", cold, None)
    matched = (await index.lookup(hot + [3, 4], ["r"]))["r"]
    assert matched == 2
    await index.learn_routed("r", hot + [3, 4], matched)  # touches; never inserts 3 and 4
    await index.learn_stored("r", new, None)  # over capacity: the least recently used chain goes
    assert await members(small_store, "r") == set(hot) | set(new)


async def test_without_kv_events_routed_and_completed_chains_are_added(small_store) -> None:
    small_store.set_capacity("r", 10)
    index = ReplicaIndex(small_store)
    await index.learn_routed("r", [1, 2, 3], 0)
    await index.learn_completed("r", [1, 2, 3, 4, 5])
    assert await index.lookup([1, 2, 3, 4, 5, 6], ["r"]) == {"r": 5}
    events = ReplicaIndex(small_store, events_own_presence=True)
    await events.learn_completed("r", [7, 8])  # with KV events the engine reports what it keeps
    assert await index.lookup([7, 8], ["r"]) == {"r": 0}


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_random_event_streams_never_leave_a_block_without_its_parent(
        kind: str, redis_server: RedisServer, redis_namespace: str) -> None:
    """Random stores (extending random resident blocks), removals and routed hits, at a capacity
    that trims all the time: after every step each held block's parent is held too, and the
    lookup of every known chain equals its leading held run."""
    rng = random.Random(14)
    store = make_store(kind, redis_server, redis_namespace, capacity=12)
    await store.start()
    index = ReplicaIndex(store, events_own_presence=True)
    parent_of: dict[int, int | None] = {}
    next_hash = 1
    try:
        for step in range(250):
            held = await members(store, "r")
            roll = rng.random()
            if roll < 0.6:
                parent = rng.choice(sorted(held)) if held and rng.random() < 0.8 else None
                blocks = list(range(next_hash, next_hash + rng.randint(1, 3)))
                next_hash += len(blocks)
                above = parent
                for h in blocks:
                    parent_of[h], above = above, h
                await index.learn_stored("r", blocks, parent)
            elif roll < 0.8 and held:
                await index.learn_removed("r", [rng.choice(sorted(held))])
            elif held:
                leaf = rng.choice(sorted(held))
                path = chain_of(leaf, parent_of)
                matched = (await index.lookup(path, ["r"]))["r"]
                await index.learn_routed("r", path, matched)
            held = await members(store, "r")
            orphans = {h for h in held if parent_of[h] is not None and parent_of[h] not in held}
            assert not orphans, f"step {step}: held without their parent: {orphans}"
            for leaf in held:
                path = chain_of(leaf, parent_of)
                assert (await index.lookup(path, ["r"]))["r"] == len(path), f"step {step}"
    finally:
        await store.close()


def chain_of(block: int, parent_of: dict[int, int | None]) -> list[int]:
    out: list[int] = []
    node: int | None = block
    while node is not None:
        out.append(node)
        node = parent_of[node]
    return out[::-1]
