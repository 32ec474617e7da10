"""Each policy against a ReplicaSet and a real MemoryStore (no HTTP)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from app.config import Settings
from app.prefix.blocks import proxy_chain
from app.prefix.fingerprint import Fingerprint
from app.routing.base import NoReplicaAvailable, Replica, RouteRequest
from app.routing.factory import build_router
from app.routing.least_load import LeastLoadRouter
from app.routing.prefix_affinity import AffinityOptions, PrefixAffinityRouter, cold_key
from app.routing.replicas import ReplicaSet
from app.routing.residency import ReplicaIndex
from app.routing.round_robin import RoundRobinRouter
from app.routing.session import SessionRouter, binding_key
from app.state.memory import MemoryStore
from app.telemetry.metrics import Metrics

B = 16


def fleet(n: int = 4) -> ReplicaSet:
    return ReplicaSet(Replica(f"r{i}", f"http://r{i}") for i in range(n))


def request(tokens: list[int], tenant: str = "t", session: str | None = None) -> RouteRequest:
    fp = Fingerprint(block_size=B, block_hashes=proxy_chain(tokens, B), num_tokens=len(tokens))
    return RouteRequest(tenant=tenant, model="m", session_id=session, fingerprint=fp,
                        prompt_tokens_estimate=len(tokens))


def doc(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i) % 50000 for i in range(n)]


async def routed(router, req, exclude=frozenset()):
    decision = await router.choose(req, exclude)
    router.on_routed(req, decision)
    await router.writes.drain()
    return decision


async def test_factory_builds_each_policy():
    for policy, cls in [("round_robin", RoundRobinRouter), ("least_load", LeastLoadRouter),
                        ("session", SessionRouter), ("prefix_affinity", PrefixAffinityRouter)]:
        s = Settings(routing={"policy": policy})
        assert isinstance(build_router(s, fleet(), MemoryStore(), Metrics()), cls)
    s = Settings(routing={"policy": "prefix_affinity", "kv_events": True})
    router = build_router(s, fleet(), MemoryStore(), Metrics())
    assert router.residency.events_own_presence is True


async def test_affinity_next_turn_lands_where_the_first_went():
    store = MemoryStore()
    router = PrefixAffinityRouter(fleet(), ReplicaIndex(store), AffinityOptions(block_size=B))
    turn1 = doc(1, 4000)
    first = await routed(router, request(turn1))
    assert first.reason == "cold_spread" and first.matched_blocks == 0
    turn2 = turn1 + doc(2, 300)
    second = await routed(router, request(turn2))
    assert second.replica.name == first.replica.name
    assert second.reason == "prefix_hit"
    assert second.matched_blocks == 4000 // B and second.available_blocks == 4000 // B
    assert second.prefill_tokens == len(turn2) - B * (4000 // B)
    assert "prefix_hit" in second.explanation and "uncached" in second.explanation


async def test_cold_prefixes_spread_and_no_replica_is_a_dumping_ground():
    replicas = fleet()
    router = PrefixAffinityRouter(replicas, ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    placed = Counter()
    for t in range(40):
        d = await routed(router, request(doc(100 + t, 2000), tenant=f"t{t}"))
        assert d.reason == "cold_spread"
        placed[d.replica.name] += 1
        d.replica.inflight += 1  # they all stay in flight: the bound must hold
        d.replica.queued_prompt_tokens += d.prefill_tokens
    assert set(placed) == {"r0", "r1", "r2", "r3"}
    assert max(placed.values()) <= 1.25 * 10 + 1


async def test_cold_key_is_stable_across_turns():
    t1 = proxy_chain(doc(5, 8000), B)
    t2 = proxy_chain(doc(5, 8000) + doc(6, 500), B)
    assert cold_key(t1, B, 4096, "x") == cold_key(t2, B, 4096, "x")
    assert cold_key([], B, 4096, "x") == "tenant:x"


async def test_load_overrides_affinity_when_the_resident_replica_is_saturated():
    replicas = fleet()
    router = PrefixAffinityRouter(replicas, ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    prompt = doc(9, 3200)
    first = await routed(router, request(prompt))
    home = first.replica
    home.queued_prompt_tokens = 50_000  # a long prefill queue in front of us
    home.inflight = 8
    again = await routed(router, request(prompt + doc(10, 64)))
    assert again.replica.name != home.name
    assert again.reason == "load_override"
    assert again.available_blocks == 3200 // B and again.matched_blocks == 0
    assert again.scores[home.name] > again.scores[again.replica.name]


async def test_affinity_retry_goes_to_the_next_best_replica():
    router = PrefixAffinityRouter(fleet(), ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    prompt = doc(3, 1600)
    home = (await routed(router, request(prompt))).replica.name
    retry = await router.choose(request(prompt), frozenset({home}))
    assert retry.replica.name != home and retry.reason == "failover"
    with pytest.raises(NoReplicaAvailable):
        await router.choose(request(prompt), frozenset({"r0", "r1", "r2", "r3"}))


async def test_unhealthy_replica_is_never_chosen():
    replicas = fleet()
    router = PrefixAffinityRouter(replicas, ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    prompt = doc(4, 1600)
    home = (await routed(router, request(prompt))).replica
    home.healthy = False
    for _ in range(5):
        assert (await routed(router, request(prompt))).replica.name != home.name


async def test_affinity_bounds_the_index_at_the_replica_kv_capacity():
    replicas = fleet(1)
    replicas.get("r0").kv_blocks = 100
    store = MemoryStore(capacity_blocks=10_000)
    router = PrefixAffinityRouter(replicas, ReplicaIndex(store), AffinityOptions(block_size=B))
    for t in range(5):
        await routed(router, request(doc(20 + t, 60 * B), tenant=f"t{t}"))
    assert store.residency_size("r0") == 100


async def test_affinity_decision_carries_the_available_and_matched_blocks_the_funnel_counts():
    # the funnel is counted after the response, on the full chain (tests/test_ui_funnel.py)
    router = PrefixAffinityRouter(fleet(), ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    prompt = doc(30, 1600)
    first = await routed(router, request(prompt))
    second = await routed(router, request(prompt))
    assert (first.available_blocks, first.matched_blocks) == (0, 0)
    assert second.available_blocks == second.matched_blocks == 1600 // B


async def test_kv_event_mode_does_not_write_predictions():
    store = MemoryStore()
    router = PrefixAffinityRouter(fleet(), ReplicaIndex(store, events_own_presence=True), AffinityOptions(block_size=B))
    d = await routed(router, request(doc(40, 800)))
    assert store.residency_size(d.replica.name) == 0


async def test_least_load_picks_the_idle_replica_and_spreads_ties():
    replicas = fleet()
    router = LeastLoadRouter(replicas)
    replicas.get("r0").queued_prompt_tokens = 9000
    replicas.get("r1").inflight = 3
    replicas.get("r2").engine_waiting = 2
    d = await router.choose(request(doc(1, 100)))
    assert d.replica.name == "r3" and d.reason == "least_load"
    replicas.get("r0").queued_prompt_tokens = 0
    replicas.get("r1").inflight = 0
    replicas.get("r2").engine_waiting = 0
    names = {(await router.choose(request(doc(1, 100)))).replica.name for _ in range(8)}
    assert names == {"r0", "r1", "r2", "r3"}


async def test_session_is_sticky_bounded_and_fails_over():
    replicas = fleet()
    store = MemoryStore()
    router = SessionRouter(replicas, store)
    req = request(doc(1, 100), session="abc")
    first = await routed(router, req)
    for _ in range(3):
        d = await routed(router, req)
        assert d.replica.name == first.replica.name and d.reason == "session"
    assert await store.binding_get(binding_key("t", "abc")) == first.replica.name
    for i in range(3):  # other sessions in flight fill its replica: 3 + 1 > ceil(1.25 * 4 / 4) = 2
        router.active.start(f"session:other{i}", first.replica.name)
    moved = await routed(router, req)
    assert moved.replica.name != first.replica.name and moved.reason == "load_override"
    assert await store.binding_get(binding_key("t", "abc")) == moved.replica.name
    moved.replica.healthy = False
    gone = await routed(router, req)
    assert gone.replica.name != moved.replica.name and gone.reason == "failover"
    # without a session id, the tenant is the key
    router.on_finished(req, moved, True)
    t1 = await routed(router, request(doc(2, 100), tenant="acme"))
    assert (await routed(router, request(doc(3, 100), tenant="acme"))).replica.name == t1.replica.name


async def test_affinity_forgets_a_prefix_after_the_index_ttl():
    now = [0.0]
    store = MemoryStore(ttl_s=60.0, clock=lambda: now[0])
    router = PrefixAffinityRouter(fleet(), ReplicaIndex(store), AffinityOptions(block_size=B))
    prompt = doc(50, 1600)
    await routed(router, request(prompt))
    assert (await routed(router, request(prompt))).reason == "prefix_hit"
    now[0] += 61.0
    again = await routed(router, request(prompt))
    assert again.reason == "cold_spread" and again.available_blocks == 0


async def test_cold_spread_avoids_a_replica_with_a_large_recent_share():
    replicas = fleet()
    router = PrefixAffinityRouter(replicas, ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    req = request(doc(77, 2000), tenant="new")
    first = (await router.choose(req)).replica.name
    for _ in range(40):  # sticky tenants kept sending their turns there
        await router.recent.add(first)
    for name in ("r0", "r1", "r2", "r3"):
        await router.recent.add(name)
    d = await router.choose(req)
    assert d.reason == "cold_spread" and d.replica.name != first


async def test_with_the_queue_on_a_cold_prompt_goes_to_a_replica_with_room_not_within_the_slack():
    """Late binding: the replica the hash prefers is within the cold slack of the least loaded
    but saturated (the gateway queue's `room` says no), so the prompt goes where there is room."""
    replicas = fleet()
    router = PrefixAffinityRouter(replicas, ReplicaIndex(MemoryStore()), AffinityOptions(block_size=B))
    req = request(doc(78, 2000), tenant="new")
    home = (await router.choose(req)).replica
    home.queued_prompt_tokens = 600  # well within the 2048-token cold slack
    assert (await router.choose(req)).replica is home  # without the queue: hashing keeps it there
    roomy = RouteRequest(req.tenant, req.model, None, req.fingerprint, req.prompt_tokens_estimate,
                         room=lambda r: r.queued_prompt_tokens == 0)
    d = await router.choose(roomy)
    assert d.reason == "cold_spread" and d.replica is not home and d.replica.queued_prompt_tokens == 0
    for r in replicas.all():
        r.queued_prompt_tokens = 600  # no replica has room: the usual placement
    assert (await router.choose(roomy)).replica is home


async def test_session_keeps_its_replica_with_concurrent_requests_in_flight():
    """One session's requests in flight are one key: an idle 4-replica fleet never moves it."""
    replicas = fleet()
    router = SessionRouter(replicas, MemoryStore())
    req = request(doc(1, 100), session="abc")
    in_flight = []
    for _ in range(8):  # as the proxy does: choose, count it in flight, on_routed; none finishes
        d = await router.choose(req)
        d.replica.inflight += 1
        router.on_routed(req, d)
        in_flight.append(d)
    await router.writes.drain()
    assert {d.replica.name for d in in_flight} == {in_flight[0].replica.name}
    assert {d.reason for d in in_flight} == {"session"}
    for d in in_flight:
        router.on_finished(req, d, True)
    assert router.active.total() == 0


async def test_session_moves_only_when_other_sessions_overload_its_replica():
    replicas = fleet()
    router = SessionRouter(replicas, MemoryStore())
    placed: dict[str, str] = {}
    for s in range(12):  # 12 sessions in flight on 4 replicas: at most ceil(1.25 * 12 / 4) = 4 each
        req = request(doc(s, 100), session=f"s{s}")
        d = await router.choose(req)
        router.on_routed(req, d)
        placed[f"s{s}"] = d.replica.name
    await router.writes.drain()
    assert max(Counter(placed.values()).values()) <= 4
    for s in range(12):  # a second concurrent request of each session stays with it
        d = await router.choose(request(doc(s, 100), session=f"s{s}"))
        assert d.replica.name == placed[f"s{s}"] and d.reason == "session"


async def test_every_policy_routes_only_to_replicas_serving_the_model():
    replicas = fleet()
    for r in replicas.all():
        r.models = frozenset({"m"} if r.name in ("r1", "r3") else {"other", "other-lora"})
    for policy in ("round_robin", "least_load", "session", "prefix_affinity"):
        router = build_router(Settings(routing={"policy": policy}), replicas, MemoryStore(), Metrics())
        chosen = set()
        for s in range(8):
            req = request(doc(s, 100), tenant=f"t{s}", session=f"s{s}")
            d = await router.choose(req)
            router.on_routed(req, d)
            chosen.add(d.replica.name)
        assert chosen <= {"r1", "r3"}, policy
        retry = await router.choose(request(doc(1, 100)), frozenset({"r1"}))
        assert retry.replica.name == "r3" and retry.reason == "failover", policy
        with pytest.raises(NoReplicaAvailable):
            await router.choose(request(doc(1, 100)), frozenset({"r1", "r3"}))


async def test_model_filter_waits_for_the_first_model_lists():
    from app.routing.filters import candidates

    replicas = fleet(2)
    assert len(candidates(replicas, request(doc(1, 10)))) == 2  # nothing known yet: no filter
    replicas.get("r0").models = frozenset({"m"})
    assert [r.name for r in candidates(replicas, request(doc(1, 10)))] == ["r0"]  # r1's list unknown


class _WaitingMemoryStore(MemoryStore):
    """The in-memory store, but saying its calls may wait (as Redis's do)."""

    never_waits = False


@pytest.mark.parametrize("store_cls", [MemoryStore, _WaitingMemoryStore])
async def test_a_routed_request_is_learned_in_place_only_where_the_store_never_waits(store_cls):
    store = store_cls()
    router = PrefixAffinityRouter(fleet(), ReplicaIndex(store), AffinityOptions(block_size=B))
    req = request(doc(3, 800))
    decision = await router.choose(req)
    router.on_routed(req, decision)
    held = await store.residency_lookup(req.fingerprint.block_hashes, [decision.replica.name])
    if store.never_waits:  # done in on_routed itself: no task left behind
        assert len(router.writes) == 0
        assert held[decision.replica.name] == len(req.fingerprint.block_hashes)
    else:  # in tasks, which have not run yet
        assert len(router.writes) == 2
        assert held[decision.replica.name] == 0
    await router.writes.drain()
    assert len(router.writes) == 0
    held = await store.residency_lookup(req.fingerprint.block_hashes, [decision.replica.name])
    assert held[decision.replica.name] == len(req.fingerprint.block_hashes)


async def test_an_in_place_write_that_waits_after_all_finishes_in_a_task():
    from app.routing.background import BackgroundWrites

    writes = BackgroundWrites(in_place=True)
    done = []

    async def write():
        await asyncio.sleep(0.01)
        done.append(1)

    writes.spawn(write())
    assert len(writes) == 1 and done == []
    await writes.drain()
    assert done == [1]
