"""Admission in EPP mode (app/admission/, the same step 3c `serve` runs): over a tenant limit the
data plane gets an ImmediateResponse 429 with serve's body, Retry-After and x-ratelimit-*; a
request that waited past the queue TTL gets a 503 with Retry-After; and a concurrency slot is
given back when the response ends and when the data plane resets the stream (none leaks)."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from tests.epp_dataplane import DataPlane, Result, _headers
from tests.epp_testing import EppHandle, chat, conversation, epp_factory_fixture  # noqa: F401

SHORT = [{"role": "user", "content": "hello there"}]


def limits(**values: float) -> dict:
    return {"tenants": {"default": {"policy": "observe"}, "overrides": {"t1": {"limits": values}}}}


def wait_healthy(epp: EppHandle) -> None:
    deadline = time.monotonic() + 10
    while not epp.epp.ready():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def leases(epp: EppHandle, tenant: str) -> int:
    """Concurrency slots the tenant holds now (in the limiter and in the renewal set)."""
    epp.settle()
    admission = epp.app.services.admission
    assert admission is not None
    deadline = time.monotonic() + 5
    while admission._active and time.monotonic() < deadline:  # releases run in a task after the end
        time.sleep(0.01)
    held = admission.limiter._leases.get(tenant, {})  # LocalLimiter (state: memory)
    return max(len(held), len(admission._active))


@pytest.mark.exclusive  # two requests within one second of a 1/s bucket
def test_over_a_limit_is_an_immediate_429_with_serves_body_and_headers(sim_factory, epp_factory, proxy_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    epp = epp_factory(sim, **limits(requests_per_s=1))
    serve = proxy_factory(sim, **limits(requests_per_s=1))
    body = chat(SHORT, stream=False)

    async def drive(plane: DataPlane) -> list[Result]:
        return [await plane.request("/v1/chat/completions", body, {"x-tenant-id": "t1"}) for _ in range(2)]

    ok, shed = epp.run(drive)
    with httpx.Client(base_url=serve.url) as http:
        direct = [http.post("/v1/chat/completions", json=body, headers={"x-tenant-id": "t1"}) for _ in range(2)]
    assert ok.status == 200 == direct[0].status_code
    assert ok.headers["x-ratelimit-limit-requests"] == direct[0].headers["x-ratelimit-limit-requests"] == "1"
    assert ok.headers["x-ratelimit-remaining-requests"] == direct[0].headers["x-ratelimit-remaining-requests"]
    assert shed.status == 429 == direct[1].status_code
    assert shed.log[-1] == "<- immediate_response (429)" and shed.forwarded == b""  # no replica called
    assert shed.json() == direct[1].json() and shed.json()["error"]["code"] == "rate_limit_exceeded"
    for name in ("retry-after", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests"):
        assert shed.headers[name] == direct[1].headers[name], name
    assert int(shed.headers["retry-after"]) >= 1
    assert shed.headers["x-ratelimit-reset-requests"].endswith("ms")
    assert epp.sample("prefixgate_admission_rejections_total", tenant="t1", reason="requests_per_s") == 1
    assert epp.sample("prefixgate_requests_total", route="chat", status="429") == 1


async def hold_a_pick(plane: DataPlane, body: dict, tenant: str) -> tuple[object, pb.ProcessingResponse]:
    """A request the EPP picked a replica for, whose response never comes (yet): the replica
    counts it in flight. Returns the open call and the pick."""
    raw = orjson.dumps(body)
    call = plane.stub.Process()
    await call.write(pb.ProcessingRequest(request_headers=_headers({
        ":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
        "content-length": str(len(raw)), "x-tenant-id": tenant})))
    await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True)))
    pick = await call.read()
    assert pick.HasField("request_headers"), pick
    await call.read()  # the request body's answer
    return call, pick


def test_a_wait_past_the_queue_ttl_is_503_and_the_reset_stream_frees_its_replica(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=0.0)
    epp = epp_factory(sim, admission={"saturated_inflight": 1, "queue": {"ttl_s": 0.3}})
    wait_healthy(epp)
    body = chat(SHORT)

    async def drive(plane: DataPlane) -> tuple[Result, Result]:
        call, _ = await hold_a_pick(plane, body, "a")  # the only replica is saturated now
        started = time.monotonic()
        queued = await plane.request("/v1/chat/completions", body, {"x-tenant-id": "b"})
        waited = time.monotonic() - started
        assert waited >= 0.3, waited
        call.cancel()  # the data plane resets the held stream
        await asyncio.sleep(0.2)
        return queued, await plane.request("/v1/chat/completions", body, {"x-tenant-id": "c"})

    queued, after = epp.run(drive)
    assert queued.status == 503, queued.body
    assert queued.json()["error"]["code"] == "queue_timeout"
    assert int(queued.headers["retry-after"]) >= 1
    assert after.status == 200  # the reset stream gave its replica back
    assert epp.sample("prefixgate_admission_rejections_total", tenant="b", reason="queue_ttl") == 1
    assert all(r.inflight == 0 for r in epp.app.services.replicas.all())


def test_concurrency_slots_are_released_at_the_end_and_on_a_reset_stream(sim_factory, epp_factory):
    sim = sim_factory(replicas=1, time_scale=1.0)
    epp = epp_factory(sim, **limits(concurrent=1))
    long = chat(conversation(3, 1)[0])
    long["max_tokens"] = 64

    async def one(plane: DataPlane, **kw: object) -> Result:
        return await plane.request("/v1/chat/completions", chat(SHORT), {"x-tenant-id": "t1"}, **kw)

    for _ in range(3):  # each ends before the next: one slot serves them all
        assert epp.run(one).status == 200
        assert leases(epp, "t1") == 0

    async def reset(plane: DataPlane) -> Result:
        return await plane.request("/v1/chat/completions", long, {"x-tenant-id": "t1"}, break_after=1)

    r = epp.run(reset)  # the data plane resets the stream after the first chunk
    assert r.status == 200
    assert leases(epp, "t1") == 0
    assert epp.run(one).status == 200  # not a 429: the reset stream's slot came back

    async def held(plane: DataPlane) -> Result:
        call, _ = await hold_a_pick(plane, chat(SHORT), "t1")
        over = await one(plane)
        call.cancel()
        return over

    over = epp.run(held)
    assert over.status == 429 and over.json()["error"]["type"] == "requests"  # the slot was taken
    assert leases(epp, "t1") == 0
    assert epp.run(one).status == 200
