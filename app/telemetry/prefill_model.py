"""A replica's prefill cost, learned online from what the gateway sees (docs/ttft-ledger.md).

The seed-002 form: prefill seconds = fixed + per_new x new + per_cached x cached +
attention x new x cached, where `new` are the prompt tokens the engine computed (prompt - cached)
and `cached` the tokens it read from its prefix cache. The attention term is the new tokens
attending to the cached context.

One more term keeps batching out of those coefficients: an engine step computes the prompt tokens
of every request it schedules, so a short request prefilled beside a long one reports the long
one's time too. `shared` are the other requests' predicted prefill tokens whose wait for a first
byte overlapped this one's on the same replica (app/routing/load.py); its coefficient absorbs
that, and every estimate (`predict`) is of a request prefilled alone (shared = 0). It is an
approximation (an overlapping request may have been queued, or only partly in the same steps), so
its coefficient is a share of the cold per-token cost, never reported as a rate.

Fitted by least squares over exponentially forgotten normal equations (`forget` < 1 keeps
~1/(1-forget) recent samples' weight), solved on demand; the features are in kilo-tokens and the
system is solved standardised (`_solve`). Until the cached columns are identifiable (fewer than
two samples with cached tokens) only fixed + per-new is fitted and the attention coefficient is
unknown (None), never a guess; the shared term likewise joins once two samples overlapped another
request's prefill. Pure: no clock, no I/O.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

K = 1000.0  # feature unit: kilo-tokens
MIN_SAMPLES = 8  # fewer: no estimate at all
UNEXPLAINED_MIN = 1e-4  # a standardised column at most this unexplained by the others: not identifiable
DEFAULT_FORGET = 0.999


@dataclass(frozen=True, slots=True)
class PrefillFit:
    fixed_s: float
    per_new_token_s: float
    per_cached_token_s: float | None  # None: not identifiable yet
    attention_s: float | None  # seconds per (new token x cached token); None: not identifiable yet
    samples: float  # the (forgotten) weight behind the fit
    per_shared_token_s: float | None = None  # seconds per token prefilled beside; None: not fitted

    @property
    def cold_tokens_per_second(self) -> float | None:
        return 1.0 / self.per_new_token_s if self.per_new_token_s > 0 else None

    def predict(self, new: int, cached: int) -> float:
        """Prefill seconds of a prompt with `new` uncached and `cached` cached tokens."""
        t = self.fixed_s + self.per_new_token_s * new
        if self.per_cached_token_s is not None:
            t += self.per_cached_token_s * cached
        if self.attention_s is not None:
            t += self.attention_s * new * cached
        return t


FEATURES = 5  # fixed, new, cached, new x cached, shared
COLD, CACHED, SHARED = (0, 1), (2, 3), (4,)  # the columns of each group


def _features(new: int, cached: int, shared: int) -> list[float]:
    n, c = new / K, cached / K
    return [1.0, n, c, n * c, shared / K]


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The normal equations `a x = b`, solved on the standardised system (unit diagonal) by
    elimination; None when a column is (nearly) a combination of the others: its pivot, the
    share of it the columns before it leave unexplained, is at most UNEXPLAINED_MIN. Without
    that test a near-collinear pair (cached = 16 on every cached sample makes new x cached track
    cached) solves to huge opposite coefficients that predict nonsense away from the samples."""
    size = len(b)
    if any(a[i][i] <= 0 for i in range(size)):
        return None
    d = [a[i][i] ** 0.5 for i in range(size)]
    m = [[a[i][j] / (d[i] * d[j]) for j in range(size)] + [b[i] / d[i]] for i in range(size)]
    for col in range(size):
        if m[col][col] <= UNEXPLAINED_MIN:
            return None
        for r in range(col + 1, size):
            f = m[r][col] / m[col][col]
            for k in range(col, size + 1):
                m[r][k] -= f * m[col][k]
    y = [0.0] * size
    for r in range(size - 1, -1, -1):
        y[r] = (m[r][size] - sum(m[r][k] * y[k] for k in range(r + 1, size))) / m[r][r]
    return [y[i] / d[i] for i in range(size)]


