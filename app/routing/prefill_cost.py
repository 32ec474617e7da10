"""What a replica's prefill work costs, in the unit the scorers add up: reference prefill tokens.

The scorers (app/routing/scorers.py) and the admission queue's saturation test count prefill work
in tokens, which prices a token the same on every replica. Where a replica's fitted prefill model
(app/telemetry/prefill_model.py, learned from the engine's per-request prefill times) is usable,
`PrefillPrices` prices that replica's work with it instead, in seconds, then turns the seconds back
into tokens at the fleet's reference rate (the mean per-new-token cost of the replicas with a fit):

- a request's own prefill there = fit(new = prompt - predicted hit, cached = predicted hit)
  / reference, so the fixed cost, the cached tokens and the attention term (new x cached) count;
- tokens already queued there (its backlog) = tokens x per_new / reference: the queued requests'
  cached shares are not kept, so the backlog is priced at the replica's cold per-token cost.

A replica without a usable fit (fewer than the model's minimum samples, a per-token cost that is
not positive, or no fit source at all) keeps today's price, one token per token, i.e. it is taken
to prefill at the reference rate. With no fit anywhere every price is the token count, exactly as
before. The other constants in tokens (decode load, waiting requests, the cold slack, the admission
threshold) keep their meaning: tokens at the fleet's (reference) rate.

A fitted new token is never priced below `MIN_TOKEN_PRICE` reference tokens: a slope the samples
barely determine (a replica that only saw short prompts, where the fixed cost dominates) must not
make a replica look free, or its backlog would never count and every long prompt would pile there.

Cost per candidate: two dictionary lookups (the fits are solved at most once per sample).
"""

from __future__ import annotations

from typing import Protocol

from app.telemetry.prefill_model import PrefillFit

MIN_TOKEN_PRICE = 0.125  # a fitted new token costs at least this many reference tokens (8x the mean rate)


class PrefillFits(Protocol):
    """Where the fitted models live (`PrefillModels`, owned by the metrics registry)."""

    def fit_of(self, replica: str) -> PrefillFit | None: ...

    def reference_per_token_s(self) -> float | None: ...


class PrefillPrices:
    """Prices prefill work per replica from its fitted model; the token count where it has none."""

    __slots__ = ("fits",)

    def __init__(self, fits: PrefillFits | None = None) -> None:
        self.fits = fits

    def _fit(self, replica: str) -> tuple[PrefillFit, float] | None:
        """The replica's usable fit and the reference per-token seconds, or None (token prices)."""
        if self.fits is None:
            return None
        fit = self.fits.fit_of(replica)
        if fit is None or fit.per_new_token_s <= 0:
            return None
        reference = self.fits.reference_per_token_s()
        return (fit, reference) if reference is not None and reference > 0 else None

    def prefill(self, replica: str, new: int, cached: int) -> tuple[float, float | None]:
        """(reference tokens, the fitted seconds or None) of prefilling `new` uncached tokens after
        `cached` cached ones on `replica`."""
        priced = self._fit(replica)
        if priced is None:
            return float(new), None
        fit, reference = priced
        seconds = max(0.0, fit.predict(new, cached))
        return max(seconds / reference, MIN_TOKEN_PRICE * new), seconds

    def backlog(self, replica: str, tokens: float) -> float:
        """Reference tokens of `tokens` uncached prompt tokens queued on `replica`."""
        priced = self._fit(replica)
        if priced is None:
            return tokens
        fit, reference = priced
        return tokens * max(fit.per_new_token_s / reference, MIN_TOKEN_PRICE)


TOKEN_PRICES = PrefillPrices()  # no fit source: a token costs a token everywhere (the old estimate)
