"""Chat-template rendering exactly as transformers' `apply_chat_template` does, without transformers.

Engines (vLLM, SGLang) render a chat request with the tokenizer's Jinja template and then encode the
text with `add_special_tokens=False`. To predict the engine's prompt token ids (and so its prefix
cache blocks) the proxy and the simulator must render byte-identically. transformers' recipe
(`transformers/utils/chat_template_utils.py`):
- `jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
  `loopcontrols` extension and the `{% generation %}` tag (a no-op for rendering);
- filter `tojson` = `json.dumps(ensure_ascii=False, ...)` (no HTML escaping);
- globals `raise_exception` (TemplateError), `strftime_now` (local time: date-printing templates
  make the prompt time-dependent, a classic prefix-cache breaker);
- variables `messages`, `tools`, `documents`, `add_generation_prompt`, the special-token strings
  (`bos_token`, `eos_token`, ...) and any extra kwargs.
Template source: `chat_template.jinja` overrides `tokenizer_config.json["chat_template"]` (a string,
or a list of `{name, template}` where "default" wins).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from types import BuiltinFunctionType
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")


class TemplateError(ValueError):
    """The template called raise_exception, or could not be compiled/rendered."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' AssistantTracker): renders its body.

    transformers uses it only to compute assistant masks; the rendered text is unchanged.
    """

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


VERDICTS_MAX = 4096  # (type, attribute) verdicts a template's sandbox keeps


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, its attribute verdicts memoised. jinja's verdict on `obj.attr`
    (a leading underscore, `is_internal_attribute`, `modifies_known_mutable`) reads only the
    attribute's name and isinstance checks of the object, so it is the same for every object of
    one type; a template asks it on every attribute access of every message (a long chat's render
    spent about a third of its time there). The memo is bounded: past VERDICTS_MAX pairs the
    verdict is computed each time."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = super().is_safe_attribute(obj, attr, value)
            if len(self._verdicts) < VERDICTS_MAX:
                self._verdicts[key] = verdict
        return verdict

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """jinja's sandboxed call, straight to a built-in function or bound C method (`dict.get`,
        `str.startswith`, every message's `message.get(...)`): such an object holds no attributes,
        so jinja's checks (`unsafe_callable`, `alters_data`, `jinja_pass_arg` on it and on its
        `__call__`) always find none, and the call is what they would have made."""
        if type(__obj) is BuiltinFunctionType:
            if kwargs:
                kwargs.pop("_block_vars", None)
                kwargs.pop("_loop_vars", None)
            try:
                return __obj(*args, **kwargs)
            except StopIteration:
                return __context.environment.undefined(
                    "value was undefined because a callable raised a StopIteration exception")
        return super().call(__context, __obj, *args, **kwargs)


def _render(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """`template.render(**variables)` without Jinja's per-render copy of its globals (a ChainMap
    read key by key, half of a short chat's render): the context's parent is one dict of the
    globals and the variables, as `render` builds it."""
    context = template.new_context({**_flat_globals(template), **variables}, shared=True)
    try:
        return template.environment.concat(template.root_render_func(context))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - re-raised by Jinja, with the template's lines in the traceback
        template.environment.handle_exception()
        raise  # (handle_exception always raises)


@lru_cache(maxsize=32)
def _flat_globals(template: jinja2.Template) -> dict[str, Any]:
    return dict(template.globals)  # fixed once compiled: _compile sets them before from_string


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from exc


def _token_content(value: Any) -> str | None:
    """AddedToken dicts in tokenizer_config.json carry the string under `content`."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


_ITERATES_CONTENT = re.compile(r"for\s+\w+\s+in\s+[\w.]+(\.content\b|\[\s*['\"]content['\"]\s*\])")


def detect_content_format(source: str) -> str:
    """vLLM's content-format guess: "openai" when the template loops over a message's content
    parts, else "string" (list content is then joined to one string before rendering)."""
    return "openai" if _ITERATES_CONTENT.search(source) else "string"


def prepare_messages(messages: Sequence[Mapping[str, Any]], content_format: str) -> list[dict[str, Any]]:
    """Normalise OpenAI messages the way vLLM does before rendering: with the "string" format,
    the non-empty texts of the text-like parts (`text`, `input_text`, `output_text`, `refusal`,
    `thinking`, bare strings) are joined with "\n"; with the "openai" format the content is a list
    (a string is one text part, null none; text-like parts as `{"type": "text", "text"}`); assistant tool-call `arguments` JSON strings become dicts
    (invalid JSON or a non-object becomes {}), and an empty `tool_calls` list is dropped."""
    out: list[dict[str, Any]] = []
    for message in messages:
        msg = dict(message)
        content = msg.get("content")
        if content_format == "string" and isinstance(content, list):
            msg["content"] = "\n".join(t for p in content if (t := _text_of(p)))
        elif content_format == "openai":
            msg["content"] = _openai_parts(content)
            if msg.get("role") == "tool" and all(isinstance(p, Mapping) and p.get("type") == "text"
                                                 for p in msg["content"]):
                msg["content"] = "\n".join(p["text"] for p in msg["content"])  # vLLM: a tool's text parts as one string
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            if not calls:
                msg.pop("tool_calls")
            else:
                msg["tool_calls"] = [_parse_call(c) for c in calls]
        out.append(msg)
    return out


