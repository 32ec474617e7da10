"""Pure judgement of `prefixgate check`: cache verdict, two-point, naive rate, ladder, exit codes."""

from __future__ import annotations

import pytest

from app.doctor.verdict import (
    EXIT_HEALTHY,
    EXIT_NOT_MEASURED,
    EXIT_PROBLEMS,
    CacheCounters,
    LadderStep,
    cache_verdict,
    exit_code,
    ladder_lengths,
    naive_decode_tps,
    point_stats,
    spread,
    summarize_ladder,
    timing_shape,
    two_point,
)

# The seeds' traces (000): cache off stays flat at ~15.3 s; cache on steps 16.3 -> 1.3 s.
FLAT = [15.266, 15.266, 15.397]
STEP = [16.274, 1.301, 1.284]


def test_timing_shape_step_and_flat() -> None:
    assert timing_shape(STEP)[0] == "step"
    assert timing_shape(STEP)[1] == pytest.approx(16.274 / 1.2925)
    assert timing_shape(FLAT)[0] == "flat"


def test_timing_shape_noisy_when_warm_calls_disagree() -> None:
    # Faster on average but the second warm call is back near cold: not "one step, then flat".
    assert timing_shape([10.0, 2.0, 9.0, 2.0])[0] == "noisy"
    assert timing_shape([1.0])[0] == "none"


def test_millisecond_jitter_after_a_big_step_is_still_flat() -> None:
    assert timing_shape([0.4035, 0.0168, 0.0082])[0] == "step"
    assert timing_shape([0.05, 0.03, 0.012])[0] == "noisy"  # jitter as large as the step


def test_counters_with_zero_queries_mean_off_whatever_the_clock_says() -> None:
    result = cache_verdict(STEP, CacheCounters(queries=0, hits=0))
    assert result.verdict == "off"
    assert "OFF" in result.reasons[0]
    assert any("hybrid" in c for c in result.causes)


def test_queries_without_hits_on_identical_prompt_is_off() -> None:
    assert cache_verdict(FLAT, CacheCounters(queries=24_000, hits=0)).verdict == "off"


def test_hits_and_step_is_on() -> None:
    result = cache_verdict(STEP, CacheCounters(queries=24_000, hits=15_968))
    assert result.verdict == "on"
    assert result.cold_ttft_s == 16.274
    assert result.warm_ttft_s == pytest.approx(1.2925)
    assert result.causes == ()


def test_hits_without_a_visible_step_is_unclear() -> None:
    assert cache_verdict(FLAT, CacheCounters(queries=24_000, hits=15_968)).verdict == "unclear"


def test_timing_only_without_counters() -> None:
    assert cache_verdict(STEP, None).verdict == "on"
    assert cache_verdict(FLAT, None).verdict == "off"
    assert cache_verdict([10.0, 2.0, 9.0, 2.0], None).verdict == "unclear"


def test_config_saying_disabled_is_off_without_counters() -> None:
    result = cache_verdict(STEP, None, prefix_caching_enabled=False)
    assert result.verdict == "off"
    assert any("enable_prefix_caching=False" in r for r in result.reasons)


def test_hit_rate() -> None:
    assert CacheCounters(100, 83).hit_rate == pytest.approx(0.83)
    assert CacheCounters(0, 0).hit_rate is None


def test_spread() -> None:
    assert spread([1.0, 1.1, 1.05]) == pytest.approx(1.1)
    assert spread([]) is None


def test_two_point_recovers_the_seed_numbers() -> None:
    # prefill 14.70 s, decode 103.4 tok/s -> t64 = 14.70 + 64/103.4, t320 = 14.70 + 320/103.4
    t64, t320 = 14.70 + 64 / 103.4, 14.70 + 320 / 103.4
    short = point_stats(64, [(t64 * f, 64) for f in (1.0, 1.01, 0.99, 1.0, 1.0)])
    long = point_stats(320, [(t320 * f, 320) for f in (1.0, 1.02, 0.995, 1.0, 1.0)])
    result = two_point(short, long)
    assert result.decode_tps == pytest.approx(103.4, rel=1e-6)
    assert result.prefill_s == pytest.approx(14.70, rel=1e-6)
    assert result.warnings == ()
    assert short.spread == pytest.approx(1.01 / 0.99)


def test_two_point_warns_loudly_when_token_counts_differ() -> None:
    short = point_stats(64, [(1.0, 64), (1.0, 41), (1.0, 64)])
    long = point_stats(320, [(3.0, 320), (3.0, 320), (3.0, None)])
    result = two_point(short, long)
    assert not short.consistent and not long.consistent
    assert len([w for w in result.warnings if "ignore_eos" in w]) == 2
    assert short.tokens == 64  # falls back to the requested length


def test_two_point_uses_actual_counts_when_they_agree() -> None:
    # An engine that caps every answer at 300 tokens: the slope must use 300, not 320.
    result = two_point(point_stats(64, [(1.0, 64)] * 3), point_stats(320, [(3.36, 300)] * 3))
    assert result.decode_tps == pytest.approx(236 / 2.36)


