"""`POST /v1/messages` against real vLLM 0.32: the real `anthropic` client, streamed, through the proxy.

A Claude-Code-shaped session: the system prompt as blocks (the billing-header block first, its
`cch=` new every turn, then static blocks, one with `cache_control`), 21 tools, and a history
that grows every turn by an assistant text + tool_use, a user tool_result, a `<system-reminder>`
text block and the user's text (one turn also carries an inline system message). The assistant
text is scripted, so every cached token comes from prompt blocks and the proxy must be exact.
`tool_choice` is `none` (the tools are rendered into the prompt all the same): vLLM refuses `auto`
without a tool parser, and a tool parser would change the replica's chat streams for the other
tests (tests/e2e/vllm_server.py).

Per turn: the proxy's predicted cached tokens equal vLLM's `cache_read_input_tokens` (vLLM drops
the billing block, and the proxy mirrors that, so nothing breaks); TTFT is stamped at the first
`content_block_delta` carrying text, not at `message_start` / `content_block_start` (the relayed
reads are tapped on the proxy's clock); Anthropic usage lands in the metrics as prompt =
input + cache_read + cache_creation, cached = cache_read. vLLM skips empty content deltas, so its
non-text events come only just before the first text: the order is what is asserted.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.e2e.proxy_handle import SendTap, first_send_with, metric_sum
from tests.e2e.workload import table, wait_processed, words

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TURNS = 6
TENANT = "claude-code"
TOOLS = [{"name": f"tool_{i:02d}", "description": words(f"tool-{i}", 6),
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for i in range(21)]


def system_blocks(turn: int) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; "
                                     f"cch={(0x1a2b3 + 7919 * turn) % 0xfffff:05x};"},
            {"type": "text", "text": words("cc-system", 200), "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": words("cc-env", 60)}]


def user_turn(turn: int) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if turn:
        blocks.append({"type": "tool_result", "tool_use_id": f"toolu_{turn - 1}", "content": words(f"out-{turn}", 30)})
    blocks.append({"type": "text", "text": f"<system-reminder>{words(f'reminder-{turn}', 10)}</system-reminder>"})
    blocks.append({"type": "text", "text": words(f"ask-{turn}", 25)})
    return {"role": "user", "content": blocks}


def _text_delta(name: str | None, event: Any) -> bool:
    delta = (event or {}).get("delta") or {}
    return name == "content_block_delta" and bool(delta.get("text") or delta.get("thinking")
                                                  or delta.get("partial_json"))


def prompt_of(usage: Any) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_claude_code_session_predicted_exactly_with_ttft_at_the_first_text_delta(e2e_proxy: Any,
                                                                                   vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_b32])
    tap = SendTap(proxy.app.openai)
    proxy.app.openai = tap
    hook = proxy.services.prefix
    client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0, timeout=120)
    history: list[dict[str, Any]] = []
    rows, usages, separate = [], [], 0
    for turn in range(TURNS):
        if turn == 3:
            history.append({"role": "system", "content": [{"type": "text", "text": "Inline system note."}]})
        history.append(user_turn(turn))
        rid = f"cc-{turn}"
        tap.sends.clear()
        with client.messages.stream(model="tiny", max_tokens=8, system=system_blocks(turn), tools=TOOLS,
                                    messages=history, tool_choice={"type": "none"},
                                    extra_headers={"x-tenant-id": TENANT, "x-request-id": rid}) as stream:
            text = "".join(stream.text_stream)
            usage = stream.get_final_message().usage
        wait_processed(hook, turn + 1)
        proxy.settle()
        usages.append(usage)
        # TTFT: after every read before the first text delta, no later than the read carrying it
        ctx = proxy.recorder.contexts[rid]
        t = ctx.timings
        first = first_send_with(tap.sends, _text_delta)
        assert text and t.first_token is not None and t.first_byte is not None
        assert all(sent <= t.first_token for sent, _ in tap.sends[:first]), f"turn {turn}: TTFT before the text"
        assert t.first_token <= tap.sends[first][0], f"turn {turn}: TTFT after the text was relayed"
        assert t.first_byte <= t.first_token
        separate += first > 0
        predicted = {r: p for r, _, p, _ in hook.predictions}.get(rid)
        rows.append((rid, prompt_of(usage), usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
                     predicted, first))
        history.append({"role": "assistant", "content": [
            {"type": "text", "text": words(f"reply-{turn}", 30)},
            {"type": "tool_use", "id": f"toolu_{turn}", "name": "tool_03", "input": {"path": f"src/m{turn}.py"}}]})
    equal = sum(1 for r in rows if r[2] == r[4])
    print(f"\n/v1/messages, real vLLM (block 32): {equal}/{TURNS} predicted == engine; first text in a later "
          f"read than message_start on {separate}/{TURNS} turns\n"
          + table(rows, ("request", "prompt", "vllm cache_read", "cache_creation", "predicted", "first text read")))
    assert [r[4] for r in rows] == [r[2] for r in rows]
    assert all(r[2] > 0.8 * r[1] for r in rows[1:]), "the growing history must hit (the billing block is dropped)"
    # usage in the metrics, in Anthropic's meaning
    assert metric_sum(proxy, "prefixgate_prompt_tokens_total", tenant=TENANT) == sum(r[1] for r in rows)
    for source in ("engine", "predicted"):
        assert metric_sum(proxy, "prefixgate_cached_tokens_total", tenant=TENANT, source=source) == \
            sum(r[2] for r in rows), source
    assert metric_sum(proxy, "prefixgate_requests_total", route="messages", status="200") == TURNS
    assert metric_sum(proxy, "prefixgate_ttft_seconds_count") == TURNS
