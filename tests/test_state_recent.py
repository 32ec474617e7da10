"""The recent placements cold prefixes are spread by (app/routing/recent.py), kept fleet-wide in
every Store: MemoryStore, RedisStore on a real redis-server (its script), ResilientStore, and the
embedded store of `serve --workers` give the numbers of `RecentRequests`, across its rescaling,
and two clients of one store see one set of counts."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import tempfile
from collections.abc import AsyncIterator

import pytest

from app.routing.recent import RESCALE_AT, RecentRequests, growth
from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.state.resilient import ResilientStore
from app.state.shared import SharedStore, StoreServer
from tests.redis_server import RedisServer

NAMES = ["r0", "r1", "r2", "r3"]


@pytest.fixture(params=["memory", "redis", "resilient"])
async def pair(request, redis_server: RedisServer, redis_namespace: str) -> AsyncIterator:
    """Two clients of one store (the same object for memory)."""
    if request.param == "memory":
        one = MemoryStore()
        yield one, one
        return
    def remote() -> RedisStore:
        return RedisStore(redis_server.url, namespace=redis_namespace)
    if request.param == "redis":
        stores = [remote(), remote()]
    else:
        stores = [ResilientStore(remote(), MemoryStore(), timeout_s=1.0, control_timeout_s=2.0) for _ in range(2)]
    for s in stores:
        await s.start()
    yield stores[0], stores[1]
    for s in stores:
        await s.close()


async def sent(store) -> None:
    if isinstance(store, ResilientStore):
        await store.flush()


async def test_counts_equal_the_reference_across_a_rescale_and_are_shared(pair) -> None:
    a, b = pair
    reference = RecentRequests()
    rng = random.Random(7)
    steps = 0
    while growth() ** steps <= RESCALE_AT:
        steps += 1
    for i in range(steps + 50):  # past one rescale of the unit
        name = rng.choice(NAMES[:3]) if i % 5 else "r0"
        reference.add(name)
        client = a if i % 2 else b
        await client.recent_add(name)
        await sent(client)  # two pods' writes land in the order they were sent
    for store in (a, b):
        got = await store.recent_values(NAMES)
        for name in NAMES:
            assert got[name] == pytest.approx(reference.value(name), rel=1e-9, abs=1e-12), name
    assert (await a.recent_values(["r3"]))["r3"] == 0.0  # never placed: none, not a default


def test_the_embedded_store_of_workers_shares_them() -> None:
    async def scenario() -> None:
        path = os.path.join(tempfile.mkdtemp(), "store.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(8)
        server = StoreServer(MemoryStore(), sock)
        await server.start()
        a, b = SharedStore(path, MemoryStore()), SharedStore(path, MemoryStore())
        await a.start()
        await b.start()
        reference = RecentRequests()
        for name in ("r0", "r1", "r0"):
            reference.add(name)
        await a.recent_add("r0")
        await b.recent_add("r1")
        await b.tenants()  # a read on the same connection returns after its writes
        await a.recent_add("r0")
        await a.tenants()
        got = await b.recent_values(["r0", "r1"])
        assert got == pytest.approx({"r0": reference.value("r0"), "r1": reference.value("r1")})
        await a.close()
        await b.close()
        await server.close()

    asyncio.run(scenario())
