"""Admission on every route that carries a prompt (chat, completions, /v1/messages, /v1/responses),
through the real gateway on loopback, the real `openai` and `anthropic` clients and the simulator:
each route reserves the same prompt-token estimate and refuses in its own API's shape (OpenAI's
429 / 503, Anthropic's 429 `rate_limit_error` / 529 `overloaded_error`, docs/admission.md)."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.chat_history import words

PROMPT = "Summarise these notes: " + words(17, 200)
TOKENS_PER_MIN = 100_000


def _openai(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)


def _anthropic(proxy: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)


def _call(route: str, proxy: Any) -> tuple[Any, int]:
    """One admitted request on `route`: (its raw response, the prompt tokens the engine counted)."""
    if route == "chat":
        raw = _openai(proxy).chat.completions.with_raw_response.create(
            model="sim", messages=[{"role": "user", "content": PROMPT}], max_tokens=4)
        return raw, raw.parse().usage.prompt_tokens
    if route == "completions":
        raw = _openai(proxy).completions.with_raw_response.create(model="sim", prompt=PROMPT, max_tokens=4)
        return raw, raw.parse().usage.prompt_tokens
    if route == "responses":
        raw = _openai(proxy).responses.with_raw_response.create(model="sim", input=PROMPT, max_output_tokens=4)
        return raw, raw.parse().usage.input_tokens
    raw = _anthropic(proxy).messages.with_raw_response.create(
        model="sim", max_tokens=4, messages=[{"role": "user", "content": PROMPT}])
    usage = raw.parse().usage
    # Anthropic splits the prompt: uncached input + cache reads + cache writes
    return raw, usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


ROUTES = ["chat", "completions", "responses", "messages"]


@pytest.mark.parametrize("route", ROUTES)
def test_every_prompt_route_reserves_the_prompt_estimate_and_refuses_in_its_shape(route, proxy_factory, sim):
    # one request per 5 s: the bucket holds one, and nothing refills while the test runs
    proxy = proxy_factory(sim, tenants={"default": {"limits": {"requests_per_s": 0.2,
                                                               "prompt_tokens_per_min": TOKENS_PER_MIN}}})
    first, prompt_tokens = _call(route, proxy)
    anthropic_route = route == "messages"
    left = "anthropic-ratelimit-input-tokens-remaining" if anthropic_route else "x-ratelimit-remaining-tokens"
    # the bucket starts full: what is left is the limit minus this request's reserved estimate,
    # the fingerprint's token count, which here equals what the engine counted
    assert TOKENS_PER_MIN - int(first.headers[left]) == prompt_tokens
    with pytest.raises(anthropic.RateLimitError if anthropic_route else openai.RateLimitError) as err:
        _call(route, proxy)
    resp = err.value.response
    assert resp.status_code == 429 and int(resp.headers["retry-after"]) >= 1
    if anthropic_route:
        body = resp.json()
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        # the wait left of the 5 s refill (less by the time the first call took on a busy box)
        assert re.fullmatch(r"Rate limit reached for tenant default on requests per second\. "
                            r"Please try again in [1-5]s\.", body["error"]["message"]), body
        assert resp.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert resp.headers["anthropic-ratelimit-requests-remaining"] == "0"
        reset = datetime.fromisoformat(resp.headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00"))
        assert 0 <= (reset - datetime.now(UTC)).total_seconds() <= 6
        assert resp.headers["anthropic-ratelimit-input-tokens-limit"] == str(TOKENS_PER_MIN)
        assert not [h for h in resp.headers if h.startswith("x-ratelimit-")]
    else:
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"
        assert resp.headers["x-ratelimit-remaining-requests"] == "0"
        assert not [h for h in resp.headers if h.startswith("anthropic-ratelimit-")]
    assert proxy.sample("prefixgate_admission_rejections_total", tenant="default", reason="requests_per_s") == 1
    assert proxy.sample("prefixgate_requests_total", route=route, status="429") == 1


def _saturate(proxy: Any, done: threading.Event) -> None:
    """Start a long stream and return once the proxy counts it in flight (a fixed sleep is too
    short on a busy machine: the next request would find the replica free and never queue)."""
    threading.Thread(target=_occupy, args=(proxy, done)).start()
    deadline = time.monotonic() + 10
    while not any(r.inflight >= 1 for r in proxy.services.replicas.all()):
        assert time.monotonic() < deadline, "the occupying stream never reached the replica"
        time.sleep(0.01)


def _occupy(proxy: Any, done: threading.Event) -> None:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 15,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        http.post("/v1/chat/completions", json=body)
    done.set()


def test_queue_shed_on_messages_is_anthropics_529_overloaded_error(proxy_factory, sim_factory):
    slow = sim_factory(replicas=1, time_scale=1.0, decode_tps=10.0)
    proxy = proxy_factory(slow, admission={"queue": {"max_depth": 4, "ttl_s": 0.3}, "saturated_inflight": 1})
    done = threading.Event()
    _saturate(proxy, done)
    start = time.monotonic()
    with pytest.raises(anthropic.OverloadedError) as err:
        _anthropic(proxy).messages.create(model="sim", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    waited = time.monotonic() - start
    resp = err.value.response
    assert resp.status_code == 529 and int(resp.headers["retry-after"]) >= 1 and waited >= 0.3
    assert resp.json() == {"type": "error", "error": {"type": "overloaded_error",
                                                      "message": "Queued 0.3s for a free replica; retry shortly."}}
    done.wait(30)
    assert proxy.sample("prefixgate_admission_rejections_total", tenant="default", reason="queue_ttl") == 1
    assert proxy.sample("prefixgate_requests_total", route="messages", status="529") == 1


@pytest.mark.parametrize("route", ["chat", "completions", "responses"])
def test_every_openai_route_waits_in_the_queue_then_sheds_503(route, proxy_factory, sim_factory):
    """A route that skipped the queue would be forwarded at once onto the saturated replica
    (/v1/messages: the test above)."""
    slow = sim_factory(replicas=1, time_scale=1.0, decode_tps=10.0)
    proxy = proxy_factory(slow, admission={"queue": {"max_depth": 4, "ttl_s": 0.3}, "saturated_inflight": 1})
    done = threading.Event()
    _saturate(proxy, done)
    with pytest.raises(openai.InternalServerError) as err:
        _call(route, proxy)
    assert err.value.response.status_code == 503
    assert err.value.response.json()["error"]["code"] == "queue_timeout"
    done.wait(30)
    assert proxy.sample("prefixgate_admission_rejections_total", tenant="default", reason="queue_ttl") == 1
