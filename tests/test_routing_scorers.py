"""Scorers and the bounded-load ring: pure functions, no server."""

from __future__ import annotations

from collections import Counter

from app.routing.base import Replica
from app.routing.ring import HashRing, first_on_ring, key_bound, load_bound, within_bound
from app.routing.scorers import (
    ScoreWeights,
    decode_load,
    prefill_backlog,
    replica_costs,
    uncached_prompt,
)


def test_uncached_prompt_follows_vllm_hit_formula():
    # 100 tokens, B=16: at most floor(99/16)=6 blocks can hit
    assert uncached_prompt(100, 0, 16).value == 100
    assert uncached_prompt(100, 3, 16).value == 100 - 48
    assert uncached_prompt(100, 10, 16).value == 100 - 96
    assert "4 of 100" in uncached_prompt(100, 10, 16).why


def test_backlog_adds_the_engines_waiting_requests_that_are_not_this_gateways():
    r = Replica("a", "http://a", queued_prompt_tokens=1000)
    assert prefill_backlog(r, 2048).value == 1000
    r.engine_waiting = 3  # scraped with none of this gateway's requests in flight: all others'
    s = prefill_backlog(r, 2048)
    assert s.value == 1000 + 3 * 2048 and "3 others' waiting in engine" in s.why
    r.engine_running, r.inflight_at_scrape = 1, 3  # 3 of its own then: 1 running, 2 of the waiting
    assert prefill_backlog(r, 2048).value == 1000 + 1 * 2048


def test_decode_load_counts_its_own_live_and_the_engines_other_running_requests():
    r = Replica("a", "http://a", inflight=2)
    assert decode_load(r, 256).value == 512
    r.engine_running, r.inflight_at_scrape = 5, 2  # 2 of the 5 were this gateway's
    assert decode_load(r, 256).value == (2 + 3) * 256
    r.inflight = 0  # its own finished since the scrape: only the others' still count
    assert decode_load(r, 256).value == 3 * 256
    r.engine_running = 1  # the scrape saw only its own request, which has finished
    assert decode_load(r, 256).value == 0


def test_costs_prefer_resident_prefix_until_backlog_outweighs_it():
    a = Replica("a", "http://a")
    b = Replica("b", "http://b")
    costs = {c.replica.name: c.total for c in replica_costs([a, b], {"a": 100}, 1700, 16, ScoreWeights())}
    assert costs["a"] < costs["b"]
    a.queued_prompt_tokens = 5000
    costs = {c.replica.name: c.total for c in replica_costs([a, b], {"a": 100}, 1700, 16, ScoreWeights())}
    assert costs["a"] > costs["b"]


def test_ring_is_stable_and_spreads_keys():
    ring = HashRing(["r0", "r1", "r2", "r3"])
    owners = Counter(next(ring.walk(f"key{i}")) for i in range(4000))
    assert set(owners) == {"r0", "r1", "r2", "r3"}
    assert max(owners.values()) / min(owners.values()) < 1.6
    again = HashRing(["r3", "r2", "r1", "r0"])
    assert all(next(ring.walk(f"key{i}")) == next(again.walk(f"key{i}")) for i in range(200))


def test_ring_removal_moves_only_the_removed_replicas_keys():
    full = HashRing(["r0", "r1", "r2", "r3"])
    less = HashRing(["r0", "r1", "r2"])
    for i in range(500):
        before = next(full.walk(i))
        if before != "r3":
            assert next(less.walk(i)) == before


def test_first_on_ring_skips_an_overloaded_first_choice():
    ring = HashRing(["r0", "r1", "r2", "r3"])
    key = "tenant-x"
    first = next(ring.walk(key))
    loads = {n: 0.0 for n in ring.names}
    assert first_on_ring(ring, key, within_bound(loads, 1.0, 0.25)) == (first, True)
    loads[first] = 100.0
    chosen, is_first = first_on_ring(ring, key, within_bound(loads, 1.0, 0.25))
    assert chosen != first and not is_first
    assert loads[chosen] <= load_bound(loads, 1.0, 0.25)


def test_key_bound_is_rounded_up_and_holds_over_many_keys():
    assert key_bound(1, 4, 0.25) == 1  # an idle 4-replica fleet: one key fits anywhere
    assert key_bound(4, 4, 0.25) == 2 and key_bound(8, 4, 0.25) == 3 and key_bound(16, 4, 0.0) == 4
    ring = HashRing([f"r{i}" for i in range(4)])
    held = {n: 0 for n in ring.names}
    for m in range(1, 401):  # each new key takes the first replica on its walk with room
        bound = key_bound(m, 4, 0.25)
        name, _ = first_on_ring(ring, f"k{m % 7}-{m}", {n for n, c in held.items() if c + 1 <= bound})
        held[name] += 1
        assert max(held.values()) <= bound


def test_recent_requests_decay_per_request():
    from app.routing.recent import RecentRequests

    recent = RecentRequests(window=10)
    for _ in range(5):
        recent.add("a")
    a_before = recent.value("a")
    assert 4.0 < a_before < 5.0  # older requests weigh less than the newest
    for _ in range(30):
        recent.add("b")
    assert recent.value("a") < a_before * 0.1  # forgotten after a few windows
    assert recent.value("b") > 8.0 and recent.value("missing") == 0.0
    for _ in range(5000):  # rescaling keeps values finite and consistent
        recent.add("b")
    assert 9.0 < recent.value("b") <= 10.0
