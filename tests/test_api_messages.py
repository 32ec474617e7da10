"""`POST /v1/messages` end to end: the real `anthropic` client -> proxy -> simulator, over loopback.

- vLLM mode (the simulator drops the billing-header block, as vLLM 0.32): predicted cached tokens
  equal the engine's on a Claude-Code-shaped multi-turn session, the hygiene finding is counted,
  and no break is reported (none happens);
- SGLang-like mode (`strip_billing_header=False`, proxy `prefix.billing_header=keep`): the same
  session breaks at the billing header under `observe` (a `dynamic_head` diagnosis) and hits
  almost fully under `rewrite`; predictions equal the engine's in both;
- usage in Anthropic's meaning lands in the prompt/cached-token metrics; TTFT is observed;
- cache isolation on this route; count_tokens; Anthropic-shaped errors, before and mid-stream.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import pytest

STATIC = "You are a coding agent. Follow the repository conventions; run the tests before you answer.\n" * 30
TOOLS = [{"name": f"tool_{i:02d}", "description": f"Tool number {i}: reads or edits files.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for i in range(22)]
SECRET_ENV = "PREFIXGATE_TEST_SALT_SECRET"


def billing(turn: int) -> dict[str, str]:
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.a1b; "
                                    f"cc_entrypoint=cli; cch={(0x1a2b3 + 7919 * turn) % 0xfffff:05x};"}


def wait_processed(hook: Any, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def session(client: anthropic.Anthropic, tenant: str, turns: int, hook: Any, start: int = 0) -> list[Any]:
    """A Claude-Code-shaped session: billing header + static system blocks, 22 tools, a growing
    history with a tool_use / tool_result round trip and an inline system reminder. Returns each
    turn's final usage."""
    history: list[dict[str, Any]] = []
    usages = []
    for turn in range(turns):
        if turn == 1:
            history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0", "content": "file contents: def f(): pass"}]})
        if turn == 2:  # an inline system reminder: rendered in place (the template accepts it)
            history.append({"role": "system", "content": [{"type": "text", "text": "<system-reminder>tests "
                                                                                   "changed</system-reminder>"}]})
        history.append({"role": "user", "content": [{"type": "text", "text": f"Turn {turn}: fix the failing test."}]})
        with client.messages.stream(model="sim", max_tokens=12, system=[billing(turn), {"type": "text", "text": STATIC}],
                                    tools=TOOLS, messages=history, extra_headers={"x-tenant-id": tenant}) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        usages.append(final.usage)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if turn == 0:
            content.append({"type": "tool_use", "id": "toolu_0", "name": "tool_03", "input": {"path": "a.py"}})
        history.append({"role": "assistant", "content": content})
        wait_processed(hook, start + turn + 1)
    return usages


def prompt_of(u: Any) -> int:
    """Anthropic usage: input_tokens excludes cache reads and writes, the prompt is the sum."""
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def client_for(proxy: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)


def ttft_count(proxy: Any) -> float:
    """Observations of prefixgate_ttft_seconds, all backends and prompt buckets."""
    proxy.settle()
    return sum(sample.value for metric in proxy.services.metrics.registry.collect()
               for sample in metric.samples if sample.name == "prefixgate_ttft_seconds_count")


def breaks(proxy: Any, tenant: str) -> dict[str, int]:
    return httpx.get(f"{proxy.url}/hygiene/tenants/{tenant}", timeout=10).json()["breaks_by_cause"]


def test_vllm_mode_predicts_exactly_and_reports_no_break(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim)
    hook = proxy.services.prefix
    usages = session(client_for(proxy), "cc", 4, hook)
    rows = list(hook.predictions)
    assert [p for _, _, p, _ in rows] == [d for _, _, _, d in rows]
    assert [u.cache_read_input_tokens for u in usages] == [d for _, _, _, d in rows]
    assert all(u.cache_read_input_tokens > 0.9 * prompt_of(u) for u in usages[1:])
    assert breaks(proxy, "cc") == {}  # the engine drops the billing header: nothing breaks
    # the client still sends it: a finding per request
    assert proxy.sample("prefixgate_hygiene_findings_total", route="messages", tenant="cc", kind="dynamic_head") == 4
    # Anthropic usage in the metrics: prompt = input + cache_read + cache_creation, cached = cache_read
    prompt = sum(prompt_of(u) for u in usages)
    assert all(u.cache_creation_input_tokens > 0 for u in usages)  # the engine reports cache writes
    assert proxy.sample("prefixgate_prompt_tokens_total", route="messages", model="sim", tenant="cc") == prompt
    assert proxy.sample("prefixgate_cached_tokens_total", route="messages", model="sim", tenant="cc", source="engine") == \
        sum(u.cache_read_input_tokens for u in usages)
    assert proxy.sample("prefixgate_requests_total", route="messages", status="200") == 4
    assert ttft_count(proxy) == 4  # TTFT stamped on each stream (where: tests/test_api_messages_shape.py)


