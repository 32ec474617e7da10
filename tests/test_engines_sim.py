"""The scraper against the simulator, both flavors, cache on/off, spec decode on/off: every gauge
equals the value computed from the simulator's own counters over the same window. Also a real
restart (a new simulator process on the same port) gives no negative or spiking rate."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.config import Settings
from app.engines.scrape import EngineScraper
from app.routing.base import Replica
from app.routing.replicas import ReplicaSet
from app.sim.testing import SimCluster
from app.telemetry.metrics import Metrics
from tests.fake_clock import FakeClock

SYSTEM = "You are a careful assistant for the billing team. Answer briefly. " * 12
SPEC_MEAN = 2.5


def gauge(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(f"prefixgate_{name}", {"backend": "r0"})


def snapshot(sim: SimCluster) -> dict[str, Any]:
    """The simulator's own counters: /sim/state, plus its spec-decode counters (white box)."""
    state = httpx.get(f"{sim.urls[0]}/sim/state").json()
    m = sim.engine(0).metrics
    if m.spec and sim.options.flavor == "vllm":
        labels = {"model_name": sim.options.model, "engine": "0"}
        state["drafts"] = m.registry.get_sample_value("vllm:spec_decode_num_drafts_total", labels)
        state["accepted"] = m.registry.get_sample_value("vllm:spec_decode_num_accepted_tokens_total", labels)
    if m.spec and sim.options.flavor == "sglang":
        state["accept_length"] = m._spec_tokens / m._spec_forwards if m._spec_forwards else None
    return state


def traffic(sim: SimCluster, prompts: list[str]) -> None:
    with httpx.Client(base_url=sim.urls[0], timeout=30) as client:
        for prompt in prompts:
            r = client.post("/v1/completions", json={"model": "sim", "prompt": prompt, "max_tokens": 24,
                                                     "ignore_eos": True})
            assert r.status_code == 200


def scraper_for(url: str, window_s: float) -> tuple[EngineScraper, ReplicaSet, Metrics, FakeClock]:
    replicas = ReplicaSet([Replica(name="r0", url=url)])
    metrics, clock = Metrics(), FakeClock()
    settings = Settings(scrape={"interval_s": 5, "timeout_s": 5, "window_s": window_s})
    return EngineScraper(replicas, metrics, settings, clock=clock), replicas, metrics, clock


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("caching", [True, False], ids=["cache_on", "cache_off"])
@pytest.mark.parametrize("spec", [None, SPEC_MEAN], ids=["no_spec", "spec"])
async def test_gauges_equal_simulator_counters_over_the_window(flavor: str, caching: bool,
                                                               spec: float | None) -> None:
    with SimCluster(replicas=1, time_scale=0, flavor=flavor, prefix_caching=caching, spec_decode=spec) as sim:
        scraper, replicas, metrics, clock = scraper_for(sim.urls[0], window_s=5)
        try:
            traffic(sim, [f"{i} cold start {SYSTEM}" for i in range(3)])  # before the window
            await scraper.scrape_once()
            clock.now += 5
            traffic(sim, [f"{SYSTEM} question {i}" for i in range(2)])
            base = snapshot(sim)
            await scraper.scrape_once()  # the window's base (window_s = 5: the first sample drops)
            clock.now += 5
            traffic(sim, [f"{SYSTEM} question {i}" for i in range(4)] + [f"{SYSTEM} other"])
            last = snapshot(sim)
            await scraper.scrape_once()
            status = scraper.status()["r0"]
        finally:
            await scraper.stop()

    assert status["window_s"] == 5
    d_queries = last["prefix_cache_queries"] - base["prefix_cache_queries"]
    d_hits = last["prefix_cache_hits"] - base["prefix_cache_hits"]
    d_prompt = last["prompt_tokens"] - base["prompt_tokens"]
    ratio = gauge(metrics, "engine_prefix_cache_hit_ratio")
    if caching:
        assert d_queries > 0 and 0 < d_hits < d_queries
        assert ratio == pytest.approx(d_hits / d_queries)
        # a window, not the lifetime (the cold requests before the window pull the lifetime down)
        assert ratio != pytest.approx(last["prefix_cache_hits"] / last["prefix_cache_queries"])
        assert gauge(metrics, "engine_prefix_caching_enabled") == 1.0
        assert status["verdict"].startswith(f"prefix cache on, {round(100 * d_hits / d_queries)}% hit")
    else:
        assert d_queries == 0 and d_prompt > 0
        # vLLM does no lookup (no queries -> no ratio); SGLang counts every prompt token as input
        assert ratio == (None if flavor == "vllm" else 0.0)
        assert gauge(metrics, "engine_prefix_caching_enabled") == 0.0
        assert status["verdict"].startswith("prefix cache OFF")

    accept = gauge(metrics, "engine_spec_acceptance_length")
    if spec is None:
        assert accept is None
    elif flavor == "vllm":
        d_drafts, d_accepted = last["drafts"] - base["drafts"], last["accepted"] - base["accepted"]
        assert d_drafts > 0
        assert accept == pytest.approx(1 + d_accepted / d_drafts)
    else:
        assert accept == pytest.approx(last["accept_length"])
    if spec is not None:
        assert 1.0 <= accept <= 4.0 and abs(accept - SPEC_MEAN) < 0.75

    assert gauge(metrics, "engine_requests_waiting") == last["waiting"] == 0
    assert gauge(metrics, "engine_requests_running") == last["running"] == 0
    assert gauge(metrics, "engine_kv_usage_ratio") == pytest.approx(last["kv_cache_usage"])
    assert gauge(metrics, "engine_block_size_tokens") == last["block_size"]
    assert gauge(metrics, "engine_kv_capacity_blocks") == last["kv_blocks"]
    replica = replicas.get("r0")
    assert replica is not None
    null = 1 if flavor == "vllm" else 0  # vLLM's pool never caches its block 0
    assert (replica.engine, replica.block_size, replica.kv_blocks) == (flavor, last["block_size"], last["kv_blocks"] - null)


async def test_simulator_restart_gives_no_negative_or_spiking_rate() -> None:
    first = SimCluster(replicas=1, time_scale=0).start()
    port = int(first.urls[0].rsplit(":", 1)[1])
    scraper, _, metrics, clock = scraper_for(first.urls[0], window_s=3600)
    second: SimCluster | None = None
    try:
        traffic(first, [f"{SYSTEM} q{i % 2}" for i in range(6)])
        await scraper.scrape_once()
        clock.now += 5
        traffic(first, [f"{SYSTEM} q{i % 2}" for i in range(6)])
        await scraper.scrape_once()
        before = gauge(metrics, "engine_prefix_cache_hit_ratio")
        first.stop()

        second = SimCluster(replicas=1, time_scale=0, ports=[port]).start()  # counters start at 0
        traffic(second, [f"{i} fresh {SYSTEM}" for i in range(2)])  # all misses after the restart
        clock.now += 5
        await scraper.scrape_once()
        right_after = gauge(metrics, "engine_prefix_cache_hit_ratio")
        base = snapshot(second)
        traffic(second, [f"{SYSTEM} q0", f"{SYSTEM} q0"])
        last = snapshot(second)
        clock.now += 5
        await scraper.scrape_once()
        status = scraper.status()["r0"]
    finally:
        await scraper.stop()
        first.stop()
        if second is not None:
            second.stop()
    assert before is not None and 0 < before <= 1
    assert right_after == before  # the restart sample is a new base, not a delta
    assert status["restarts"] == 1
    # the window starts at the restart sample (= `base`): only the new process's traffic counts
    expected = (last["prefix_cache_hits"] - base["prefix_cache_hits"]) / (
        last["prefix_cache_queries"] - base["prefix_cache_queries"])
    assert gauge(metrics, "engine_prefix_cache_hit_ratio") == pytest.approx(expected)
