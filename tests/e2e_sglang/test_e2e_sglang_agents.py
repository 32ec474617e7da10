"""The agents' routes, `POST /v1/messages` and `POST /v1/responses`, on real SGLang 0.5.23 through
the proxy, with the real `anthropic` and `openai` clients, streamed.

SGLang 0.5.23 serves both (sglang/srt/entrypoints/http_server.py; docs/e2e-sglang.md): it converts
either body to a chat-completions request and renders that with the chat template, as vLLM does,
but with its own conversion rules (sglang/srt/entrypoints/anthropic/serving.py,
openai/serving_responses.py), which the proxy follows in front of SGLang replicas
(app/prefix/convert_messages.py, convert_responses.py, template.py), so:

- a conversation whose bodies both engines convert alike (string system / instructions, string
  turns, no tools) is predicted exactly: predicted == SGLang's `cache_read_input_tokens` /
  `input_tokens_details.cached_tokens` on every turn, usage lands in the metrics;
- the agents' own shapes (a Claude-Code session: system blocks, multi-block user turns, tools under
  `tool_choice` none or auto; a Codex session: a developer message, function tools, function calls)
  are rendered differently by SGLang, and the proxy, in front of an SGLang-only fleet, renders them
  SGLang's way: predicted exactly on every turn; with Claude Code's billing block SGLang reuses only
  the text before it, which is predicted;
- `previous_response_id`, which SGLang refuses unless started with `--enable-response-store`,
  comes back as SGLang's OpenAI-shaped 400, relayed as it is;
- the tenant's `cache_salt` isolates tenants on `/v1/responses` (SGLang's Responses request
  carries it to the radix cache) but not on `/v1/messages`, whose request model has no such field
  (a strict xfail); the proxy predicts the cache SGLang shares there.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.proxy_handle import metric_sum
from tests.e2e.test_e2e_agents_messages import TOOLS as CC_TOOLS
from tests.e2e.test_e2e_agents_messages import prompt_of, system_blocks, user_turn
from tests.e2e.test_e2e_agents_responses import DEVELOPER, INSTRUCTIONS
from tests.e2e.test_e2e_agents_responses import TOOLS as CODEX_TOOLS
from tests.e2e.test_e2e_agents_responses import user as codex_user
from tests.e2e.workload import table, wait_processed, words

pytestmark = [pytest.mark.e2e_sglang, pytest.mark.timeout(900)]
TURNS = 4
MAX_TOKENS = 8
SECRET_ENV = "PREFIXGATE_E2E_SGLANG_AGENTS_SALT"


def _predicted(proxy: Any, rid: str) -> int | None:
    return {r: p for r, _t, p, _d in proxy.services.prefix.predictions}.get(rid)


def _anthropic(proxy: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0, timeout=180)


def _openai(proxy: Any, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=180,
                         default_headers={"x-tenant-id": tenant})


def _message(proxy: Any, tenant: str, rid: str, **body: Any) -> Any:
    """One streamed Messages request; the final message's usage. Greedy, as `_response` is: the
    Messages API samples at temperature 1 by default, and the tiny random model then sometimes
    writes no text at all in 8 tokens (seen once in CI: an empty text stream). This SDK takes no
    `temperature` argument, so it goes in the body."""
    with _anthropic(proxy).messages.stream(model="tiny", max_tokens=MAX_TOKENS, extra_body={"temperature": 0.0},
                                           extra_headers={"x-tenant-id": tenant, "x-request-id": rid},
                                           **body) as stream:
        assert "".join(stream.text_stream)
        return stream.get_final_message().usage


def _response(proxy: Any, tenant: str, rid: str, **body: Any) -> Any:
    """One streamed Responses request; the completed response's usage."""
    with _openai(proxy, tenant).responses.create(model="tiny", stream=True, max_output_tokens=MAX_TOKENS,
                                                 temperature=0.0, extra_headers={"x-request-id": rid},
                                                 **body) as stream:
        events = list(stream)
    # SGLang ends a reply cut by max_output_tokens with `response.incomplete` (vLLM: `completed`)
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    return events[-1].response.usage


def _messages_session(proxy: Any, tenant: str, body_of: Any) -> list[tuple[Any, ...]]:
    """(request, prompt, SGLang cache_read, predicted) per turn; `body_of(turn, history)` gives the
    turn's body and appends the turn's user message to `history`."""
    history: list[dict[str, Any]] = []
    rows = []
    for turn in range(TURNS):
        rid = f"{tenant}-{turn}"
        usage = _message(proxy, tenant, rid, **body_of(turn, history))
        wait_processed(proxy.services.prefix, turn + 1)
        rows.append((rid, prompt_of(usage), usage.cache_read_input_tokens, _predicted(proxy, rid)))
        history.append({"role": "assistant", "content": words(f"{tenant}-reply-{turn}", 20)})
    return rows


