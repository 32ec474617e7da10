"""The real `openai` client through the proxy to simulated replicas: stream and non-stream, chat
and completions; the clock against role-chunk-early and batched deltas; the control plane."""

from __future__ import annotations

import time

import httpx
import pytest
from openai import OpenAI

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def client(proxy, **kwargs) -> OpenAI:
    return OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0, timeout=60, **kwargs)


def test_chat_stream_and_non_stream(proxy) -> None:
    c = client(proxy)
    full = c.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=8)
    assert full.choices[0].message.content
    assert full.usage is not None and full.usage.prompt_tokens > 0
    chunks = list(c.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=8, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert all(ch.usage is None for ch in chunks), "the usage chunk the proxy added leaked to the client"
    assert all(ch.choices for ch in chunks)
    with_usage = list(c.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=8, stream=True,
                                                stream_options={"include_usage": True}))
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens > 0
    assert proxy.sample("prefixgate_requests_total", route="chat", status="200") == 3


def test_completions_stream_and_non_stream(proxy) -> None:
    c = client(proxy)
    full = c.completions.create(model="sim", prompt="Once upon a time", max_tokens=8)
    assert full.choices[0].text and full.usage.prompt_tokens > 0
    chunks = list(c.completions.create(model="sim", prompt="Once upon a time", max_tokens=8, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)
    backends = proxy.services.replicas.names()
    ttft = sum(proxy.sample("prefixgate_ttft_seconds_count", route="completions", model="sim", backend=b,
                            prompt_bucket="0-1k") or 0 for b in backends)
    assert ttft == 1  # only the streamed request has a client-side TTFT
    assert proxy.sample("prefixgate_prompt_tokens_total", route="completions", model="sim", tenant="default") > 0


def test_request_id_and_backend_headers(proxy) -> None:
    raw = client(proxy).chat.completions.with_raw_response.create(
        model="sim", messages=MESSAGES, max_tokens=4, extra_headers={"x-request-id": "abc-1"})
    assert raw.headers["x-request-id"] == "abc-1"
    assert raw.headers["x-prefixgate-backend"] in proxy.services.replicas.names()
    matched, total = raw.headers["x-prefixgate-prefix"].split("/")  # from the fingerprint hook
    assert 0 <= int(matched) <= int(total)


def test_ttft_is_content_time_not_role_chunk(sim_factory, proxy_factory) -> None:
    """Role chunk sent at arrival (role_chunk_early) and a slow prefill: TTFT must be the prefill."""
    sim = sim_factory(replicas=1, role_chunk_early=True, prefill_tps=2000, decode_tps=200, time_scale=1.0)
    proxy = proxy_factory(sim, names=["s0"])
    prompt = "alpha beta gamma delta " * 250  # ~1000 tokens -> ~0.5 s of prefill
    chunks = list(client(proxy).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": prompt}], max_tokens=4, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    first_byte = proxy.sample("prefixgate_upstream_first_byte_seconds_sum", route="chat", model="sim", backend="s0")
    buckets = ("0-1k", "1k-4k")
    ttft = sum(proxy.sample("prefixgate_ttft_seconds_sum", route="chat", model="sim", backend="s0", prompt_bucket=b) or 0
               for b in buckets)
    assert ttft > 0.25, ttft
    assert first_byte < ttft / 3, (first_byte, ttft)


def test_decode_rate_sane_with_batched_deltas(sim_factory, proxy_factory) -> None:
    """8 tokens per chunk at 100 tok/s: the decode rate stays ~100, not 12.5 (chunks/s) or 800."""
    sim = sim_factory(replicas=1, deltas_per_chunk=8, decode_tps=100, prefill_tps=100000, time_scale=1.0)
    proxy = proxy_factory(sim, names=["s0"])
    list(client(proxy).chat.completions.create(model="sim", messages=MESSAGES, max_tokens=48, stream=True,
                                               extra_body={"ignore_eos": True}))
    count = proxy.sample("prefixgate_decode_tokens_per_second_count", route="chat", model="sim", backend="s0")
    total = proxy.sample("prefixgate_decode_tokens_per_second_sum", route="chat", model="sim", backend="s0")
    assert count == 1
    assert 50 < total < 200, total


def test_control_plane(proxy) -> None:
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(proxy.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["ready"]
    models = client(proxy).models.list()
    assert [m.id for m in models.data] == ["sim"]
    client(proxy).chat.completions.create(model="sim", messages=MESSAGES, max_tokens=2)
    text = httpx.get(proxy.url + "/metrics").text
    for name in ("prefixgate_request_duration_seconds", "prefixgate_route_decisions_total",
                 "prefixgate_proxy_overhead_seconds", "prefixgate_backend_healthy"):
        assert name in text


def test_readyz_503_without_healthy_replica(proxy_factory) -> None:
    from app.serving import free_port

    proxy = proxy_factory([f"http://127.0.0.1:{free_port()}"])  # nothing listens there
    deadline = time.monotonic() + 10
    while (r := httpx.get(proxy.url + "/readyz")).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not r.json()["ready"]
    r = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "sim", "messages": MESSAGES})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_upstream"


@pytest.mark.parametrize("header,body_user,expected", [
    ({"x-tenant-id": "team-a"}, None, "team-a"),
    ({}, "alice", "alice"),
    ({}, None, "default"),
])
def test_tenant_resolution_reaches_metrics(proxy, header, body_user, expected) -> None:
    extra = {"user": body_user} if body_user else {}
    client(proxy).chat.completions.create(model="sim", messages=MESSAGES, max_tokens=2,
                                          extra_headers=header, **extra)
    assert proxy.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant=expected) > 0


def test_api_keys_required_and_define_the_tenant(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, tenants={"api_keys": {"sk-good": "paying"}})
    with pytest.raises(Exception) as info:
        client(proxy).chat.completions.create(model="sim", messages=MESSAGES, max_tokens=2)
    assert getattr(info.value, "status_code", None) == 401
    assert proxy.sample("prefixgate_rejections_total", route="chat", tenant="unauthenticated", reason="invalid_api_key") == 1
    good = OpenAI(base_url=proxy.base_url, api_key="sk-good", max_retries=0)
    good.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=2,
                                 extra_headers={"x-tenant-id": "someone-else"})
    assert proxy.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant="paying") > 0
    assert proxy.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant="someone-else") is None


def test_sglang_flavor_reasoning_counts_as_first_token(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, flavor="sglang", reasoning_tokens=4, time_scale=0.0)
    proxy = proxy_factory(sim, names=["sg"])
    chunks = list(client(proxy).chat.completions.create(model="sim", messages=MESSAGES, max_tokens=8,
                                                        stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert any(getattr(d, "reasoning_content", None) for d in deltas)
    assert proxy.sample("prefixgate_ttft_seconds_count", route="chat", model="sim", backend="sg", prompt_bucket="0-1k") == 1
    assert proxy.sample("prefixgate_requests_total", route="chat", status="200") == 1
