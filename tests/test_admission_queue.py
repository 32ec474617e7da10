"""The gateway queue: weighted fair order across tenants then priority, the TTL 503 with
Retry-After through the real gateway, and queue metrics."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from app.admission.gate import Admission
from app.admission.limits import LocalLimiter
from app.admission.queue import FairQueue
from app.config import Settings
from app.routing.base import Replica
from app.telemetry.metrics import Metrics


def test_fair_queue_alternates_tenants_despite_a_flood_then_priority():
    async def run() -> list[str]:
        q = FairQueue(100)
        order: list[str] = []
        futs = []
        for i in range(6):  # the noisy tenant queues first and most
            futs.append(("noisy", i, q.push("noisy", 0)))
        futs.append(("quiet", 0, q.push("quiet", 0)))
        futs.append(("quiet", 1, q.push("quiet", 5)))  # higher priority inside its tenant
        for _ in range(8):
            assert q.pop()
            for tenant, i, fut in futs:
                if fut.done() and (tenant, i) not in [(o.split(":")[0], int(o.split(":")[1])) for o in order]:
                    order.append(f"{tenant}:{i}")
        return order

    order = asyncio.run(run())
    assert order[:4] == ["noisy:0", "quiet:1", "noisy:1", "quiet:0"]
    assert order[4:] == ["noisy:2", "noisy:3", "noisy:4", "noisy:5"]


def test_weight_gives_a_tenant_its_share_of_departures():
    async def run() -> list[str]:
        q = FairQueue(100)
        futs = [("a", q.push("a", 0)) for _ in range(6)] + [("b", q.push("b", 0)) for _ in range(6)]
        served = []
        for _ in range(6):
            q.pop({"a": 2.0, "b": 1.0})
            served = [t for t, f in futs if f.done()]
        return served

    served = asyncio.run(run())
    assert served.count("a") == 4 and served.count("b") == 2


def test_queue_ttl_is_503_with_retry_after_and_counted():
    async def run() -> tuple[int, str, float]:
        settings = Settings(admission={"queue": {"max_depth": 4, "ttl_s": 0.2}, "saturated_inflight": 1})
        metrics = Metrics()
        adm = Admission(settings, LocalLimiter(), metrics)
        busy = Replica("r0", "http://127.0.0.1:1", inflight=1)
        start = time.perf_counter()
        try:
            await adm.wait_turn("t", 0, lambda: [busy], None)
        except Exception as exc:  # ProxyError
            return exc.status, exc.headers["retry-after"], time.perf_counter() - start  # type: ignore[attr-defined]
        raise AssertionError("no 503")

    status, retry, waited = asyncio.run(run())
    assert status == 503 and int(retry) >= 1 and waited >= 0.2


def test_queued_request_goes_when_a_replica_frees():
    async def run() -> float:
        settings = Settings(admission={"queue": {"max_depth": 4, "ttl_s": 5}, "saturated_inflight": 1})
        adm = Admission(settings, LocalLimiter(), Metrics())
        busy = Replica("r0", "http://127.0.0.1:1", inflight=1)
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: setattr(busy, "inflight", 0))
        start = time.perf_counter()
        await adm.wait_turn("t", 0, lambda: [busy], None)
        assert adm.queue.depth == 0
        return time.perf_counter() - start

    waited = asyncio.run(run())
    assert 0.09 <= waited < 1.0


def test_saturated_fleet_queues_then_sheds_through_the_gateway(proxy_factory, sim_factory):
    slow = sim_factory(replicas=1, time_scale=1.0, decode_tps=10.0)
    proxy = proxy_factory(slow, admission={"queue": {"max_depth": 1, "ttl_s": 0.3}, "saturated_inflight": 1})
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 15,
            "ignore_eos": True, "stream": True}
    done = threading.Event()

    def occupy() -> None:
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            http.post("/v1/chat/completions", json=body)
        done.set()

    threading.Thread(target=occupy).start()
    time.sleep(0.3)
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        start = time.monotonic()
        shed = http.post("/v1/chat/completions", json={**body, "stream": False})
        waited = time.monotonic() - start
    assert shed.status_code == 503 and int(shed.headers["retry-after"]) >= 1
    assert shed.json()["error"]["code"] == "queue_timeout"
    assert waited >= 0.3
    done.wait(30)
    assert proxy.sample("prefixgate_admission_rejections_total", tenant="default", reason="queue_ttl") == 1
    assert proxy.sample("prefixgate_admission_wait_seconds_count") == 1
    assert proxy.sample("prefixgate_admission_queue_depth") == 0


def test_cheaper_prefill_leaves_first_within_a_tenant_and_priority():
    async def run() -> list[str]:
        q = FairQueue(10)
        long_cold = q.push("t", 0, cost=16_000)
        short = q.push("t", 0, cost=2_000)
        urgent_long = q.push("t", 1, cost=16_000)  # priority still comes first
        order = []
        for _ in range(3):
            q.pop()
            for name, fut in (("long", long_cold), ("short", short), ("urgent", urgent_long)):
                if fut.done() and name not in order:
                    order.append(name)
        return order

    assert asyncio.run(run()) == ["urgent", "short", "long"]


def test_prefill_backlog_marks_a_replica_saturated():
    settings = Settings(admission={"saturated_prefill_tokens": 4096})
    adm = Admission(settings, LocalLimiter(), Metrics())
    assert not adm.saturated(Replica("r0", "http://x", queued_prompt_tokens=4096))
    assert adm.saturated(Replica("r0", "http://x", queued_prompt_tokens=4097))
