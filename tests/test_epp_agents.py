"""The agents' routes in EPP mode, `/v1/messages` (Anthropic) and `/v1/responses` (OpenAI
Responses): through the test data plane into simulated replicas, each case run the same way
through `prefixgate serve` into replicas of its own, and the two compared: statuses, the bytes the
client gets, TTFT observations, prompt / cached tokens, predictions, hygiene (a rewrite and the
cache salt as body mutations, a reject as an ImmediateResponse in the route's error shape), and
`previous_response_id` pinning a turn to the replica that produced its history."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from tests.chat_history import words
from tests.epp_dataplane import DataPlane, Result
from tests.epp_testing import EppHandle, endpoint, epp_factory_fixture  # noqa: F401

SECRET_ENV = "PREFIXGATE_TEST_EPP_SALT_SECRET"
STATIC = "You are a coding agent. Follow the repository conventions; run the tests before you answer.\n" * 30
TOOLS = [{"name": f"tool_{i:02d}", "description": f"Tool number {i}: reads or edits files.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for i in range(8)]
INSTRUCTIONS = "You are a coding agent. Repository notes: " + words(11, 400)


def messages_turns(turns: int, head: str = "") -> list[dict]:
    """Bodies of a Claude-Code-shaped session: static system, tools, a growing history."""
    history: list[dict] = []
    out = []
    for turn in range(turns):
        history.append({"role": "user", "content": [{"type": "text", "text": f"Turn {turn}: fix test {turn}."}]})
        out.append({"model": "sim", "max_tokens": 8, "stream": True, "system": head + STATIC, "tools": TOOLS,
                    "messages": list(history)})
        history.append({"role": "assistant", "content": [{"type": "text", "text": "done " + words(turn, 8)}]})
    return out


def sse_events(body: bytes) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in body.decode().split("\n") if line.startswith("event:")]


def sample_sum(services: Any, name: str, **labels: str) -> float:
    return sum(s.value for family in services.metrics.registry.collect() for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def observed(services: Any, route: str, tenant: str) -> dict[str, float]:
    """What the gateway recorded for a run: the numbers serve and the EPP must agree on."""
    return {
        "requests_200": sample_sum(services, "prefixgate_requests_total", route=route, status="200"),
        "ttft": sample_sum(services, "prefixgate_ttft_seconds_count"),
        "prompt": sample_sum(services, "prefixgate_prompt_tokens_total", tenant=tenant),
        "engine_cached": sample_sum(services, "prefixgate_cached_tokens_total", tenant=tenant, source="engine"),
        "predicted": sample_sum(services, "prefixgate_cached_tokens_total", tenant=tenant, source="predicted"),
        "processed": services.prefix.processed,
    }


def settle_serve(proxy: Any) -> None:
    import asyncio

    proxy.settle()
    asyncio.run_coroutine_threadsafe(proxy.services.prefix.drain(), proxy.server.loop).result(20)


def through_both(sim_factory, epp_factory, proxy_factory, path: str, bodies: list[dict], tenant: str = "acme",
                 sim: dict | None = None, **sections: Any) -> tuple[list[Result], list[httpx.Response], EppHandle, Any]:
    """The same bodies, in order, through an EPP and through serve (each before its own replicas)."""
    epp = epp_factory(sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000, **(sim or {})), **sections)
    serve = proxy_factory(sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000, **(sim or {})), **sections)
    headers = {"x-tenant-id": tenant}

    async def drive(plane: DataPlane) -> list[Result]:
        out = []
        for body in bodies:
            out.append(await plane.request(path, body, headers))
            epp.settle()  # as a client would: the next turn after this one's end
        return out

    results = epp.run(drive)
    direct = []
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        for body in bodies:
            direct.append(http.post(path, json=body, headers=headers))
            settle_serve(serve)
    epp.settle()
    return results, direct, epp, serve


def test_a_messages_session_is_recorded_as_serve_records_it(sim_factory, epp_factory, proxy_factory):
    bodies = messages_turns(3)
    results, direct, epp, serve = through_both(sim_factory, epp_factory, proxy_factory, "/v1/messages", bodies)
    for r, d in zip(results, direct, strict=True):
        assert r.status == 200 == d.status_code, r.body
        kinds = sse_events(r.body)
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert kinds == sse_events(d.content)  # the client gets serve's Anthropic stream
        assert b"[DONE]" not in r.body
    mine, theirs = observed(epp.app.services, "messages", "acme"), observed(serve.services, "messages", "acme")
    assert mine == theirs, (mine, theirs)
    assert mine["ttft"] == 3 and mine["engine_cached"] > 500  # later turns hit the cache
    assert mine["predicted"] == mine["engine_cached"]
    assert list(p for _, _, p, _ in epp.app.services.prefix.predictions) == \
        list(p for _, _, p, _ in serve.services.prefix.predictions)


def test_a_non_streamed_message_and_count_tokens(sim_factory, epp_factory, proxy_factory):
    body = {**messages_turns(1)[0], "stream": False}
    results, direct, epp, serve = through_both(sim_factory, epp_factory, proxy_factory, "/v1/messages", [body])
    r, d = results[0], direct[0]
    assert r.status == 200 and r.json()["type"] == "message"
    assert r.json()["usage"] == d.json()["usage"]
    assert observed(epp.app.services, "messages", "acme") == observed(serve.services, "messages", "acme")

    async def count(plane: DataPlane) -> Result:  # a passthrough path: picked, bytes untouched
        return await plane.request("/v1/messages/count_tokens", {"model": "sim", "messages": body["messages"]})

    counted = epp.run(count)
    direct_count = httpx.post(serve.url + "/v1/messages/count_tokens", timeout=30,
                              json={"model": "sim", "messages": body["messages"]})
    assert counted.status == 200 and counted.json() == direct_count.json()
    assert counted.forwarded == orjson.dumps({"model": "sim", "messages": body["messages"]})
    # a passthrough path is counted as serve counts it
    assert epp.sample("prefixgate_requests_total", route="passthrough", status="200") == \
        serve.sample("prefixgate_requests_total", route="passthrough", status="200") == 1


def billing(turn: int) -> dict[str, str]:
    """Claude Code's billing-header system block: its `cch=` value changes every turn."""
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.a1b; "
                                    f"cc_entrypoint=cli; cch={(0x1a2b3 + 7919 * turn) % 0xfffff:05x};"}


