"""Windowed deltas of engine counters, and the ratios built from them. Pure: time is passed in.

Why windows and not lifetime averages: a cache that worked for a day and broke an hour ago still
shows a fine lifetime ratio. Every ratio here is Δnumerator / Δdenominator over the same window,
which is what `rate(a)/rate(b)` gives in PromQL.

Restart invariant: counters only grow while an engine process lives. A decrease of any counter (or
a changed `process_start_time_seconds`) means the engine restarted; the window then starts over
with the new sample as its base, so a delta never spans two processes and is never negative.
The first window after a restart is empty (no delta) rather than a spike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from app.engines.sample import CACHE_HITS, CACHE_QUERIES, PROMPT_TOKENS, SPEC_ACCEPTED, SPEC_DRAFTS


@dataclass(frozen=True)
class WindowDeltas:
    """Counter increases between the window's base sample and its newest sample."""

    span_s: float
    deltas: Mapping[str, float]

    def get(self, key: str) -> float | None:
        return self.deltas.get(key)

    def rate(self, key: str) -> float | None:
        delta = self.deltas.get(key)
        if delta is None or self.span_s <= 0:
            return None
        return delta / self.span_s


class CounterWindow:
    """Counter samples over a sliding window. The base is the newest sample at or before
    `now - window_s`, so once enough history exists a window spans at least `window_s`."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque()
        self._process_start: float | None = None
        self.restarts = 0

    def add(self, t: float, counters: Mapping[str, float], process_start: float | None = None) -> bool:
        """Adds a sample; returns True when it revealed an engine restart."""
        restarted = False
        if self._samples:
            _, last = self._samples[-1]
            moved_start = (process_start is not None and self._process_start is not None
                           and process_start != self._process_start)
            went_down = any(value < last[key] for key, value in counters.items() if key in last)
            restarted = moved_start or went_down
        if restarted:
            self._samples.clear()
            self.restarts += 1
        if process_start is not None:
            self._process_start = process_start
        self._samples.append((t, dict(counters)))
        cutoff = t - self.window_s
        while len(self._samples) >= 2 and self._samples[1][0] <= cutoff:
            self._samples.popleft()
        return restarted

    def reset(self) -> None:
        self._samples.clear()
        self._process_start = None

    def deltas(self) -> WindowDeltas | None:
        """None until two samples of the same process exist."""
        if len(self._samples) < 2:
            return None
        t0, base = self._samples[0]
        t1, newest = self._samples[-1]
        # A counter absent from the base (it appeared mid-window) has no defined delta yet.
        return WindowDeltas(t1 - t0, {k: v - base[k] for k, v in newest.items() if k in base})


def hit_ratio(window: WindowDeltas) -> float | None:
    """Δhits / Δqueried tokens; None when nothing was looked up in the window."""
    queries, hits = window.get(CACHE_QUERIES), window.get(CACHE_HITS)
    if not queries or hits is None:
        return None
    return min(1.0, max(0.0, hits / queries))


def acceptance_length(window: WindowDeltas) -> float | None:
    """vLLM mean acceptance length, bonus token included: 1 + Δaccepted / Δdrafts."""
    drafts, accepted = window.get(SPEC_DRAFTS), window.get(SPEC_ACCEPTED)
    if not drafts or accepted is None:
        return None
    return 1.0 + accepted / drafts


def prompt_tokens_per_s(window: WindowDeltas) -> float | None:
    return window.rate(PROMPT_TOKENS)


class SumWindow:
    """Running sums over a sliding window, in one-second buckets so memory stays bounded by the
    window length whatever the request rate (record() runs once per proxied request)."""

    def __init__(self, window_s: float, bucket_s: float = 1.0) -> None:
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._buckets: deque[list[float]] = deque()  # [bucket start, a, b]

    def add(self, t: float, a: float, b: float) -> None:
        start = t - (t % self.bucket_s)
        if self._buckets and self._buckets[-1][0] == start:
            bucket = self._buckets[-1]
            bucket[1] += a
            bucket[2] += b
        else:
            self._buckets.append([start, a, b])
        self._trim(t)

    def totals(self, now: float) -> tuple[float, float]:
        self._trim(now)
        return sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets)

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._buckets and self._buckets[0][0] + self.bucket_s <= cutoff:
            self._buckets.popleft()
