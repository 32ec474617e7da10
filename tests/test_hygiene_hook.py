"""The hygiene stage over real loopback HTTP: policies, rewrites, cache isolation.

Bodies the proxy forwards are read on a scripted upstream (tests/fake_upstream.py); cache effects
are read on the simulator (usage.prompt_tokens_details.cached_tokens and /sim/state).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from fake_upstream import FakeResponse

SECRET_ENV = "PREFIXGATE_TEST_SALT_SECRET"
STATIC = "You are the support assistant for Acme.\n" + "Refunds within 30 days; shipping 3 to 5 days.\n" * 60
DECOY = "Our refund policy was last changed on 2024-01-15.\n"
COMPLETION = {"id": "c1", "object": "chat.completion", "model": "fake", "created": 1,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}


def json_reply(_: Any) -> FakeResponse:
    return FakeResponse(headers={"content-type": "application/json"}, chunks=[(0, orjson.dumps(COMPLETION))])


def messages(head: str = "", question: str = "Where is my order?") -> list[dict]:
    return [{"role": "system", "content": head + STATIC}, {"role": "user", "content": question}]


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} things",
                                             "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}


def post(proxy: Any, body: dict, tenant: str = "t1", **headers: str) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/chat/completions", json={"model": "fake", **body},
                      headers={"x-tenant-id": tenant, **headers}, timeout=30)


def policy(name: str, **tenants: Any) -> dict:
    return {"tenants": {"default": {"policy": name}, **tenants}}


def test_observe_counts_and_forwards_the_original_bytes(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], **policy("observe"))
    body = {"model": "fake", "messages": messages("Current time: 2026-04-14T09:31:07Z\n")}
    r = post(proxy, body)
    assert r.status_code == 200
    assert "x-prefixgate-hygiene" not in r.headers and "x-prefixgate-rewrites" not in r.headers
    assert orjson.loads(up.requests[0].body) == body
    assert proxy.sample("prefixgate_hygiene_findings_total", route="chat", tenant="t1", kind="dynamic_head") == 1


def test_warn_lists_findings_in_a_header(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], **policy("warn"))
    r = post(proxy, {"messages": messages("Current time: 2026-04-14T09:31:07Z\n")})
    assert r.status_code == 200
    assert r.headers["x-prefixgate-hygiene"] == "dynamic_head(messages[0] line 1: timestamp)"
    assert "2026" not in r.headers["x-prefixgate-hygiene"]
    clean = post(proxy, {"messages": messages(DECOY)})  # a fixed date is not a finding
    assert "x-prefixgate-hygiene" not in clean.headers
    # tools: a stable order is fine, a varying one is a finding
    tools = [tool("b"), tool("a"), tool("c")]
    assert "x-prefixgate-hygiene" not in post(proxy, {"messages": messages(), "tools": tools}).headers
    assert "x-prefixgate-hygiene" not in post(proxy, {"messages": messages(), "tools": tools}).headers
    varied = post(proxy, {"messages": messages(), "tools": tools[::-1]})
    assert varied.headers["x-prefixgate-hygiene"] == "tool_order(tools: order)"
    assert proxy.sample("prefixgate_hygiene_findings_total", route="chat", tenant="t1", kind="tool_order") == 1
    # warn never changes the body: every request reached the engine with its own tools, in its order
    assert [orjson.loads(u.body).get("tools") for u in up.requests] == [None, None, tools, tools, tools[::-1]]


def test_rewrite_moves_sorts_and_reports(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], **policy("rewrite"))
    head = "Current time: 2026-04-14T09:31:07Z\n"
    r = post(proxy, {"messages": messages(head), "tools": [tool("b"), tool("a")]})
    assert r.status_code == 200
    assert r.headers["x-prefixgate-rewrites"] == "move_dynamic(1), sort_tools"
    assert "x-prefixgate-hygiene" not in r.headers
    sent = orjson.loads(up.requests[0].body)
    assert sent["messages"][0]["content"] == STATIC
    assert sent["messages"][1]["content"] == "Where is my order?\n\n" + head.rstrip("\n")
    assert [t["function"]["name"] for t in sent["tools"]] == ["a", "b"]
    # a value at the end and a decoy date stay; nothing to do, nothing re-serialised
    body = {"model": "fake", "messages": [{"role": "system", "content": DECOY + STATIC + "Now: 09:31:07 UTC"},
                                          {"role": "user", "content": "hi"}]}
    r = post(proxy, body)
    assert "x-prefixgate-rewrites" not in r.headers
    assert up.requests[1].body == orjson.dumps(body)
    assert proxy.sample("prefixgate_rewrites_total", route="chat", tenant="t1", kind="move_dynamic") == 1
    assert proxy.sample("prefixgate_rewrites_total", route="chat", tenant="t1", kind="sort_tools") == 1


def test_rewrite_leaves_unfixable_findings_in_the_hygiene_header(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], **policy("rewrite"), hygiene={"rewrites": {"max_moved_lines": 1}})
    head = "Current time: 2026-04-14T09:31:07Z\nSession id: sess_4f3e2d1c0b\n"
    r = post(proxy, {"messages": messages(head)})
    assert "x-prefixgate-rewrites" not in r.headers
    assert r.headers["x-prefixgate-hygiene"].count("dynamic_head") == 2
    assert orjson.loads(up.requests[0].body)["messages"][0]["content"] == head + STATIC


def test_rewrite_system_end_target_and_canonical_json(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], **policy("rewrite"),
                          hygiene={"rewrites": {"move_target": "system_end", "canonical_json": True}})
    messy = {"function": {"parameters": {"type": "object"}, "name": "x"}, "type": "function"}
    r = post(proxy, {"messages": messages("Today is 2026-04-14.\n"), "tools": [messy]})
    assert r.headers["x-prefixgate-rewrites"] == "move_dynamic(1), canonical_json"
    sent = orjson.loads(up.requests[0].body)
    assert sent["messages"][0]["content"] == STATIC + "Today is 2026-04-14."
    assert list(sent["tools"][0]) == ["function", "type"] and list(sent["tools"][0]["function"]) == ["name", "parameters"]


def test_reject_is_openai_shaped_and_explains_the_fix(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], **policy("observe", overrides={"strict": {"policy": "reject"}}))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake", messages=messages("Current time: 2026-04-14T09:31:07Z\n"),
                                       extra_headers={"x-tenant-id": "strict"})
    err = info.value.body
    assert info.value.status_code == 400
    assert err["code"] == "dynamic_head" and err["param"] == "messages[0].content"
    assert "messages[0] line 1" in err["message"] and "Fix: move that line" in err["message"]
    assert info.value.response.headers["x-prefixgate-hygiene"].startswith("dynamic_head(")
    assert up.requests == []  # never forwarded
    assert proxy.sample("prefixgate_rejections_total", route="chat", tenant="strict", reason="dynamic_head") == 1
    # a clean request of the strict tenant passes, and other tenants are only observed
    ok = client.chat.completions.create(model="fake", messages=messages(DECOY),
                                        extra_headers={"x-tenant-id": "strict"})
    assert ok.choices[0].message.content == "ok"
    client.chat.completions.create(model="fake", messages=messages("Current time: 2026-04-14T09:31:07Z\n"),
                                   extra_headers={"x-tenant-id": "lenient"})
    assert len(up.requests) == 2
    # varying tool order is rejected too, with its own fix
    client.chat.completions.create(model="fake", messages=messages(), tools=[tool("a"), tool("b")],
                                   extra_headers={"x-tenant-id": "strict"})
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake", messages=messages(), tools=[tool("b"), tool("a")],
                                       extra_headers={"x-tenant-id": "strict"})
    assert info.value.body["code"] == "tool_order" and "sorted by function name" in info.value.body["message"]


# ---------------------------------------------------------------------------- the simulator
def sim_chat(client: openai.OpenAI, tenant: str, head: str, question: str = "Where is my order?",
             **extra: Any) -> tuple[int, int, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=messages(head, question), max_tokens=4,
        extra_headers={"x-tenant-id": tenant}, **extra)
    usage = raw.parse().usage
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, raw.headers


def test_rewrite_turns_misses_into_hits(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, **policy("observe", overrides={"fixed": {"policy": "rewrite"}}))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    ratios: dict[str, float] = {}
    for tenant in ("broken", "fixed"):
        sim_chat(client, tenant, f"Current time: 2026-04-14T09:31:0{len(tenant)}Z [{tenant}]\n")
        prompt, cached, _ = sim_chat(client, tenant, f"Current time: 2026-04-14T09:32:1{len(tenant)}Z [{tenant}]\n",
                                     "And my refund?")
        ratios[tenant] = cached / prompt
    assert ratios["broken"] < 0.1
    assert ratios["fixed"] > 0.9
    # streamed, without include_usage: the rewritten body also carries the proxy's usage request
    stream = client.chat.completions.create(
        model="sim", messages=messages("Current time: 2026-04-14T09:40:00Z [fixed]\n", "Third?"), max_tokens=4,
        stream=True, extra_headers={"x-tenant-id": "fixed"})
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)  # the client did not ask for usage
    proxy.settle()
    prompt = proxy.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant="fixed")
    cached = proxy.sample("prefixgate_cached_tokens_total", route="chat", model="sim", tenant="fixed", source="engine")
    assert prompt and cached and cached / prompt > 0.6  # 3 requests, the first one cold


SALT = {"tenants": {"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}}}


def test_salt_isolates_tenants_and_the_same_tenant_shares(sim_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, **SALT)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    a1 = sim_chat(client, "alice", "")
    proxy.drain()  # each turn's blocks learned before the next is routed, however loaded the CPU
    b1 = sim_chat(client, "bob", "")  # identical prompt, other tenant
    proxy.drain()
    a2 = sim_chat(client, "alice", "")
    assert a1[1] == 0 and b1[1] == 0, "another tenant's identical prompt must not hit"
    assert a2[1] >= a2[0] - 16, "the same tenant shares its cache"
    state = httpx.get(sim.urls[0] + "/sim/state", timeout=10).json()
    assert [r["cached_tokens"] for r in state["recent_requests"]] == [0, 0, a2[1]]
    # the fingerprint chain starts from the salt: predictions match the engine exactly
    hook = proxy.services.prefix
    proxy.settle()
    deadline = time.monotonic() + 20
    while hook.processed < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    # (by request id: the after-response work of two requests may finish in either order)
    predicted = {rid: (p, d) for rid, _, p, d in hook.predictions}
    assert [predicted[r[2]["x-request-id"]] for r in (a1, b1, a2)] == [(0, 0), (0, 0), (a2[1], a2[1])]


def test_without_salt_tenants_share(sim_factory, proxy_factory) -> None:
    """Control for the isolation test: the same workload without salts does share blocks."""
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    sim_chat(client, "alice", "")
    prompt, cached, _ = sim_chat(client, "bob", "")
    assert cached >= prompt - 16


def test_client_salt_replaced(sim_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, **SALT)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    sim_chat(client, "alice", "")
    # bob tries to read alice's cache with a salt of his choosing: it is replaced by his own
    prompt, cached, headers = sim_chat(client, "bob", "", extra_body={"cache_salt": "guess"})
    assert cached == 0 and headers["x-prefixgate-rewrites"] == "client_salt"
    prompt, cached, _ = sim_chat(client, "bob", "", extra_body={"cache_salt": "other-guess"})
    assert cached >= prompt - 16  # bob's own salt both times
    assert proxy.sample("prefixgate_rewrites_total", route="chat", tenant="bob", kind="client_salt") == 2


def test_client_salt_rejected(fake_upstream_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV,
                                                            "client_salt": "reject"}})
    r = post(proxy, {"messages": messages(), "cache_salt": "guess"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "cache_salt_not_allowed" and r.json()["error"]["param"] == "cache_salt"
    assert up.requests == []
    r = post(proxy, {"messages": messages()})
    sent = orjson.loads(up.requests[0].body)
    assert r.status_code == 200 and sent["cache_salt"].startswith("pg1-") and len(sent["cache_salt"]) <= 128
    assert proxy.sample("prefixgate_rejections_total", route="chat", tenant="t1", reason="client_salt") == 1


def test_isolation_without_secret_fails_loudly(proxy_factory, monkeypatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ValueError, match=SECRET_ENV):
        proxy_factory(["http://127.0.0.1:9"], **SALT)


def test_client_salt_passes_through_when_isolation_is_off(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url])
    body = {"model": "fake", "messages": messages(), "cache_salt": "their-own"}
    post(proxy, body)
    assert up.requests[0].body == orjson.dumps(body)


def test_completions_get_the_salt_but_no_scan(fake_upstream_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    up = fake_upstream_factory(json_reply)
    proxy = proxy_factory([up.url], tenants={**SALT["tenants"], "default": {"policy": "reject"}})
    prompt = "Current time: 2026-04-14T09:31:07Z\n" + STATIC
    r = httpx.post(proxy.url + "/v1/completions", json={"model": "fake", "prompt": prompt},
                   headers={"x-tenant-id": "t1"}, timeout=30)
    assert r.status_code == 200
    sent = orjson.loads(up.requests[0].body)
    assert sent["prompt"] == prompt and sent["cache_salt"].startswith("pg1-")
