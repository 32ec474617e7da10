"""`POST /v1/responses` against real vLLM 0.32: the real `openai` client
(`client.responses.create(stream=True)`), through the proxy.

- A Codex-shaped session, stateless (`store: false`, the whole input resent): static
  instructions, 12 flat function tools (`strict: false`), a developer message and the user's
  messages, the input growing every turn by a function call, its output, a scripted assistant
  message and the next user message. vLLM merges the developer message into the leading system
  message (its template has no developer role), and the proxy mirrors that. Per turn: predicted
  cached tokens equal vLLM's `input_tokens_details.cached_tokens`; TTFT is stamped at the first
  `response.output_text.delta`, after `response.created` / `in_progress` (which vLLM sends before
  the request reaches the engine: on the cold first turn they are relayed in an earlier read);
  usage lands in the prompt / cached-token metrics. `tool_choice` is `none` (the tools are rendered
  into the prompt all the same), as on the Messages test (tests/e2e/test_e2e_agents_messages.py).
- A `previous_response_id` chain (`store: true`; the replica runs with
  `VLLM_ENABLE_RESPONSES_API_STORE=1`): vLLM prepends the stored messages (minus system ones) and
  the previous output text; the proxy rebuilds that history from what it relayed. The previous
  output is the engine's own reply, so, as for echoed chat replies (test_e2e_prediction.py), vLLM
  can also hit blocks of the ids it sampled: exact whenever the re-tokenised reply gives back as
  many ids as were generated, never above vLLM otherwise.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from tokenizers import Tokenizer

from tests.e2e.proxy_handle import SendTap, first_send_with, metric_sum
from tests.e2e.workload import table, wait_processed, words

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TURNS = 6
INSTRUCTIONS = "You are a coding agent running in a sandbox. " + words("codex-instructions", 300)
TOOLS = [{"type": "function", "name": f"fn_{i}", "description": words(f"fn-{i}", 6), "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
         for i in range(12)]
DEVELOPER = {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>" + words("perm", 30) + "</permissions>"}]}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _text_delta(name: str | None, event: Any) -> bool:
    return bool(name and name.endswith(".delta") and (event or {}).get("delta"))


def _stream(client: openai.OpenAI, rid: str, **kwargs: Any) -> Any:
    with client.responses.create(model="tiny", stream=True, max_output_tokens=8, temperature=0.0,
                                 extra_headers={"x-request-id": rid}, **kwargs) as stream:
        events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    return events[-1].response


def _client(proxy: Any, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=120,
                         default_headers={"x-tenant-id": tenant})


def test_codex_session_predicted_exactly_with_ttft_at_the_first_text_delta(e2e_proxy: Any, vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_b32])
    tap = SendTap(proxy.app.openai)
    proxy.app.openai = tap
    hook = proxy.services.prefix
    client = _client(proxy, "codex")
    items: list[dict[str, Any]] = [DEVELOPER, user(words("codex-task", 40))]
    rows, separate = [], 0
    for turn in range(TURNS):
        rid = f"codex-{turn}"
        tap.sends.clear()
        response = _stream(client, rid, instructions=INSTRUCTIONS, tools=TOOLS, tool_choice="none", input=items,
                           store=False)
        wait_processed(hook, turn + 1)
        proxy.settle()
        t = proxy.recorder.contexts[rid].timings
        first = first_send_with(tap.sends, _text_delta)
        assert t.first_token is not None and t.first_byte is not None
        assert all(sent <= t.first_token for sent, _ in tap.sends[:first]), f"turn {turn}: TTFT before the text"
        assert t.first_token <= tap.sends[first][0], f"turn {turn}: TTFT after the text was relayed"
        if turn == 0:  # cold: response.created left long before the first delta, in its own read
            assert first > 0 and t.first_byte < t.first_token
        separate += first > 0
        usage = response.usage
        predicted = {r: p for r, _, p, _ in hook.predictions}.get(rid)
        rows.append((rid, usage.input_tokens, usage.input_tokens_details.cached_tokens, predicted, first))
        items += [{"type": "function_call", "call_id": f"call_{turn}", "name": "fn_1",
                   "arguments": json.dumps({"cmd": f"sed -n 1,40p src/mod{turn}.py"})},
                  {"type": "function_call_output", "call_id": f"call_{turn}", "output": words(f"cmd-out-{turn}", 40)},
                  {"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": words(f"codex-reply-{turn}", 20)}]},
                  user(words(f"codex-next-{turn}", 15))]
    equal = sum(1 for r in rows if r[2] == r[3])
    print(f"\n/v1/responses (store false, growing input), real vLLM (block 32): {equal}/{TURNS} predicted == engine; "
          f"first delta in a later read than response.created on {separate}/{TURNS} turns\n"
          + table(rows, ("request", "input_tokens", "vllm cached", "predicted", "first delta read")))
    assert [r[3] for r in rows] == [r[2] for r in rows]
    assert all(r[2] > 0.8 * r[1] for r in rows[1:]), "the growing input must hit"
    assert metric_sum(proxy, "prefixgate_prompt_tokens_total", tenant="codex") == sum(r[1] for r in rows)
    for source in ("engine", "predicted"):
        assert metric_sum(proxy, "prefixgate_cached_tokens_total", tenant="codex", source=source) == \
            sum(r[2] for r in rows), source
    assert metric_sum(proxy, "prefixgate_requests_total", route="responses", status="200") == TURNS
    assert metric_sum(proxy, "prefixgate_ttft_seconds_count") == TURNS


def test_previous_response_id_chain_predicted_from_what_the_proxy_relayed(e2e_proxy: Any, vllm_model_dir: Any,
                                                                         vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_b32])
    hook = proxy.services.prefix
    client = _client(proxy, "codex-chain")
    tokenizer = Tokenizer.from_file(str(vllm_model_dir / "tokenizer.json"))
    previous: Any = None
    rows: list[tuple[Any, ...]] = []
    stable: list[bool] = []
    for turn in range(TURNS):
        rid = f"chain-{turn}"
        extra = {"previous_response_id": previous.id} if previous is not None else {}
        items = [DEVELOPER, user(words("chain-task", 40))] if previous is None else [user(words(f"chain-{turn}", 20))]
        response = _stream(client, rid, instructions=INSTRUCTIONS, input=items, store=True, **extra)
        wait_processed(hook, turn + 1)
        if previous is not None:  # did the previous reply re-tokenise to the ids vLLM sampled?
            ids = tokenizer.encode(previous.output_text, add_special_tokens=False).ids
            stable.append(len(ids) == previous.usage.output_tokens)
        predicted = {r: p for r, _, p, _ in hook.predictions}.get(rid)
        usage = response.usage
        rows.append((rid, usage.input_tokens, usage.input_tokens_details.cached_tokens, predicted,
                     "" if previous is None else f"prev reply stable: {stable[-1]}"))
        previous = response
    equal = sum(1 for r in rows if r[2] == r[3])
    print(f"\n/v1/responses previous_response_id chain (store true), real vLLM (block 32): {equal}/{TURNS} predicted "
          f"== engine\n" + table(rows, ("request", "input_tokens", "vllm cached", "predicted", "note")))
    assert all(r[3] is not None for r in rows), "the proxy relayed every previous response: none may be unknown"
    assert rows[0][2] == rows[0][3] == 0
    for (rid, _, engine, predicted, _), exact in zip(rows[1:], stable, strict=True):
        assert predicted <= engine, f"{rid}: over-predicted"
        if exact:
            assert predicted == engine, f"{rid}: not exact after a stable reply"
    assert all(r[2] > 0.8 * r[1] for r in rows[1:]), "the stored history must hit"
    assert metric_sum(proxy, "prefixgate_prompt_tokens_total", tenant="codex-chain") == sum(r[1] for r in rows)
