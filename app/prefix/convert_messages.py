"""Anthropic Messages bodies as the chat messages the engine renders (docs/agents-apis.md).

vLLM serves `/v1/messages` by converting the body to a chat-completions request and applying the
chat template to that; the proxy must render the same messages or its block hashes (and so its
predictions and diagnosis) are wrong. The rules of vLLM 0.32, as docs/agents-apis.md records them:

- The top-level `system` (a string, or the text of its non-empty text blocks, concatenated with
  no separator) is the leading system message.
- vLLM drops a system text block that starts with `x-anthropic-billing-header` (Claude Code's
  per-request attribution, whose `cch=` hash changes every turn), and an inline system message
  whose string content starts so; SGLang keeps both. `strip_billing` says which engine the
  prompt is rendered for.
- `role: "system"` entries inside `messages` stay in place as system messages (their text, billing
  blocks dropped; nothing when no text is left), or, for a template that requires system-first
  ordering (`merge_inline_system`), are appended to the leading system text instead.
- Other messages keep their role (`ctx` / `msg`, which newer Claude Code sends, read as `user` as
  later vLLM does; 0.32 refuses them); a string content stays a string; block content becomes
  text / image_url parts (one text part collapses to a string), `thinking` to `reasoning`,
  `tool_use` to `tool_calls` (arguments as Python `json.dumps` of the input), a user
  `tool_result` to its own `role: "tool"` message placed before the user message it came in, an
  assistant one to a `Tool result: ...` text part. A user message left without content is dropped.
- Then, as for every chat request, the chat renderer drops a leading billing-header line from
  each system message's text (`strip_billing_lines`): a top-level `system` string that opens with
  the header loses that line there.
- `tools` become what vLLM's tool model dumps for the template: `{"type": "function", "function":
  {name, description (null when absent), parameters, [strict], [defer_loading]}}` (the tool
  model drops a top-level `defer_loading` that is unset, and strict / defer_loading when null),
  `input_schema` as parameters (`"type": "object"` added when absent).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

BILLING_PREFIX = "x-anthropic-billing-header"
_ROLE_ALIASES = {"ctx": "user", "msg": "user"}


def is_billing_block(block: Any) -> bool:
    """A system text block holding Claude Code's billing header (vLLM's test: the text starts so)."""
    return (isinstance(block, Mapping) and block.get("type") == "text"
            and isinstance(block.get("text"), str) and block["text"].startswith(BILLING_PREFIX))


def system_blocks(content: Any, strip_billing: bool) -> list[tuple[int | None, str]]:
    """The texts vLLM joins into the leading system message, each with where it comes from:
    (None, the string) for a string `system`, else (block index, text) of each non-empty text
    block (billing blocks dropped with `strip_billing`)."""
    if isinstance(content, str):
        return [(None, content)] if content else []
    out: list[tuple[int | None, str]] = []
    if isinstance(content, list):
        for i, block in enumerate(content):
            if not (isinstance(block, Mapping) and block.get("type") == "text"):
                continue
            text = block.get("text")
            if not isinstance(text, str) or not text or (strip_billing and is_billing_block(block)):
                continue
            out.append((i, text))
    return out


def _system_texts(content: Any, strip_billing: bool) -> list[str]:
    return [text for _, text in system_blocks(content, strip_billing)]


def _image_url(source: Any) -> str:
    if not isinstance(source, Mapping):
        return ""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_result_message(block: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    images: list[str] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts: list[str] = []
        for item in content:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "text":
                parts.append(str(item.get("text", "")))
            elif item.get("type") == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
        text = "\n".join(parts)
    else:
        text = ""
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text or ""})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})


def _convert_blocks(role: str, blocks: list[Any], message: dict[str, Any], out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(str(block["thinking"]))
        elif kind == "tool_use":
            calls.append({"id": block.get("id") or "", "type": "function",
                          "function": {"name": block.get("name") or "",
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result":
            if role == "user":
                _tool_result_message(block, out)
            else:
                content = block.get("content")
                parts.append({"type": "text", "text": f"Tool result: {str(content) if content else ''}"})
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _anthropic_tools(tools: Any) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
    """The well-formed entries of an Anthropic `tools` list, each with a copy of its input
    schema ({} when it has none); [] when there are none."""
    if not isinstance(tools, list):
        return []
    out = []
    for tool in tools:
        if isinstance(tool, Mapping):
            schema = tool.get("input_schema")
            out.append((tool, dict(schema) if isinstance(schema, Mapping) else {}))
    return out


def convert_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic tools as the chat tools vLLM hands the template (None when there are none)."""
    out: list[dict[str, Any]] = []
    for tool, schema in _anthropic_tools(tools):
        schema.setdefault("type", "object")
        function: dict[str, Any] = {"name": tool.get("name", ""), "description": tool.get("description"),
                                    "parameters": schema}
        for optional in ("strict", "defer_loading"):
            if tool.get(optional) is not None:
                function[optional] = tool[optional]
        out.append({"type": "function", "function": function})
    return out or None


