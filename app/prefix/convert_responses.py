"""A Responses API body (`POST /v1/responses`) as the chat messages + tools vLLM renders.

vLLM 0.32 does not tokenise a Responses request directly: it converts `instructions`, the
history of `previous_response_id` and the `input` items to chat messages and the flat
Responses `tools` to chat tools, then applies the chat template (docs/agents-responses.md lists
the rules this module mirrors). The proxy must render the same prompt to predict the engine's
cache, so the rules are mirrored here (the simulator has its own conversion, written apart as
an independent oracle: app/sim/responses_convert.py, docs/testing-oracles.md).

`previous_response_id`: the engine prepends the stored messages of that response (minus system
messages) and its output text. The proxy knows them only when it relayed that response itself:
`ResponseHistory` keeps, per response id, the chat messages that response continued from and
its output text, bounded by bytes. An id it does not hold makes the conversion `None` (prediction
unknown), never a guess.

gpt-oss models are rendered with Harmony by vLLM, not with the chat template: `harmony_model`
says so, and the prefix stage then makes no prediction for them (docs/agents-responses.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.prefix.prompt import PromptInput, sglang_tools
from app.prefix.tool_dump import ToolDump, vllm_function

DEFAULT_HISTORY_BYTES = 32 * 1024 * 1024
_TEXT_PART_TYPES = ("input_text", "output_text", "text")


def harmony_model(model: str | None) -> bool:
    """vLLM renders gpt-oss (model_type `gpt_oss`) with Harmony; the model name is what the proxy sees."""
    return isinstance(model, str) and "gpt-oss" in model.lower()


@dataclass
class Converted:
    """The chat form of one Responses request: what the engine renders, and what a later
    request continuing it (`previous_response_id`) gets prepended."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def convert_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Flat Responses function tools -> chat tools, as vLLM's function-definition model dumps
    them: `name`, `description`, `parameters` (None when absent), then `strict` and
    `defer_loading` only when not None; no other member reaches the template. Tools of other
    types (built-ins) are not rendered."""
    if not isinstance(tools, list) or not tools:
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            continue
        out.append({"type": "function", "function": vllm_function(tool)})
    return out or None


def _part_text(content: Any) -> str:
    """A message's content parts as the chat renderer joins text parts (newline between parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [p.get("text", "") for p in content
             if isinstance(p, Mapping) and p.get("type") in _TEXT_PART_TYPES and isinstance(p.get("text"), str)]
    return "\n".join(texts)


def _first_text(content: Any) -> str:
    """An assistant message item's text: vLLM keeps only its first content part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        first = content[0]
        return first.get("text", "") if isinstance(first, Mapping) else str(first)
    return ""


def _item_message(item: Mapping[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """One input item as a chat message, or None when it merged into `prev` (an assistant message
    collects the tool calls, reasoning and text that follow it, one slot each)."""
    assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    kind = item.get("type")
    if kind == "function_call":
        call = {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                "type": "function"}
        if assistant is not None:
            calls = assistant.get("tool_calls")
            if calls is None:
                assistant["tool_calls"] = [call]
                return None
            if isinstance(calls, list):
                calls.append(call)
                return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        first = parts[0] if isinstance(parts, list) and parts else ""
        text = first.get("text", "") if isinstance(first, Mapping) else str(first)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    role = item.get("role")
    if role == "assistant":
        text = _first_text(item.get("content"))
        if assistant is not None and assistant.get("content") is None:
            assistant["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if isinstance(role, str):  # user / system / developer: content parts joined as text
        return {"role": role, "content": _part_text(item.get("content"))}
    return None


DEVELOPER_LABEL = "Developer instructions:"


def _sglang_content(content: Any) -> Any:
    """A message item's content as SGLang passes it on: a string as it is, else its text parts
    (the template step joins them with a space, app/prefix/template.py)."""
    if isinstance(content, str) or not isinstance(content, list):
        return content if isinstance(content, str) else ""
    return [{"type": "text", "text": p["text"]} for p in content
            if isinstance(p, Mapping) and p.get("type") in _TEXT_PART_TYPES and isinstance(p.get("text"), str)]


def _sglang_developer(content: Any) -> Any:
    """SGLang's `label_developer_content`: the first text opens with "Developer instructions:\n"
    (a list without text gets the label as its own first part)."""
    if isinstance(content, str):
        return f"{DEVELOPER_LABEL}\n{content}"
    if content:
        return [{**content[0], "text": f"{DEVELOPER_LABEL}\n{content[0]['text']}"}, *content[1:]]
    return [{"type": "text", "text": DEVELOPER_LABEL}]


def _sglang_message(item: Mapping[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """SGLang 0.5.23 (`openai/serving_responses.py`): a user / system message keeps its text
    parts; a developer message stays in place as a labelled system message (vLLM merges it into
    the leading system message); other items as vLLM converts them."""
    role = item.get("role")
    if item.get("type") in (None, "message") and role in ("user", "system", "developer"):
        content = _sglang_content(item.get("content"))
        if role == "developer":
            return {"role": "system", "content": _sglang_developer(content)}
        return {"role": role, "content": content}
    return _item_message(item, prev)


def input_messages(instructions: Any, items: Any, history: list[dict[str, Any]] | None = None,
                   engine: str = "vllm") -> list[dict[str, Any]]:
    """`instructions` (a system message), then `history` (the previous response's messages
    without system ones, and its output), then the `input` (a string is one user message);
    each item converted by `engine`'s rules."""
    convert_item = _sglang_message if engine == "sglang" else _item_message
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if history:
        messages.extend(m for m in history if m.get("role") != "system")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            if not isinstance(item, Mapping):
                continue
            message = convert_item(item, messages[-1] if messages else None)
            if message is not None:
                messages.append(message)
    return messages


