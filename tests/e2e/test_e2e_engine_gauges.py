"""Engine gauges scraped from real vLLM /metrics: the proxy's windowed prefix-cache hit ratio equals
Δvllm:prefix_cache_hits_total / Δvllm:prefix_cache_queries_total over the same span, and a replica
started with --no-enable-prefix-caching reads 0 on prefixgate_engine_prefix_caching_enabled."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.e2e.workload import chat_body, stream_chat, words

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def vllm_counter(replica: Any, name: str) -> float:
    """Sum of a counter's samples in the replica's own /metrics."""
    total = 0.0
    for line in replica.metrics_text().splitlines():
        if re.match(rf"^{re.escape(name)}(\{{|\s)", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_hit_ratio_gauge_equals_vllm_counters(e2e_proxy: Any, vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_b32], scrape={"window_s": 600.0})
    base_hits = vllm_counter(vllm_b32, "vllm:prefix_cache_hits_total")
    base_queries = vllm_counter(vllm_b32, "vllm:prefix_cache_queries_total")
    system = words("gauge-system", 500)
    with httpx.Client(timeout=60) as client:
        for i in range(4):  # one cold prompt, then three that share its system prompt
            messages = [{"role": "system", "content": system}, {"role": "user", "content": words(f"q{i}", 30)}]
            stream_chat(client, vllm_b32.url, chat_body(messages, 4))
    hits = vllm_counter(vllm_b32, "vllm:prefix_cache_hits_total") - base_hits
    queries = vllm_counter(vllm_b32, "vllm:prefix_cache_queries_total") - base_queries
    expected = hits / queries
    assert 0.3 < expected < 1.0, (hits, queries)

    def gauge() -> float | None:
        return proxy.services.metrics.registry.get_sample_value(
            "prefixgate_engine_prefix_cache_hit_ratio", {"backend": "b32"})

    wait_for(lambda: gauge() is not None and abs(gauge() - expected) < 1e-9, what=f"hit ratio {expected:.4f}")
    print(f"\nvLLM Δhits/Δqueries = {hits:.0f}/{queries:.0f} = {expected:.4f}; proxy gauge {gauge():.4f}")
    assert proxy.sample("prefixgate_engine_prefix_caching_enabled", backend="b32") == 1.0
    assert proxy.sample("prefixgate_engine_block_size_tokens", backend="b32") == 32.0


def test_caching_disabled_replica_reads_zero(e2e_proxy: Any, vllm_nocache: Any, vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_nocache, vllm_b32])

    def enabled(name: str) -> float | None:
        return proxy.services.metrics.registry.get_sample_value(
            "prefixgate_engine_prefix_caching_enabled", {"backend": name})

    wait_for(lambda: enabled("nocache") is not None and enabled("b32") is not None, what="caching gauges")
    assert enabled("nocache") == 0.0
    assert enabled("b32") == 1.0
