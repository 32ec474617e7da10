"""The gateway queue: weighted fair order across tenants then priority, the TTL 503 with
Retry-After through the real gateway, and queue metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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
    deadline = time.monotonic() + 10
    while not slow.engine(0).running:  # the first request holds the one replica
        assert time.monotonic() < deadline, "the first request never reached the replica"
        time.sleep(0.01)
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


def test_queued_requests_through_the_gateway_all_leave_and_free_every_room(proxy_factory, sim_factory):
    """Eight concurrent requests on one replica that takes one at a time: all answered, and once
    done no released request is left holding a room (a leak would stall the queue for good)."""
    one = sim_factory(replicas=1, time_scale=0.2)
    proxy = proxy_factory(one, admission={"queue": {"max_depth": 16, "ttl_s": 30}, "saturated_inflight": 1})
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True, "stream": True}

    def post(_: int) -> int:
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            return http.post("/v1/chat/completions", json=body).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(8)))
    proxy.settle()
    assert codes == [200] * 8
    assert proxy.sample("prefixgate_admission_wait_seconds_count") >= 1  # some did queue
    assert proxy.services.admission.unplaced == 0 and proxy.services.admission.queue.depth == 0


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
    zero = Admission(Settings(admission={"saturated_prefill_tokens": 0}), LocalLimiter(), Metrics())
    assert not zero.saturated(Replica("r0", "http://x")) and zero.saturated(Replica("r0", "http://x", queued_prompt_tokens=1))


def test_with_a_zero_backlog_bound_queued_requests_still_leave_cheapest_first():
    async def run() -> list[str]:
        adm = Admission(Settings(admission={"queue": {"max_depth": 8, "ttl_s": 30}, "saturated_prefill_tokens": 0}),
                        LocalLimiter(), Metrics())
        busy = Replica("r0", "http://r0", queued_prompt_tokens=100)
        left: list[str] = []

        async def one(name: str, tokens: int) -> None:
            placed = await adm.wait_turn("t", 0, lambda: [busy], None, _costs(tokens))
            left.append(name)
            busy.queued_prompt_tokens += tokens  # it holds the replica now
            placed()

        tasks = [asyncio.create_task(one("long", 4000))]
        while adm.queue.depth < 1:
            await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(one("short", 500)))
        while adm.queue.depth < 2:
            await asyncio.sleep(0.01)
        busy.queued_prompt_tokens = 0
        adm.kick()
        await _until(lambda: bool(left))
        await asyncio.sleep(0.1)  # the long one stays: the short one holds the replica now
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return left

    assert asyncio.run(run()) == ["short"]


def test_a_stream_of_cheaper_requests_goes_first_until_the_long_one_has_waited_age_s():
    """Cheapest prefill first (a freed replica goes to the request that holds it least), but a
    long request behind a stream of short ones leaves once it has waited `age_s`, not at its TTL."""
    async def run() -> tuple[list[str], list[str]]:
        q = FairQueue(100, age_s=0.2)
        long_ = q.push("t", 0, cost=4000, klass="long")
        shorts = [q.push("t", 0, cost=500, klass="short") for _ in range(3)]
        early = []
        for _ in range(3):  # the long one arrived first, the cheaper ones still leave before it
            shorts.append(q.push("t", 0, cost=500, klass="short"))  # the stream keeps coming
            assert q.pop()
            early.append("long" if long_.done() else "short")
        await asyncio.sleep(0.25)
        late = []
        for _ in range(2):
            shorts.append(q.push("t", 0, cost=500, klass="short"))
            assert q.pop()
            late.append("long" if long_.done() else "short")
        return early, late

    early, late = asyncio.run(run())
    assert early == ["short", "short", "short"] and late[0] == "long"


def test_a_freed_replica_releases_one_queued_request_until_it_is_placed():
    """A departure takes the room it left for: while the released request holds no replica yet,
    the next one waits (two released onto one free replica would queue one behind the other)."""
    async def run() -> tuple[int, int, int]:
        settings = Settings(admission={"queue": {"max_depth": 8, "ttl_s": 5}, "saturated_inflight": 1})
        adm = Admission(settings, LocalLimiter(), Metrics())
        fleet = [Replica("r0", "http://r0", inflight=1), Replica("r1", "http://r1", inflight=1)]
        placements = []

        async def one() -> None:
            placements.append(await adm.wait_turn("t", 0, lambda: fleet, None))

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        while adm.queue.depth < 3:
            await asyncio.sleep(0.01)
        fleet[0].inflight = 0  # one replica frees; nothing is placed on it yet
        await _until(lambda: len(placements) >= 1)
        await asyncio.sleep(0.1)  # several polls: a second release would show now
        released_before = len(placements)
        placements[0]()  # the released request now holds r0 ...
        fleet[0].inflight = 1
        fleet[1].inflight = 0  # ... and r1 frees
        await _until(lambda: len(placements) >= 2)
        await asyncio.sleep(0.1)
        released_after = len(placements)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return released_before, released_after, adm.unplaced

    released_before, released_after, unplaced = asyncio.run(run())
    assert released_before == 1 and released_after == 2 and unplaced == 1


def test_admission_kick_makes_a_queued_request_recheck_at_once_not_at_its_next_poll(monkeypatch):
    """`Admission.kick()` wakes the queue: a request waiting on a minute-long poll re-checks and
    leaves at once. That the proxy kicks at a first byte is checked through the real gateway in
    tests/test_admission_first_token_kick.py."""
    monkeypatch.setattr("app.admission.gate.POLL_S", 60.0)

    async def run() -> float:
        settings = Settings(admission={"queue": {"max_depth": 4, "ttl_s": 120}, "saturated_inflight": 1})
        adm = Admission(settings, LocalLimiter(), Metrics())
        busy = Replica("r0", "http://r0", inflight=1)
        task = asyncio.create_task(adm.wait_turn("t", 0, lambda: [busy], None))
        while adm.queue.depth < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # it is waiting on its (minute-long) poll now
        busy.inflight = 0
        start = time.perf_counter()
        adm.kick()
        placed = await asyncio.wait_for(task, 5)
        placed()
        assert adm.unplaced == 0
        return time.perf_counter() - start

    assert asyncio.run(run()) < 5


def test_tenant_fairness_holds_inside_the_class_that_may_leave():
    """Only the short lane has room: departures still alternate tenants (the flood gets its
    share), and the long request waits for its own lane."""
    async def run() -> tuple[list[str], bool]:
        q = FairQueue(100)
        futs = [("noisy", q.push("noisy", 0, klass="short")) for _ in range(5)]
        long_ = q.push("quiet", 0, cost=4000, klass="long")
        futs += [("quiet", q.push("quiet", 0, klass="short")) for _ in range(2)]
        for _ in range(4):
            assert q.pop(admissible=lambda k: k == "short")
        return [t for t, f in futs if f.done()], long_.done()

    served, long_left = asyncio.run(run())
    assert sorted(served) == ["noisy", "noisy", "quiet", "quiet"] and not long_left


def _dedicated_lane_admission() -> Admission:
    # r3 is the long lane; a replica with a request in flight is saturated
    settings = Settings(routing={"policy": "prefix_affinity", "lanes": {"long_prefill_tokens": 1000,
                                                                        "replicas": ["r3"]}},
                        admission={"queue": {"max_depth": 32, "ttl_s": 30}, "saturated_inflight": 1,
                                   "saturated_prefill_tokens": 100_000})
    return Admission(settings, LocalLimiter(), Metrics())


async def _until(condition, timeout: float = 10.0) -> None:
    """Wait for `condition()` (a loaded machine may take its time), failing after `timeout`."""
    deadline = time.perf_counter() + timeout
    while not condition():
        assert time.perf_counter() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _costs(tokens: int):
    async def cost() -> int:
        return tokens
    return cost


def test_a_queued_long_request_leaves_when_a_long_lane_replica_frees_not_the_short_stream():
    async def run() -> tuple[list[str], int]:
        adm = _dedicated_lane_admission()
        fleet = [Replica(f"r{i}", f"http://r{i}", inflight=1) for i in range(4)]
        left: list[str] = []

        async def one(name: str, tokens: int) -> None:
            await adm.wait_turn("t", 0, lambda: fleet, None, _costs(tokens))
            left.append(name)

        tasks = [asyncio.create_task(one(f"short{i}", 500)) for i in range(3)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(one("long", 4000)))
        while adm.queue.depth < 4:
            await asyncio.sleep(0.01)
        fleet[3].inflight = 0  # the long lane frees; the short lane stays saturated
        await asyncio.wait_for(tasks[3], 5)
        queued_after = adm.queue.depth
        for t in tasks[:3]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return left, queued_after

    left, queued_after = asyncio.run(run())
    assert left == ["long"] and queued_after == 3  # no short was released onto the long lane's room


def test_a_short_request_is_not_held_when_only_the_long_lane_is_saturated():
    async def run() -> tuple[bool, int, float | None]:
        adm = _dedicated_lane_admission()
        fleet = [Replica(f"r{i}", f"http://r{i}") for i in range(4)]
        fleet[3].inflight = 1  # the long lane is saturated; the short lane has room
        long_task = asyncio.create_task(adm.wait_turn("a", 0, lambda: fleet, None, _costs(4000)))
        while adm.queue.depth < 1:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(adm.wait_turn("b", 0, lambda: fleet, None, _costs(500)), 5)
        # the wait histogram counts queued requests only, and the long one is still queued
        queued_shorts = adm.metrics.registry.get_sample_value("prefixgate_admission_wait_seconds_count")
        long_released, depth = long_task.done(), adm.queue.depth
        long_task.cancel()
        await asyncio.gather(long_task, return_exceptions=True)
        return long_released, depth, queued_shorts

    long_released, depth, queued_shorts = asyncio.run(run())
    assert not long_released and depth == 1 and not queued_shorts