def test_messages_rewrite_and_reject_as_serve_does(sim_factory, epp_factory, proxy_factory):
    # an engine that keeps the billing header (SGLang-like): only the rewrite makes turn 2 hit
    bodies = []
    for turn, body in enumerate(messages_turns(2)):
        bodies.append({**body, "stream": False, "system": [billing(turn), {"type": "text", "text": STATIC}]})
    config = {"prefix": {"billing_header": "keep"},
              "tenants": {"default": {"policy": "rewrite"}, "overrides": {"strict": {"policy": "reject"}}}}
    results, direct, epp, serve = through_both(sim_factory, epp_factory, proxy_factory, "/v1/messages", bodies,
                                               sim={"strip_billing_header": False}, **config)
    for r, d in zip(results, direct, strict=True):
        assert r.status == 200 == d.status_code, (r.body, d.text)
        assert r.headers["x-prefixgate-rewrites"] == d.headers["x-prefixgate-rewrites"]
        assert "strip_billing_header" in r.headers["x-prefixgate-rewrites"]
        forwarded = orjson.loads(r.forwarded)
        assert "x-anthropic-billing-header" not in orjson.dumps(forwarded).decode()  # the replica got the rewrite
    assert results[1].json()["usage"] == direct[1].json()["usage"]
    assert results[1].json()["usage"]["cache_read_input_tokens"] > 500  # the changing header no longer breaks it
    assert epp.sample("prefixgate_rewrites_total", route="messages", tenant="acme", kind="strip_billing_header") == 2

    async def strict(plane: DataPlane) -> Result:
        return await plane.request("/v1/messages", bodies[0], {"x-tenant-id": "strict"})

    refused = epp.run(strict)
    again = httpx.post(serve.url + "/v1/messages", json=bodies[0], headers={"x-tenant-id": "strict"}, timeout=30)
    assert refused.status == 400 == again.status_code
    assert refused.json() == again.json() and refused.json()["type"] == "error"  # Anthropic's shape
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert refused.log[-1] == "<- immediate_response (400)"


