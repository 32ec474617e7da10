"""Admission limits through the real gateway (loopback HTTP, the openai client, the simulator):
429 shape and headers, token reservation settled on usage, concurrency slots, and the limits
shared across two gateways on a real redis-server (with Redis killed mid-run)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from app.admission.limits import LocalLimiter
from app.config import TenantLimits

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def _limits(**limits: Any) -> dict[str, Any]:
    return {"default": {"limits": limits}}


def test_over_requests_per_s_is_openai_429_with_retry_after_and_ratelimit_headers(proxy_factory, sim):
    proxy = proxy_factory(sim, tenants=_limits(requests_per_s=2))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    ok = client.chat.completions.with_raw_response.create(**CHAT)
    assert ok.headers["x-ratelimit-limit-requests"] == "2"
    assert ok.headers["x-ratelimit-remaining-requests"] == "1"
    client.chat.completions.create(**CHAT)
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(**CHAT)
    resp = err.value.response
    assert resp.status_code == 429
    assert int(resp.headers["retry-after"]) >= 1
    assert resp.headers["x-ratelimit-limit-requests"] == "2"
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert resp.headers["x-ratelimit-reset-requests"].endswith("ms")
    body = resp.json()["error"]
    assert body["code"] == "rate_limit_exceeded" and body["type"] == "requests"
    assert "requests per second" in body["message"]
    assert proxy.sample("prefixgate_admission_rejections_total", tenant="default",
                        reason="requests_per_s") == 1


def test_tenant_override_limits_only_that_tenant(proxy_factory, sim):
    proxy = proxy_factory(sim, tenants={"overrides": {"t1": {"limits": {"requests_per_s": 1}}}})
    hdr = {"x-tenant-id": "t1"}
    with httpx.Client(base_url=proxy.url) as http:
        assert http.post("/v1/chat/completions", json=CHAT, headers=hdr).status_code == 200
        assert http.post("/v1/chat/completions", json=CHAT, headers=hdr).status_code == 429
        for _ in range(5):  # the default tenant has no limit
            assert http.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_prompt_tokens_reserved_on_estimate_and_settled_on_usage():
    async def run() -> None:
        lim = LocalLimiter()
        limits = TenantLimits(prompt_tokens_per_min=1000)
        assert (await lim.acquire("t", limits, 900, "a")).reason is None
        refused = await lim.acquire("t", limits, 200, "b")
        assert refused.reason == "prompt_tokens_per_min" and refused.retry_after_s > 0
        await lim.settle("t", limits, 900 - 100)  # usage said 100 prompt tokens, not 900
        assert (await lim.acquire("t", limits, 200, "c")).reason is None

    asyncio.run(run())


def test_over_prompt_tokens_per_min_is_429_tokens(proxy_factory, sim):
    proxy = proxy_factory(sim, tenants=_limits(prompt_tokens_per_min=50))
    big = {**CHAT, "messages": [{"role": "user", "content": "word " * 60}]}
    with httpx.Client(base_url=proxy.url) as http:
        assert http.post("/v1/chat/completions", json=big).status_code == 200  # full bucket: passes, in debt
        resp = http.post("/v1/chat/completions", json=big)
    assert resp.status_code == 429
    assert resp.json()["error"]["type"] == "tokens"
    assert resp.headers["x-ratelimit-limit-tokens"] == "50"
    assert resp.headers["x-ratelimit-remaining-tokens"] == "0"


def test_concurrent_limit_refuses_third_stream_and_frees_slot_at_end(proxy_factory, sim_factory):
    slow = sim_factory(replicas=1, time_scale=1.0, decode_tps=20.0)
    proxy = proxy_factory(slow, tenants=_limits(concurrent=2))
    body = {**CHAT, "stream": True, "max_tokens": 20, "ignore_eos": True}
    results: list[int] = []

    def stream() -> None:
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                r.read()
                results.append(r.status_code)

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    with httpx.Client(base_url=proxy.url) as http:
        third = http.post("/v1/chat/completions", json=CHAT)
    for t in threads:
        t.join()
    assert results == [200, 200]
    assert third.status_code == 429 and "concurrent" in third.json()["error"]["message"]
    proxy.settle()
    time.sleep(0.1)  # the release runs as a task after the response ended
    with httpx.Client(base_url=proxy.url) as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
