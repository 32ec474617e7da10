"""The workers' live load table (app/routing/siblings.py): what one forked worker holds on a
replica, the others read live, in their scorers and in how they read an engine scrape."""

from __future__ import annotations

import os

import pytest

from app.routing.base import Replica, RouteDecision
from app.routing.load import ReplicaLoad
from app.routing.replicas import ReplicaSet
from app.routing.scorers import ScoreWeights, load_scores
from app.routing.siblings import SLOTS, SiblingLoads
from app.telemetry.metrics import Metrics


def _in_worker(table: SiblingLoads, index: int, work) -> None:  # noqa: ANN001
    """Run `work(replicas)` in a forked worker `index` of `table`; returns once it is done."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            table.bind(index)
            work(ReplicaSet([Replica("a", "http://a"), Replica("b", "http://b")], table))
            os.write(write, b"k")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    assert os.read(read, 1) == b"k"
    os.close(read)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_a_siblings_held_request_is_read_live_and_leaves_the_foreign_count() -> None:
    table = SiblingLoads(3)
    holds: list = []

    def route_two(replicas: ReplicaSet) -> None:  # worker 1: two requests on replica a, in flight
        load = ReplicaLoad(Metrics(16))
        for _ in range(2):
            holds.append(load.hold(RouteDecision(replicas.get("a"), "prefix_hit", prefill_tokens=300)))
        holds[0].prefill_done()

    _in_worker(table, 1, route_two)
    _in_worker(table, 2, lambda replicas: ReplicaLoad(Metrics(16)).hold(
        RouteDecision(replicas.get("b"), "cold_spread", prefill_tokens=50)))
    table.bind(0)
    replicas = ReplicaSet([Replica("a", "http://a"), Replica("b", "http://b")], table)
    a, b = replicas.get("a"), replicas.get("b")
    assert (a.inflight, a.gateway_inflight(), a.gateway_queued_tokens()) == (0, 2, 300)
    assert (b.gateway_inflight(), b.gateway_queued_tokens()) == (1, 50)
    # a scrape of a's engine: the gateway's two requests running, one other gateway's waiting
    a.engine_running, a.engine_waiting, a.inflight_at_scrape = 2.0, 1.0, a.gateway_inflight()
    assert a.engine_foreign() == (0.0, 1.0)
    backlog, decode = load_scores(a, ScoreWeights(waiting_request_tokens=2048, decode_tokens_per_running=256))
    assert backlog.value == 300 + 2048 and decode.value == 2 * 256
    table.close()


def test_a_worker_reads_its_siblings_not_itself() -> None:
    table = SiblingLoads(2)
    table.bind(0)
    replica = ReplicaSet([Replica("a", "http://a")], table).get("a")
    load = ReplicaLoad(Metrics(16))
    hold = load.hold(RouteDecision(replica, "prefix_hit", prefill_tokens=70))
    assert (replica.inflight, replica.gateway_inflight(), replica.gateway_queued_tokens()) == (1, 1, 70)
    hold.release()
    assert (replica.gateway_inflight(), replica.gateway_queued_tokens()) == (0, 0)
    with pytest.raises(ValueError):
        table.bind(2)
    table.close()


def test_past_the_tables_slots_a_replica_is_not_shared_but_still_routed() -> None:
    table = SiblingLoads(2)
    table.bind(0)
    views = [table.view(f"replica-{i}") for i in range(SLOTS)]
    assert all(v is not None for v in views)
    assert table.view("replica-3") is not None  # a known name keeps its slot
    late = ReplicaSet([Replica("late", "http://late")], table).get("late")
    assert late.siblings is None
    late.inflight = 2
    late.publish_load()
    assert late.gateway_inflight() == 2  # its own count, as without the table
    table.close()
