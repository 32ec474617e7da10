"""A Responses API body as the chat messages + tools vLLM renders: the simulator's own code.

vLLM 0.32 turns a `/v1/responses` request into chat messages and chat tools, then applies the
chat template (docs/agents-responses.md records the rules from vLLM's `entrypoints/openai/
responses`). The gateway converts with app/prefix/convert_responses.py; the simulator with this
module, written from those rules and checked against real vLLM's rendered ids
(tests/fixtures/real_vllm_agents/render.json). An oracle must not share the code it checks:
`duplicates` may flag this module on purpose (docs/testing-oracles.md).

- `instructions` (non-empty) -> a leading system message;
- `previous_response_id` -> that response's stored messages without system messages, then one
  assistant message per output text part of its message output (no tool calls, no reasoning);
- `input`: a string is one user message; items in order: `function_call` -> an assistant
  `tool_calls` entry (joining a directly preceding assistant message), `function_call_output` ->
  a `tool` message, `reasoning` -> the preceding assistant message's `reasoning` when it has
  none yet (else a new assistant message), from its first content (else summary) text, an
  assistant `message` -> its first content part's text (filling a preceding assistant message
  with no content yet), any other message -> as it is (the chat renderer joins its text parts);
- flat `function` tools -> chat tools (`name`, `description`, `parameters`, and `strict` /
  `defer_loading`); other tool types are not rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _first_text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list) and parts:
        head = parts[0]
        return head.get("text", "") if isinstance(head, Mapping) else str(head)
    return ""


def _open_assistant(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return messages[-1] if messages and messages[-1].get("role") == "assistant" else None


def _add_item(messages: list[dict[str, Any]], item: Mapping[str, Any]) -> None:
    kind = item.get("type")
    last = _open_assistant(messages)
    if kind == "function_call":
        call = {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                "type": "function"}
        if last is not None and isinstance(last.setdefault("tool_calls", []), list):
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
    elif kind == "reasoning":
        text = _first_text(item.get("content") or item.get("summary") or [])
        if last is not None and last.get("reasoning") is None:
            last["reasoning"] = text
        else:
            messages.append({"role": "assistant", "reasoning": text})
    elif item.get("role") == "assistant":
        text = _first_text(item.get("content"))
        if last is not None and last.get("content") is None:
            last["content"] = text
        else:
            messages.append({"role": "assistant", "content": text})
    elif isinstance(item.get("role"), str):
        messages.append({"role": item["role"], "content": item.get("content")})


def prior_turn(messages: list[dict[str, Any]], response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a request continuing `response` starts from (after its own instructions)."""
    out = [m for m in messages if m.get("role") != "system"]
    for item in response.get("output") or []:
        if isinstance(item, Mapping) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    out.append({"role": "assistant", "content": part.get("text", "")})
    return out


def responses_to_chat(body: Mapping[str, Any], prior: list[dict[str, Any]] | None = None
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of the chat request vLLM renders for `body`, `prior` prepended."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(dict(m) for m in prior or [])
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, Mapping):
                _add_item(messages, item)
    tools = [{"type": "function", "function": {k: t.get(k) for k in ("name", "description", "parameters", "strict",
                                                                      "defer_loading") if k in t}}
             for t in body.get("tools") or [] if isinstance(t, Mapping) and t.get("type") == "function"]
    return messages, tools or None
