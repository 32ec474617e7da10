"""Endpoint Pickers sharing one Redis (a real redis-server): an EPP restarted between two turns,
and two EPPs active-active with the test data plane alternating between them, route exactly as
one EPP that saw every turn (docs/epp.md, "Several EPPs, restarts")."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.epp_dataplane import DataPlane
from tests.epp_testing import NAMES, EppHandle, chat, conversation, epp_factory_fixture, sse_usage  # noqa: F401

TENANTS, TURNS = 6, 3


def shared(redis_server: Any, namespace: str) -> dict:
    # budgets for a busy test machine (the Redis lookup; a never-seen prompt's tokenisation before
    # the pick): the subject is what the Store holds, not how fast this machine is
    return {"state": redis_server.url, "state_options": {"namespace": namespace, "redis_timeout_s": 2.0},
            "prefix": {"blind_wait_ms": 10_000}}


def reasons(*epps: EppHandle) -> Counter:
    """(backend, reason) -> decisions, summed over `epps`."""
    out: Counter = Counter()
    for epp in epps:
        epp.settle()
        for family in epp.app.services.metrics.registry.collect():
            for s in family.samples:
                if s.name == "prefixgate_route_decisions_total" and s.value:
                    out[(s.labels["backend"], s.labels["reason"])] += int(s.value)
    return out


def turn(epp: EppHandle, tenant: int, messages: list[dict]) -> tuple[str, str, int]:
    """(backend, x-prefixgate-prefix, engine cached tokens) of one streamed turn through `epp`,
    once its post-response work and shared-state writes are done."""
    async def one(plane: DataPlane) -> Any:
        return await plane.request("/v1/chat/completions", chat(messages), {"x-tenant-id": f"t{tenant}"})

    r = epp.run(one)
    assert r.status == 200, r.body
    epp.settle()
    cached = sse_usage(r).get("prompt_tokens_details", {}).get("cached_tokens") or 0
    return r.headers["x-prefixgate-backend"], r.headers["x-prefixgate-prefix"], cached


def readiness(epp: EppHandle) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{epp.epp.health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5).status


def wait_serving(epp: EppHandle) -> None:
    deadline = time.monotonic() + 10
    while readiness(epp) != health_pb2.HealthCheckResponse.SERVING:
        assert time.monotonic() < deadline, "readiness never SERVING"
        time.sleep(0.05)


def test_epp_restart_with_redis_state_routes_the_next_turn_to_its_prefix(
        sim_factory, epp_factory, redis_server, redis_namespace):
    sim = sim_factory(replicas=4, time_scale=0.0)
    first = epp_factory(sim, names=NAMES, **shared(redis_server, redis_namespace))
    convs = [conversation(t, 2) for t in range(4)]
    homes = {t: turn(first, t, convs[t][0])[0] for t in range(4)}
    first.server.stop()  # the lifespan flushes its queued writes to Redis; its memory is gone

    second = epp_factory(sim, names=NAMES, **shared(redis_server, redis_namespace))
    wait_serving(second)
    for t in range(4):
        backend, prefix, cached = turn(second, t, convs[t][1])
        matched, total = map(int, prefix.split("/"))
        assert backend == homes[t]
        assert total > 0 and matched > 0.9 * total, prefix
        assert cached > 1000
    assert reasons(second) == Counter((homes[t], "prefix_hit") for t in range(4))


def run_workload(epps: list[EppHandle]) -> list[tuple[str, str]]:
    """Turn by turn, tenants interleaved; request i goes to epps[i % len(epps)]. (backend, prefix)
    per request."""
    convs = [conversation(40 + t, TURNS) for t in range(TENANTS)]
    out = []
    for k in range(TURNS):
        for t in range(TENANTS):
            epp = epps[len(out) % len(epps)]
            backend, prefix, _ = turn(epp, t, convs[t][k])
            out.append((backend, prefix))
    return out


def test_two_epps_on_one_redis_decide_as_one_epp(sim_factory, epp_factory, redis_server, redis_namespace):
    # one EPP, its own Redis namespace and fresh replicas
    solo_sim = sim_factory(replicas=4, time_scale=0.0)
    solo = epp_factory(solo_sim, names=NAMES, **shared(redis_server, redis_namespace + "-solo"))
    alone = run_workload([solo])

    # two EPPs active-active on one namespace, fresh replicas with the same names
    pair_sim = sim_factory(replicas=4, time_scale=0.0)
    pair = [epp_factory(pair_sim, names=NAMES, **shared(redis_server, redis_namespace + "-pair")) for _ in range(2)]
    for epp in pair:
        wait_serving(epp)
    together = run_workload(pair)

    assert together == alone  # every request: the same replica, the same resident prefix
    assert reasons(*pair) == reasons(solo)
    assert sum(n for (_, why), n in reasons(solo).items() if why == "prefix_hit") == TENANTS * (TURNS - 1)
    for epp in pair:  # both usable at once: no leader, no standby
        assert readiness(epp) == health_pb2.HealthCheckResponse.SERVING
        assert epp.app.services.store.up()
