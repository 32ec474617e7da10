"""The two gateway latency metrics measure exactly what the README says (README, Metrics):
`prefixgate_proxy_overhead_seconds` is the gateway's own time before the request went out, never
the time a failed attempt spent on its replica; `prefixgate_upstream_first_byte_seconds` stops at
the first body byte, also for a non-streamed answer whose body is still arriving."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
from fake_upstream import FakeResponse, SeenRequest, sse

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
SLOW = 0.6  # seconds a failing replica makes the gateway wait, or a body takes to finish


def good_stream(req: SeenRequest) -> FakeResponse:
    return FakeResponse(chunks=[(0, sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),
                                (0, sse({"choices": [{"index": 0, "delta": {"content": "a"}}]})),
                                (0, sse(b"[DONE]"))])


def slow_5xx(req: SeenRequest) -> FakeResponse:
    """HTTP 500 headers at once, the error body only after SLOW seconds."""
    body = orjson.dumps({"error": {"message": "overloaded", "type": "InternalServerError"}})
    return FakeResponse(status=500, headers={"content-type": "application/json"}, chunks=[(SLOW, body)])


def stalled(req: SeenRequest) -> FakeResponse:
    """Headers, then no body byte for far longer than the first-byte timeout."""
    return FakeResponse(chunks=[(10.0, b"data: [DONE]\n\n")])


@pytest.mark.parametrize("failing", [slow_5xx, stalled])
def test_overhead_excludes_the_failed_attempt(fake_upstream_factory, proxy_factory, failing) -> None:
    bad = fake_upstream_factory(failing)
    good = fake_upstream_factory(good_stream)
    proxy = proxy_factory([bad.url, good.url], names=["bad", "good"], limits={"first_byte_timeout_s": SLOW},
                          routing={"policy": "round_robin", "health_interval_s": 3600})
    proxy.wait_models()  # both replicas probed (their model lists read): round robin starts at "bad"
    t0 = time.perf_counter()
    r = httpx.post(proxy.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    elapsed = time.perf_counter() - t0
    assert r.status_code == 200 and r.headers["x-prefixgate-backend"] == "good"
    assert len(bad.requests) == 1 and elapsed >= SLOW  # the first attempt really cost SLOW seconds
    overhead = proxy.sample("prefixgate_proxy_overhead_seconds_sum", route="chat")
    assert proxy.sample("prefixgate_proxy_overhead_seconds_count", route="chat") == 1
    assert 0 < overhead < SLOW / 3, overhead  # the gateway's own work: parse, hooks, two routings
    # the client still waited for the failed attempt: first byte and TTFT count it
    first_byte = proxy.sample("prefixgate_upstream_first_byte_seconds_sum", route="chat", model="fake", backend="good")
    assert first_byte >= SLOW


def test_overhead_without_retries_is_arrival_to_send(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(good_stream)
    proxy = proxy_factory([up.url])
    r = httpx.post(proxy.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    assert r.status_code == 200
    assert 0 < proxy.sample("prefixgate_proxy_overhead_seconds_sum", route="chat") < 0.2


def test_non_stream_first_byte_is_the_first_body_byte(fake_upstream_factory, proxy_factory) -> None:
    payload = orjson.dumps({"id": "x", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                          "content": "hello"}}]})
    half = len(payload) // 2
    up = fake_upstream_factory(lambda req: FakeResponse(headers={"content-type": "application/json"},
                                                        chunks=[(0, payload[:half]), (SLOW, payload[half:])]))
    proxy = proxy_factory([up.url], names=["slow-body"])
    t0 = time.perf_counter()
    r = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200 and r.content == payload
    assert time.perf_counter() - t0 >= SLOW
    first_byte = proxy.sample("prefixgate_upstream_first_byte_seconds_sum", route="chat", model="fake", backend="slow-body")
    assert first_byte is not None and first_byte < SLOW / 2, first_byte
    duration = proxy.sample("prefixgate_request_duration_seconds_sum", route="chat", model="fake", backend="slow-body",
                            status="200")
    assert duration >= SLOW
