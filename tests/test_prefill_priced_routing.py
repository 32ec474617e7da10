"""The fitted prefill models price routing and admission (app/routing/prefill_cost.py): the real
proxy over loopback in front of two simulated vLLM replicas (`--enable-per-request-metrics`, so
the ledger feeds each replica's model) that prefill at different, known rates."""

from __future__ import annotations

import httpx
import pytest

from app.telemetry.prefill_model import MIN_SAMPLES
from tests.chat_history import words

FAST_TPS, SLOW_TPS = 20_000.0, 5_000.0
NAMES = ["fast", "slow"]


def stream_chat(client: httpx.Client, text: str) -> str:
    """One streamed chat request (the ledger's prefill part needs the engine's report); its backend."""
    body = {"model": "sim", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": text}]}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_bytes():
            pass
        return resp.headers["x-prefixgate-backend"]


@pytest.fixture
def fitted(sim_factory, proxy_factory):
    """A proxy whose two replicas' prefill models are both fitted from cold prompts of varied sizes
    (~250-2500 tokens; until both are fitted, routing still prices in tokens and hashes them across
    both)."""
    fast = sim_factory(replicas=1, time_scale=1.0, prefill_tps=FAST_TPS, enable_per_request_metrics=True)
    slow = sim_factory(replicas=1, time_scale=1.0, prefill_tps=SLOW_TPS, enable_per_request_metrics=True)
    proxy = proxy_factory([fast.urls[0], slow.urls[0]], names=NAMES,
                          admission={"saturated_prefill_tokens": 4096})
    def samples(name: str) -> float:
        return proxy.sample("prefixgate_prefill_model_samples", backend=name) or 0.0

    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        for i in range(80):
            if all(samples(n) >= MIN_SAMPLES for n in NAMES):
                break
            stream_chat(client, f"warm-up {i}: " + words(1000 + i, 60 + 80 * (i % 8)))
    assert all(samples(n) >= MIN_SAMPLES for n in NAMES)
    return proxy


def test_cold_long_prompts_go_to_the_faster_prefill_replica(fitted) -> None:
    """Token prices make a cold prompt cost the same everywhere, so the cold spread hashes long ones
    across both replicas; priced by the fitted models, the slow replica's prefill of a long prompt
    costs more than one prefill chunk over the fast one's, so every one goes to the fast one."""
    rates = {n: fitted.sample("prefixgate_prefill_model_cold_tokens_per_second", backend=n) for n in NAMES}
    assert rates["fast"] > 2 * rates["slow"]  # the models learned which replica is slower
    with httpx.Client(base_url=fitted.url, timeout=60) as client:
        backends = [stream_chat(client, f"long {i}: " + words(5000 + i, 2500)) for i in range(6)]
    fits = {n: fitted.services.metrics.prefill_models.fit_of(n) for n in NAMES}
    assert backends == ["fast"] * 6, (fits, fitted.services.replicas.all())  # what priced them, if not
    # the short ones still spread: the slow replica is dearer by less than the cold slack
    with httpx.Client(base_url=fitted.url, timeout=60) as client:
        short = {stream_chat(client, f"short {i}: " + words(7000 + i, 40)) for i in range(12)}
    assert short == set(NAMES)


def test_admission_prices_the_backlog_at_the_replicas_fitted_rate(fitted) -> None:
    """`saturated_prefill_tokens` counts a replica's queued prefill at its fitted rate: the same
    queued tokens saturate the slow replica and leave the fast one room."""
    rates = {n: fitted.sample("prefixgate_prefill_model_cold_tokens_per_second", backend=n) for n in NAMES}
    # with fast > 2 x slow the reference prices slow's token above 4/3 and fast's below 2/3
    assert rates["fast"] > 2 * rates["slow"]
    admission = fitted.services.admission
    replicas = {n: fitted.services.replicas.get(n) for n in NAMES}
    queued = 3600  # below the 4096 threshold at token prices
    for r in replicas.values():
        r.queued_prompt_tokens += queued
    try:
        assert admission.room(replicas["fast"])
        assert not admission.room(replicas["slow"])
    finally:
        for r in replicas.values():
            r.queued_prompt_tokens -= queued
