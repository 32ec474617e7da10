"""The Endpoint Picker end to end: the test data plane (tests/epp_dataplane.py) speaking ext_proc
over real gRPC + TLS on loopback to `prefixgate epp`'s servers, forwarding over real HTTP to
simulated replicas, as Envoy would (docs/epp.md)."""

from __future__ import annotations

import time

import grpc
import httpx
import orjson
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.epp import protocol
from tests.chat_history import words
from tests.epp_dataplane import DataPlane, Result
from tests.epp_testing import NAMES, chat, conversation, endpoint, epp_factory_fixture, sse_usage, total  # noqa: F401

STATIC = "You are the support assistant for Acme.\n" + "Refunds within 30 days; shipping 3 to 5 days.\n" * 60


def test_turns_of_a_tenant_stay_on_their_replica_and_hit_its_cache(sim_factory, epp_factory):
    sim = sim_factory(replicas=4, time_scale=0.0)
    epp = epp_factory(sim, names=NAMES)
    by_endpoint = dict(zip(map(endpoint, sim.urls), NAMES, strict=True))

    async def drive(plane: DataPlane) -> dict[int, set[str]]:
        homes: dict[int, set[str]] = {}
        for turn in range(3):
            for tenant in range(4):
                r = await plane.request("/v1/chat/completions", chat(conversation(tenant, 3)[turn]),
                                        {"x-tenant-id": f"t{tenant}"})
                assert r.status == 200, r.body
                assert r.body.rstrip().endswith(b"data: [DONE]")
                assert r.headers["x-prefixgate-backend"] == by_endpoint[r.served]
                homes.setdefault(tenant, set()).add(r.served)
                if turn > 0:
                    assert sse_usage(r)["prompt_tokens_details"]["cached_tokens"] > 1000
        return homes

    homes = epp.run(drive)
    assert all(len(s) == 1 for s in homes.values()), homes
    assert len(set().union(*homes.values())) >= 2  # cold tenants were spread
    hits = sum(epp.sample("prefixgate_route_decisions_total", backend=n, reason="prefix_hit") or 0 for n in NAMES)
    assert hits == 8
    assert total(epp, "prefixgate_ttft_seconds_count") == 12  # every streamed answer's first generated token was observed
    continuity = epp.sample("prefixgate_prefix_continuity_ratio", tenant="t0")
    assert continuity is not None and continuity > 0.9


