"""An Anthropic Messages body as the chat request vLLM builds from it: the simulator's own code.

vLLM serves `/v1/messages` by converting the body to a chat-completions request and rendering
that (docs/agents-apis.md records the rules, read from vLLM 0.32's `entrypoints/anthropic`).
The gateway converts with app/prefix/convert_messages.py; the simulator with this module, so that
the gateway's prediction equals the simulator's answer only when both follow the engine (real
vLLM's rendered ids in tests/fixtures/real_vllm_agents/render.json arbitrate). An oracle must not
share the code it checks: `duplicates` may flag this module on purpose (docs/testing-oracles.md).

- The leading system message: the top-level `system` string as it is, or its non-empty text
  blocks concatenated (no separator), a block starting with Claude Code's billing header dropped
  when the engine strips it (vLLM does; SGLang does not).
- `system` messages inside `messages` stay where they are (text blocks concatenated; a billing
  string or block dropped; nothing when no text is left), unless the template refuses a system
  message after the first turn: then their texts are appended to the leading system text.
- Other roles are kept (`ctx` and `msg` read as `user`). A string content stays a string. Blocks:
  `text` -> a text part (one text part alone becomes a string), `image` -> `image_url`,
  `thinking` -> the message's `reasoning`, `tool_use` -> a `tool_calls` entry (arguments:
  `json.dumps(input)`), `tool_result` -> in a user message its own `tool` message placed before
  the user message (text joined with "\\n"), in an assistant message a `Tool result: ...` text
  part. A user message left without content is dropped.
- `tools` -> `{"type": "function", "function": {name, description, parameters: input_schema
  ("type": "object" added when missing), strict / defer_loading when set}}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.sim.chat_template import BILLING_HEADER

_USER_ALIASES = ("ctx", "msg")


def _billing(text: Any) -> bool:
    return isinstance(text, str) and text.startswith(BILLING_HEADER)


def _block_text(content: Any, strip_billing: bool) -> str:
    """A system `content`'s text: a string as is, or its kept text blocks concatenated."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for block in content:
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
            if block["text"] and not (strip_billing and _billing(block["text"])):
                texts.append(block["text"])
    return "".join(texts)


def _inline_system(content: Any, strip_billing: bool) -> str:
    if isinstance(content, str) and strip_billing and _billing(content):
        return ""
    return _block_text(content, strip_billing)


def _image(source: Any) -> dict[str, Any]:
    source = source if isinstance(source, Mapping) else {}
    if source.get("type") == "url":
        url = str(source.get("url", ""))
    else:
        url = f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: Mapping[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, list):
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return {"role": "tool", "tool_call_id": block.get("tool_use_id") or "",
            "content": content if isinstance(content, str) else ""}


def _message(role: str, content: Any, before: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One non-system message; tool messages it spawns are appended to `before`."""
    message: dict[str, Any] = {"role": role}
    if isinstance(content, str):
        message["content"] = content
        return message
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            if block.get("source"):
                parts.append(_image(block["source"]))
        elif kind == "thinking":
            if block.get("thinking") is not None:
                thinking.append(str(block["thinking"]))
        elif kind == "tool_use":
            calls.append({"id": block.get("id") or "", "type": "function",
                          "function": {"name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result":
            if role == "user":
                before.append(_tool_message(block))
            else:
                result = block.get("content")
                parts.append({"type": "text", "text": "Tool result: " + (str(result) if result else "")})
    if thinking:
        message["reasoning"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        message["content"] = parts[0]["text"]
    elif parts:
        message["content"] = parts
    if role == "user" and "content" not in message:
        return None
    return message


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, Mapping):
            continue
        schema = dict(tool["input_schema"]) if isinstance(tool.get("input_schema"), Mapping) else {}
        if "type" not in schema:
            schema["type"] = "object"
        function = {"name": tool.get("name", ""), "description": tool.get("description"), "parameters": schema}
        function.update({k: tool[k] for k in ("strict", "defer_loading") if tool.get(k) is not None})
        out.append({"type": "function", "function": function})
    return out or None


def messages_to_chat(body: Mapping[str, Any], strip_billing: bool, system_first: bool) -> dict[str, Any]:
    """The chat body (model, messages, tools, chat_template_kwargs) vLLM builds from `body`."""
    raw = body.get("messages") if isinstance(body.get("messages"), list) else []
    head = _block_text(body.get("system"), strip_billing)
    if system_first:
        head += "".join(_inline_system(m.get("content"), strip_billing) for m in raw
                        if isinstance(m, Mapping) and m.get("role") == "system")
    messages: list[dict[str, Any]] = [{"role": "system", "content": head}] if head else []
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        role = str(item.get("role"))
        if role == "system":
            text = "" if system_first else _inline_system(item.get("content"), strip_billing)
            if text:
                messages.append({"role": "system", "content": text})
            continue
        spawned: list[dict[str, Any]] = []
        message = _message("user" if role in _USER_ALIASES else role, item.get("content"), spawned)
        messages.extend(spawned)
        if message is not None:
            messages.append(message)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if isinstance(body.get("chat_template_kwargs"), Mapping):
        chat["chat_template_kwargs"] = dict(body["chat_template_kwargs"])
    return chat
