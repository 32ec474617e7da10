"""SGLang (0.5.23) /metrics (+ optional /server_info) -> EngineSample. Pure.

Names (engine-facts.md D.2): declared names already end in `_total`. Scheduler metrics carry
`tp_rank`/`pp_rank`/`dp_rank`; with `--enable-metrics-for-all-schedulers` every tensor-parallel
rank reports the same batch, so only `tp_rank="0"` rows are counted (data-parallel ranks are
summed). The windowed hit ratio comes from `sglang:prefill_effective_tokens_total{mode}`, never
from `sglang:cache_hit_rate`, which covers only the most recent prefill batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.engines.sample import (
    BLOCK_SIZE,
    CACHE_HITS,
    CACHE_QUERIES,
    HIT_ALIGNMENT,
    KV_BLOCKS,
    KV_USAGE,
    PROCESS_START,
    PROMPT_TOKENS,
    RUNNING,
    SPEC_ACCEPT_LENGTH,
    WAITING,
    EngineSample,
    Labels,
    Samples,
    mean,
    parse_bool,
    parse_int,
    put,
    total,
)

EFFECTIVE = "sglang:prefill_effective_tokens_total"
CACHED_BY_SOURCE = "sglang:cached_tokens_total"


def _rank0(labels: Labels) -> bool:
    return labels.get("tp_rank", "0") == "0"


def _hit_mode(labels: Labels) -> bool:
    return _rank0(labels) and labels.get("mode", "").endswith("_hit")


def _cache_counters(samples: Samples) -> tuple[float | None, float | None]:
    """(queried tokens, hit tokens). Preferred: all modes vs *_hit modes of the prefill counter.
    Fallback for builds without it: per-finished-request cached tokens over prompt tokens."""
    queried = total(samples, EFFECTIVE, _rank0)
    if queried is not None:
        return queried, total(samples, EFFECTIVE, _hit_mode) or 0.0
    hits = total(samples, CACHED_BY_SOURCE, lambda lb: _rank0(lb) and lb.get("cache_source") == "total")
    prompt = total(samples, "sglang:prompt_tokens_total", _rank0)
    if hits is None or prompt is None:
        return None, None
    return prompt, hits


def _capacity_tokens(samples: Samples, server_info: Mapping[str, Any]) -> int | None:
    gauge = total(samples, "sglang:max_total_num_tokens", _rank0)
    if gauge is not None:
        return parse_int(str(gauge))
    return parse_int(str(server_info["max_total_num_tokens"])) if "max_total_num_tokens" in server_info else None


def adapt(samples: Samples, server_info: Mapping[str, Any] | None = None) -> EngineSample:
    info = server_info or {}
    counters: dict[str, float] = {}
    queried, hits = _cache_counters(samples)
    put(counters, CACHE_QUERIES, queried)
    put(counters, CACHE_HITS, hits)
    put(counters, PROMPT_TOKENS, total(samples, "sglang:prompt_tokens_total", _rank0))

    gauges: dict[str, float] = {}
    put(gauges, WAITING, total(samples, "sglang:num_queue_reqs", _rank0))
    put(gauges, RUNNING, total(samples, "sglang:num_running_reqs", _rank0))
    put(gauges, KV_USAGE, mean(samples, "sglang:token_usage", _rank0))
    page = total(samples, "sglang:page_size", _rank0)
    page_size = parse_int(str(page)) if page is not None else parse_int(str(info.get("page_size")))
    put(gauges, BLOCK_SIZE, page_size)
    put(gauges, HIT_ALIGNMENT, page_size)  # radix matches are floored to the page size
    capacity = _capacity_tokens(samples, info)
    if capacity is not None and page_size:
        put(gauges, KV_BLOCKS, capacity // page_size)
    accept = mean(samples, "sglang:spec_accept_length", _rank0)
    if accept is not None and accept >= 1.0:  # 0 = no speculative decoding / no data yet
        gauges[SPEC_ACCEPT_LENGTH] = accept

    disabled = parse_bool(str(info["disable_radix_cache"])) if "disable_radix_cache" in info else None
    return EngineSample(
        engine="sglang",
        counters=counters,
        gauges=gauges,
        cache_config={k: str(info[k]) for k in ("disable_radix_cache", "page_size",
                                                 "radix_eviction_policy") if k in info},
        prefix_caching_configured=None if disabled is None else not disabled,
        process_start=total(samples, PROCESS_START),
    )
