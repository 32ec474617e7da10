"""The "is the prefix cache on?" decision, the one-line verdict and the fidelity diagnosis."""

from __future__ import annotations

from app.engines.rates import WindowDeltas
from app.engines.sample import CACHE_QUERIES, PROMPT_TOKENS
from app.engines.status import (
    BY_CONFIG,
    BY_NO_QUERIES,
    BY_QUERIES,
    CAUSES_ARCH,
    EngineView,
    decide_caching,
    fidelity_note,
    likely_causes,
    verdict,
)


def window(queried: float, prompt: float, span: float = 5.0) -> WindowDeltas:
    return WindowDeltas(span, {CACHE_QUERIES: queried, PROMPT_TOKENS: prompt})


def test_config_off_wins_over_traffic() -> None:
    assert decide_caching(False, window(1000, 1000), True, BY_QUERIES) == (False, BY_CONFIG)


def test_prompts_without_queries_mean_off() -> None:
    assert decide_caching(True, window(0, 6000), None, None) == (False, BY_NO_QUERIES)
    assert decide_caching(True, window(0, 6000), None, None, queries_total=0.0) == (False, BY_NO_QUERIES)


def test_prompts_without_queries_in_one_window_of_an_engine_that_has_queried_keep_the_verdict() -> None:
    """A long prefill that ended in a window where nothing new was scheduled (vLLM counts queries
    at scheduling, prompt tokens at the end of the prefill)."""
    assert decide_caching(True, window(0, 57_000), True, BY_QUERIES, queries_total=120_000.0) == (True, BY_QUERIES)


def test_queries_mean_on() -> None:
    assert decide_caching(None, window(500, 500), False, BY_NO_QUERIES) == (True, BY_QUERIES)


def test_idle_window_keeps_the_previous_verdict() -> None:
    assert decide_caching(True, window(0, 0), False, BY_NO_QUERIES) == (False, BY_NO_QUERIES)


def test_counters_alone_are_no_evidence() -> None:
    """An engine that exports cache counters but has neither a config flag nor traffic yet: unknown."""
    assert decide_caching(None, None, None, None) == (None, None)
    assert decide_caching(None, window(0, 0), None, None) == (None, None)


def test_verdict_on_with_hit_ratio_and_spec() -> None:
    view = EngineView("b0", engine="vllm", stale=False, hit_ratio=0.834, caching_enabled=True,
                      window_queried_tokens=1000.0, spec_acceptance_length=2.8)
    assert verdict(view) == "prefix cache on, 83% hit, spec acceptance length 2.80"
    assert likely_causes(view) == []


def test_verdict_off_names_the_prompt_rate_and_causes() -> None:
    view = EngineView("b0", engine="vllm", stale=False, caching_enabled=False, caching_reason=BY_NO_QUERIES,
                      off_prompt_tokens_per_s=1200.0)
    assert verdict(view) == "prefix cache OFF: 0 queries over 1,200 prompt tokens/s"
    assert CAUSES_ARCH in likely_causes(view)


def test_verdict_stale_and_unreachable() -> None:
    assert verdict(EngineView("b0", error="timeout")) == "engine /metrics unreachable: timeout"
    view = EngineView("b0", engine="vllm", stale=True, error="timeout", hit_ratio=0.5, caching_enabled=True,
                      window_queried_tokens=10.0)
    assert verdict(view).startswith("engine metrics stale (timeout); last known: prefix cache on, 50% hit")


def test_fidelity_note_picks_eviction_or_block_model() -> None:
    full = EngineView("b0", prediction_fidelity=0.4, kv_usage=0.97, caching_enabled=True)
    assert fidelity_note(full) is not None and fidelity_note(full).startswith("eviction pressure")
    roomy = EngineView("b0", prediction_fidelity=0.4, kv_usage=0.2, caching_enabled=True)
    assert fidelity_note(roomy).startswith("wrong block model")
    pinned = EngineView("b0", prediction_fidelity=0.4, kv_usage=0.97, configured_block_size=16,
                        hit_alignment_tokens=528)
    assert "16-token" in fidelity_note(pinned) and "528" in fidelity_note(pinned)
    assert fidelity_note(EngineView("b0", prediction_fidelity=0.95)).startswith("predictions match")
    assert fidelity_note(EngineView("b0")) is None
