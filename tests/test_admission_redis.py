"""Limits shared by two gateways on a real redis-server: the global limit holds within 10%, a
concurrency lease of a crashed pod expires, and killing Redis mid-run loses no request."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from app.admission.redis_limits import RedisLimiter
from app.config import TenantLimits
from app.state.redis import connect

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _gateways(proxy_factory, sim, url: str, namespace: str, **limits):
    sections = dict(state=url, state_options={"namespace": namespace},
                    tenants={"default": {"limits": limits}}, admission={"pods": 2})
    return proxy_factory(sim, **sections), proxy_factory(sim, **sections)


def _hammer(urls: list[str], seconds: float, workers: int = 8) -> tuple[list[int], float, float]:
    """Requests as fast as `workers` threads can send them, spread over `urls`; statuses, first and last send."""
    stop = time.monotonic() + seconds
    stamps: list[float] = []

    def worker(i: int) -> list[int]:
        out = []
        with httpx.Client(base_url=urls[i % len(urls)], timeout=30) as http:
            while time.monotonic() < stop:
                stamps.append(time.monotonic())
                out.append(http.post("/v1/chat/completions", json=CHAT).status_code)
        return out

    with ThreadPoolExecutor(workers) as pool:
        statuses = [s for part in pool.map(worker, range(workers)) for s in part]
    return statuses, min(stamps), max(stamps)


def test_global_requests_per_s_holds_within_10_percent_across_two_gateways(
        proxy_factory, sim, redis_server, redis_namespace):
    rate = 20.0
    a, b = _gateways(proxy_factory, sim, redis_server.url, redis_namespace, requests_per_s=rate)
    statuses, first, last = _hammer([a.url, b.url], 3.0)
    admitted = statuses.count(200)
    expected = rate + rate * (last - first)  # a full bucket (one second's worth) plus the refill
    assert statuses.count(429) > admitted  # the load was well over the limit
    assert set(statuses) <= {200, 429}
    assert abs(admitted - expected) <= 0.1 * expected, (admitted, expected)
    # both pods admitted some: the limit is shared, not per pod (each pod alone would allow 2x)
    assert a.sample("prefixgate_admission_rejections_total", tenant="default", reason="requests_per_s")
    assert b.sample("prefixgate_admission_rejections_total", tenant="default", reason="requests_per_s")


def test_redis_killed_mid_run_loses_no_request_and_falls_back_to_pod_share(
        proxy_factory, sim, redis_proc, redis_namespace):
    a, b = _gateways(proxy_factory, sim, redis_proc.url, redis_namespace, requests_per_s=10_000, concurrent=64)
    results: list[list[int]] = []
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_hammer, [a.url, b.url], 3.0, 4)
        time.sleep(1.0)
        redis_proc.kill()
        results.append(running.result()[0])
    statuses = results[0]
    assert statuses and statuses.count(200) == len(statuses), set(statuses)


def test_lease_of_a_crashed_pod_expires_and_frees_the_slot(redis_server, redis_namespace):
    async def run() -> None:
        client = connect(redis_server.url)
        limits = TenantLimits(concurrent=1)
        crashed = RedisLimiter(client, redis_namespace, lease_ttl_s=0.3)
        assert (await crashed.acquire("t", limits, 1, "lease-a")).reason is None  # never released
        other = RedisLimiter(client, redis_namespace, lease_ttl_s=0.3)
        assert (await other.acquire("t", limits, 1, "lease-b")).reason == "concurrent"
        await asyncio.sleep(0.2)
        await crashed.renew("t", limits, "lease-a")  # a live pod renews: still held
        await asyncio.sleep(0.2)
        assert (await other.acquire("t", limits, 1, "lease-b")).reason == "concurrent"
        await asyncio.sleep(0.4)  # no renewal: the lease expired
        assert (await other.acquire("t", limits, 1, "lease-b")).reason is None
        await client.aclose()

    asyncio.run(run())
