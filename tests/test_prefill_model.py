"""The online prefill model (app/telemetry/prefill_model.py) recovers a simulated replica's known
costs: its cold prefill rate and the attention term that grows with new x cached tokens. The data
are the simulator's own (SimEngine at time_scale 0: its virtual clock advances by each step's
modelled cost, so the timings are exact and independent of CPU load)."""

from __future__ import annotations

import pytest

from app.sim.engine import SimEngine
from app.sim.options import SimOptions
from app.sim.request import SimRequest
from app.telemetry.prefill_model import PrefillModel

PREFILL_TPS = 8000.0
ATTENTION = 2e-9  # seconds per (new token x cached token)


async def prefill(engine: SimEngine, prompt: list[int]) -> tuple[int, int, float]:
    """(new, cached, engine prefill seconds) of one request run alone."""
    req = SimRequest(prompt, 1, ignore_eos=True)
    engine.prepare(req)
    engine.add(req)
    while not req.finished:
        await req.event.wait()
        req.event.clear()
    assert req.virtual_first_token is not None
    cached = req.num_cached_tokens
    return req.num_prompt_tokens - cached, cached, req.virtual_first_token - req.virtual_arrival


async def simulated_samples(**costs: float) -> list[tuple[int, int, float]]:
    engine = SimEngine(SimOptions.from_kwargs(time_scale=0, kv_blocks=65536, max_batch_tokens=1 << 20,
                                              decode_tps=1e9, **costs))
    engine.start()
    out: list[tuple[int, int, float]] = []
    try:
        k = 0
        for context in (0, 1000, 4000, 16000, 32000):
            for tail in (200, 1500, 6000):
                k += 1
                doc = [10 + (k * 7919 + i) % 50_000 for i in range(context)]
                if context:
                    out.append(await prefill(engine, doc))  # cold: warms the context
                out.append(await prefill(engine, doc + [60_000 + (k * 31 + i) % 9000 for i in range(tail)]))
    finally:
        await engine.stop()
    return out


async def test_recovers_the_cold_rate_and_the_attention_term() -> None:
    samples = await simulated_samples(prefill_tps=PREFILL_TPS, attention_pair_s=ATTENTION)
    assert any(c > 10_000 for _, c, _ in samples)  # the attention term really was exercised
    model = PrefillModel(forget=1.0)
    for new, cached, seconds in samples:
        model.add(new, cached, seconds)
    fit = model.fit()
    assert fit is not None and fit.attention_s is not None and fit.cold_tokens_per_second is not None
    assert fit.cold_tokens_per_second == pytest.approx(PREFILL_TPS, rel=0.05)
    assert fit.attention_s == pytest.approx(ATTENTION, rel=0.05)
    assert fit.samples == len(samples)


async def test_default_forgetting_still_recovers_them() -> None:
    samples = await simulated_samples(prefill_tps=PREFILL_TPS, attention_pair_s=ATTENTION)
    model = PrefillModel()
    for new, cached, seconds in samples * 3:
        model.add(new, cached, seconds)
    fit = model.fit()
    assert fit is not None and fit.attention_s is not None
    assert fit.cold_tokens_per_second == pytest.approx(PREFILL_TPS, rel=0.05)
    assert fit.attention_s == pytest.approx(ATTENTION, rel=0.05)


def test_attention_is_unknown_until_cached_samples_exist() -> None:
    model = PrefillModel(forget=1.0)
    for new in range(100, 1000, 100):
        model.add(new, 0, 0.002 + new / 5000)
    fit = model.fit()
    assert fit is not None and fit.attention_s is None and fit.per_cached_token_s is None
    assert fit.cold_tokens_per_second == pytest.approx(5000)
    assert fit.fixed_s == pytest.approx(0.002)
    assert PrefillModel().fit() is None  # no samples: no estimate
