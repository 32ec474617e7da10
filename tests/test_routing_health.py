"""Active health checks: a slow /health is tolerated once, a refused connection is not."""

from __future__ import annotations

import asyncio

from app.routing.base import Replica
from app.routing.health import PROBE_TIMEOUTS_TO_FAIL, HealthChecker
from app.routing.replicas import ReplicaSet
from app.serving import free_port
from app.telemetry.metrics import Metrics


async def _hanging_server() -> tuple[asyncio.base_events.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        await asyncio.sleep(30)  # never answers within the probe timeout
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_probe_timeouts_must_repeat_before_a_replica_leaves_rotation() -> None:
    server, port = await _hanging_server()
    replica = Replica(name="slow", url=f"http://127.0.0.1:{port}")
    checker = HealthChecker(ReplicaSet([replica]), Metrics(), interval_s=60, probe_timeout_s=0.2)
    await checker.start()
    try:
        for _ in range(PROBE_TIMEOUTS_TO_FAIL - 1):
            assert await checker.check(replica) is True
            assert replica.healthy
        assert await checker.check(replica) is False
        assert not replica.healthy
    finally:
        await checker.stop()
        server.close()


async def test_refused_connection_fails_at_once() -> None:
    port = free_port()  # closed again: nothing listens there
    replica = Replica(name="gone", url=f"http://127.0.0.1:{port}")
    checker = HealthChecker(ReplicaSet([replica]), Metrics(), interval_s=60, probe_timeout_s=0.5)
    await checker.start()
    try:
        assert await checker.check(replica) is False
        assert not replica.healthy
    finally:
        await checker.stop()