def _responses_session(proxy: Any, tenant: str, body_of: Any) -> list[tuple[Any, ...]]:
    """(request, input tokens, SGLang cached tokens, predicted) per turn, as `_messages_session`."""
    items: list[dict[str, Any]] = []
    rows = []
    for turn in range(TURNS):
        rid = f"{tenant}-{turn}"
        usage = _response(proxy, tenant, rid, **body_of(turn, items))
        wait_processed(proxy.services.prefix, turn + 1)
        rows.append((rid, usage.input_tokens, usage.input_tokens_details.cached_tokens, _predicted(proxy, rid)))
        items.append({"type": "message", "role": "assistant", "content": words(f"{tenant}-reply-{turn}", 20)})
    return rows


def _report(title: str, rows: list[tuple[Any, ...]], cached: str) -> None:
    equal = sum(1 for r in rows if (r[2] or 0) == r[3])
    print(f"\n{title}: {equal}/{len(rows)} predicted == SGLang\n"
          + table(rows, ("request", "prompt", cached, "predicted")))


# ------------------------------------------------------------------ shapes both engines convert alike

def _plain_messages(turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    history.append({"role": "user", "content": words(f"plain-ask-{turn}", 40)})
    return {"system": words("plain-system", 300), "messages": history}


def _plain_responses(turn: int, items: list[dict[str, Any]]) -> dict[str, Any]:
    items.append({"type": "message", "role": "user", "content": words(f"plain-input-{turn}", 40)})
    return {"instructions": words("plain-instructions", 300), "input": items, "store": False}


def test_messages_plain_session_predicted_exactly(e2e_proxy: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_radix])
    rows = _messages_session(proxy, "sg-messages", _plain_messages)
    _report("/v1/messages, string system and turns, real SGLang (page 1)", rows, "sglang cache_read")
    # SGLang sends cache_read_input_tokens only when it is not 0: the cold turn's is absent, and
    # the proxy records no engine count for it rather than a 0 it was not told
    assert rows[0][2] is None and rows[0][3] == 0
    assert [r[3] for r in rows[1:]] == [r[2] for r in rows[1:]]
    assert all(r[2] > 0.8 * r[1] for r in rows[1:]), "the growing history must hit"
    assert metric_sum(proxy, "prefixgate_prompt_tokens_total", tenant="sg-messages") == sum(r[1] for r in rows)
    assert metric_sum(proxy, "prefixgate_cached_tokens_total", tenant="sg-messages", source="engine") == \
        sum(r[2] or 0 for r in rows)
    assert metric_sum(proxy, "prefixgate_requests_total", route="messages", status="200") == TURNS
    assert metric_sum(proxy, "prefixgate_ttft_seconds_count", route="messages") == TURNS


def test_responses_plain_session_predicted_exactly(e2e_proxy: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_radix])
    rows = _responses_session(proxy, "sg-responses", _plain_responses)
    _report("/v1/responses, instructions and string turns, real SGLang (page 1)", rows, "sglang cached")
    assert [r[3] for r in rows] == [r[2] for r in rows]
    assert rows[0][2] == 0 and all(r[2] > 0.8 * r[1] for r in rows[1:]), "the growing input must hit"
    assert metric_sum(proxy, "prefixgate_prompt_tokens_total", tenant="sg-responses") == sum(r[1] for r in rows)
    for source in ("engine", "predicted"):
        assert metric_sum(proxy, "prefixgate_cached_tokens_total", tenant="sg-responses", source=source) == \
            sum(r[2] for r in rows), source
    assert metric_sum(proxy, "prefixgate_requests_total", route="responses", status="200") == TURNS
    assert metric_sum(proxy, "prefixgate_ttft_seconds_count", route="responses") == TURNS


def test_messages_count_tokens_is_sglangs_own_count(e2e_proxy: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_radix])
    body = {"model": "tiny", "system": words("count-system", 100),
            "messages": [{"role": "user", "content": words("count-user", 30)}]}
    through = _anthropic(proxy).messages.count_tokens(**body)
    direct = anthropic.Anthropic(base_url=sglang_radix.url, api_key="x", max_retries=0).messages.count_tokens(**body)
    assert through.input_tokens == direct.input_tokens > 100


# ------------------------------------------------------------------ the agents' shapes