def convert(body: Mapping[str, Any], history: list[dict[str, Any]] | None = None, engine: ToolDump = "vllm") -> Converted:
    """The chat messages + tools `engine` renders for `body` (with `history` prepended); SGLang
    leaves the tools out under `tool_choice: "none"` and keeps only the named one under a named
    choice (app/prefix/prompt.py `sglang_tools`)."""
    tools = convert_tools(body.get("tools"))
    if engine == "sglang":
        tools = sglang_tools(tools, body.get("tool_choice"))
    return Converted(input_messages(body.get("instructions"), body.get("input"), history, engine), tools)


def responses_prompt_input(body: Mapping[str, Any], history: ResponseHistory,
                           engine: ToolDump = "vllm") -> PromptInput | None:
    """The prompt of a Responses body as a chat PromptInput, rendered for `engine`; None when it
    cannot be known: a Harmony-rendered model, or a `previous_response_id` this process did not relay."""
    if harmony_model(body.get("model")):
        return None
    previous = body.get("previous_response_id")
    prior = None
    if isinstance(previous, str):
        prior = history.get(previous)
        if prior is None:
            return None
    converted = convert(body, prior, engine)
    if not converted.messages:
        return None
    chat_body: dict[str, Any] = {"model": body.get("model"), "messages": converted.messages}
    if converted.tools:
        chat_body["tools"] = converted.tools
    return PromptInput("chat", messages=converted.messages, tools=converted.tools,
                       template_kwargs={"add_generation_prompt": True}, model=body.get("model"), body=chat_body,
                       engine=engine)


def continued_history(messages: list[dict[str, Any]], output_text: str | None) -> list[dict[str, Any]]:
    """What a request continuing this response gets prepended: its messages, then its output
    text as an assistant message (vLLM keeps only message output, never tool calls or reasoning)."""
    out = list(messages)
    if output_text:
        out.append({"role": "assistant", "content": output_text})
    return out


class ResponseHistory:
    """response id -> the history a request continuing it gets prepended, LRU-bounded by bytes
    (the JSON size of each entry). Only responses this process relayed are held."""

    def __init__(self, max_bytes: int = DEFAULT_HISTORY_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        item = self._items.get(response_id)
        if item is None:
            return None
        self._items.move_to_end(response_id)
        return item[0]

    def put(self, response_id: str, history: list[dict[str, Any]]) -> None:
        size = len(orjson.dumps(history, default=str))
        if size > self.max_bytes:
            return
        old = self._items.pop(response_id, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[response_id] = (history, size)
        self.bytes += size
        while self.bytes > self.max_bytes and self._items:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped
