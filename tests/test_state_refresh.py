"""The Redis residency set's refresh window (`state_options.residency_refresh_s`, docs/routing.md,
"The Redis set"): an add does not rewrite the head of a chain used within the window, only the
blocks after it, scored below it; past the window it rewrites the whole chain, as exact LRU does.
Real redis-server, a fake clock (the stores' scores are the clock's microseconds)."""

from __future__ import annotations

from app.state.redis import RedisStore
from tests.fake_clock import FakeClock
from tests.redis_server import RedisServer
from tests.test_store_conformance import chain

CAPACITY = 8


async def _held(store: RedisStore, *chains: list[int]) -> list[int]:
    return [(await store.residency_lookup(c, ["r"]))["r"] for c in chains]


async def _two_chains_and_a_longer_first(store: RedisStore, clock: FakeClock) -> None:
    """Chain 1 (4 blocks), then chain 2 (4: the set is full), then chain 1 again with two more."""
    await store.residency_add("r", chain(1, 4))
    clock.now += 0.1
    await store.residency_add("r", chain(2, 4))
    clock.now += 0.1
    await store.residency_add("r", chain(1, 6))


async def test_a_head_used_within_the_window_keeps_its_place_and_its_new_blocks_rank_below_it(
        redis_server: RedisServer, redis_namespace: str) -> None:
    clock = FakeClock(1_700_000_000.0)
    store = RedisStore(redis_server.url, namespace=redis_namespace, capacity_blocks=CAPACITY, refresh_s=1.0,
                       clock=clock)
    await _two_chains_and_a_longer_first(store, clock)
    # chain 1's head was used 0.2 s ago: not rewritten; its two new blocks score below it, so the
    # two least recent blocks are those, and the set stays prefix-closed
    assert await _held(store, chain(1, 6), chain(2, 4)) == [4, 4]
    assert await store.residency_count("r") == CAPACITY
    clock.now += 1.5  # past the window: the whole chain is rewritten, the most recent again
    await store.residency_add("r", chain(1, 6))
    assert await _held(store, chain(1, 6), chain(2, 4)) == [6, 2]
    await store.close()


async def test_no_window_rewrites_every_add(redis_server: RedisServer, redis_namespace: str) -> None:
    """`refresh_s: 0`: the same adds as above give exact LRU order at once, as MemoryStore does."""
    clock = FakeClock(1_700_000_000.0)
    store = RedisStore(redis_server.url, namespace=redis_namespace, capacity_blocks=CAPACITY, refresh_s=0.0,
                       clock=clock)
    await _two_chains_and_a_longer_first(store, clock)
    assert await _held(store, chain(1, 6), chain(2, 4)) == [6, 2]
    await store.close()


async def test_a_touch_within_the_window_moves_nothing_and_past_it_refreshes_the_head(
        redis_server: RedisServer, redis_namespace: str) -> None:
    """KV-event mode touches a hit's resident head; a touch never inserts, fresh or not."""
    clock = FakeClock(1_700_000_000.0)
    store = RedisStore(redis_server.url, namespace=redis_namespace, capacity_blocks=CAPACITY, refresh_s=1.0,
                       clock=clock)
    await store.residency_add("r", chain(1, 4))
    clock.now += 0.1
    await store.residency_add("r", chain(2, 4))
    clock.now += 0.1
    await store.residency_touch("r", chain(1, 4) + chain(9, 2))  # fresh: nothing moves
    clock.now += 0.1
    await store.residency_add("r", chain(3, 2))  # evicts the two least recent: chain 1's tail
    assert await _held(store, chain(1, 4), chain(2, 4), chain(9, 2)) == [2, 4, 0]
    clock.now += 1.5
    await store.residency_touch("r", chain(1, 2) + chain(9, 2))  # stale: chain 1's head is the most recent
    clock.now += 0.1
    await store.residency_add("r", chain(4, 2))  # evicts chain 2's tail, not chain 1's head
    assert await _held(store, chain(1, 4), chain(2, 4), chain(9, 2)) == [2, 2, 0]
    await store.close()
