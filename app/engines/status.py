"""Per-backend engine status and the one-line verdict operators read first. Pure.

The verdict answers "is the prefix cache even on?" before anything else, because the failure that
costs the most (15 s instead of 1 s TTFT in the seeds) is a cache that is silently off: the flag,
or a model architecture the engine version cannot prefix-cache (hybrid Mamba models), shows up
only as prompt tokens flowing while the engine's cache-query counter stays at zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from app.engines.rates import WindowDeltas
from app.engines.sample import CACHE_QUERIES, PROMPT_TOKENS

# Reasons behind `caching_enabled`.
BY_CONFIG = "config"  # the engine's own config (cache_config_info / server_info)
BY_QUERIES = "queries"  # the engine looked prompts up in its cache during the window
BY_NO_QUERIES = "no_queries"  # prompt tokens flowed, cache queries stayed at 0

FIDELITY_OK = 0.9  # delivered/predicted at or above this: the block model matches the engine
EVICTION_KV_USAGE = 0.85  # KV usage at or above this makes eviction the likelier explanation

CAUSES_FLAG = "prefix caching switched off (vLLM --no-enable-prefix-caching, SGLang --disable-radix-cache)"
CAUSES_ARCH = ("model architecture without prefix-caching support on this engine version "
               "(hybrid attention + Mamba/linear-attention models)")
CAUSES_SKIP = "every request skips the cache lookup (e.g. prompt_logprobs requested)"


@dataclass
class EngineView:
    """What prefixgate knows about one backend's engine; `status()` serves it as JSON."""

    backend: str
    engine: str | None = None  # vllm | sglang | unknown
    stale: bool = True  # no successful scrape yet counts as stale
    error: str | None = None
    scraped_at: float | None = None  # wall clock of the last successful scrape
    hit_ratio: float | None = None
    caching_enabled: bool | None = None
    caching_reason: str | None = None
    off_prompt_tokens_per_s: float | None = None  # prompt rate seen when it was judged OFF
    spec_acceptance_length: float | None = None
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    block_size: int | None = None
    hit_alignment_tokens: int | None = None
    kv_capacity_blocks: int | None = None
    hash_algo: str | None = None
    configured_block_size: int | None = None  # pinned in the proxy's config, if any
    window_s: float | None = None
    window_prompt_tokens: float | None = None
    window_queried_tokens: float | None = None
    prompt_tokens_per_s: float | None = None
    restarts: int = 0
    predicted_tokens: float = 0.0
    delivered_tokens: float = 0.0
    prediction_fidelity: float | None = None
    cache_config: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = verdict(self)
        out["likely_causes"] = likely_causes(self)
        out["fidelity_note"] = fidelity_note(self)
        return out


def decide_caching(configured: bool | None, window: WindowDeltas | None,
                   previous: bool | None, previous_reason: str | None,
                   queries_total: float | None = None) -> tuple[bool | None, str | None]:
    """Is the prefix cache on? Config wins when it says off; otherwise traffic decides; with no
    traffic the previous verdict stands, then the config's "on"; with no evidence the answer is
    unknown (None), which the gauge exports as absent: an engine that merely exports cache
    counters has not shown that they move.

    Off by traffic: prompt tokens flowed in the window, its cache queries did not, and the
    engine's query counter (`queries_total`) has never moved. vLLM counts a request's queries when
    it is scheduled and its prompt tokens when its prefill ends, so a window in which a long
    prefill ended and no new request was scheduled has prompt tokens and no queries with the cache
    on; a cache that is off never counts a query."""
    if configured is False:
        return False, BY_CONFIG
    if window is not None:
        queried, prompt = window.get(CACHE_QUERIES), window.get(PROMPT_TOKENS)
        if queried:
            return True, BY_QUERIES
        if queried == 0 and prompt and not queries_total:
            return False, BY_NO_QUERIES
    if previous is not None and previous_reason != BY_CONFIG:
        return previous, previous_reason
    if configured is True:
        return True, BY_CONFIG
    return None, None  # cache counters alone are no evidence: unknown is absent, never "on"


def _percent(ratio: float) -> str:
    return f"{round(ratio * 100)}%"


def _tokens(value: float) -> str:
    return f"{value:,.0f}"


def _core_verdict(view: EngineView) -> str:
    if view.engine == "unknown":
        return "no vLLM or SGLang metrics at /metrics (is --enable-metrics on for SGLang?)"
    if view.caching_enabled is False:
        if view.caching_reason == BY_CONFIG:
            return "prefix cache OFF: disabled in the engine's config"
        rate = view.off_prompt_tokens_per_s
        flow = f"{_tokens(rate)} prompt tokens/s" if rate is not None else "flowing prompt tokens"
        return f"prefix cache OFF: 0 queries over {flow}"
    if view.caching_enabled is None:
        text = "prefix cache state unknown: no config flag says and no prompt traffic decided it yet"
    elif view.hit_ratio is None:
        text = "prefix cache on, no prompt traffic yet"
    else:
        text = f"prefix cache on, {_percent(view.hit_ratio)} hit"
        if not view.window_queried_tokens:
            text += " (no prompt traffic in the current window)"
    if view.spec_acceptance_length is not None:
        text += f", spec acceptance length {view.spec_acceptance_length:.2f}"
    return text


def verdict(view: EngineView) -> str:
    """One line, e.g. "prefix cache on, 83% hit" or
    "prefix cache OFF: 0 queries over 1,200 prompt tokens/s"."""
    if view.engine is None:
        return f"engine /metrics unreachable: {view.error}" if view.error else "no engine data yet"
    core = _core_verdict(view)
    if view.stale:
        return f"engine metrics stale ({view.error or 'last scrape failed'}); last known: {core}"
    return core


def likely_causes(view: EngineView) -> list[str]:
    """Why the cache is off, most likely first; empty when it is on."""
    if view.caching_enabled is not False:
        return []
    if view.caching_reason == BY_CONFIG:
        return [CAUSES_FLAG]
    return [CAUSES_FLAG, CAUSES_ARCH, CAUSES_SKIP]


def fidelity_note(view: EngineView) -> str | None:
    """Which explanation of delivered < predicted is likelier: eviction or a wrong block model."""
    ratio = view.prediction_fidelity
    if ratio is None:
        return None
    if ratio > 1.0 / FIDELITY_OK:
        return ("engine delivers more than predicted: other clients share this cache, or the "
                "proxy's residency model dropped blocks the engine still holds")
    if ratio >= FIDELITY_OK:
        return "predictions match what the engine delivers"
    engine_unit = view.hit_alignment_tokens or view.block_size
    if view.configured_block_size and engine_unit and view.configured_block_size != engine_unit:
        return (f"wrong block model likelier: the proxy is configured for {view.configured_block_size}-token "
                f"blocks, the engine's hits land on {engine_unit}-token boundaries")
    if view.caching_enabled is False:
        return "the engine's prefix cache is off: every predicted hit is lost"
    if view.kv_usage is not None and view.kv_usage >= EVICTION_KV_USAGE:
        return f"eviction pressure likelier: the engine's KV cache is {_percent(view.kv_usage)} full"
    usage = f"only {_percent(view.kv_usage)} full" if view.kv_usage is not None else "of unknown fill"
    return (f"wrong block model likelier: the KV cache is {usage}, so predicted blocks should still be "
            "resident (check block size, cache_salt, chat template and tokenizer)")
