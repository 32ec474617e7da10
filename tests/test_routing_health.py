"""Active health checks: a slow /health is tolerated once (and not at all while the replica answers
proxied traffic), a refused connection is not."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
from fake_upstream import FakeResponse

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
    await checker.start()  # its first pass is the first timed-out probe
    try:
        assert replica.healthy
        for _ in range(PROBE_TIMEOUTS_TO_FAIL - 2):
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
    await checker.start()  # its first pass probes once
    try:
        assert not replica.healthy
        assert await checker.check(replica) is False
        assert not replica.healthy
    finally:
        await checker.stop()


def test_a_replica_answering_traffic_stays_in_rotation_while_its_health_probes_time_out(
        fake_upstream_factory, proxy_factory) -> None:
    """SGLang's /health generates a token behind the running batch: on busy cores it answers late
    exactly while the replica serves. Probes that time out (2 s) between answered requests do not
    take it out of rotation; without traffic two in a row would (the test above)."""
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "fake",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    up = fake_upstream_factory(lambda _: FakeResponse(headers={"content-type": "application/json"},
                                                      chunks=[(0, orjson.dumps(completion))]), health_delay_s=2.5)
    proxy = proxy_factory([up.url], names=["busy"], routing={"policy": "round_robin", "health_interval_s": 0.5})
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    statuses = []
    deadline = time.monotonic() + 7.0  # past three probe timeouts
    while time.monotonic() < deadline:
        statuses.append(httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=10).status_code)
        time.sleep(0.3)
    assert set(statuses) == {200}, statuses
    assert proxy.sample("prefixgate_backend_healthy", backend="busy") == 1


def test_the_gateway_starts_serving_once_every_replica_s_model_list_is_known(
        fake_upstream_factory, proxy_factory) -> None:
    """Start-up waits for the first probe pass: a request sent the moment the gateway is up must not
    find one replica's model list known and another's still unknown (the serves-the-model filter
    would leave out a replica that serves the model; CI saw round robin skip its first replica)."""
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "fake",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    script = lambda _: FakeResponse(headers={"content-type": "application/json"},  # noqa: E731
                                    chunks=[(0, orjson.dumps(completion))])
    slow_list = fake_upstream_factory(script, models_delay_s=0.6)
    quick_list = fake_upstream_factory(script)
    proxy = proxy_factory([slow_list.url, quick_list.url], names=["a", "b"],
                          routing={"policy": "round_robin", "health_interval_s": 3600})
    assert httpx.get(proxy.url + "/readyz", timeout=5).json()["healthy_backends"] == ["a", "b"]
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    backends = [httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=10).headers["x-prefixgate-backend"]
                for _ in range(2)]
    assert backends == ["a", "b"]


def test_a_models_list_with_entries_that_are_no_model_lists_the_rest(fake_upstream_factory, proxy_factory) -> None:
    """A replica's /v1/models whose entries are no object, have no string id, or hold a NaN (JSON
    parsers accept one): the gateway lists and routes the well-formed entries; its /v1/models
    answered 500 before (an unhashable or missing id, a NaN strict JSON refuses)."""
    body = (b'{"object": "list", "data": [{"id": "good", "max_model_len": 4096}, {"id": {"x": 1}}, '
            b'{"object": "model"}, "text", 5, {"id": "bad", "max_model_len": NaN}]}')
    upstream = fake_upstream_factory(lambda req: FakeResponse(headers={"content-type": "application/json"}, chunks=[
        (0.0, orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "good", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}))]),
        model="good", models_body=body)
    proxy = proxy_factory(upstream.url)
    listed = httpx.get(f"{proxy.url}/v1/models", timeout=10)
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == ["good"]
    got = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=10, json={
        "model": "good", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]})
    assert got.status_code == 200
