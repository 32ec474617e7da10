"""ResilientStore against a real redis-server that is absent, killed, restarted and paused:
requests never fail, never wait past the budget, and sharing resumes."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from app.config import Settings
from app.state.factory import build_store
from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.state.resilient import ResilientStore
from app.telemetry.metrics import Metrics
from tests.redis_server import RedisServer

BUDGET_S = 0.05
pytestmark = pytest.mark.exclusive  # every test times calls against a 50 ms budget


def make(url: str, metrics: Metrics | None = None, namespace: str = "f") -> ResilientStore:
    return ResilientStore(RedisStore(url, namespace=namespace), MemoryStore(), metrics, timeout_s=BUDGET_S,
                          control_timeout_s=0.5, stall_s=0.2, backoff_s=0.05, backoff_max_s=0.2)


async def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def gauge(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_unreachable_at_start_serves_locally_then_connects_and_replays(caplog) -> None:
    server = RedisServer()  # a free port, nothing listening yet
    metrics = Metrics()
    store = make(server.url, metrics)
    caplog.set_level(logging.WARNING, logger="app.state.resilient")
    t0 = time.monotonic()
    await store.start()
    assert time.monotonic() - t0 < 2.0
    assert not store.up()
    assert gauge(metrics, "prefixgate_state_backend_up") == 0
    await store.residency_add("r", [1, 2, 3])
    await store.counter_incr("t", "requests")
    await store.binding_set("s", "r")
    assert await store.residency_lookup([1, 2, 3, 4], ["r"]) == {"r": 3}
    assert await store.binding_get("s") == "r"
    assert await store.counters("t") == {"requests": 1.0}
    unreachable_logs = [r for r in caplog.records if "unreachable" in r.message]
    assert len(unreachable_logs) == 1
    assert gauge(metrics, "prefixgate_state_fallbacks_total", op="residency_lookup", reason="down") == 1
    try:
        server.start()
        await wait_until(store.up)
        assert gauge(metrics, "prefixgate_state_backend_up") == 1
        await wait_until(lambda: store.pending_writes == 0)
        other = make(server.url)  # another pod sees what this one did while Redis was away
        await other.start()
        assert await other.residency_lookup([1, 2, 3, 4], ["r"]) == {"r": 3}
        assert await other.binding_get("s") == "r"
        assert await other.counters("t") == {"requests": 1.0}
        await other.close()
    finally:
        await store.close()
        server.stop()


async def test_killed_mid_run_then_restarted(redis_proc: RedisServer, caplog) -> None:
    metrics = Metrics()
    a, b = make(redis_proc.url, metrics), make(redis_proc.url)
    await a.start()
    await b.start()
    caplog.set_level(logging.WARNING, logger="app.state.resilient")
    try:
        await a.residency_add("r", [1, 2])
        await a.flush()
        assert await b.residency_lookup([1, 2], ["r"]) == {"r": 2}

        redis_proc.kill()
        for i in range(50):  # every call answers, from local state, quickly
            t0 = time.monotonic()
            await a.residency_add("r", [1, 2, 3 + i])
            assert (await a.residency_lookup([1, 2, 3 + i], ["r"]))["r"] == 3
            await a.history_append("t", {"i": i})
            assert time.monotonic() - t0 < 1.0
        assert not a.up()
        assert gauge(metrics, "prefixgate_state_backend_up") == 0
        assert len([r for r in caplog.records if "unreachable" in r.message]) == 1

        redis_proc.start()  # same port, empty
        await wait_until(lambda: a.up() and a.pending_writes == 0)
        assert len([r for r in caplog.records if "resumes" in r.message]) == 1
        assert gauge(metrics, "prefixgate_state_backend_up") == 1
        # the outage's writes were replayed, and new writes are shared again
        assert (await b.residency_lookup([1, 2, 52], ["r"]))["r"] == 3
        assert len(await b.history_recent("t", 100)) == 50
        await a.binding_set("s", "r9")
        await a.flush()
        await wait_until(b.up)
        assert await b.binding_get("s") == "r9"
    finally:
        await a.close()
        await b.close()


async def test_paused_redis_costs_at_most_the_budget_then_trips_to_local(redis_proc: RedisServer) -> None:
    metrics = Metrics()
    store = make(redis_proc.url, metrics)
    await store.start()
    try:
        await store.residency_add("r", [1, 2, 3])
        await store.flush()
        redis_proc.pause()  # accepts connections, never answers
        waits = []
        for _ in range(6):
            t0 = time.monotonic()
            assert await store.residency_lookup([1, 2, 3], ["r"]) == {"r": 3}
            assert await store.binding_get("nobody") is None
            waits.append(time.monotonic() - t0)
        # each call waited at most about one budget (50 ms); none waited for Redis itself
        assert max(waits) < 10 * BUDGET_S * 2
        await wait_until(lambda: not store.up(), timeout=2.0)  # unanswered past stall_s: tripped
        assert gauge(metrics, "prefixgate_state_fallbacks_total", op="residency_lookup", reason="timeout") >= 1
        t0 = time.monotonic()
        for _ in range(20):
            await store.residency_lookup([1, 2, 3], ["r"])
        assert time.monotonic() - t0 < 10 * BUDGET_S  # local-only mode: no Redis waits at all
        redis_proc.resume()
        await wait_until(store.up)
        assert await store.residency_lookup([1, 2, 3], ["r"]) == {"r": 3}
    finally:
        redis_proc.resume()
        await store.close()


BUSY_LUA = """
local t0 = redis.call('TIME')
local start = tonumber(t0[1]) * 1000000 + tonumber(t0[2])
while true do
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > tonumber(ARGV[1]) then return 1 end
end
"""


async def test_slow_but_answering_redis_stays_in_use(redis_proc: RedisServer) -> None:
    """Redis busy for 0.3 s (a long script from elsewhere): calls over budget fall back to local
    answers, but the liveness PING is answered within stall_s, so the pod keeps using Redis."""
    metrics = Metrics()
    store = ResilientStore(RedisStore(redis_proc.url, namespace="late"), MemoryStore(), metrics,
                           timeout_s=BUDGET_S, stall_s=1.0)
    await store.start()
    other = RedisStore(redis_proc.url)
    try:
        busy = asyncio.create_task(other.client.eval(BUSY_LUA, 0, 300_000))
        await asyncio.sleep(0.02)
        t0 = time.monotonic()
        assert await store.residency_lookup([1, 2], ["r"]) == {"r": 0}
        assert time.monotonic() - t0 < 0.25  # the budget, not the 0.3 s busy spell
        await busy
        await asyncio.sleep(0.3)
        assert store.up() and store.outages == 0  # never switched to local-only mode
        assert gauge(metrics, "prefixgate_state_fallbacks_total", op="residency_lookup", reason="timeout") == 1
        assert gauge(metrics, "prefixgate_state_backend_up") == 1
    finally:
        await other.close()
        await store.close()


async def test_outage_queue_is_bounded() -> None:
    server = RedisServer()  # never started
    store = ResilientStore(RedisStore(server.url), MemoryStore(), timeout_s=BUDGET_S,
                           control_timeout_s=0.2, max_pending=100, backoff_s=5.0)
    await store.start()
    try:
        for i in range(50):
            await store.residency_add("r", list(range(i * 10, i * 10 + 9)))  # weight 10 each
        assert store._queued_weight <= 100
        assert store.dropped_writes > 0
    finally:
        await store.close()


async def test_refused_writes_are_dropped_logged_once_and_serving_goes_on(caplog) -> None:
    """A Redis at its maxmemory (noeviction) refuses writes: they are counted and dropped (a
    retry would not help), the pod keeps Redis for reads and keeps answering."""
    caplog.set_level(logging.WARNING, logger="app.state.resilient")
    with RedisServer(maxmemory="3mb") as server:
        metrics = Metrics()
        store = make(server.url, metrics)
        await store.start()
        try:
            for i in range(60):
                await store.history_append(f"t{i}", {"pad": "x" * 100_000})
                await store.flush()
            assert store.dropped_writes > 0
            assert gauge(metrics, "prefixgate_state_dropped_writes_total") == store.dropped_writes
            assert len([r for r in caplog.records if "refused" in r.message]) == 1
            assert store.up()
            await store.residency_add("r", [1, 2])
            assert await store.residency_lookup([1, 2], ["r"]) == {"r": 2}
        finally:
            await store.close()


async def test_factory_builds_resilient_store_from_url(redis_proc: RedisServer) -> None:
    metrics = Metrics()
    settings = Settings(state=redis_proc.url)
    store = build_store(settings, metrics)
    assert isinstance(store, ResilientStore)
    assert gauge(metrics, "prefixgate_state_backend_up") == 0
    await store.start()
    try:
        assert store.up()
        assert gauge(metrics, "prefixgate_state_backend_up") == 1
        assert store.timeout_s == settings.state_options.redis_timeout_s
    finally:
        await store.close()
    assert isinstance(build_store(Settings(), Metrics()), MemoryStore)
