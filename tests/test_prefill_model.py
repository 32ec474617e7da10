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


async def batched_samples() -> list[tuple[int, int, float, int]]:
    """(new, cached, prefill seconds, shared) of requests sent in pairs: a long cold document and
    a short question over an earlier, cached context, admitted into the same engine steps (no
    chunking), so each one's prefill time is both prompts' cost. `shared` is what the gateway
    counts for it (app/routing/load.py): the other request's prefill tokens beside it."""
    engine = SimEngine(SimOptions.from_kwargs(time_scale=0, kv_blocks=65536, max_batch_tokens=1 << 20,
                                              decode_tps=1e9, prefill_tps=PREFILL_TPS, attention_pair_s=ATTENTION,
                                              cached_tps=0))
    engine.start()
    out: list[tuple[int, int, float, int]] = []
    try:
        for k, (doc_len, context) in enumerate((d, c) for d in (2000, 8000, 20000) for c in (1000, 4000, 16000)):
            base = [10 + (k * 7919 + i) % 50_000 for i in range(context)]
            out.append((*await prefill(engine, base), 0))  # alone: warms the context
            doc = SimRequest([60_000 + (k * 31 + i) % 9000 for i in range(doc_len)], 1, ignore_eos=True)
            ask = SimRequest(base + [70_000 + k * 100 + i for i in range(20 + k)], 1, ignore_eos=True)
            for req in (doc, ask):
                engine.prepare(req)
                engine.add(req)
            for req in (doc, ask):
                while not req.finished:
                    await req.event.wait()
                    req.event.clear()
            news = [r.num_prompt_tokens - r.num_cached_tokens for r in (doc, ask)]
            for r, other in zip((doc, ask), reversed(news), strict=True):
                assert r.virtual_first_token is not None
                out.append((r.num_prompt_tokens - r.num_cached_tokens, r.num_cached_tokens,
                            r.virtual_first_token - r.virtual_arrival, other))
    finally:
        await engine.stop()
    return out


async def test_a_request_prefilled_beside_others_is_fitted_apart() -> None:
    """A short cached question batched with a long cold document takes the document's time: the
    shared term takes that apart, so the fit predicts a request prefilled alone (and a break's
    bill) within 5%; fitted without it, the batching is read as a dear cache and the predictions
    are wrong by whole multiples. (The attention coefficient itself is proven on unbatched
    samples above: here the document also pays the question's attention, which `shared` does not
    count.)"""
    samples = await batched_samples()
    assert any(shared and cached for _, cached, _, shared in samples)  # batched cache reads happened
    model, blind = PrefillModel(forget=1.0), PrefillModel(forget=1.0)
    for new, cached, seconds, shared in samples:
        model.add(new, cached, seconds, shared)
        blind.add(new, cached, seconds)
    fit, biased = model.fit(), blind.fit()
    assert fit is not None and fit.per_shared_token_s is not None and biased is not None
    assert fit.cold_tokens_per_second == pytest.approx(PREFILL_TPS, rel=0.05)

    def alone(new: int, cached: int) -> float:
        return new / PREFILL_TPS + ATTENTION * new * cached

    for new, cached in ((20, 16000), (20, 4000), (2640, 16), (5000, 0)):
        assert fit.predict(new, cached) == pytest.approx(alone(new, cached), rel=0.05)
    # a timestamp break's bill: 2640 of 2655 tokens recomputed instead of read
    bill = fit.predict(2655, 16) - fit.predict(15, 2656)
    assert bill == pytest.approx(alone(2655, 16) - alone(15, 2656), rel=0.05)
    blind_bill = biased.predict(2655, 16) - biased.predict(15, 2656)
    assert abs(blind_bill - bill) > 0.5 * bill  # the bias it removes


def test_the_shared_term_waits_for_two_overlapping_samples() -> None:
    model = PrefillModel(forget=1.0)
    for new in range(100, 1000, 100):
        model.add(new, 0, 0.002 + new / 5000)
    model.add(500, 0, 0.002 + (500 + 300) / 5000, shared=300)
    fit = model.fit()
    assert fit is not None and fit.per_shared_token_s is None
    model.add(200, 0, 0.002 + (200 + 600) / 5000, shared=600)
    fit = model.fit()
    assert fit is not None and fit.per_shared_token_s == pytest.approx(1 / 5000)
    assert fit.cold_tokens_per_second == pytest.approx(5000)


def test_cached_samples_that_never_vary_leave_the_cached_terms_unknown() -> None:
    """A replica whose only cached samples read the same 16 tokens with nearly the same new tokens
    (a timestamp tenant's, in `prefixgate demo`), beside short and long cold ones: new x cached
    tracks cached, so those terms are not identifiable. No fit, rather than one whose huge
    opposite coefficients bill a break thousands of seconds (what a pivot test relative to the
    largest diagonal let through)."""
    model = PrefillModel(forget=1.0)
    for k in range(12):
        model.add(27 + k % 3, 0, 0.005 + 0.07 * (k % 2), 1668 * (k % 2))
        model.add(2654 + k % 3, 16, 0.33 + 0.01 * (k % 4) + 0.18 * (k % 3 == 0), 15382 * (k % 3 == 0) + 27)
        if k % 4 == 0:
            model.add(20606, 0, 2.6 + 0.1 * (k % 8 == 0), 1668)
    assert model.fit() is None