def _inline_system_text(content: Any, strip_billing: bool) -> str:
    if isinstance(content, str):
        return "" if strip_billing and content.startswith(BILLING_PREFIX) else content
    return "".join(_system_texts(content, strip_billing))


def convert_messages(body: Mapping[str, Any], strip_billing: bool = True,
                     merge_inline_system: bool = False) -> list[dict[str, Any]]:
    """The chat messages the engine renders for a Messages body (see the module docstring)."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    system = _system_texts(body.get("system"), strip_billing)  # (a string is never stripped)
    if merge_inline_system:
        for msg in messages:
            if isinstance(msg, Mapping) and msg.get("role") == "system":
                text = _inline_system_text(msg.get("content"), strip_billing)
                if text:
                    system.append(text)
    out: list[dict[str, Any]] = [{"role": "system", "content": "".join(system)}] if system else []
    for msg in messages:
        if not isinstance(msg, Mapping):
            continue
        if msg.get("role") == "system":
            text = "" if merge_inline_system else _inline_system_text(msg.get("content"), strip_billing)
            if text:
                out.append({"role": "system", "content": text})
            continue
        role = str(msg.get("role"))
        role = _ROLE_ALIASES.get(role, role)
        converted: dict[str, Any] = {"role": role}
        content = msg.get("content")
        if isinstance(content, str):
            converted["content"] = content
        elif isinstance(content, list):
            _convert_blocks(role, content, converted, out)
        if not (role == "user" and "content" not in converted):
            out.append(converted)
    return out


def system_sources(body: Mapping[str, Any], strip_billing: bool = True,
                   merge_inline_system: bool = False) -> list[str]:
    """Where each system message of `convert_messages(body, ...)` comes from, in order:
    "system" (the top-level `system`, with the inline ones merged into it) or "messages[i]" (an
    inline system message left in place), so a finding about the converted messages can name
    the place in the client's body."""
    inline = inline_system_indexes(body, strip_billing)
    leading = bool(_system_texts(body.get("system"), strip_billing)) or (merge_inline_system and bool(inline))
    return (["system"] if leading else []) + ([] if merge_inline_system else [f"messages[{i}]" for i in inline])


