"""The scraper inside the real proxy: engine gauges on the proxy's /metrics, GET /hygiene/engines,
and a replica whose /metrics hangs keeps serving requests at full speed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from openai import OpenAI

from app.serving import ServerThread
from app.sim.options import SimOptions
from app.sim.server import SimApp

PROMPT = "Summarise the quarterly billing policy for enterprise customers. " * 20


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_proxy_serves_engine_gauges_and_verdicts(sim_factory, proxy_factory) -> None:
    on = sim_factory(replicas=1, time_scale=0.0)
    off = sim_factory(replicas=1, time_scale=0.0, prefix_caching=False)
    proxy = proxy_factory([on.urls[0], off.urls[0]], names=["on", "off"], routing={"policy": "round_robin"},
                          scrape={"interval_s": 0.1, "timeout_s": 2.0})
    client = OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=30)
    # the hit ratio is a window's deltas (app/engines/rates.py): the traffic must come after a first
    # sample of "on", or no window sees it (on a busy machine the 8 requests can beat the first scrape)
    wait_for(lambda: httpx.get(f"{proxy.url}/hygiene/engines").json()["backends"]["on"]["scraped_at"])
    for i in range(8):
        client.completions.create(model="sim", prompt=f"{PROMPT} #{i // 4}", max_tokens=4)

    def engines() -> dict[str, Any] | None:
        body = httpx.get(f"{proxy.url}/hygiene/engines").json()
        on_view = body["backends"]["on"]
        return body if on_view["hit_ratio"] and body["prefix_cache_off"] == ["off"] else None

    body = wait_for(engines)
    assert body["backends"]["on"]["verdict"].startswith("prefix cache on, ")
    assert body["backends"]["off"]["verdict"].startswith("prefix cache OFF")
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'prefixgate_engine_prefix_caching_enabled{backend="off"} 0.0' in text
    assert 'prefixgate_engine_prefix_caching_enabled{backend="on"} 1.0' in text
    assert 'prefixgate_engine_metrics_stale{backend="on"} 0.0' in text
    replica = proxy.services.replicas.get("on")
    assert replica is not None and replica.engine == "vllm" and replica.block_size == 16


class HungMetrics:
    """A simulated replica whose /metrics never answers (until teardown); everything else works."""

    def __init__(self) -> None:
        self.sim = SimApp(SimOptions(time_scale=0.0))
        self.release = threading.Event()
        self.metrics_calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            self.metrics_calls += 1
            while not self.release.is_set():
                await asyncio.sleep(0.05)
            return
        await self.sim(scope, receive, send)


def test_hung_metrics_does_not_slow_requests(proxy_factory) -> None:
    hung = HungMetrics()
    server = ServerThread(hung).start()
    try:
        proxy = proxy_factory([server.url], names=["hung"], scrape={"interval_s": 0.05, "timeout_s": 5.0})
        client = OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=30)
        wait_for(lambda: hung.metrics_calls > 0)  # a scrape is now stuck for 5 s
        latencies = []
        for i in range(10):
            t0 = time.perf_counter()
            client.completions.create(model="sim", prompt=f"{PROMPT} {i}", max_tokens=4)
            latencies.append(time.perf_counter() - t0)
        still_stuck = proxy.services.scraper.status()["hung"]["error"] is None
    finally:
        hung.release.set()
        server.stop()
    # an order of magnitude below the 5 s scrape timeout the stuck scrape is waiting out
    assert max(latencies) < 1.0, latencies
    assert still_stuck  # the requests ran while the scrape was still hanging, not after it gave up
