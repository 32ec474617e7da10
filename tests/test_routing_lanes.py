"""The long-prefill lane on prefix_affinity (real MemoryStore residency, no HTTP): long is decided
by the predicted *uncached* prefill, dedicated and max_share modes, affinity inside a lane, and
`auto` (the defaults): threshold and long share derived from the recent requests' prefill."""

from __future__ import annotations

import random

from app.admission.gate import Admission
from app.admission.limits import LocalLimiter
from app.config import Settings
from app.prefix.blocks import proxy_chain
from app.prefix.fingerprint import Fingerprint
from app.routing.base import Replica, RouteRequest
from app.routing.factory import build_router
from app.routing.load import ReplicaLoad
from app.routing.replicas import ReplicaSet
from app.server import create_app
from app.state.memory import MemoryStore
from app.telemetry.metrics import Metrics

B = 16


def fleet(n: int = 4) -> ReplicaSet:
    return ReplicaSet(Replica(f"r{i}", f"http://r{i}") for i in range(n))


def request(tokens: list[int], tenant: str = "t") -> RouteRequest:
    fp = Fingerprint(block_size=B, block_hashes=proxy_chain(tokens, B), num_tokens=len(tokens))
    return RouteRequest(tenant=tenant, model="m", session_id=None, fingerprint=fp, prompt_tokens_estimate=len(tokens))


def doc(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i) % 50000 for i in range(n)]


def router(fleet_: ReplicaSet, **lanes):
    s = Settings(routing={"policy": "prefix_affinity", "block_size": B,
                          "lanes": {"long_prefill_tokens": 8000, **lanes}})
    return build_router(s, fleet_, MemoryStore(), Metrics())


async def routed(r, req):
    d = await r.choose(req)
    r.on_routed(req, d)
    await r.writes.drain()
    return d


def hold(d) -> None:
    """What the load owner holds while the request waits for its first token (serve and EPP alike)."""
    ReplicaLoad(Metrics()).hold(d)


async def test_dedicated_lane_sends_cold_long_prompts_to_its_replicas_and_short_elsewhere():
    replicas = fleet()
    r = router(replicas, replicas=["r3"])
    for i in range(6):
        d = await routed(r, request(doc(i, 16_000), tenant=f"L{i}"))
        assert d.lane == "long" and d.replica.name == "r3"
    for i in range(12):
        d = await routed(r, request(doc(100 + i, 2000), tenant=f"S{i}"))
        assert d.lane == "short" and d.replica.name != "r3"


async def test_a_warm_long_prompt_is_short_and_keeps_its_affinity():
    replicas = fleet()
    r = router(replicas, replicas=["r3"])
    prompt = doc(7, 16_000)
    first = await routed(r, request(prompt))
    assert first.lane == "long" and first.replica.name == "r3"
    r2 = router(replicas, replicas=["r0"])  # now r0 is the lane, the prefix lives on r3
    r2.residency = r.residency
    again = await routed(r2, request(prompt + doc(8, 200)))
    assert again.lane == "short"  # ~200 uncached tokens: cheap, wherever its prefix is
    assert again.replica.name == "r3" and again.reason == "prefix_hit"


async def test_shared_mode_caps_long_prefills_at_max_share_of_replicas():
    replicas = fleet()
    r = router(replicas, max_share=0.5)
    homes = []
    for i in range(6):  # all stay in flight
        d = await routed(r, request(doc(i, 16_000), tenant=f"L{i}"))
        assert d.lane == "long"
        hold(d)
        homes.append(d.replica.name)
    assert len(set(homes)) == 2  # never more than half of the 4 replicas hold long prefills
    for i in range(8):
        d = await routed(r, request(doc(200 + i, 2000), tenant=f"S{i}"))
        assert d.lane == "short" and d.replica.name not in homes
        hold(d)


async def test_without_lanes_long_prefills_spread_over_the_whole_fleet():
    replicas = fleet()
    s = Settings(routing={"policy": "prefix_affinity", "block_size": B})
    r = build_router(s, replicas, MemoryStore(), Metrics())
    homes = set()
    for i in range(6):
        d = await routed(r, request(doc(i, 16_000), tenant=f"L{i}"))
        assert d.lane is None
        hold(d)
        homes.add(d.replica.name)
    assert len(homes) == 4


# ---- auto: the threshold and the long share derived from the window of recent requests
def auto_router(fleet_: ReplicaSet, **lanes):
    s = Settings(routing={"policy": "prefix_affinity", "block_size": B, "lanes": lanes})
    return build_router(s, fleet_, MemoryStore(), Metrics()), s


async def warm_up(r, short: int, long: int, n: int = 100, seed: int = 23) -> None:
    """`n` cold requests, a fifth of them `long` tokens, the rest `short`; none stays in flight."""
    rng = random.Random(seed)
    for i in range(n):
        await routed(r, request(doc(10_000 + i, long if rng.random() < 0.2 else short), tenant=f"w{i}"))


async def test_auto_threshold_falls_between_the_two_prompt_sizes_of_any_trace():
    for short, long in ((2000, 16_000), (10_000, 80_000), (600, 6000)):
        r, _ = auto_router(fleet())
        await warm_up(r, short, long)
        threshold = r.lane.threshold()
        assert threshold is not None and short < threshold < long, (short, long, threshold)
        assert (await routed(r, request(doc(1, long), tenant="L"))).lane == "long"
        assert (await routed(r, request(doc(2, short), tenant="S"))).lane == "short"


async def test_auto_calls_nothing_long_before_the_window_has_samples_or_when_sizes_do_not_split():
    r, _ = auto_router(fleet())
    assert (await routed(r, request(doc(1, 16_000)))).lane == "short"  # nothing observed yet
    rng = random.Random(5)
    for i in range(100):  # one size, give or take 30%
        await routed(r, request(doc(300 + i, rng.randint(7000, 13_000)), tenant=f"u{i}"))
    assert r.lane.threshold() is None
    assert (await routed(r, request(doc(2, 13_000)))).lane == "short"


async def test_auto_share_gives_the_long_lane_its_share_of_the_prefill_tokens():
    replicas = fleet()
    r, _ = auto_router(replicas)
    await warm_up(r, 2000, 16_000)  # ~67% of the prefill tokens are long
    homes = set()
    for i in range(6):  # all stay in flight
        d = await routed(r, request(doc(i, 16_000), tenant=f"L{i}"))
        assert d.lane == "long"
        hold(d)
        homes.add(d.replica.name)
    assert len(homes) == 3  # ceil(0.67 x 4) of the 4 replicas; the fourth stays free for short ones
    d = await routed(r, request(doc(99, 2000), tenant="S"))
    assert d.lane == "short" and d.replica.name not in homes


def test_the_router_and_the_admission_queue_share_one_lane():
    r, s = auto_router(fleet())
    adm = Admission(s, LocalLimiter(), Metrics())
    assert adm.lane is r.lane
    app = create_app(Settings(backends=[{"url": "http://127.0.0.1:9"}], routing={"lanes": {}}))
    assert app.services.admission.lane is app.services.router.lane is not None