class PrefillModel:
    """One replica's online fit. `add` per observed request; `fit()` solves on demand."""

    __slots__ = ("forget", "xtx", "xty", "weight", "cached_weight", "shared_weight", "_fit", "_stale")

    def __init__(self, forget: float = DEFAULT_FORGET) -> None:
        if not 0 < forget <= 1:
            raise ValueError("forget must be in (0, 1]")
        self.forget = forget
        self.xtx = [[0.0] * FEATURES for _ in range(FEATURES)]
        self.xty = [0.0] * FEATURES
        self.weight = 0.0
        self.cached_weight = 0.0  # weight of samples that read cached tokens
        self.shared_weight = 0.0  # weight of samples prefilled beside other requests
        self._fit: PrefillFit | None = None  # `current()`'s solve, kept until the next sample
        self._stale = True

    def add(self, new: int, cached: int, seconds: float, shared: int = 0) -> None:
        """One request's engine prefill time with `new` computed and `cached` reused tokens,
        `shared` other requests' prefill tokens beside it."""
        if new < 0 or cached < 0 or seconds < 0 or shared < 0:
            return
        x = _features(new, cached, shared)
        lam = self.forget
        for i in range(FEATURES):
            self.xty[i] = lam * self.xty[i] + x[i] * seconds
            row = self.xtx[i]
            for j in range(FEATURES):
                row[j] = lam * row[j] + x[i] * x[j]
        self.weight = lam * self.weight + 1.0
        self.cached_weight = lam * self.cached_weight + (1.0 if cached > 0 else 0.0)
        self.shared_weight = lam * self.shared_weight + (1.0 if shared > 0 else 0.0)
        self._stale = True

    def current(self) -> PrefillFit | None:
        """`fit()`, solved at most once per sample (the router reads it on every request)."""
        if self._stale:
            self._fit, self._stale = self.fit(), False
        return self._fit

    def fit(self) -> PrefillFit | None:
        if self.weight < MIN_SAMPLES:
            return None
        # cached samples: the full form, or nothing (a cold fit would be biased)
        cols = COLD + (CACHED if self.cached_weight >= 2 else ())
        if self.shared_weight >= 2:
            solved = self._fit_columns(cols + SHARED)
            if solved is not None:
                return solved
        return self._fit_columns(cols)  # the shared term collinear with the rest: fitted without it

    def _fit_columns(self, cols: tuple[int, ...]) -> PrefillFit | None:
        """The fit over the feature columns `cols` (None: they are not identifiable)."""
        x = _solve([[self.xtx[i][j] for j in cols] for i in cols], [self.xty[i] for i in cols])
        if x is None:
            return None
        coef = dict(zip(cols, x, strict=True))
        cached = CACHED[0] in coef
        return PrefillFit(coef[0], coef[1] / K, coef[2] / K if cached else None,
                          coef[3] / (K * K) if cached else None, self.weight,
                          coef[4] / K if SHARED[0] in coef else None)


class PrefillModels:
    """One `PrefillModel` per replica (the metrics registry owns this; the recorder feeds it)."""

    def __init__(self, forget: float = DEFAULT_FORGET) -> None:
        self.forget = forget
        self._models: dict[str, PrefillModel] = {}
        self._lock = threading.Lock()  # fed on the event loop, read by the /metrics scrape
        self._reference: float | None = None  # `reference_per_token_s()`, kept until the next sample
        self._reference_stale = True

    def add(self, replica: str, new: int, cached: int, seconds: float, shared: int = 0) -> None:
        with self._lock:
            model = self._models.get(replica)
            if model is None:
                model = self._models[replica] = PrefillModel(self.forget)
            model.add(new, cached, seconds, shared)
            self._reference_stale = True

    def snapshot(self) -> dict[str, tuple[float, PrefillFit | None]]:
        """Every replica's sample weight and current fit (None: not enough to fit yet), each solved
        at most once per sample (the scrape and the router share `current()`'s solve)."""
        with self._lock:
            return {name: (model.weight, model.current()) for name, model in self._models.items()}

    def shared_samples(self, replica: str) -> float:
        """The (forgotten) weight of `replica`'s samples prefilled beside other requests."""
        with self._lock:
            model = self._models.get(replica)
            return model.shared_weight if model is not None else 0.0

    def fit_of(self, replica: str) -> PrefillFit | None:
        """`replica`'s current fit (None: too few samples, or none), solved at most once per sample:
        what routing and admission price prefill work with (app/routing/prefill_cost.py)."""
        with self._lock:
            model = self._models.get(replica)
            return model.current() if model is not None else None

    def reference_per_token_s(self) -> float | None:
        """The mean per-new-token seconds over the replicas with a usable fit (a positive
        per-token cost); None when none has one. Recomputed at most once per sample."""
        with self._lock:
            if self._reference_stale:
                costs = [f.per_new_token_s for f in (m.current() for m in self._models.values())
                         if f is not None and f.per_new_token_s > 0]
                self._reference = sum(costs) / len(costs) if costs else None
                self._reference_stale = False
            return self._reference
