"""`PrefillPrices` (app/routing/prefill_cost.py): a replica's prefill work in reference tokens from
its fitted model, the token count where it has none; and the fits it reads stay current."""

from __future__ import annotations

import pytest

from app.routing.base import Replica
from app.routing.prefill_cost import MIN_TOKEN_PRICE, TOKEN_PRICES, PrefillPrices
from app.routing.scorers import ScoreWeights, replica_costs
from app.telemetry.prefill_model import MIN_SAMPLES, PrefillModels


def cold_samples(models: PrefillModels, replica: str, tps: float, fixed: float = 0.0, n: int = 20) -> None:
    for k in range(n):
        new = 100 + 50 * k
        models.add(replica, new, 0, fixed + new / tps)


def test_without_fits_a_token_costs_a_token() -> None:
    assert TOKEN_PRICES.prefill("a", 1000, 5000) == (1000.0, None)
    assert TOKEN_PRICES.backlog("a", 700.0) == 700.0
    models = PrefillModels(forget=1.0)
    cold_samples(models, "a", 4000.0, n=MIN_SAMPLES - 1)  # too few samples: no fit yet
    assert PrefillPrices(models).prefill("a", 1000, 0) == (1000.0, None)


def test_fitted_replicas_are_priced_against_the_fleet_mean_cost() -> None:
    models = PrefillModels(forget=1.0)
    cold_samples(models, "fast", 8000.0)
    cold_samples(models, "slow", 2000.0)
    prices = PrefillPrices(models)
    reference = (1 / 8000 + 1 / 2000) / 2
    assert models.reference_per_token_s() == pytest.approx(reference)
    value, seconds = prices.prefill("slow", 1000, 0)
    assert seconds == pytest.approx(0.5)
    assert value == pytest.approx(0.5 / reference)  # 1600 reference tokens
    assert prices.backlog("fast", 1000.0) == pytest.approx(1000 * (1 / 8000) / reference)  # 400
    assert prices.prefill("unknown", 1000, 0) == (1000.0, None)  # no fit: the reference rate


def test_the_attention_term_makes_a_long_context_dearer() -> None:
    models = PrefillModels(forget=1.0)
    for k in range(30):
        new, cached = 100 + 70 * k, (k % 5) * 4000
        models.add("a", new, cached, 0.001 + new / 5000 + 1e-9 * new * cached)
    prices = PrefillPrices(models)
    _, short_context = prices.prefill("a", 1000, 0)
    _, long_context = prices.prefill("a", 1000, 16_000)
    assert long_context - short_context == pytest.approx(1e-9 * 1000 * 16_000, rel=1e-3)


def test_a_new_sample_reprices_at_once() -> None:
    """The fit and the reference are kept between samples, never past one."""
    models = PrefillModels(forget=1.0)
    cold_samples(models, "a", 4000.0)
    before = models.fit_of("a")
    assert models.fit_of("a") is before  # kept: no re-solve per routing decision
    cold_samples(models, "a", 1000.0, n=200)
    after = models.fit_of("a")
    assert after is not None and before is not None
    assert after.per_new_token_s > 2 * before.per_new_token_s
    assert models.reference_per_token_s() == pytest.approx(after.per_new_token_s)


def test_scores_order_the_replicas_by_fitted_cost() -> None:
    models = PrefillModels(forget=1.0)
    cold_samples(models, "fast", 8000.0)
    cold_samples(models, "slow", 2000.0)
    fast, slow = Replica("fast", "http://f", queued_prompt_tokens=3000), Replica("slow", "http://s")
    flat = {c.replica.name: c.total for c in replica_costs([fast, slow], {}, 2000, 16, ScoreWeights())}
    assert flat["fast"] > flat["slow"]  # at token prices the queued 3000 tokens decide
    priced = {c.replica.name: c for c in replica_costs([fast, slow], {}, 2000, 16, ScoreWeights(),
                                                       PrefillPrices(models))}
    assert priced["fast"].total < priced["slow"].total  # 5000 tokens at 8k/s beat 2000 at 2k/s
    assert "fitted 1000 ms" in priced["slow"].explain()


def test_a_barely_determined_slope_never_makes_a_replica_free() -> None:
    """A near-zero fitted per-token cost (the fixed cost dominated its samples) is priced at
    MIN_TOKEN_PRICE reference tokens per new token, backlog included."""
    models = PrefillModels(forget=1.0)
    cold_samples(models, "normal", 4000.0)
    cold_samples(models, "flat", 4e7, fixed=0.05)  # 50 ms whatever the size: slope ~0
    prices = PrefillPrices(models)
    assert prices.backlog("flat", 10_000.0) == pytest.approx(10_000 * MIN_TOKEN_PRICE)
    value, _ = prices.prefill("flat", 10_000, 0)
    assert value >= 10_000 * MIN_TOKEN_PRICE
