"""A replica's prefill cost, learned online from what the gateway sees (docs/ttft-ledger.md).

The seed-002 form: prefill seconds = fixed + per_new x new + per_cached x cached +
attention x new x cached, where `new` are the prompt tokens the engine computed (prompt - cached)
and `cached` the tokens it read from its prefix cache. The attention term is the new tokens
attending to the cached context. Fitted by least squares over exponentially forgotten normal
equations (`forget` < 1 keeps ~1/(1-forget) recent samples' weight), solved on demand; the
features are in kilo-tokens so the 4x4 system stays well conditioned. Until the cached columns
are identifiable (fewer than two samples with cached tokens) only fixed + per-new is fitted and
the attention coefficient is unknown (None), never a guess. Pure: no clock, no I/O.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

K = 1000.0  # feature unit: kilo-tokens
MIN_SAMPLES = 8  # fewer: no estimate at all
PIVOT_EPS = 1e-9  # relative pivot below which a system is taken as singular
DEFAULT_FORGET = 0.999


@dataclass(frozen=True, slots=True)
class PrefillFit:
    fixed_s: float
    per_new_token_s: float
    per_cached_token_s: float | None  # None: not identifiable yet
    attention_s: float | None  # seconds per (new token x cached token); None: not identifiable yet
    samples: float  # the (forgotten) weight behind the fit

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


def _features(new: int, cached: int) -> list[float]:
    n, c = new / K, cached / K
    return [1.0, n, c, n * c]


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (near) singular."""
    size = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    scale = max((abs(m[i][i]) for i in range(size)), default=0.0) or 1.0
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= PIVOT_EPS * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, size):
            f = m[r][col] / m[col][col]
            for k in range(col, size + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * size
    for r in range(size - 1, -1, -1):
        x[r] = (m[r][size] - sum(m[r][k] * x[k] for k in range(r + 1, size))) / m[r][r]
    return x


class PrefillModel:
    """One replica's online fit. `add` per observed request; `fit()` solves on demand."""

    __slots__ = ("forget", "xtx", "xty", "weight", "cached_weight", "_fit", "_stale")

    def __init__(self, forget: float = DEFAULT_FORGET) -> None:
        if not 0 < forget <= 1:
            raise ValueError("forget must be in (0, 1]")
        self.forget = forget
        self.xtx = [[0.0] * 4 for _ in range(4)]
        self.xty = [0.0] * 4
        self.weight = 0.0
        self.cached_weight = 0.0  # weight of samples that read cached tokens
        self._fit: PrefillFit | None = None  # `current()`'s solve, kept until the next sample
        self._stale = True

    def add(self, new: int, cached: int, seconds: float) -> None:
        """One request's engine prefill time with `new` computed and `cached` reused tokens."""
        if new < 0 or cached < 0 or seconds < 0:
            return
        x = _features(new, cached)
        lam = self.forget
        for i in range(4):
            self.xty[i] = lam * self.xty[i] + x[i] * seconds
            row = self.xtx[i]
            for j in range(4):
                row[j] = lam * row[j] + x[i] * x[j]
        self.weight = lam * self.weight + 1.0
        self.cached_weight = lam * self.cached_weight + (1.0 if cached > 0 else 0.0)
        self._stale = True

    def current(self) -> PrefillFit | None:
        """`fit()`, solved at most once per sample (the router reads it on every request)."""
        if self._stale:
            self._fit, self._stale = self.fit(), False
        return self._fit

    def fit(self) -> PrefillFit | None:
        if self.weight < MIN_SAMPLES:
            return None
        if self.cached_weight >= 2:  # cached samples: the full form, or nothing (a cold fit would be biased)
            full = _solve(self.xtx, self.xty)
            if full is None:
                return None
            a, b, c, d = full
            return PrefillFit(a, b / K, c / K, d / (K * K), self.weight)
        cold = _solve([row[:2] for row in self.xtx[:2]], self.xty[:2])
        if cold is None:
            return None
        return PrefillFit(cold[0], cold[1] / K, None, None, self.weight)


class PrefillModels:
    """One `PrefillModel` per replica (the metrics registry owns this; the recorder feeds it)."""

    def __init__(self, forget: float = DEFAULT_FORGET) -> None:
        self.forget = forget
        self._models: dict[str, PrefillModel] = {}
        self._lock = threading.Lock()  # fed on the event loop, read by the /metrics scrape
        self._reference: float | None = None  # `reference_per_token_s()`, kept until the next sample
        self._reference_stale = True

    def add(self, replica: str, new: int, cached: int, seconds: float) -> None:
        with self._lock:
            model = self._models.get(replica)
            if model is None:
                model = self._models[replica] = PrefillModel(self.forget)
            model.add(new, cached, seconds)
            self._reference_stale = True

    def snapshot(self) -> dict[str, tuple[float, PrefillFit | None]]:
        """Every replica's sample weight and current fit (None: not enough to fit yet)."""
        with self._lock:
            return {name: (model.weight, model.fit()) for name, model in self._models.items()}

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
