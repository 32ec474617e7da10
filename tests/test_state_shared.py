"""The embedded shared store of `serve --workers N` (app/state/shared.py) and the merged /metrics
(app/telemetry/merge.py): two clients of one master store see each other's writes; with the master
gone, a client answers from local state and says it is down; merged series sum counters and
per-worker gauges and take the largest of the other gauges."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.state.memory import MemoryStore
from app.state.shared import SharedStore, StoreServer
from app.telemetry.merge import merge_expositions

BIG = 2**64 - 1  # block hashes are unsigned 64-bit


def _listening(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    return sock


async def synced(client: SharedStore) -> None:
    await client.tenants()


def test_two_clients_share_residency_history_bindings_and_counters() -> None:
    async def scenario() -> None:
        path = os.path.join(tempfile.mkdtemp(), "store.sock")
        server = StoreServer(MemoryStore(), _listening(path))
        await server.start()
        a, b = SharedStore(path, MemoryStore()), SharedStore(path, MemoryStore())
        await a.start()
        await b.start()
        chain = [BIG, 7, 9, 11]
        # writes are one-way; a read on the same connection returns after them (`synced`)
        await a.residency_add("r1", chain)
        await synced(a)
        assert await b.residency_lookup([BIG, 7, 9, 12], ["r1", "r2"]) == {"r1": 3, "r2": 0}
        await a.binding_set("session:x", "r1")
        await synced(a)
        assert await b.binding_get("session:x") == "r1"
        await a.history_append("t", {"seq": 1, "sample": [BIG]})
        await synced(a)
        await b.history_append("t", {"seq": 2})
        await synced(b)
        assert [r["seq"] for r in await a.history_recent("t", 10)] == [1, 2]
        await a.counter_incr("t", "requests")
        await b.counter_incr("t", "requests", 2.0)
        await synced(b)
        assert (await a.counters("t"))["requests"] == 3.0
        assert await b.tenants() == ["t"]
        assert a.up() and b.up()
        await a.close()
        await b.close()
        await server.close()

    asyncio.run(scenario())


def test_client_answers_from_local_state_when_the_master_is_gone() -> None:
    async def scenario() -> None:
        path = os.path.join(tempfile.mkdtemp(), "store.sock")
        server = StoreServer(MemoryStore(), _listening(path))
        await server.start()
        reported: list[float] = []
        client = SharedStore(path, MemoryStore(), reported.append)
        await client.start()
        assert await client.binding_get("session:x") is None  # connected and served
        await server.close()
        os.unlink(path)
        await asyncio.sleep(0.05)
        await client.residency_add("r1", [1, 2])
        assert not client.up() and reported == [1, 0]  # prefixgate_state_backend_up
        assert await client.residency_lookup([1, 2], ["r1"]) == {"r1": 2}  # the local store answered
        await client.close()

    asyncio.run(scenario())


def _worker(requests: float, inflight: float, healthy: float) -> str:
    r = CollectorRegistry()
    Counter("prefixgate_requests", "n", ["route"], registry=r).labels("chat").inc(requests)
    Gauge("prefixgate_backend_inflight_requests", "n", ["backend"], registry=r).labels("a").set(inflight)
    Gauge("prefixgate_backend_healthy", "n", ["backend"], registry=r).labels("a").set(healthy)
    return generate_latest(r).decode()


def test_merge_sums_counters_and_per_worker_gauges_and_maxes_shared_gauges() -> None:
    merged = merge_expositions([_worker(3, 2, 0), _worker(4, 5, 1)])
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(merged.decode()) for s in f.samples}
    assert values[("prefixgate_requests_total", (("route", "chat"),))] == 7
    assert values[("prefixgate_backend_inflight_requests", (("backend", "a"),))] == 7
    assert values[("prefixgate_backend_healthy", (("backend", "a"),))] == 1