def test_cache_salt_is_a_body_mutation_on_both_routes(sim_factory, epp_factory, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    epp = epp_factory(sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000),
                      tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})
    message = {**messages_turns(1)[0], "stream": False}
    response = {"model": "sim", "instructions": INSTRUCTIONS, "input": "same question", "max_output_tokens": 4,
                "store": False}

    async def drive(plane: DataPlane) -> list[Result]:
        out = []
        for path, body in (("/v1/messages", message), ("/v1/responses", response)):
            for tenant in ("alice", "bob", "alice"):
                out.append(await plane.request(path, body, {"x-tenant-id": tenant}))
                epp.settle()
        return out

    results = epp.run(drive)
    assert all(r.status == 200 for r in results), [r.body for r in results]
    salts = [orjson.loads(r.forwarded)["cache_salt"] for r in results]
    assert salts[0] == salts[2] == salts[3] == salts[5] != salts[1] == salts[4]  # per tenant, on both routes
    m = [r.json()["usage"] for r in results[:3]]
    assert m[0]["cache_read_input_tokens"] == m[1]["cache_read_input_tokens"] == 0  # bob never hits alice's
    assert m[2]["cache_read_input_tokens"] > 200
    rs = [r.json()["usage"]["input_tokens_details"]["cached_tokens"] for r in results[3:]]
    assert rs[0] == rs[1] == 0 and rs[2] > 200


def responses_turns() -> list[dict]:
    return [{"model": "sim", "instructions": INSTRUCTIONS, "input": f"question {n} " + words(3 + n, 30),
             "max_output_tokens": 6, "stream": True} for n in range(3)]


def response_id(result: Result) -> str:
    for line in result.body.split(b"\n"):
        if line.startswith(b"data: {") and b'"response.completed"' in line:
            return orjson.loads(line[6:])["response"]["id"]
    raise AssertionError(result.body[-300:])


def test_a_responses_stream_is_recorded_as_serve_records_it(sim_factory, epp_factory, proxy_factory):
    first = responses_turns()[0]
    results, direct, epp, serve = through_both(sim_factory, epp_factory, proxy_factory, "/v1/responses",
                                               [first, {**first, "stream": False}])
    assert [r.status for r in results] == [200, 200] == [d.status_code for d in direct]
    kinds = sse_events(results[0].body)
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds == sse_events(direct[0].content)
    assert results[1].json()["usage"] == direct[1].json()["usage"]
    mine, theirs = observed(epp.app.services, "responses", "acme"), observed(serve.services, "responses", "acme")
    assert mine == theirs, (mine, theirs)
    assert mine["ttft"] == 1  # the streamed answer's first text delta (a buffered answer has none)
    assert mine["engine_cached"] > 200 and mine["predicted"] == mine["engine_cached"]


def test_previous_response_id_pins_the_turn_to_the_replica_that_holds_it(sim_factory, epp_factory):
    sim = sim_factory(replicas=2, time_scale=0.0, kv_blocks=100_000)
    epp = epp_factory(sim, names=["r0", "r1"], routing={"policy": "round_robin"})
    by_endpoint = {endpoint(u): n for u, n in zip(sim.urls, ["r0", "r1"], strict=True)}

    async def drive(plane: DataPlane) -> list[Result]:
        out = [await plane.request("/v1/responses", responses_turns()[0], {"x-tenant-id": "acme"})]
        for n in range(1, 4):  # round robin would alternate; the id pins every turn to its producer
            epp.settle()
            body = {"model": "sim", "previous_response_id": response_id(out[-1]), "input": f"follow-up {n}",
                    "max_output_tokens": 6, "stream": True}
            out.append(await plane.request("/v1/responses", body, {"x-tenant-id": "acme"}))
        epp.settle()
        got = await plane.request(f"/v1/responses/{response_id(out[-1])}", b"", {":method": "GET"})
        return [*out, got]

    *turns, retrieved = epp.run(drive)
    homes = {by_endpoint[r.served] for r in turns}
    assert len(homes) == 1, [r.served for r in turns]
    assert all(r.status == 200 for r in turns)
    rows = list(epp.app.services.prefix.predictions)
    assert len(rows) == 4 and all(p == d for _, _, p, d in rows), rows
    assert sum(d or 0 for _, _, _, d in rows[1:]) > 300  # the history the engine prepended hit the cache
    assert retrieved.status == 200 and by_endpoint[retrieved.served] in homes  # GET by id: its owner