@pytest.mark.parametrize("policy", ["observe", "rewrite"])
def test_keeping_engine_breaks_at_the_billing_header_unless_rewritten(sim_factory, proxy_factory, policy) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000, strip_billing_header=False)
    proxy = proxy_factory(sim, prefix={"billing_header": "keep"}, tenants={"default": {"policy": policy}})
    hook = proxy.services.prefix
    usages = session(client_for(proxy), "cc", 4, hook)
    rows = list(hook.predictions)
    assert [p for _, _, p, _ in rows] == [d for _, _, _, d in rows]  # predictions exact in both policies
    ratios = [u.cache_read_input_tokens / prompt_of(u) for u in usages[1:]]
    if policy == "observe":
        assert max(ratios) < 0.05  # the cch= value changes at the head of every prompt
        assert breaks(proxy, "cc") == {"dynamic_head": 3}
        last = httpx.get(f"{proxy.url}/hygiene/tenants/cc", timeout=10).json()["last_breaks"][0]
        assert last["span_kinds"] == ["billing_header"] and "billing-header" in last["fix"]
    else:
        assert min(ratios) > 0.9
        assert breaks(proxy, "cc") == {}
        assert proxy.sample("prefixgate_rewrites_total", route="messages", tenant="cc", kind="strip_billing_header") == 4


