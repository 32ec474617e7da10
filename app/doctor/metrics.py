"""Read an engine's /metrics for the doctor: which engine, is it busy, prefix-cache counters.

Names (engine-facts C and D): vLLM `vllm:num_requests_running|waiting`,
`vllm:prefix_cache_queries_total|hits_total` (tokens; `gpu_` prefix on old versions) and the info
gauge `vllm:cache_config_info{block_size, enable_prefix_caching, …}`; SGLang
`sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:prefill_effective_tokens_total{mode}`
(hits = *_hit modes, queries = all modes) and `sglang:page_size`. The name mapping is the
engine-metrics adapters' (app/engines/vllm.py, sglang.py), reused here so it lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from app.doctor.verdict import CacheCounters
from app.engines import sglang, vllm
from app.engines.sample import (
    BLOCK_SIZE,
    CACHE_HITS,
    CACHE_QUERIES,
    RUNNING,
    WAITING,
    EngineSample,
    detect_engine,
    parse_exposition,
    total,
)


@dataclass(frozen=True)
class EngineSnapshot:
    engine: str  # vllm | sglang | prefixgate | unknown
    running: float | None = None
    waiting: float | None = None
    queries: float | None = None  # prefix-cache lookups, tokens
    hits: float | None = None
    block_size: int | None = None
    prefix_caching_enabled: bool | None = None

    @property
    def busy(self) -> bool:
        return (self.running or 0) > 0 or (self.waiting or 0) > 0


def _from_sample(sample: EngineSample) -> EngineSnapshot:
    block = sample.gauges.get(BLOCK_SIZE)
    return EngineSnapshot(
        sample.engine,
        running=sample.gauges.get(RUNNING),
        waiting=sample.gauges.get(WAITING),
        queries=sample.counters.get(CACHE_QUERIES),
        hits=sample.counters.get(CACHE_HITS),
        block_size=int(block) if block else None,
        prefix_caching_enabled=sample.prefix_caching_configured,
    )


def parse_metrics(text: str) -> EngineSnapshot:
    """Pure: Prometheus text → EngineSnapshot. Unknown or partial expositions give None fields."""
    samples = parse_exposition(text)
    engine = detect_engine(samples)
    if engine == "vllm":
        return _from_sample(vllm.adapt(samples))
    if engine == "sglang":
        return _from_sample(sglang.adapt(samples))
    if any(name.startswith("prefixgate_") for name in samples):
        # prefixgate itself: only the replicas' queues; per-engine counters stay behind it.
        return EngineSnapshot("prefixgate", waiting=total(samples, "prefixgate_engine_requests_waiting"))
    return EngineSnapshot("unknown")


def counters_delta(before: EngineSnapshot | None, after: EngineSnapshot | None) -> CacheCounters | None:
    """Prefix-cache lookups between two snapshots, or None when the engine does not count them."""
    if before is None or after is None:
        return None
    if None in (before.queries, before.hits, after.queries, after.hits):
        return None
    return CacheCounters(
        queries=max(0.0, (after.queries or 0) - (before.queries or 0)),
        hits=max(0.0, (after.hits or 0) - (before.hits or 0)),
    )


async def read_metrics(client: httpx.AsyncClient, root: str, headers: dict[str, str]) -> EngineSnapshot | None:
    """GET {root}/metrics; None when it is absent, unreachable or not Prometheus text."""
    try:
        response = await client.get(f"{root}/metrics", headers=headers)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_metrics(response.text)
    except (ValueError, TypeError):
        return None