_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
               "thinking": "thinking"}  # vLLM's text-like part types -> the member holding the text


def _text_of(part: Any) -> str | None:
    """A content part's text as vLLM's parser reads it (a bare string is a text part too)."""
    if isinstance(part, str):
        return part
    key = _TEXT_PARTS.get(part.get("type")) if isinstance(part, Mapping) else None
    text = part.get(key) if key else None
    return text if isinstance(text, str) else None


def _openai_parts(content: Any) -> list[Any]:
    parts = [] if content is None else [content] if isinstance(content, str) else list(content)
    out: list[Any] = []
    for part in parts:
        text = _text_of(part)
        if text is not None:
            out.append({"type": "text", "text": text})
        elif not (isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS):  # a null text is dropped
            out.append(part)
    return out


_SGLANG_ITERATES_CONTENT = re.compile(r"for\s+\w+\s+in\s+(?:message|msg|m)(?:\.content\b|\[\s*['\"]content['\"]\s*\])")


def sglang_content_format(source: str) -> str:
    """SGLang 0.5.23's detection (`parser/jinja_template_utils.py`): "openai" when a `for` loop
    iterates the content of a message named `message`, `msg` or `m`, else "string"."""
    return "openai" if _SGLANG_ITERATES_CONTENT.search(source) else "string"


def sglang_prepare(messages: Sequence[Mapping[str, Any]], content_format: str) -> list[dict[str, Any]]:
    """Messages as SGLang 0.5.23's chat route hands them to the template
    (`process_content_for_template_format`, `normalize_tool_content`, `_handle_last_assistant_message`):
    null members dropped, a null content is ""; with the "string" format a list content is the
    texts of its `text` / `input_text` parts joined with a space (vLLM: a newline); with "openai"
    the parts `_sglang_part` keeps (a tool message's all-text list joined with a space); assistant tool-call arguments parsed to objects; then a final assistant
    message with string content becomes a user message (the template still asks for the
    generation prompt: SGLang's chat route always does)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        msg = {k: v for k, v in message.items() if v is not None}
        content = msg.get("content", "")
        if isinstance(content, list):
            parts = [q for p in content if (q := _sglang_part(p)) is not None]
            texts = [p["text"] for p in parts if p.get("type") == "text"]
            if content_format == "string" or (msg.get("role") == "tool" and len(texts) == len(parts)):
                msg["content"] = " ".join(texts)
            else:
                msg["content"] = parts
        else:
            msg["content"] = content
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            msg["tool_calls"] = [_parse_call(c) for c in calls]
        out.append(msg)
    if out and out[-1].get("role") == "assistant" and isinstance(out[-1].get("content"), str):
        out[-1] = {"role": "user", "content": out[-1]["content"]}
    return out


_SGLANG_MEDIA = {"image_url": "image", "input_image": "image", "video_url": "video", "audio_url": "audio"}


def _sglang_part(part: Any) -> dict[str, Any] | None:
    """A content part as SGLang keeps it: text as `{"type": "text"}`, media as its bare type, a
    `tool_reference` as sent; anything else dropped."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind in ("text", "input_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind in _SGLANG_MEDIA:
        return {"type": _SGLANG_MEDIA[kind]}
    return dict(part) if kind == "tool_reference" else None


def developer_as_system(messages: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """vLLM 0.32's step for a template that never names the `developer` role (renderers/hf.py,
    after the content-format step): every developer message becomes a system message (its `tools`
    dropped), and when a system message then sits anywhere but first, or there are several, all
    of them are merged into one leading system message, their texts (text parts joined with "\n",
    empty ones skipped) joined with "\n\n", the other messages in order after it. Codex sends
    developer messages in a Responses `input`; without this the proxy's prompt head is not the
    engine's. `messages` itself is returned when nothing applies."""
    if not any(m.get("role") == "developer" for m in messages) or \
            '"developer"' in source or "'developer'" in source:
        return messages
    converted = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"} if m.get("role") == "developer"
                 else m for m in messages]
    positions = [i for i, m in enumerate(converted) if m.get("role") == "system"]
    if positions == [0]:
        return converted
    texts: list[str] = []
    for i in positions:
        content = converted[i].get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] if isinstance(p, Mapping) else p for p in content
                                 if (isinstance(p, Mapping) and "text" in p) or isinstance(p, str))
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)},
            *(m for m in converted if m.get("role") != "system")]


def _parse_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = {}
        function["arguments"] = parsed if isinstance(parsed, dict) else {}
    return {**call, "function": function}


class ChatTemplate:
    """A compiled chat template plus the special tokens it is rendered with."""

    def __init__(self, source: str, special_token_vars: Mapping[str, str] | None = None,
                 special_tokens: Sequence[str] = (), tool_source: str | None = None) -> None:
        self.source = source
        self.tool_source = tool_source  # a named "tool_use" template: what a request with tools renders
        self.special_token_vars: dict[str, str] = dict(special_token_vars or {})
        # Every special (added) token string, longest first: the delimiters a segmenter splits on.
        self.special_tokens: list[str] = sorted(set(special_tokens), key=lambda s: (-len(s), s))
        self.content_format = detect_content_format(source)
        self._template = _compile(source)

    @classmethod
    def from_dir(cls, path: str | Path | None = None) -> ChatTemplate:
        """Load from a Hugging Face tokenizer directory (None: the built-in default tokenizer)."""
        directory = Path(path) if path is not None else DEFAULT_TOKENIZER_DIR
        config = _read_json(directory / "tokenizer_config.json")
        source = _template_source(directory, config)
        tool_source = _named_tool_template(directory, config)
        token_vars: dict[str, str] = {}
        for src in (_read_json(directory / "special_tokens_map.json"), config):
            for key in SPECIAL_TOKEN_KEYS:
                content = _token_content(src.get(key))
                if content is not None:
                    token_vars[key] = content
        specials = set(token_vars.values())
        for entry in (config.get("added_tokens_decoder") or {}).values():
            if isinstance(entry, Mapping) and entry.get("special") and entry.get("content"):
                specials.add(str(entry["content"]))
        for entry in _read_json(directory / "tokenizer.json").get("added_tokens") or []:
            if isinstance(entry, Mapping) and entry.get("special") and entry.get("content"):
                specials.add(str(entry["content"]))
        for extra in config.get("additional_special_tokens") or []:
            content = _token_content(extra)
            if content:
                specials.add(content)
        return cls(source, token_vars, sorted(specials), tool_source)

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
               add_generation_prompt: bool = True, documents: Sequence[Any] | None = None,
               engine: str = "vllm", **kwargs: Any) -> str:
        """The prompt text `engine` ("vllm" or "sglang") tokenizes (then encoded with
        add_special_tokens=False): the messages prepared by that engine's rules."""
        variables: dict[str, Any] = dict(self.special_token_vars)
        continue_final = bool(kwargs.pop("continue_final_message", False))
        if engine == "sglang" and continue_final:
            # SGLang appends the final message's ids after the generation prompt, encoded on
            # their own: not a text this renderer can produce, so no prediction rather than a wrong one
            raise TemplateError("continue_final_message is not predicted for SGLang")
        if continue_final and add_generation_prompt:
            raise TemplateError("continue_final_message and add_generation_prompt are not compatible")
        variables.update(kwargs)
        source, template, content_format = self.source, self._template, self.content_format
        if tools is not None and self.tool_source is not None:  # transformers' get_chat_template
            source, template = self.tool_source, _compile(self.tool_source)
            content_format = detect_content_format(source)
        if engine == "sglang":
            prepared = sglang_prepare(messages, sglang_content_format(source))
            add_generation_prompt = True
        else:
            prepared = developer_as_system(prepare_messages(messages, content_format), source)
        variables.update(messages=prepared, tools=list(tools) if tools else None,
                         documents=list(documents) if documents else None,
                         add_generation_prompt=add_generation_prompt)
        try:
            text = _render(template, variables)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        return _continue_final(text, prepared) if continue_final and prepared else text


def _continue_final(text: str, messages: list[dict[str, Any]]) -> str:
    """transformers' `continue_final_message`: the prompt ends where the final message's text
    (its last text part) ends, so the model continues it instead of a closed turn."""
    final = messages[-1].get("content")
    if isinstance(final, list):
        final = next((p["text"] for p in reversed(final) if isinstance(p, Mapping) and "text" in p), None)
        if final is None:
            raise TemplateError("continue_final_message: the final message has no text to continue")
    final = final if isinstance(final, str) else ""
    if final.strip() not in text:
        raise TemplateError("continue_final_message: the template does not render the final message")
    at = text.rindex(final.strip())
    keep = len(final.lstrip()) if text[at:at + len(final.lstrip())] == final else len(final.strip())
    return text[:at + keep]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _template_source(directory: Path, config: Mapping[str, Any]) -> str:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str):
        raise TemplateError(f"no chat template in {directory}")
    return template


def _named_tool_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    """The "tool_use" entry of named templates (none when a chat_template.jinja overrides them)."""
    template = config.get("chat_template")
    if (directory / "chat_template.jinja").is_file() or not isinstance(template, list):
        return None
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
    tool = named.get("tool_use")
    return tool if isinstance(tool, str) else None


@lru_cache(maxsize=8)
def _load_cached(path: str | None) -> ChatTemplate:
    return ChatTemplate.from_dir(path)


def load_chat_template(path: str | Path | None = None) -> ChatTemplate:
    """Memoised `ChatTemplate.from_dir` (one compiled template per directory per process)."""
    return _load_cached(str(path) if path is not None else None)


def render(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
           add_generation_prompt: bool = True, tokenizer: str | Path | None = None,
           **kwargs: Any) -> str:
    """Render with the template of `tokenizer` (a directory; None = the built-in default)."""
    return load_chat_template(tokenizer).render(messages, tools=tools,
                                                add_generation_prompt=add_generation_prompt, **kwargs)
