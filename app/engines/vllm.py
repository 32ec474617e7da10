"""vLLM (V1, 0.32/0.33) /metrics -> EngineSample. Pure: parsed samples in, canonical numbers out.

Names (engine-facts.md C): counters are declared without `_total` and exported with it; every core
metric carries `model_name` and `engine` (the data-parallel engine index), so counters and queue
gauges are summed over engines and KV usage is averaged. `vllm:cache_config_info` is an info gauge
whose labels are the CacheConfig fields, all as strings ("True", "None", "27306").
"""

from __future__ import annotations

from app.engines.sample import (
    BLOCK_SIZE,
    CACHE_HITS,
    CACHE_QUERIES,
    HIT_ALIGNMENT,
    KV_BLOCKS,
    KV_RESERVED_BLOCKS,
    KV_USAGE,
    PROCESS_START,
    PROMPT_TOKENS,
    RUNNING,
    SPEC_ACCEPTED,
    SPEC_DRAFTS,
    WAITING,
    EngineSample,
    Samples,
    first_labels,
    mean,
    parse_bool,
    parse_int,
    put,
    total,
)

CACHE_CONFIG_INFO = "vllm:cache_config_info"

# (current name, pre-rename name); the old ones are gone in 0.33 but cost nothing to accept.
_COUNTERS: dict[str, tuple[str, ...]] = {
    CACHE_QUERIES: ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    CACHE_HITS: ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
    SPEC_DRAFTS: ("vllm:spec_decode_num_drafts_total",),
    SPEC_ACCEPTED: ("vllm:spec_decode_num_accepted_tokens_total",),
}


def _first_total(samples: Samples, names: tuple[str, ...]) -> float | None:
    for name in names:
        value = total(samples, name)
        if value is not None:
            return value
    return None


def _kv_pools(samples: Samples) -> dict[str, int]:
    """num_gpu_blocks per data-parallel engine (each has its own pool)."""
    per_engine: dict[str, int] = {}
    for labels, _ in samples.get(CACHE_CONFIG_INFO) or []:
        blocks = parse_int(labels.get("num_gpu_blocks"))
        if blocks is not None:
            per_engine[labels.get("engine", "0")] = blocks
    return per_engine


def adapt(samples: Samples) -> EngineSample:
    counters: dict[str, float] = {}
    for key, names in _COUNTERS.items():
        put(counters, key, _first_total(samples, names))

    gauges: dict[str, float] = {}
    put(gauges, WAITING, total(samples, "vllm:num_requests_waiting"))
    put(gauges, RUNNING, total(samples, "vllm:num_requests_running"))
    put(gauges, KV_USAGE, mean(samples, "vllm:kv_cache_usage_perc")
        if "vllm:kv_cache_usage_perc" in samples else mean(samples, "vllm:gpu_cache_usage_perc"))

    config = first_labels(samples, CACHE_CONFIG_INFO) or {}
    block_size = parse_int(config.get("block_size"))
    # Hits land on cache_hit_alignment_tokens (hybrid models: hundreds of tokens); older
    # releases lack the label and hash at block_size (engine-facts.md A.2).
    alignment = (parse_int(config.get("cache_hit_alignment_tokens"))
                 or parse_int(config.get("hash_block_size")) or block_size)
    put(gauges, BLOCK_SIZE, block_size)
    put(gauges, HIT_ALIGNMENT, alignment)
    pools = _kv_pools(samples)
    if pools:
        put(gauges, KV_BLOCKS, sum(pools.values()))
        # each pool's block 0 is vLLM's null block (BlockPool): never handed out, never cached
        put(gauges, KV_RESERVED_BLOCKS, len(pools))

    algo = config.get("prefix_caching_hash_algo")
    return EngineSample(
        engine="vllm",
        counters=counters,
        gauges=gauges,
        cache_config=config,
        prefix_caching_configured=parse_bool(config.get("enable_prefix_caching")),
        hash_algo=algo if algo and algo != "None" else None,
        process_start=total(samples, PROCESS_START),
    )