def test_reject_is_an_immediate_response_with_serves_body(sim_factory, epp_factory, proxy_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    strict = {"tenants": {"default": {"policy": "observe"}, "overrides": {"strict": {"policy": "reject"}}}}
    epp = epp_factory(sim, **strict)
    serve = proxy_factory(sim, **strict)
    body = chat([{"role": "system", "content": "Current time: 2026-04-14T09:31:07Z\n" + STATIC},
                 {"role": "user", "content": "hi"}], stream=False)
    r = epp.run(lambda plane: plane.request("/v1/chat/completions", body, {"x-tenant-id": "strict"}))
    direct = httpx.post(serve.url + "/v1/chat/completions", json=body, headers={"x-tenant-id": "strict"})
    assert r.status == 400 == direct.status_code
    assert r.json() == direct.json() and r.json()["error"]["code"] == "dynamic_head"
    assert r.headers["x-prefixgate-hygiene"] == direct.headers["x-prefixgate-hygiene"]
    assert epp.sample("prefixgate_rejections_total", route="chat", tenant="strict", reason="dynamic_head") == 1


def test_rewrite_reaches_the_replica_as_a_body_mutation(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    epp = epp_factory(sim, tenants={"default": {"policy": "rewrite"}})
    head = "Current time: 2026-04-14T09:31:07Z\n"
    body = chat([{"role": "system", "content": head + STATIC}, {"role": "user", "content": "Where?"}], stream=False)
    r = epp.run(lambda plane: plane.request("/v1/chat/completions", body, {"x-tenant-id": "t1"}))
    assert r.status == 200, r.body
    assert r.headers["x-prefixgate-rewrites"] == "move_dynamic(1)"
    forwarded = orjson.loads(r.forwarded)
    assert forwarded["messages"][0]["content"] == STATIC
    assert forwarded["messages"][1]["content"] == "Where?\n\n" + head.rstrip("\n")
    assert epp.sample("prefixgate_rewrites_total", route="chat", tenant="t1", kind="move_dynamic") == 1


def test_subset_hint_is_honoured_and_an_empty_or_foreign_subset_is_503(sim_factory, epp_factory):
    sim = sim_factory(replicas=3, time_scale=0.0)
    epp = epp_factory(sim, names=NAMES[:3])
    only = endpoint(sim.urls[2])

    async def drive(plane: DataPlane) -> list[Result]:
        out = []
        for tenant in range(4):
            out.append(await plane.request("/v1/chat/completions", chat(conversation(tenant, 1)[0]),
                                           {"x-tenant-id": f"t{tenant}"}, subset=[only]))
        out.append(await plane.request("/v1/chat/completions", chat(conversation(9, 1)[0]), subset=[]))
        out.append(await plane.request("/v1/chat/completions", chat(conversation(9, 1)[0]),
                                       subset=["10.9.9.9:8000"]))
        return out

    *picked, empty, foreign = epp.run(drive)
    for r in picked:
        assert r.status == 200 and r.endpoints == [only] and r.served == only
    for r in (empty, foreign):
        assert r.status == 503, r.body
        assert r.json()["error"]["type"] == "server_error"


def test_retry_to_the_second_endpoint_follows_the_served_metadata(sim_factory, epp_factory):
    sim = sim_factory(replicas=2, time_scale=0.0)
    epp = epp_factory(sim, names=["gone", "live"],
                      routing={"policy": "round_robin", "max_retries": 1, "health_interval_s": 3600})
    gone, live = map(endpoint, sim.urls)
    deadline = time.monotonic() + 5
    # the first health round saw both replicas up (`ready()` is true once one of them is: the
    # other's probe may still be in flight, and would then see it dead)
    while not all(r.healthy for r in epp.app.services.replicas.all()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sim.servers[0].stop()  # dies after the health check: the EPP still lists it

    async def drive(plane: DataPlane) -> list[Result]:
        return [await plane.request("/v1/chat/completions", chat(conversation(i, 1)[0]), {"x-tenant-id": f"t{i}"})
                for i in range(2)]

    results = epp.run(drive)
    retried = [r for r in results if r.endpoints[0] == gone]
    assert len(retried) == 1, [r.endpoints for r in results]
    r = retried[0]
    assert r.endpoints == [gone, live]
    assert r.status == 200 and r.served == live
    assert r.headers["x-prefixgate-backend"] == "live"  # the accounting followed the served endpoint
    assert epp.sample("prefixgate_upstream_errors_total", backend="gone", kind="connect") == 1
    assert total(epp, "prefixgate_ttft_seconds_count", backend="live") == 2
    assert total(epp, "prefixgate_route_decisions_total", backend="live") == 2
    assert all(rep.inflight == 0 for rep in epp.app.services.replicas.all())


def test_replica_death_mid_stream_is_a_midstream_error(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=1.0)
    epp = epp_factory(sim)
    body = chat(conversation(1, 1)[0])
    body["max_tokens"] = 64
    r = epp.run(lambda plane: plane.request("/v1/chat/completions", body, break_after=2))
    assert r.status == 200
    epp.settle()
    services = epp.app.services
    name = services.replicas.all()[0].name
    assert epp.sample("prefixgate_upstream_errors_total", backend=name, kind="midstream") == 1
    assert services.replicas.all()[0].inflight == 0


def test_grpc_health_says_serving_only_while_usable(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    epp = epp_factory(sim)

    def check(service: str) -> int:
        with grpc.insecure_channel(f"127.0.0.1:{epp.epp.health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def wait_for(service: str, status: int) -> None:
        deadline = time.monotonic() + 5
        while check(service) != status:
            assert time.monotonic() < deadline, f"{service} never became {status}"
            time.sleep(0.05)

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("liveness", "readiness", protocol.EXT_PROC_SERVICE):
        wait_for(service, serving)
    epp.app.begin_drain()  # SIGTERM: readiness goes first, liveness stays
    wait_for("readiness", not_serving)
    wait_for(protocol.EXT_PROC_SERVICE, not_serving)
    assert check("liveness") == serving


def test_usage_is_observed_but_not_shown_to_a_client_that_did_not_ask(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    epp = epp_factory(sim)
    body = {"model": "sim", "messages": conversation(2, 1)[0], "max_tokens": 4, "stream": True}
    r = epp.run(lambda plane: plane.request("/v1/chat/completions", body, {"x-tenant-id": "quiet"}))
    assert r.status == 200
    assert orjson.loads(r.forwarded)["stream_options"] == {"include_usage": True}  # asked upstream
    assert b'"usage":{' not in r.body and r.body.rstrip().endswith(b"data: [DONE]")  # dropped for the client
    assert (epp.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant="quiet") or 0) > 1000


def test_completions_and_buffered_answers_are_observed(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    epp = epp_factory(sim)
    body = {"model": "sim", "prompt": "tenant c documents: " + words(5, 800), "max_tokens": 4}
    r = epp.run(lambda plane: plane.request("/v1/completions", body, {"x-tenant-id": "c"}))
    assert r.status == 200 and r.json()["object"] == "text_completion"
    prompt = r.json()["usage"]["prompt_tokens"]
    assert epp.sample("prefixgate_prompt_tokens_total", route="completions", model="sim", tenant="c") == prompt
    assert epp.sample("prefixgate_requests_total", route="completions", status="200") == 1