def test_rewrite_can_be_switched_off(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, strip_billing_header=False)
    proxy = proxy_factory(sim, prefix={"billing_header": "keep"}, tenants={"default": {"policy": "rewrite"}},
                          hygiene={"rewrites": {"strip_billing_header": False}})
    r = httpx.post(proxy.url + "/v1/messages", timeout=10, json={
        "model": "sim", "max_tokens": 4, "system": [billing(0), {"type": "text", "text": STATIC}],
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert "billing_header" in r.headers["x-prefixgate-hygiene"]
    assert "x-prefixgate-rewrites" not in r.headers


def test_non_streamed_usage_and_count_tokens(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim)
    client = client_for(proxy)
    kwargs: dict[str, Any] = {"model": "sim", "system": [billing(1), {"type": "text", "text": STATIC}],
                              "tools": TOOLS[:3], "messages": [{"role": "user", "content": "Explain the diff."}]}
    counted = client.messages.count_tokens(**kwargs).input_tokens
    first = client.messages.create(max_tokens=6, **kwargs, extra_headers={"x-tenant-id": "t"})
    # the ring is in the order post-response processing ends, which two requests may swap
    wait_processed(proxy.services.prefix, 1)
    second = client.messages.create(max_tokens=6, **kwargs, extra_headers={"x-tenant-id": "t"})
    assert prompt_of(first.usage) == counted and first.usage.cache_read_input_tokens == 0
    assert prompt_of(second.usage) == counted
    assert second.usage.cache_read_input_tokens >= counted - 16
    assert first.content[0].type == "text" and first.content[0].text
    assert proxy.sample("prefixgate_prompt_tokens_total", route="messages", model="sim", tenant="t") == 2 * counted
    assert proxy.sample("prefixgate_cached_tokens_total", route="messages", model="sim", tenant="t", source="engine") == \
        second.usage.cache_read_input_tokens
    wait_processed(proxy.services.prefix, 2)
    assert [(p, d) for _, _, p, d in proxy.services.prefix.predictions] == \
        [(0, 0), (second.usage.cache_read_input_tokens,) * 2]


def test_cache_isolation_on_the_messages_route(sim_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})
    client = client_for(proxy)

    def ask(tenant: str) -> Any:
        return client.messages.create(model="sim", max_tokens=4, system=STATIC,
                                      messages=[{"role": "user", "content": "Same question."}],
                                      extra_headers={"x-tenant-id": tenant}).usage

    alice = ask("alice")
    proxy.drain()  # alice's blocks learned before her second request is routed, however loaded the CPU
    bob = ask("bob")
    proxy.drain()
    alice2 = ask("alice")
    assert alice.cache_read_input_tokens == 0 and bob.cache_read_input_tokens == 0  # zero shared blocks
    assert alice2.cache_read_input_tokens >= prompt_of(alice2) - 16
    wait_processed(proxy.services.prefix, 3)
    assert sorted(p for _, _, p, _ in proxy.services.prefix.predictions) == [0, 0, alice2.cache_read_input_tokens]


def test_midstream_death_ends_with_an_anthropic_error_event(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, output_tokens=20)
    proxy = proxy_factory(sim)
    httpx.post(sim.urls[0] + "/sim/faults", json={"mode": "die_midstream", "after_chunks": 4}, timeout=10)
    body = {"model": "sim", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", proxy.url + "/v1/messages", json=body, timeout=10) as r:
        raw = r.read().decode()
    assert r.status_code == 200
    events = [e for e in raw.split("\n\n") if e]
    assert events[0].startswith("event: message_start")
    assert events[-1].startswith("event: error\ndata: ")
    assert '"type":"error","error":{"type":"api_error","message":' in events[-1]
    assert "[DONE]" not in raw and '"code"' not in raw  # never the chat-shaped error
    # and the real client raises it as an API error
    httpx.post(sim.urls[0] + "/sim/faults", json={"mode": "die_midstream", "after_chunks": 4}, timeout=10)
    with pytest.raises(anthropic.APIStatusError) as info:
        with client_for(proxy).messages.stream(model="sim", max_tokens=20,
                                               messages=[{"role": "user", "content": "hi"}]) as s:
            list(s.text_stream)
    assert "mid-stream" in str(info.value) or "upstream" in str(info.value)
    proxy.settle()
    assert proxy.sample("prefixgate_requests_total", route="messages", status="200") == 2


def test_proxy_errors_are_anthropic_shaped(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim)
    client = client_for(proxy)
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body == {"type": "error", "error": {"type": "not_found_error",
                                                          "message": "The model `nope` does not exist."}}
    r = httpx.post(proxy.url + "/v1/messages", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(proxy.url + "/v1/messages", json={"model": "sim", "max_tokens": 4, "system": 3,
                                                     "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert r.status_code == 400 and "'system'" in r.json()["error"]["message"]


@pytest.mark.parametrize("mode", ["vllm-warn", "keep-warn", "keep-rewrite"])
def test_billing_header_through_chat_completions(sim_factory, proxy_factory, mode: str) -> None:
    """Claude Code behind an OpenAI-shaped adapter: the header is the system message's first line.
    vLLM 0.32's chat renderer drops that line itself; an SGLang-like engine keeps it."""
    import openai

    keep = mode.startswith("keep")
    sim = sim_factory(replicas=1, time_scale=0.0, strip_billing_header=not keep)
    proxy = proxy_factory(sim, tenants={"default": {"policy": mode.split("-")[1]}},
                          prefix={"billing_header": "keep" if keep else "auto"})
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    usages, headers = [], []
    for turn in range(2):
        raw = client.chat.completions.with_raw_response.create(model="sim", max_tokens=4, messages=[
            {"role": "system", "content": billing(turn)["text"] + "\n" + STATIC},
            {"role": "user", "content": "Fix it."}], extra_headers={"x-tenant-id": "cc"})
        usages.append(raw.parse().usage)
        headers.append(raw.headers)
        wait_processed(proxy.services.prefix, turn + 1)
    rows = list(proxy.services.prefix.predictions)
    assert [p for _, _, p, _ in rows] == [d for _, _, _, d in rows]  # the proxy renders what the engine does
    hit = usages[1].prompt_tokens_details.cached_tokens / usages[1].prompt_tokens
    if mode == "keep-rewrite":
        assert headers[1]["x-prefixgate-rewrites"] == "strip_billing_header"
        assert "x-prefixgate-hygiene" not in headers[1]
        assert hit > 0.9
    else:
        assert headers[1]["x-prefixgate-hygiene"] == "dynamic_head(messages[0] line 1: billing_header)"
        assert (hit < 0.1) if keep else (hit > 0.9)  # kept: it breaks; vLLM: it never reaches the cache
        assert breaks(proxy, "cc") == ({"dynamic_head": 1} if keep else {})


def test_affinity_keeps_the_session_on_one_replica_and_retries_before_the_first_byte(sim_factory,
                                                                                     proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim)
    hook = proxy.services.prefix
    client = client_for(proxy)
    backends = []
    history: list[dict[str, Any]] = []
    for turn in range(3):
        history.append({"role": "user", "content": f"Turn {turn}?"})
        raw = client.messages.with_raw_response.create(
            model="sim", max_tokens=6, system=[billing(turn), {"type": "text", "text": STATIC}], tools=TOOLS,
            messages=history, extra_headers={"x-tenant-id": "cc"})
        backends.append(raw.headers["x-prefixgate-backend"])
        history.append({"role": "assistant", "content": raw.parse().content[0].text})
        wait_processed(hook, turn + 1)
    assert len(set(backends)) == 1  # prefix affinity: the session's blocks live there
    assert [p for _, _, p, _ in hook.predictions] == [d for _, _, _, d in hook.predictions]
    # the home replica refuses once (503 before any byte): the request is retried on the other one
    home = [r.name for r in proxy.services.replicas.all()].index(backends[0])
    httpx.post(sim.urls[home] + "/sim/faults", json={"mode": "error", "status": 503, "count": 1}, timeout=10)
    history.append({"role": "user", "content": "One more?"})
    with client.messages.stream(model="sim", max_tokens=6, messages=history, tools=TOOLS,
                                system=[billing(3), {"type": "text", "text": STATIC}],
                                extra_headers={"x-tenant-id": "cc"}) as s:
        assert "".join(s.text_stream)
    proxy.settle()
    assert proxy.sample("prefixgate_upstream_errors_total", backend=backends[0], kind="status_5xx") == 1
    assert proxy.sample("prefixgate_requests_total", route="messages", status="200") == 4


def test_api_keys_name_the_tenant_and_refuse_in_anthropic_shape(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, tenants={"api_keys": {"sk-team-a": "team-a"}})
    ok = anthropic.Anthropic(base_url=proxy.url, api_key="sk-team-a", max_retries=0)  # sent as x-api-key
    ok.messages.create(model="sim", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert proxy.sample("prefixgate_prompt_tokens_total", route="messages", model="sim", tenant="team-a") > 0
    bad = anthropic.Anthropic(base_url=proxy.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="sim", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "authentication_error"
