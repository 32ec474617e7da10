"""The long-prefill lane on prefix_affinity (real MemoryStore residency, no HTTP): long is decided
by the predicted *uncached* prefill, dedicated and max_share modes, affinity inside a lane."""

from __future__ import annotations

from app.config import Settings
from app.prefix.blocks import proxy_chain
from app.prefix.fingerprint import Fingerprint
from app.routing.base import Replica, RouteRequest
from app.routing.factory import build_router
from app.routing.load import ReplicaLoad
from app.routing.replicas import ReplicaSet
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
