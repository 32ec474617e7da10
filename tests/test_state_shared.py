"""The embedded shared store of `serve --workers N` (app/state/shared.py) and the merged /metrics
(app/telemetry/merge.py): with the master gone, a client answers from local state and says it is
down; merged series sum counters and per-worker gauges and take the largest of the other gauges.
What a client shares with another while the master is there is the Store contract, checked with
every other Store in tests/test_store_conformance.py."""

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


def _listening(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    return sock


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
