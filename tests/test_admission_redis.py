"""Limits shared by two gateway pods on a real redis-server: the global limit holds within 10% (two
`prefixgate serve` processes), a crashed pod's concurrency lease expires (a pod SIGKILLed
mid-stream), and killing Redis mid-run loses no request and falls back to each pod's share."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis as redis_lib

from app.admission.redis_limits import RedisLimiter
from app.config import TenantLimits
from app.state.redis import connect
from tests.gateway_process import GatewayProcess, started

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _sections(url: str, namespace: str, overrides: dict | None = None, **limits) -> dict:
    return dict(state=url, state_options={"namespace": namespace},
                tenants={"default": {"limits": limits}, "overrides": overrides or {}}, admission={"pods": 2})


def _gateways(proxy_factory, sim, url: str, namespace: str, overrides: dict | None = None, **limits):
    sections = _sections(url, namespace, overrides, **limits)
    return proxy_factory(sim, **sections), proxy_factory(sim, **sections)


FALLBACK_LOG = "admission: Redis unreachable"


def _pod(sim, url: str, namespace: str, lease_ttl_s: float = 30.0, **limits) -> GatewayProcess:
    """One gateway pod: a `prefixgate serve` process of its own. Redis gets 2 s per decision: on a
    loaded test box a slow answer must not switch the pod to its local share mid-test."""
    config = {"backends": [{"url": u} for u in sim.urls], **_sections(url, namespace, **limits)}
    config["admission"]["lease_ttl_s"] = lease_ttl_s
    config["state_options"]["redis_timeout_s"] = 2.0
    return GatewayProcess(config)


def _hammer(urls: list[str], seconds: float, workers: int = 8) -> tuple[list[list[int]], float, float]:
    """Requests as fast as each worker thread can send them, worker i to urls[i % len(urls)]; the
    statuses per distinct url (in order of first mention), first and last send."""
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
        parts = list(pool.map(worker, range(workers)))
    per_url = [[s for i, part in enumerate(parts) if urls[i % len(urls)] == url for s in part]
               for url in dict.fromkeys(urls)]
    return per_url, min(stamps), max(stamps)


def _admitted_vs_limit(statuses: list[int], first: float, last: float, rate: float) -> tuple[int, float]:
    """(requests admitted, what the limit allows over the run: a full bucket, one second's worth,
    plus the refill) after checking every answer was a 200 or a 429 and the load was over the limit."""
    assert set(statuses) <= {200, 429}
    admitted = statuses.count(200)
    assert statuses.count(429) > admitted
    return admitted, rate + rate * (last - first)


RATE = 20.0  # requests/s, global across the two pods of rate_pods


@pytest.fixture
def rate_pods(sim, redis_server, redis_namespace) -> Iterator[tuple[GatewayProcess, ...]]:
    """Two pods sharing a global RATE/s limit, started in the set-up: it runs beside the other
    workers' tests, only the timed body runs alone (tests/parallel.py)."""
    with started(_pod(sim, redis_server.url, redis_namespace, requests_per_s=RATE),
                 _pod(sim, redis_server.url, redis_namespace, requests_per_s=RATE)) as pods:
        yield pods


@pytest.mark.exclusive  # a rate held within 10% of wall-clock time
def test_global_requests_per_s_holds_within_10_percent_across_two_gateway_processes(
        rate_pods, redis_server, redis_namespace):
    a, b = rate_pods
    (on_a, on_b), first, last = _hammer([a.url, b.url], 2.0, workers=6)
    admitted, allowed = _admitted_vs_limit(on_a + on_b, first, last, RATE)
    assert abs(admitted - allowed) <= 0.1 * allowed, (admitted, allowed)
    assert on_a.count(429) and on_b.count(429) and on_a.count(200) and on_b.count(200)
    time.sleep(1.5)  # the bucket refills
    # pod a alone takes the whole global limit: per-pod shares (admission.pods = 2, what a pod
    # enforces without Redis) would give it half
    (alone,), first, last = _hammer([a.url], 2.0, workers=3)
    admitted, allowed = _admitted_vs_limit(alone, first, last, RATE)
    assert abs(admitted - allowed) <= 0.1 * allowed, (admitted, allowed)
    assert FALLBACK_LOG not in a.log() + b.log()  # every decision was Redis's
    assert redis_lib.Redis.from_url(redis_server.url).keys(f"{redis_namespace}:v1:adm:*")


