"""Pure judgement for `prefixgate check`: cache verdict, two-point prefill/decode, length ladder,
exit code. No I/O here, so every rule is unit-tested without a server.

The method (the seeds, 000): send the same prompt several times — a working prefix cache shows
one step down after the first call and then stays flat; no cache stays flat from the start.
Engine counters decide when they exist (0 queries means the cache code path never ran); timing
decides when they do not. Decode speed comes from two prompt-identical requests that differ only
in forced output length, so prefill cancels and the server's chunking of deltas cannot matter.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["on", "off", "unclear"]

# Cold / median(warm) at or above this is "one step down" (the seed saw 12x at 234k tokens; the
# smallest useful probes still show ~2x, so 1.5 separates a step from noise).
STEP_RATIO = 1.5
# Cold / median(warm) below this is "flat": the repeats gained nothing.
FLAT_RATIO = 1.2
# Warm repeats must agree within this max/min to count as "then flat".
WARM_SPREAD_MAX = 1.5
# ...or vary by at most this fraction of the step (cold − median warm).
WARM_JITTER_OF_STEP = 0.25
# The engine counted hits on at least this share of what the warm calls could hit (every token of
# their prompts): each warm call found nearly the whole prompt cached.
WHOLE_PROMPT_HITS = 0.9

NEGATIVE_PREFILL_TOLERANCE = 0.1  # of the short point's time: beyond it the points disagree
NAIVE_MIN_GAP_S = 1e-6  # floor for the naive rate's median gap (batched deltas arrive together)

EXIT_HEALTHY = 0
EXIT_PROBLEMS = 1
EXIT_NOT_MEASURED = 2

OFF_CAUSES = (
    "the engine was started without it (vLLM --no-enable-prefix-caching, SGLang --disable-radix-cache)",
    "the engine turned it off itself: look for enable_prefix_caching=False in the startup log or in "
    "vllm:cache_config_info; hybrid (Mamba / linear-attention / GDN) models on an engine version "
    "without prefix-caching support for that architecture do this, and no flag fixes it (upgrade)",
    "something between you and the engine changes the prompt's first tokens on every call "
    "(a proxy adding a timestamp or request id at the top)",
)


@dataclass(frozen=True)
class CacheCounters:
    """Prefix-cache lookups over the probe, in tokens (vLLM queries/hits, SGLang effective tokens)."""

    queries: float
    hits: float

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


@dataclass(frozen=True)
class CacheVerdict:
    verdict: Verdict
    cold_ttft_s: float | None
    warm_ttft_s: float | None
    ratio: float | None  # cold / median(warm)
    shape: Literal["step", "flat", "noisy", "none"]
    reasons: tuple[str, ...] = ()
    causes: tuple[str, ...] = ()  # likely causes when the verdict is "off"


def spread(values: Sequence[float]) -> float | None:
    """max/min of positive samples: 1.00 is perfectly steady (the seed's "spread 1.01")."""
    positive = [v for v in values if v > 0]
    if not positive:
        return None
    return max(positive) / min(positive)


def timing_shape(ttfts: Sequence[float]) -> tuple[Literal["step", "flat", "noisy", "none"], float | None]:
    """Classify cold-then-warm TTFTs: `step` (one step down, then flat), `flat` (no gain) or `noisy`."""
    if len(ttfts) < 2 or ttfts[0] <= 0:
        return "none", None
    warm = list(ttfts[1:])
    warm_median = statistics.median(warm)
    if warm_median <= 0:
        return "none", None
    ratio = ttfts[0] / warm_median
    warm_spread = spread(warm) or 1.0
    # "Then flat": the warm calls agree with each other, relatively or compared with the step
    # itself (millisecond warm TTFTs jitter by 2x and are still flat next to a 400 ms step).
    flat_after = warm_spread <= WARM_SPREAD_MAX or (
        max(warm) - min(warm) <= WARM_JITTER_OF_STEP * (ttfts[0] - warm_median))
    if ratio >= STEP_RATIO and flat_after and max(warm) * FLAT_RATIO <= ttfts[0]:
        return "step", ratio
    if ratio < FLAT_RATIO:
        return "flat", ratio
    return "noisy", ratio


def cache_verdict(
    ttfts: Sequence[float],
    counters: CacheCounters | None,
    prefix_caching_enabled: bool | None = None,
) -> CacheVerdict:
    """Decide on/off/unclear from the repeated-prompt TTFTs and the engine's counter deltas.

    Counters outrank timing: zero queries (or queries but zero hits on an identical prompt) is a
    cache that did not run, whatever the clock says. With hits, the timing must also show the
    step, or every warm call must be a clear step (`STEP_RATIO`) faster than the cold one when the
    warm calls jitter among themselves — most of them, when the engine found nearly the whole
    prompt cached on the warm calls; hits without that is "unclear" (prefill too short to matter,
    or hits too small). Without counters the timing alone decides, and a noisy trace is "unclear".
    """
    cold = ttfts[0] if ttfts else None
    warm = statistics.median(ttfts[1:]) if len(ttfts) > 1 else None
    shape, ratio = timing_shape(ttfts)
    reasons: list[str] = []
    timing_text = {
        "step": f"warm calls {ratio:.1f}x faster than the cold one, then flat" if ratio else "",
        "flat": "repeating the same prompt did not make it faster (flat)",
        "noisy": f"warm calls {ratio:.2f}x faster but the trace is not one clean step" if ratio else "",
        "none": "not enough timed calls to judge",
    }[shape]
    reasons.append(timing_text)
    if prefix_caching_enabled is False:
        reasons.append("cache_config_info reports enable_prefix_caching=False")

    if counters is not None:
        if counters.queries <= 0:
            reasons.insert(0, "0 prefix-cache queries: prefix caching is OFF (the code path never ran)")
            return CacheVerdict("off", cold, warm, ratio, shape, tuple(reasons), OFF_CAUSES)
        if counters.hits <= 0:
            reasons.insert(0, f"{counters.queries:.0f} tokens looked up, 0 hits on an identical prompt")
            return CacheVerdict("off", cold, warm, ratio, shape, tuple(reasons), OFF_CAUSES)
        rate = counters.hit_rate or 0.0
        reasons.insert(0, f"engine hit rate over the probe {rate:.1%}")
        if shape == "step":
            return CacheVerdict("on", cold, warm, ratio, shape, tuple(reasons))
        if shape == "noisy" and cold is not None and max(ttfts[1:]) * STEP_RATIO <= cold:
            # the engine counted the hits and every warm call was a clear step faster: the warm
            # calls disagree with each other (a busy machine), not with the cache
            reasons.append(f"every warm call at least {STEP_RATIO:g}x faster than the cold one; "
                           "the engine's counters confirm the hits")
            return CacheVerdict("on", cold, warm, ratio, shape, tuple(reasons))
        if shape == "noisy" and cold is not None and _whole_prompt_hits(counters, len(ttfts)):
            stepped = sum(1 for t in ttfts[1:] if t * STEP_RATIO <= cold)
            if 2 * stepped > len(ttfts) - 1:
                # nearly every warm token was a hit and most warm calls show the step: the slow
                # one waited for the machine (two busy cores: a warm call at 3x its siblings)
                reasons.append(f"{stepped} of {len(ttfts) - 1} warm calls at least {STEP_RATIO:g}x faster "
                               "than the cold one, and the engine found nearly the whole prompt cached "
                               "on the warm calls")
                return CacheVerdict("on", cold, warm, ratio, shape, tuple(reasons))
        reasons.append("the engine reports hits but the clock shows no clear gain: use a longer --prompt-tokens")
        return CacheVerdict("unclear", cold, warm, ratio, shape, tuple(reasons))

    if prefix_caching_enabled is False:
        return CacheVerdict("off", cold, warm, ratio, shape, tuple(reasons), OFF_CAUSES)
    reasons.append("no engine counters: judged by timing only")
    if shape == "step":
        return CacheVerdict("on", cold, warm, ratio, shape, tuple(reasons))
    if shape == "flat":
        return CacheVerdict("off", cold, warm, ratio, shape, tuple(reasons), OFF_CAUSES)
    return CacheVerdict("unclear", cold, warm, ratio, shape, tuple(reasons))


def _whole_prompt_hits(counters: CacheCounters, calls: int) -> bool:
    """The probe's hits cover nearly every token the warm calls sent (the cold call can hit nothing)."""
    if calls < 2 or counters.queries <= 0:
        return False
    return counters.hits >= WHOLE_PROMPT_HITS * counters.queries * (calls - 1) / calls


@dataclass(frozen=True)
class PointStats:
    """One point of the two-point method: several identical requests with forced output length."""

    max_tokens: int
    median_s: float
    spread: float | None
    completion_tokens: tuple[int | None, ...]

    @property
    def consistent(self) -> bool:
        """Every repeat returned the same, known completion-token count (ignore_eos honoured)."""
        return len(set(self.completion_tokens)) == 1 and None not in self.completion_tokens

    @property
    def tokens(self) -> int:
        """Output tokens to use in the slope: the agreed count, else the requested max_tokens."""
        if self.consistent and self.completion_tokens[0]:
            return int(self.completion_tokens[0])
        return self.max_tokens


def point_stats(max_tokens: int, samples: Sequence[tuple[float, int | None]]) -> PointStats:
    times = [t for t, _ in samples]
    return PointStats(max_tokens, statistics.median(times), spread(times), tuple(n for _, n in samples))


@dataclass(frozen=True)
class TwoPoint:
    short: PointStats
    long: PointStats
    decode_tps: float | None
    prefill_s: float | None
    warnings: tuple[str, ...] = field(default=())


def two_point(short: PointStats, long: PointStats) -> TwoPoint:
    """decode tok/s = (n_long − n_short) / (t_long − t_short); prefill ≈ t_short − n_short / decode.

    Prefill appears identically in both points and cancels; only wall-clock end times are used,
    so batched or coalesced SSE deltas cannot distort it.
    """
    warnings: list[str] = []
    for point in (short, long):
        if not point.consistent:
            counts = ", ".join("?" if n is None else str(n) for n in point.completion_tokens)
            warnings.append(
                f"max_tokens={point.max_tokens}: completion token counts differ or are missing "
                f"across repeats ({counts}) — ignore_eos may not be honoured; the slope is unreliable"
            )
    dt = long.median_s - short.median_s
    dn = long.tokens - short.tokens
    if dt <= 0 or dn <= 0:
        warnings.append("the longer answer was not slower: decode too fast to resolve at these lengths")
        return TwoPoint(short, long, None, None, tuple(warnings))
    decode = dn / dt
    prefill = short.median_s - short.tokens / decode
    if prefill < 0:
        # A cached prompt's prefill is ~0 and noise makes the intercept slightly negative: that is
        # expected. A large negative intercept means the two points are not comparable.
        if -prefill > NEGATIVE_PREFILL_TOLERANCE * short.median_s:
            warnings.append("strongly negative prefill intercept: the two points disagree (noisy endpoint?)")
        prefill = 0.0
    return TwoPoint(short, long, decode, prefill, tuple(warnings))


def naive_decode_tps(event_times: Sequence[float]) -> float | None:
    """The method that fools people: one token per SSE event, rate = 1 / median inter-event gap.

    Shown next to the two-point rate as a warning sign: when a server batches deltas, most gaps
    are ~0 and this reports absurd speeds (the seed's 460,000 tok/s).
    """
    if len(event_times) < 3:
        return None
    gaps = [b - a for a, b in zip(event_times, event_times[1:], strict=False)]
    return 1.0 / max(statistics.median(gaps), NAIVE_MIN_GAP_S)


# ---- length ladder -------------------------------------------------------------------------

LadderOutcome = Literal["ok", "rejected", "failed", "unhealthy"]


# A rung this close to the cap is dropped: the cap itself is the next rung anyway.
LADDER_NEAR_CAP = 0.9


def ladder_lengths(start: int, cap: int, factor: float = 2.0) -> list[int]:
    """Prompt lengths to climb: start, start·factor, … and always the cap itself as the last rung."""
    if cap <= 0 or start <= 0:
        return []
    start = min(start, cap)
    lengths: list[int] = []
    n = float(start)
    while int(n) < cap * LADDER_NEAR_CAP:
        lengths.append(int(n))
        n *= factor
    lengths.append(cap)
    return lengths


@dataclass(frozen=True)
class LadderStep:
    target_tokens: int
    prompt_tokens: int | None
    outcome: LadderOutcome
    detail: str = ""
    seconds: float | None = None


@dataclass(frozen=True)
class LadderSummary:
    ceiling_tokens: int | None
    stopped: str  # why the climb ended
    problem: bool  # a crash or an unhealthy engine (a clean "too long" rejection is not one)


def summarize_ladder(steps: Sequence[LadderStep], cap: int) -> LadderSummary:
    """The ceiling worth advertising is the last length that passed, not the configured maximum."""
    ceiling: int | None = None
    for step in steps:
        if step.outcome != "ok":
            problem = step.outcome in ("failed", "unhealthy")
            what = {
                "rejected": "rejected as too long",
                "failed": "request failed",
                "unhealthy": "engine unhealthy afterwards",
            }[step.outcome]
            return LadderSummary(ceiling, f"{what} at ~{step.target_tokens} tokens: {step.detail}".rstrip(": "),
                                 problem)
        ceiling = step.prompt_tokens or step.target_tokens
    if not steps:
        return LadderSummary(None, "no rungs to climb", False)
    return LadderSummary(ceiling, f"reached the cap ({cap} tokens)", False)


def exit_code(measured: bool, problems: Sequence[str]) -> int:
    if not measured:
        return EXIT_NOT_MEASURED
    return EXIT_PROBLEMS if problems else EXIT_HEALTHY