def inline_system_indexes(body: Mapping[str, Any], strip_billing: bool = True) -> list[int]:
    """Indexes in `messages` of the inline system messages the engine keeps (some text left)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "system"
            and _inline_system_text(m.get("content"), strip_billing)]


_PROBE = [{"role": "system", "content": "t"}, {"role": "user", "content": "t"},
          {"role": "system", "content": "t"}, {"role": "user", "content": "t"}]


def requires_system_first(template: Any) -> bool:
    """vLLM's test for `merge_inline_system`: the chat template refuses a system message after
    the first turn (e.g. Qwen's `loop.first` guard), or there is no template."""
    if template is None:
        return True
    try:
        template.render(_PROBE, tools=None, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - any template error means "refused", as vLLM reads it
        return True
    return False


def _strip_part(part: Any) -> Any:
    """A system content part without a leading billing-header line; None when nothing is left."""
    text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) and \
        part.get("type") == "text" else None
    if not (isinstance(text, str) and text.startswith(BILLING_PREFIX)):
        return part
    rest = text.partition("\n")[2]
    if not rest:
        return None
    return rest if isinstance(part, str) else {**part, "text": rest}


def strip_billing_lines(messages: list[Any]) -> list[Any]:
    """vLLM 0.32's chat renderer step (`renderers/chat_utils.py`), on every path: the first line
    of each system message's text part that starts with the billing header is dropped. Returns
    `messages` itself when no system message starts so (the usual case: no copy)."""
    def starts(m: Any) -> bool:
        if not (isinstance(m, Mapping) and m.get("role") == "system"):
            return False
        c = m.get("content")
        if isinstance(c, str):
            return c.startswith(BILLING_PREFIX)
        return isinstance(c, list) and any(_strip_part(p) is not p for p in c)

    if not any(starts(m) for m in messages):
        return messages
    out: list[Any] = []
    for m in messages:
        if not starts(m):
            out.append(m)
            continue
        c = m["content"]
        if isinstance(c, str):
            out.append({**m, "content": c.partition("\n")[2]})
        else:
            out.append({**m, "content": [q for q in (_strip_part(p) for p in c) if q is not None]})
    return out


def sglang_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic tools as SGLang 0.5.23 hands them to the template (`anthropic/serving.py` builds
    a chat `Tool` per tool, dumped by the chat route): `{"type": "function", "function": {name,
    description ("" when absent), parameters, strict (its Anthropic model's default: false)},
    "defer_loading": <the tool's, null when unset>}`."""
    out: list[dict[str, Any]] = []
    for tool, schema in _anthropic_tools(tools):
        function = {"name": tool.get("name", ""), "description": tool.get("description") or "",
                    "parameters": schema, "strict": tool.get("strict", False)}
        if function["strict"] is None:
            del function["strict"]
        out.append({"type": "function", "function": function, "defer_loading": tool.get("defer_loading")})
    return out or None


def sglang_tool_choice(choice: Any) -> Any:
    """An Anthropic `tool_choice` as SGLang's chat request carries it: "none", a named function,
    "required" (`any`), else "auto"."""
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "required" if kind == "any" else "auto"


def _sglang_system(messages: list[dict[str, Any]], body: Mapping[str, Any], strip_billing: bool,
                   merge_inline_system: bool) -> list[dict[str, Any]]:
    """SGLang joins the leading system texts (the top-level ones, then the merged inline ones)
    with "\n" (vLLM: no separator) and skips a blank system string: the leading message rebuilt so."""
    top = _system_texts(body.get("system"), strip_billing)
    inline: list[str] = []
    if merge_inline_system:
        for i in inline_system_indexes(body, strip_billing):
            inline.append(_inline_system_text(body["messages"][i].get("content"), strip_billing))
    if not (top or inline):
        return messages  # no leading system message was built
    system = body.get("system")
    if isinstance(system, str) and not system.strip():
        top = []
    parts = top + inline
    rest = messages[1:]
    return [{"role": "system", "content": "\n".join(parts)}, *rest] if parts else rest


def chat_view(body: Mapping[str, Any], strip_billing: bool = True, merge_inline_system: bool = False,
              engine: str = "vllm") -> dict[str, Any]:
    """The chat-completions body the engine builds from a Messages body: the keys that shape the
    prompt (messages, tools, chat_template_kwargs, model; for SGLang its `tool_choice` too, and
    its own system join and tool dump)."""
    messages = convert_messages(body, strip_billing, merge_inline_system)
    if engine == "sglang":
        messages = _sglang_system(messages, body, strip_billing, merge_inline_system)
    view: dict[str, Any] = {"model": body.get("model"),
                            "messages": strip_billing_lines(messages) if strip_billing else messages}
    tools = sglang_tools(body.get("tools")) if engine == "sglang" else convert_tools(body.get("tools"))
    if tools:
        view["tools"] = tools
        if engine == "sglang":
            view["tool_choice"] = sglang_tool_choice(body.get("tool_choice"))
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping):
        view["chat_template_kwargs"] = dict(kwargs)
    return view