@pytest.mark.exclusive  # a 3 s load with Redis killed at 1 s, timed on the wall clock
def test_redis_killed_mid_run_loses_no_request_and_falls_back_to_pod_share(
        proxy_factory, sim, redis_proc, redis_namespace):
    small = {"small": {"limits": {"requests_per_s": 4}}}
    a, b = _gateways(proxy_factory, sim, redis_proc.url, redis_namespace, small,
                     requests_per_s=10_000, concurrent=64)
    killed_at: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_hammer, [a.url, b.url], 3.0, 4)
        time.sleep(1.0)
        redis_proc.kill()
        killed_at.append(time.monotonic())
        (on_a, on_b), _, last = running.result()
    statuses = on_a + on_b
    assert statuses and statuses.count(200) == len(statuses), set(statuses)
    assert last - killed_at[0] > 1.5  # requests kept coming for seconds with Redis gone
    assert a.services.admission.limiter.down and b.services.admission.limiter.down
    # without Redis a pod enforces its share: half of a 4/s bucket is 2 (plus what refills meanwhile)
    def small_request(_: int) -> int:
        with httpx.Client(base_url=a.url, timeout=30) as http:
            return http.post("/v1/chat/completions", json=CHAT, headers={"x-tenant-id": "small"}).status_code

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(small_request, range(8)))
    elapsed = time.monotonic() - start
    # the pod's bucket holds 2 and refills at 2/s; the global one would hold 4
    assert 2 <= burst.count(200) <= 2 + 2 * elapsed and burst.count(429) >= 4, (burst, elapsed)


@pytest.mark.exclusive  # sleeps of 0.2-0.4 s against a 0.3 s lease
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


LEASE_TTL_S = 1.0  # the lease of leased_pods


@pytest.fixture
def leased_pods(sim_factory, redis_server, redis_namespace) -> Iterator[tuple[GatewayProcess, ...]]:
    """Two pods sharing one concurrent slot per tenant (a LEASE_TTL_S lease) in front of a slow
    replica (10 tokens/s), started in the set-up, beside the other workers' tests."""
    slow = sim_factory(replicas=1, time_scale=1.0, decode_tps=10.0)
    with started(_pod(slow, redis_server.url, redis_namespace, lease_ttl_s=LEASE_TTL_S, concurrent=1),
                 _pod(slow, redis_server.url, redis_namespace, lease_ttl_s=LEASE_TTL_S, concurrent=1)) as pods:
        yield pods


@pytest.mark.exclusive  # a 1 s lease timed on the wall clock
def test_pod_killed_mid_stream_frees_its_slot_after_the_lease_ttl(leased_pods):
    """Pod a holds the tenant's one concurrent slot with a stream that outlives the lease TTL (it
    renews), then is SIGKILLed: pod b refuses until the lease expires, then admits."""
    ttl = LEASE_TTL_S
    stream_body = {**CHAT, "stream": True, "max_tokens": 60, "ignore_eos": True}  # ~6 s of decode
    a, b = leased_pods
    streaming = threading.Event()

    def hold() -> None:
        try:
            with httpx.Client(base_url=a.url, timeout=30) as http, \
                    http.stream("POST", "/v1/chat/completions", json=stream_body) as r:
                for _ in r.iter_bytes():
                    streaming.set()
        except httpx.HTTPError:
            pass  # the pod died under it

    holder = threading.Thread(target=hold)
    holder.start()
    assert streaming.wait(10)
    with httpx.Client(base_url=b.url, timeout=30) as http:
        time.sleep(2 * ttl)  # past one TTL: only pod a's renewals keep the slot
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 429
        a.signal(signal.SIGKILL)
        a.wait(10)
        killed = time.monotonic()
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 429  # still leased
        while http.post("/v1/chat/completions", json=CHAT).status_code == 429:
            assert time.monotonic() - killed < ttl + 1.0, "the crashed pod's lease did not expire"
            time.sleep(0.05)
    freed_after = time.monotonic() - killed
    holder.join(10)
    # its last renewal was at most ttl/3 before the kill: nothing but the expiry freed the slot
    assert 0.5 * ttl <= freed_after <= ttl + 1.0
