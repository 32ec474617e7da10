"""Chat rendering as vLLM does it with a Hugging Face tokenizer: the simulator's own implementation.

An oracle must not share the code it checks: the gateway renders with app/prefix/template.py,
the simulator with this module, written from the engine's behaviour (vLLM's chat renderer and
transformers' `apply_chat_template`, docs/testing-oracles.md) and checked against real vLLM's
rendered ids (tests/fixtures/real_vllm_agents/render.json, tests/test_sim_render_captures.py).
`duplicates` may flag the likeness: the duplication is deliberate.

What vLLM does with a chat request's messages before the template sees them:
1. content format: "openai" when the template loops over a message's `content` (found in the
   template's Jinja AST: a `for` over `<message var>.content` where the message var is a `for`
   target over `messages`), else "string";
2. per message: a string content is one text part; `None` is no parts; a system message's text
   parts lose a first line that starts with Claude Code's `x-anthropic-billing-header` (the part
   goes when nothing is left); with "string" the non-empty texts of the text parts (`text`,
   `input_text`, `output_text`: `text`; `refusal`: `refusal`; `thinking`: `thinking`; bare
   strings) are joined with "\\n" (a part without a `type` is refused); the message keeps
   only `role`, `content`, an assistant's `tool_calls` / `reasoning` (also as
   `reasoning_content`), a tool's `tool_call_id`, and a string `name`; a tool message's text
   parts become one string;
3. assistant `tool_calls`: an empty list is dropped; `arguments` become a dict (missing or empty:
   {}; a JSON string is parsed; invalid JSON or a non-object becomes {});
4. `developer` messages, for a template that never names that role, become `system` messages;
   if a system message then sits anywhere but first (or there are several), all are merged into
   one leading system message, non-empty texts joined with a blank line;
5. the template (transformers' Jinja environment: sandboxed, trim_blocks, lstrip_blocks,
   loopcontrols, `{% generation %}`, `tojson` without ASCII escaping, `raise_exception`,
   `strftime_now`) renders `messages`, `tools`, `documents`, `add_generation_prompt`, the
   tokenizer's special-token strings and the request's `chat_template_kwargs`;
6. `continue_final_message` (transformers): refused with `add_generation_prompt`; the rendered
   text is cut right after the final message's content (its last text part), so the model
   continues that message instead of closing it.
SGLang's chat route prepares messages its own way (`sglang_conversation`, read from the SGLang
0.5.23 wheel: `entrypoints/openai/serving_chat.py`, `parser/jinja_template_utils.py`): its own
content-format detection, a list content joined with a space, a final assistant message turned
into a user message, the generation prompt always added, tools left out with `tool_choice:
"none"` (app/sim/server.py), no billing-header step, and a `developer` message reaches the
template as it is. Not simulated: SGLang's `continue_final_message` (it encodes the final
message's text after the rendered prompt).
Template source (transformers): `chat_template.jinja` in the directory, else
`tokenizer_config.json`'s `chat_template`: a string, or named templates where a request with
tools takes "tool_use" when there is one, else "default".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

BILLING_HEADER = "x-anthropic-billing-header"
# the content part types vLLM parses as text, and the member holding each one's text
_TEXT_FIELD = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
               "thinking": "thinking"}
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class RenderError(ValueError):
    """The engine refuses the request: the template raised, or does not compile (vLLM: 400)."""


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` block: only marks assistant tokens; renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise RenderError(message)


def _to_json(value: Any, ensure_ascii: bool = False, indent: int | None = None,
             separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _to_json
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


# ---------------------------------------------------------------- content format (Jinja AST)

def _loads_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """`node` reads variable `name` (or its member `key`), through filters, tests and slices."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return _loads_name(node, name)
    if isinstance(node, nodes.Getitem):
        return _loads_name(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Getattr):
        return _loads_name(node.node, name) and node.attr == key
    return False


def _aliases(root: nodes.Template, name: str) -> list[str]:
    """`name` plus every variable `{% set %}` from it (transitively)."""
    found = [name]
    queue = [name]
    while queue:
        current = queue.pop(0)
        for assign in root.find_all(nodes.Assign):
            if isinstance(assign.target, nodes.Name) and _reads(assign.node, current):
                if assign.target.name not in found:
                    found.append(assign.target.name)
                    queue.append(assign.target.name)
    return found


def _loop_targets(root: nodes.Template, over: list[str], key: str | None) -> Iterator[str]:
    for loop in root.find_all(nodes.For):
        if isinstance(loop.target, nodes.Name) and any(_reads(loop.iter, v, key) for v in over):
            yield loop.target.name


@lru_cache(maxsize=16)
def content_format(source: str) -> str:
    """vLLM's detection: "openai" when the template iterates a message's content, else "string"."""
    try:
        root = _environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    message_vars = list(_loop_targets(root, _aliases(root, "messages"), None))
    return "openai" if any(True for _ in _loop_targets(root, message_vars, "content")) else "string"


# ---------------------------------------------------------------- messages as vLLM parses them

def _drop_billing_line(parts: list[Any]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) \
            and part.get("type") == "text" else None
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.split("\n", 1)[1] if "\n" in text else ""
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _without_billing(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """A system message without its billing-header line (a replica told to strip it)."""
    content = message.get("content")
    if message.get("role") != "system" or not isinstance(content, str | list):
        return message
    kept = _drop_billing_line([content] if isinstance(content, str) else list(content))
    return {**message, "content": (kept[0] if kept else "") if isinstance(content, str) else kept}


def _part_text(part: Any) -> str | None:
    """A content part's text, or None for a part that adds none (vLLM joins only non-empty texts)."""
    if isinstance(part, str):
        return part or None
    if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
        raise RenderError("Missing 'type' field in multimodal part.")
    field = _TEXT_FIELD.get(part["type"])
    if field is None:
        return None  # media parts: a text-only model has no placeholder to render
    text = part.get(field)
    return text if isinstance(text, str) and text else None


def _openai_parts(parts: list[Any]) -> list[Any]:
    """The "openai" format keeps parts: a text part as {"type": "text", "text"} (a null text is
    dropped), a media part as it is."""
    out: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            out.append({"type": "text", "text": part})
            continue
        _part_text(part)  # refuses a part without a type
        field = _TEXT_FIELD.get(part["type"])
        if field is None:
            out.append(part)
        elif part.get(field) is not None:
            out.append({"type": "text", "text": part[field]})
    return out


def _arguments(value: Any) -> Any:
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def _tool_calls(calls: list[Any]) -> list[Any]:
    out: list[Any] = []
    for call in calls:
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping) \
                or call.get("type", "function") != "function":
            raise RenderError("chat completions only support assistant tool_calls of type 'function'.")
        out.append({**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}})
    return out


def vllm_message(message: Mapping[str, Any], fmt: str, strip_billing: bool) -> dict[str, Any]:
    """One chat message as vLLM's parser hands it to the template (steps 2 and 3)."""
    role = message.get("role")
    content = message.get("content")
    parts: list[Any] = [] if content is None else [content] if isinstance(content, str) else list(content)
    if role == "system" and strip_billing:
        parts = _drop_billing_line(parts)
    out: dict[str, Any] = {"role": role}
    if fmt == "openai":
        out["content"] = _openai_parts(parts)
    else:
        out["content"] = "\n".join(t for p in parts if (t := _part_text(p)) is not None)
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise RenderError("tool_calls must be a list")
            if calls:
                out["tool_calls"] = _tool_calls(calls)
        if message.get("reasoning") is not None:
            out["reasoning"] = out["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(out["content"], list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                                    for p in out["content"]):
            out["content"] = "\n".join(p["text"] for p in out["content"])
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _system_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] if isinstance(p, Mapping) else p for p in content
                         if isinstance(p, str) or (isinstance(p, Mapping) and "text" in p))
    return content or ""


@lru_cache(maxsize=16)
def _names(source: str, value: str) -> bool:
    """The template holds the string constant `value` (e.g. compares a role to it)."""
    try:
        root = _environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return value in source
    return any(c.value == value for c in root.find_all(nodes.Const))


def developer_to_system(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Step 4 (vLLM's HF renderer, for a template that never names `developer`)."""
    if not any(m.get("role") == "developer" for m in messages) or _names(source, "developer"):
        return messages
    converted = [{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m.get("role") == "developer"
                 else m for m in messages]
    systems = [i for i, m in enumerate(converted) if m.get("role") == "system"]
    if systems == [0]:
        return converted
    merged = "\n\n".join(t for i in systems if (t := _system_text(converted[i].get("content"))))
    return [{"role": "system", "content": merged}] + [m for m in converted if m.get("role") != "system"]


# ---------------------------------------------------------------- SGLang's dialect

_SGLANG_MESSAGE_VARS = ("message", "msg", "m")  # the loop variables SGLang's detection looks at
_SGLANG_MEDIA = {"image_url": "image", "audio_url": "audio", "video_url": "video"}


@lru_cache(maxsize=16)
def sglang_content_format(source: str) -> str:
    """SGLang's detection: "openai" when a `for` iterates `message.content` (or `msg` / `m`),
    by those variable names only; else "string"."""
    try:
        root = _environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    loops = root.find_all(nodes.For)
    return "openai" if any(_reads(loop.iter, v, "content") for loop in loops for v in _SGLANG_MESSAGE_VARS) \
        else "string"


def sglang_message(message: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """One chat message as SGLang 0.5.23 hands it to the template (`process_content_for_template_format`,
    `normalize_tool_content`, `normalize_assistant_tool_call_arguments`): null members dropped, a
    null content is ""; a list content with the "string" format is its `text` / `input_text`
    parts' texts joined with a space; with "openai" those parts become `{"type": "text", "text"}`,
    media parts `{"type": "image" | "video" | "audio"}`, other parts are dropped; a string content
    stays a string in both; a tool message's all-text list is joined with a space; assistant
    tool-call `arguments` strings must be JSON objects (else the request is refused)."""
    out = {k: v for k, v in message.items() if v is not None}
    content = out.get("content", "")
    if isinstance(content, list):
        if fmt == "openai":
            parts: list[Any] = []
            for p in content:
                kind = p.get("type") if isinstance(p, Mapping) else None
                if kind in _SGLANG_MEDIA:
                    parts.append({"type": _SGLANG_MEDIA[kind]})
                elif kind in ("text", "input_text"):
                    parts.append({"type": "text", "text": p["text"]})
                elif kind == "tool_reference":
                    parts.append(p)
            if out.get("role") == "tool" and all(p.get("type") == "text" for p in parts):
                parts = " ".join(p["text"] for p in parts)  # type: ignore[assignment]
            out["content"] = parts
        else:
            out["content"] = " ".join(p["text"] for p in content
                                      if isinstance(p, Mapping) and p.get("type") in ("text", "input_text"))
    else:
        out["content"] = content
    calls = out.get("tool_calls")
    if out.get("role") == "assistant" and isinstance(calls, list):
        parsed = []
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                try:
                    arguments = json.loads(function["arguments"])
                except json.JSONDecodeError as exc:
                    raise RenderError("Assistant tool call function.arguments must be valid JSON.") from exc
                if not isinstance(arguments, dict):
                    raise RenderError("Assistant tool call function.arguments must be a JSON object.")
                call = {**call, "function": {**function, "arguments": arguments}}
            parsed.append(call)
        out["tool_calls"] = parsed
    return out


def sglang_conversation(messages: Sequence[Mapping[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """SGLang 0.5.23's chat route: every message prepared (`sglang_message`), then a final
    assistant message with string content is turned into a user message (its
    `_handle_last_assistant_message`, `continue_final_message` unset)."""
    out = [sglang_message(m, fmt) for m in messages]
    if out and out[-1].get("role") == "assistant" and isinstance(out[-1].get("content"), str):
        out[-1] = {"role": "user", "content": out[-1]["content"]}
    return out


# ---------------------------------------------------------------- the tokenizer directory's template

def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_string(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HfChatTemplate:
    """A tokenizer directory's chat template(s) and special-token strings."""

    def __init__(self, directory: Path) -> None:
        config = _read(directory / "tokenizer_config.json")
        jinja_file = directory / "chat_template.jinja"
        raw = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else config.get("chat_template")
        if isinstance(raw, list):
            raw = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        if not isinstance(raw, str | dict):
            raise RenderError(f"no chat template in {directory}")
        self.sources: str | dict[str, str] = raw
        self.variables: dict[str, Any] = {}
        for source in (config, _read(directory / "special_tokens_map.json")):
            for key in _SPECIAL_KEYS:
                value = _token_string(source.get(key))
                if value is not None:
                    self.variables.setdefault(key, value)
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            self.variables["additional_special_tokens"] = [s for e in extra if (s := _token_string(e))]

    def source(self, tools: Sequence[Any] | None) -> str:
        """transformers' `get_chat_template`: named templates pick "tool_use" for a request with tools."""
        if isinstance(self.sources, str):
            return self.sources
        if tools is not None and "tool_use" in self.sources:
            return self.sources["tool_use"]
        if "default" in self.sources:
            return self.sources["default"]
        raise RenderError("this tokenizer has several chat templates and none is named 'default'")

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
               add_generation_prompt: bool = True, strip_billing: bool = True, engine: str = "vllm",
               **kwargs: Any) -> str:
        """The prompt text `engine` ("vllm" or "sglang") tokenizes (encoded with
        add_special_tokens=False for chat). `strip_billing`: vLLM's billing-header step."""
        source = self.source(tools)
        if engine == "sglang":  # its chat route always asks for the generation prompt
            fmt = sglang_content_format(source)
            conversation = sglang_conversation([_without_billing(m) if strip_billing else m for m in messages], fmt)
            add_generation_prompt = True
        else:
            fmt = content_format(source)
            conversation = developer_to_system([vllm_message(m, fmt, strip_billing) for m in messages], source)
        continue_final = bool(kwargs.pop("continue_final_message", False))
        if continue_final and add_generation_prompt:
            raise RenderError("continue_final_message and add_generation_prompt are not compatible.")
        variables = {**self.variables, **kwargs, "messages": conversation, "tools": tools,
                     "documents": kwargs.get("documents"), "add_generation_prompt": add_generation_prompt}
        try:
            text = _compiled(source).render(**variables)
        except RenderError:
            raise
        except jinja2.TemplateError as exc:
            raise RenderError(f"chat template failed: {exc}") from exc
        return _cut_after_final(text, conversation) if continue_final and conversation else text

    def requires_system_first(self) -> bool:
        """vLLM's start-up probe for /v1/messages: the template refuses [system, user, system, user]."""
        probe = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
        try:
            self.render(probe, add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - any failure reads as "refused", as vLLM reads it
            return True
        return False


def _cut_after_final(text: str, conversation: list[dict[str, Any]]) -> str:
    """transformers' continue_final_message: end the prompt where the final message's text ends."""
    final = conversation[-1].get("content")
    if isinstance(final, list):
        texts = [p["text"] for p in final if isinstance(p, Mapping) and "text" in p]
        if not texts:
            raise RenderError("continue_final_message is set but the final message has no text to continue")
        final = texts[-1]
    final = final if isinstance(final, str) else ""
    if final.strip() not in text:
        raise RenderError("continue_final_message is set but the template does not render the final message")
    at = text.rindex(final.strip())
    if text[at:at + len(final.lstrip())] == final:
        return text[:at + len(final.lstrip())]
    return text[:at + len(final.strip())]


@lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"chat template does not compile: {exc}") from exc