# SGLang 0.5.23 converts these shapes unlike vLLM 0.32: the tools left out under tool_choice none,
# each Messages tool dumped with `strict: false` and `defer_loading: null`, system blocks joined with
# "\n" and text parts with " ", a Responses developer message kept in place labelled
# "Developer instructions:\n". The proxy renders by SGLang's rules in front of an SGLang-only fleet
# (docs/agents-apis.md), so its prediction must equal SGLang's count on every turn.


def _claude_code(billing: bool, tool_choice: dict[str, Any] | None = None) -> Any:
    """Claude-Code turns (tests/e2e/test_e2e_agents_messages.py's shape): system blocks, 21 tools,
    user turns of a tool_result and two text blocks, replies with a tool_use; with `billing`, the
    billing-header block (its `cch=` new every turn) opens the system blocks; `tool_choice` None:
    left out (`auto`, what Claude Code sends; SGLang without a tool parser parses no calls)."""
    def body_of(turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
        if turn:  # the previous reply called a tool; this turn carries its result
            history[-1] = {"role": "assistant", "content": [
                {"type": "text", "text": history[-1]["content"]},
                {"type": "tool_use", "id": f"toolu_{turn - 1}", "name": "tool_03", "input": {"path": f"m{turn}.py"}}]}
        history.append(user_turn(turn))
        body = {"system": system_blocks(turn)[0 if billing else 1:], "tools": CC_TOOLS, "messages": history}
        return body if tool_choice is None else {**body, "tool_choice": tool_choice}

    return body_of


def test_claude_code_billing_header_leaves_sglang_only_the_head_predicted_exactly(e2e_proxy: Any,
                                                                                  sglang_radix: Any) -> None:
    """SGLang keeps the billing block (vLLM 0.32 drops it), so every turn misses from its `cch=` on;
    `prefix.billing_header: auto` keeps it in the proxy's render too, and the proxy predicts that."""
    proxy = e2e_proxy([sglang_radix])
    rows = _messages_session(proxy, "sg-cc-billing", _claude_code(billing=True, tool_choice={"type": "none"}))
    _report("/v1/messages, Claude-Code shape with the billing header, real SGLang (page 1)", rows,
            "sglang cache_read")
    head = rows[1][2]
    assert head and all(r[2] == head < 0.1 * r[1] for r in rows[1:]), "only the text before cch= hits"
    assert [r[3] for r in rows] == [r[2] or 0 for r in rows]


@pytest.mark.parametrize("tool_choice", [
    pytest.param({"type": "none"}, id="none"), pytest.param(None, id="auto")])
def test_claude_code_session_predicted_exactly(e2e_proxy: Any, sglang_radix: Any,
                                               tool_choice: dict[str, Any] | None) -> None:
    """The same session without the billing block (as under `hygiene` rewrite's strip): the history
    hits, and the proxy must render it as SGLang does."""
    proxy = e2e_proxy([sglang_radix])
    rows = _messages_session(proxy, "sg-claude-code", _claude_code(billing=False, tool_choice=tool_choice))
    _report(f"/v1/messages, Claude-Code shape, tool_choice {'auto' if tool_choice is None else 'none'}, "
            "real SGLang (page 1)", rows, "sglang cache_read")
    assert all(r[2] > 0.5 * r[1] for r in rows[1:]), "the growing history must hit"
    assert [r[3] for r in rows[1:]] == [r[2] for r in rows[1:]]


def test_codex_session_predicted_exactly(e2e_proxy: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_radix])

    def body_of(turn: int, items: list[dict[str, Any]]) -> dict[str, Any]:
        if not items:
            items += [DEVELOPER, codex_user(words("codex-task", 40))]
        else:
            items += [{"type": "function_call", "call_id": f"call_{turn}", "name": "fn_1",
                       "arguments": json.dumps({"cmd": f"sed -n 1,40p src/mod{turn}.py"})},
                      {"type": "function_call_output", "call_id": f"call_{turn}", "output": words(f"out-{turn}", 40)},
                      codex_user(words(f"codex-next-{turn}", 15))]
        return {"instructions": INSTRUCTIONS, "tools": CODEX_TOOLS, "tool_choice": "none", "input": items,
                "store": False}

    rows = _responses_session(proxy, "sg-codex", body_of)
    _report("/v1/responses, Codex shape, real SGLang (page 1)", rows, "sglang cached")
    assert all(r[2] for r in rows[1:]), "the growing input must hit"
    assert [r[3] for r in rows] == [r[2] for r in rows]


# ------------------------------------------------------------------ what SGLang does not serve by default

