"""The Store conformance suite: one contract, every implementation (app/state/base.py).

Each test runs against MemoryStore (the reference semantics), the embedded shared store of
`serve --workers N` (SharedStore clients of a StoreServer over a real UNIX socket), RedisStore on a
real redis-server, and ResilientStore (Redis + local mirror) with Redis up. Stores that are shared
(all but memory, whose one object stands for both) are also checked through two clients: what one
writes the other reads. Plus: every Store subclass is in the suite, every contract method is called
here, the contract is enforced when a class is defined, and a randomised comparison of MemoryStore
and RedisStore over long op sequences."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import app.state.factory  # noqa: F401 -- imports every implementation, for the subclass census
from app.routing.recent import RESCALE_AT, RecentRequests, growth
from app.state.base import Store, contract_methods, contract_problems
from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.state.resilient import ResilientStore
from app.state.shared import SharedStore, StoreServer
from tests.redis_server import RedisServer

CAPACITY = 8
HISTORY = 4
MAX_TENANTS = 3
TTL_S = 30.0
BIG = 2**64 - 1  # block hashes are unsigned 64-bit: every wire must carry this one exactly
NAMES = ["r0", "r1", "r2", "r3"]
IMPLEMENTATIONS = {"memory": MemoryStore, "shared": SharedStore, "redis": RedisStore, "resilient": ResilientStore}
KINDS = list(IMPLEMENTATIONS)


def chain(tag: int, n: int, start: int = 0) -> list[int]:
    """n distinct fake block hashes; chains with the same tag share their leading blocks."""
    return [(tag << 32) | i for i in range(start, start + n)]


def bounded_memory(ttl_s: float = TTL_S) -> MemoryStore:
    return MemoryStore(capacity_blocks=CAPACITY, ttl_s=ttl_s, history_len=HISTORY, max_tenants=MAX_TENANTS)


def make_store(kind: str, server: RedisServer, namespace: str, ttl_s: float = TTL_S):
    """A RedisStore or ResilientStore (the stores a test drives op by op against MemoryStore). Exact
    LRU (`refresh_s=0`): what recency a fresh head keeps is tested in test_state_refresh.py."""
    if kind == "memory":
        return bounded_memory(ttl_s)
    remote = RedisStore(server.url, namespace=namespace, capacity_blocks=CAPACITY, ttl_s=ttl_s,
                        key_ttl_s=ttl_s, history_len=HISTORY, max_tenants=MAX_TENANTS, refresh_s=0.0)
    if kind == "redis":
        return remote
    return ResilientStore(remote, bounded_memory(ttl_s), timeout_s=1.0, control_timeout_s=2.0)


def _steps_once(store: MemoryStore) -> MemoryStore:
    """`store`, with every async contract call checked to end in its first step: a store that says
    it never waits (`Store.never_waits`) has its writes run in place by the routers
    (app/routing/background.py), so every call of this suite checks that it never does."""
    assert store.never_waits
    for name in contract_methods():
        method = getattr(store, name)
        if not inspect.iscoroutinefunction(method):
            continue

        def checked(*args, _method=method, _name=name, **kwargs):
            coro = _method(*args, **kwargs)
            try:
                coro.send(None)
            except StopIteration as stop:
                return _value(stop.value)
            coro.close()
            raise AssertionError(f"MemoryStore.{_name} waited")

        setattr(store, name, checked)
    return store


async def _value(value):
    return value


@contextlib.asynccontextmanager
async def clients(kind: str, server: RedisServer, namespace: str, ttl_s: float = TTL_S) -> AsyncIterator[tuple]:
    """Two started clients of one store of `kind` (memory: the same object twice)."""
    async with contextlib.AsyncExitStack() as stack:
        if kind == "memory":
            one = _steps_once(bounded_memory(ttl_s))
            pair: tuple = (one, one)
        elif kind == "shared":
            folder = tempfile.mkdtemp(prefix="pg-store-")  # short: a UNIX socket path is <= 107 bytes
            stack.callback(shutil.rmtree, folder, True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(os.path.join(folder, "store.sock"))
            sock.listen(8)
            master = StoreServer(bounded_memory(ttl_s), sock)
            await master.start()
            stack.push_async_callback(master.close)
            pair = tuple(SharedStore(os.path.join(folder, "store.sock"), bounded_memory(ttl_s)) for _ in range(2))
        else:
            pair = (make_store(kind, server, namespace, ttl_s), make_store(kind, server, namespace, ttl_s))
        for s in dict.fromkeys(pair):
            await s.start()
            stack.push_async_callback(s.close)
        yield pair


@pytest.fixture(params=KINDS)
async def pair(request, redis_server: RedisServer, redis_namespace: str) -> AsyncIterator[tuple]:
    async with clients(request.param, redis_server, redis_namespace) as both:
        yield both


@pytest.fixture
def store(pair):
    return pair[0]


async def settle(store) -> None:
    """Writes that are queued or one-way have reached the shared backend: the resilient store's
    queue is flushed, a shared-store client's writes are applied (a read on its connection returns
    after them). After this another client reads them."""
    if isinstance(store, ResilientStore):
        await store.flush()
    elif isinstance(store, SharedStore):
        await store.tenants()


# ------------------------------------------------------------------ the contract itself


def test_every_store_implementation_is_in_this_suite() -> None:
    defined = {c for c in Store.__subclasses__() if c.__module__.startswith("app.")}  # not this file's
    assert defined == set(IMPLEMENTATIONS.values())
    for cls in IMPLEMENTATIONS.values():
        assert contract_problems(cls) == [], cls


def test_every_contract_method_is_called_in_this_suite() -> None:
    source = Path(__file__).read_text()
    assert sorted(m for m in contract_methods() if f".{m}(" not in source) == []


def test_a_class_that_breaks_the_contract_fails_when_it_is_defined() -> None:
    class Complete(MemoryStore):
        pass  # inherits every method: fine

    with pytest.raises(TypeError, match="binding_get missing"):
        class Partial(Store):  # a Store written by hand that forgot most of the contract
            async def binding_set(self, key: str, replica: str) -> None: ...

    with pytest.raises(TypeError, match="binding_get must be async"):
        class Sync(MemoryStore):
            def binding_get(self, key: str) -> str | None:  # type: ignore[override]
                return None

    with pytest.raises(TypeError, match=r"counter_incr\(self, tenant, name, amount=1.0\) is not counter_incr\(self, tenant, field, amount=1.0\)"):
        class Renamed(MemoryStore):
            async def counter_incr(self, tenant: str, name: str, amount: float = 1.0) -> None: ...

    with pytest.raises(TypeError, match=r"history_recent\(self, tenant\) is not"):
        class NoLimit(MemoryStore):
            async def history_recent(self, tenant: str) -> list[dict]:  # type: ignore[override]
                return []

    assert Complete().up()


async def test_up_once_started_with_the_backend_reachable(pair) -> None:
    a, b = pair
    assert a.up() is True and b.up() is True


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


async def test_a_chain_longer_than_the_capacity_holds_its_first_blocks(store) -> None:
    await store.residency_add("r", chain(1, 4))
    await store.residency_add("r", chain(2, 3 * CAPACITY))  # the engine can hold its first 8 blocks only
    await settle(store)
    assert await store.residency_lookup(chain(2, 3 * CAPACITY), ["r"]) == {"r": CAPACITY}
    assert await store.residency_lookup(chain(1, 4), ["r"]) == {"r": 0}
    await store.residency_add("r", chain(2, 3 * CAPACITY))  # again: nothing moves
    await settle(store)
    assert await store.residency_lookup(chain(2, 3 * CAPACITY), ["r"]) == {"r": CAPACITY}


async def test_a_packed_chain_is_a_chain(store) -> None:
    """The gateway hands its fingerprints' block hashes over packed (array('Q')): every store takes
    them as it takes a list, the shared one across its socket included."""
    from array import array

    await store.residency_add("r", array("Q", chain(1, 4)))
    await store.residency_touch("r", array("Q", chain(1, 2)))
    await settle(store)
    assert await store.residency_lookup(array("Q", chain(1, 4)), ["r"]) == {"r": 4}
    assert await store.residency_lookup(chain(1, 4), ["r"]) == {"r": 4}


def test_a_run_tree_never_takes_blocks_past_its_capacity() -> None:
    """The memory store's tree packs a long chain's first `capacity` blocks only: nothing of it is
    counted as evicted, and its size never passes the bound (a 1 MB prompt on a replica whose
    capacity the engine did not report would otherwise be packed whole, then cut, on every add)."""
    from app.prefix.runs import RunTree

    tree = RunTree(CAPACITY, float("inf"), lambda: 0.0)
    long = chain(2, 3 * CAPACITY)
    assert tree.add(long) == 0
    assert tree.size == CAPACITY and tree.leading(long) == CAPACITY
    assert tree.add(chain(3, 3)) == 3  # a new chain evicts the long one's tail, three blocks
    assert tree.leading(long) == CAPACITY - 3


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


async def test_response_owners(pair) -> None:
    a, b = pair
    assert await a.response_owner_get("resp_1") is None
    await a.response_owner_set("resp_1", "r0")
    await a.binding_set("resp_1", "r9")  # a session of the same name is another key
    assert await a.response_owner_get("resp_1") == "r0"  # read-your-writes, flushed or not
    await settle(a)
    assert await b.response_owner_get("resp_1") == "r0"
    assert await b.binding_get("resp_1") == "r9"
    await b.response_owner_set("resp_1", "r1")  # the last set wins
    await settle(b)
    assert await a.response_owner_get("resp_1") == "r1"
    assert await a.response_owner_get("resp_2") is None


async def test_two_clients_see_one_residency_index_bindings_and_history(pair) -> None:
    a, b = pair
    await a.residency_add("r1", [BIG, 7, 9, 11])
    await a.binding_set("session:x", "r1")
    await a.history_append("t", {"seq": 1, "sample": [BIG]})
    await settle(a)
    assert await b.residency_lookup([BIG, 7, 9, 12], ["r1", "r2"]) == {"r1": 3, "r2": 0}
    assert await b.binding_get("session:x") == "r1"
    await b.history_append("t", {"seq": 2})
    await b.counter_incr("t", "requests", 2.0)
    await settle(b)
    await a.counter_incr("t", "requests")
    await settle(a)
    assert await a.history_recent("t", 10) == [{"seq": 1, "sample": [BIG]}, {"seq": 2}]
    assert await b.counters("t") == {"requests": 3.0}
    assert await b.tenants() == ["t"]


async def test_recent_placements_equal_the_reference_across_a_rescale_and_are_shared(pair) -> None:
    """The decayed counts cold prefixes are spread by (app/routing/recent.py): the numbers of
    `RecentRequests` whichever client placed the request, past a rescale of the unit."""
    a, b = pair
    reference = RecentRequests()
    rng = random.Random(7)
    steps = 0
    while growth() ** steps <= RESCALE_AT:
        steps += 1
    for i in range(steps + 50):
        name = rng.choice(NAMES[:3]) if i % 5 else "r0"
        reference.add(name)
        client = a if i % 2 else b
        await client.recent_add(name)
        await settle(client)  # two pods' writes land in the order they were sent
    for s in (a, b):
        got = await s.recent_values(NAMES)
        for name in NAMES:
            assert got[name] == pytest.approx(reference.value(name), rel=1e-9, abs=1e-12), name
    assert (await a.recent_values(["r3"]))["r3"] == 0.0  # never placed: none, not a default
    assert await a.recent_values([]) == {}


@pytest.mark.parametrize("kind", KINDS)
async def test_residency_bindings_and_response_owners_expire(kind, redis_server: RedisServer,
                                                             redis_namespace: str) -> None:
    async with clients(kind, redis_server, redis_namespace, ttl_s=0.3) as (store, _):
        await store.residency_add("r", chain(1, 3))
        await store.binding_set("s", "r")
        await store.response_owner_set("resp_1", "r")
        await settle(store)
        assert await store.residency_lookup(chain(1, 3), ["r"]) == {"r": 3}
        assert await store.response_owner_get("resp_1") == "r"
        await asyncio.sleep(0.5)
        assert await store.residency_lookup(chain(1, 3), ["r"]) == {"r": 0}
        assert await store.binding_get("s") is None
        assert await store.response_owner_get("resp_1") is None


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


async def test_one_batch_writes_each_tenants_records_in_order_and_its_counters(
        redis_server: RedisServer, redis_namespace: str) -> None:
    """RedisStore.apply writes what a batch holds for a tenant in one script call: its records in
    order (trimmed to the history's length), every increment, a TTL on each key; the tenants it
    touched registered, past `max_tenants` the least recent evicted."""
    store = make_store("redis", redis_server, redis_namespace)
    await store.start()
    batch = [store.history_op("a", {"n": 0}), store.counter_op("a", "requests", 1.0),
             store.history_op("b", {"n": 0}), store.counter_op("a", "requests", 2.5),
             store.counter_op("b", "blocks", 4.0)]
    batch += [store.history_op("a", {"n": n}) for n in range(1, HISTORY + 2)]
    await store.apply(batch)
    assert [r["n"] for r in await store.history_recent("a", 100)] == list(range(2, HISTORY + 2))
    assert await store.history_recent("b", 100) == [{"n": 0}]
    assert await store.counters("a") == {"requests": 3.5}
    assert await store.counters("b") == {"blocks": 4.0}
    keys = store.keys
    for key in (keys.history("a"), keys.counters("a"), keys.history("b"), keys.counters("b"), keys.tenants()):
        assert 0 < await store.client.pttl(key) <= TTL_S * 1000
    await store.apply([store.counter_op(t, "requests", 1.0) for t in ("c", "d", "e")])
    assert sorted(await store.tenants()) == ["c", "d", "e"]  # a and b, the least recent, went
    await store.close()
