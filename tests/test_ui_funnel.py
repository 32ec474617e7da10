"""The reuse funnel over concurrent traffic through the gateway (the real openai client, the
proxy, the simulator as the engine): whatever the traffic, no stage exceeds `available`, and every
cached token the engine reports is counted once, as `delivered` (within what was available) or as
`beyond_available` (cached after the proxy looked: an earlier request with the same head still in
flight). docs/ui.md, "The reuse funnel".

Hypothesis draws waves of requests (a wave is sent at once, the waves one after another) over a few
heads, short (tokenised inline) or long (tokenised in the worker pool while in flight, so routed on
a partial chain), each example under a fresh nonce so it starts on a cold fleet."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from app.telemetry.funnel import STAGES

REUSE = "prefixgate_prefix_reuse_tokens_total"
SHORT = " ".join(f"Rule {i}: answer in at most {i % 7 + 2} sentences." for i in range(12))  # ~500 chars
LONG = " ".join(f"Clause {i}: the supplier ships part {i} within {i % 9 + 1} days." for i in range(160))
QUESTIONS = ["How do refunds work?", "Can I return a gift?", "Is shipping refunded?"]

request_st = st.tuples(st.integers(0, 2), st.integers(0, len(QUESTIONS) - 1), st.integers(0, 1))
waves_st = st.lists(st.lists(request_st, min_size=1, max_size=4), min_size=1, max_size=3)
heads_st = st.lists(st.booleans(), min_size=3, max_size=3)  # True: a long head
_nonce = itertools.count()


@pytest.fixture
def funnel_proxy(sim_factory: Any, proxy_factory: Any) -> Any:
    return proxy_factory(sim_factory(replicas=2, time_scale=0.0))


def _stages(proxy: Any) -> dict[str, float]:
    value = proxy.services.metrics.registry.get_sample_value
    return {s: value(REUSE, {"stage": s}) or 0.0 for s in STAGES}


def _engine_cached(proxy: Any) -> float:
    total = 0.0
    for family in proxy.services.metrics.registry.collect():
        if family.name == "prefixgate_cached_tokens":
            total += sum(s.value for s in family.samples
                         if s.name.endswith("_total") and s.labels.get("source") == "engine")
    return total


async def _send(base_url: str, waves: list[list[tuple[int, int, int]]], heads: list[str]) -> int:
    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    sent = 0
    try:
        for wave in waves:
            jobs = [client.chat.completions.create(
                model="sim", max_tokens=4, stream=False,
                messages=[{"role": "system", "content": heads[h]}, {"role": "user", "content": QUESTIONS[q]}],
                extra_headers={"x-tenant-id": f"tenant-{t}"}) for h, q, t in wave]
            for reply in await asyncio.gather(*jobs):
                assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            sent += len(jobs)
    finally:
        await client.close()
    return sent


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(waves=waves_st, long_heads=heads_st)
def test_no_funnel_stage_exceeds_available_and_every_engine_cached_token_is_counted_once(
        funnel_proxy: Any, waves: list[list[tuple[int, int, int]]], long_heads: list[bool]) -> None:
    proxy = funnel_proxy
    nonce = next(_nonce)
    heads = [f"Session {nonce}-{i}. " + (LONG if long else SHORT) for i, long in enumerate(long_heads)]
    before, engine_before = _stages(proxy), _engine_cached(proxy)
    processed = proxy.services.prefix.processed
    sent = asyncio.run(_send(proxy.base_url, waves, heads))
    proxy.settle()
    deadline = time.monotonic() + 10
    while proxy.services.prefix.processed < processed + sent:  # after-response work is a task
        assert time.monotonic() < deadline
        time.sleep(0.01)
    after = _stages(proxy)
    d = {s: after[s] - before[s] for s in STAGES}
    engine = _engine_cached(proxy) - engine_before
    assert d["captured"] <= d["available"], d
    assert d["delivered"] <= d["available"], d
    assert d["delivered"] + d["beyond_available"] == engine, (d, engine)