def test_stored_responses_are_sglangs_openai_shaped_400(e2e_proxy: Any, sglang_radix: Any) -> None:
    """SGLang keeps no responses unless started with `--enable-response-store`: a request continuing
    one gets its 400 naming `previous_response_id`, a retrieve or cancel one naming `response_id`,
    relayed as SGLang wrote them (OpenAI's error shape, which the `openai` client raises as
    BadRequestError), never a 5xx or a hang."""
    proxy = e2e_proxy([sglang_radix])
    first = _openai(proxy, "sg-chain").responses.create(model="tiny", input=words("chain-task", 30),
                                                        max_output_tokens=MAX_TOKENS, store=True)
    with pytest.raises(openai.BadRequestError) as caught:
        _response(proxy, "sg-chain", "sg-chain-1", input="and then?", previous_response_id=first.id, store=True)
    error = caught.value.body
    print(f"\nprevious_response_id through the proxy: {caught.value.status_code} {error}")
    assert caught.value.status_code == 400
    assert error["param"] == "previous_response_id" and "--enable-response-store" in error["message"]
    assert metric_sum(proxy, "prefixgate_requests_total", route="responses", status="400") == 1
    # GET /v1/responses/{id} and POST .../cancel (pinned to the replica that answered): the same 400
    for call in (_openai(proxy, "sg-chain").responses.retrieve, _openai(proxy, "sg-chain").responses.cancel):
        with pytest.raises(openai.BadRequestError) as caught:
            call(first.id)
        assert caught.value.body["param"] == "response_id", caught.value.body
        assert "--enable-response-store" in caught.value.body["message"]


# ------------------------------------------------------------------ tenant isolation by cache_salt

def _two_tenants(proxy: Any, send: Any) -> list[tuple[str, int, int | None, int | None]]:
    """The same body from acme, globex, acme: (tenant, prompt, SGLang cached, predicted) each."""
    rows = []
    for i, tenant in enumerate(("acme", "globex", "acme")):
        rid = f"salt-{i}"
        prompt, cached = send(tenant, rid)
        wait_processed(proxy.services.prefix, i + 1)
        rows.append((tenant, prompt, cached, _predicted(proxy, rid)))
    print("\n" + table(rows, ("tenant", "prompt", "sglang cached", "predicted")))
    return rows


def test_responses_cache_salt_isolates_tenants(e2e_proxy: Any, sglang_radix: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    proxy = e2e_proxy([sglang_radix], tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})

    def send(tenant: str, rid: str) -> tuple[int, int]:
        usage = _response(proxy, tenant, rid, **_plain_responses(0, []))
        return usage.input_tokens, usage.input_tokens_details.cached_tokens

    rows = _two_tenants(proxy, send)
    assert [r[2] for r in rows] == [0, 0, rows[0][1] - 1]
    assert [r[3] for r in rows] == [r[2] for r in rows]


def _salted_plain_messages(e2e_proxy: Any, sglang_radix: Any, monkeypatch: pytest.MonkeyPatch) -> list:
    """Two tenants' plain Messages turns through a proxy with cache salting on (`_two_tenants` rows)."""
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    proxy = e2e_proxy([sglang_radix], tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})

    def send(tenant: str, rid: str) -> tuple[int, int | None]:
        usage = _message(proxy, tenant, rid, **_plain_messages(0, []))
        return prompt_of(usage), usage.cache_read_input_tokens

    return _two_tenants(proxy, send)


@pytest.mark.xfail(strict=True, reason="SGLang 0.5.23's AnthropicMessagesRequest has no cache_salt (nor extra_key) "
                                       "field and ignores unknown ones: the salt the gateway splices in never "
                                       "reaches the radix cache, so two tenants share the prompt's cached tokens")
def test_messages_cache_salt_isolates_tenants(e2e_proxy: Any, sglang_radix: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _salted_plain_messages(e2e_proxy, sglang_radix, monkeypatch)
    assert [r[2] or 0 for r in rows] == [0, 0, rows[0][1] - 1], "globex read acme's cached tokens"
    assert [r[3] for r in rows] == [r[2] or 0 for r in rows]


def test_messages_cache_salt_prediction_follows_sglang(e2e_proxy: Any, sglang_radix: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang caches a Messages request unsalted whatever salt it carries, so the proxy predicts
    the shared cache it gets (app/prefix/namespace.py `request_namespace`), not an isolation it
    does not: globex reads acme's tokens, and each prediction equals SGLang's count."""
    rows = _salted_plain_messages(e2e_proxy, sglang_radix, monkeypatch)
    assert (rows[1][2] or 0) > 0.5 * rows[1][1], "SGLang shares the tenants' cache on /v1/messages"
    assert [r[3] for r in rows] == [r[2] or 0 for r in rows]