def test_two_point_clamps_a_slightly_negative_intercept_quietly() -> None:
    # prefill ~0 (cached) and the short point measured a little fast
    result = two_point(point_stats(64, [(0.63, 64)] * 3), point_stats(320, [(3.20, 320)] * 3))
    assert result.prefill_s == 0.0 and result.warnings == ()
    result = two_point(point_stats(64, [(0.3, 64)] * 3), point_stats(320, [(3.20, 320)] * 3))
    assert result.prefill_s == 0.0 and any("negative" in w for w in result.warnings)


def test_two_point_unresolvable() -> None:
    result = two_point(point_stats(64, [(1.0, 64)]), point_stats(320, [(0.9, 320)]))
    assert result.decode_tps is None and result.prefill_s is None
    assert result.warnings


def test_naive_rate_explodes_on_batched_deltas_but_is_right_on_single_ones() -> None:
    # 100 tok/s, one delta per event: 10 ms gaps.
    single = [0.5 + i * 0.01 for i in range(64)]
    assert naive_decode_tps(single) == pytest.approx(100.0)
    # Same rate, 16 deltas flushed together every 160 ms: most gaps are ~0.
    batched = [0.5 + (i // 16) * 0.16 + (i % 16) * 1e-7 for i in range(64)]
    assert naive_decode_tps(batched) > 100_000
    assert naive_decode_tps([0.1, 0.2]) is None


def test_ladder_lengths() -> None:
    assert ladder_lengths(8000, 100_000) == [8000, 16000, 32000, 64000, 100_000]
    assert ladder_lengths(8000, 8000) == [8000]
    assert ladder_lengths(8000, 5000) == [5000]
    assert ladder_lengths(1000, 4000) == [1000, 2000, 4000]
    assert ladder_lengths(1000, 16_376) == [1000, 2000, 4000, 8000, 16_376]  # no 16000 rung
    assert ladder_lengths(0, 4000) == []


def test_ladder_summary_clean_rejection_is_not_a_problem() -> None:
    steps = [LadderStep(1000, 1003, "ok"), LadderStep(2000, 2004, "ok"),
             LadderStep(4000, None, "rejected", "HTTP 400: too long")]
    summary = summarize_ladder(steps, 4000)
    assert summary.ceiling_tokens == 2004
    assert not summary.problem
    assert "rejected" in summary.stopped


def test_ladder_summary_crash_is_a_problem() -> None:
    steps = [LadderStep(1000, 1003, "ok"), LadderStep(2000, None, "unhealthy", "HTTP 500")]
    summary = summarize_ladder(steps, 8000)
    assert summary.ceiling_tokens == 1003
    assert summary.problem
    assert summarize_ladder([LadderStep(1000, 1003, "ok")], 1000).stopped.startswith("reached the cap")


def test_exit_codes() -> None:
    assert exit_code(False, []) == EXIT_NOT_MEASURED == 2
    assert exit_code(True, ["prefix caching is OFF"]) == EXIT_PROBLEMS == 1
    assert exit_code(True, []) == EXIT_HEALTHY == 0


def test_hits_with_every_warm_call_a_step_faster_is_on_though_the_warm_calls_jitter() -> None:
    """A busy machine (the SGLang tier on two shared cores): 3.30 s cold, then 1.12 s and 0.28 s,
    with the engine counting the hits: caching works, the warm calls just disagree."""
    counters = CacheCounters(queries=6000, hits=3982)
    assert timing_shape([3.2951, 1.1215, 0.2789])[0] == "noisy"
    assert cache_verdict([3.2951, 1.1215, 0.2789], counters).verdict == "on"
    assert cache_verdict([3.0, 2.5, 0.3], counters).verdict == "unclear"  # one warm call barely faster
    assert cache_verdict([3.2951, 1.1215, 0.2789], None).verdict == "unclear"  # timing alone: not enough


def test_hits_on_the_whole_prompt_with_most_warm_calls_a_step_faster_is_on() -> None:
    """The SGLang tier's radix replica on two busy cores: 6997 of 7000 tokens cached on each warm
    call and two of three warm calls 3.4x faster; the third waited for the machine."""
    whole = CacheCounters(queries=28_000, hits=3 * 6997)  # 4 calls, the three warm ones all but hit
    assert timing_shape([2.1075, 0.6141, 1.5, 0.6476])[0] == "noisy"
    assert cache_verdict([2.1075, 0.6141, 1.5, 0.6476], whole).verdict == "on"
    assert cache_verdict([2.1075, 1.5, 1.6, 0.6476], whole).verdict == "unclear"  # one of three: not most
    small = CacheCounters(queries=28_000, hits=3 * 2000)  # hits on a shared head only
    assert cache_verdict([2.1075, 0.6141, 1.5, 0.6476], small).verdict == "unclear"
    assert cache_verdict([2.1075, 0.6141, 1.5, 0.6476], None).verdict == "unclear"  # timing alone
