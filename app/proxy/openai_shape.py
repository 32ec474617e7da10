"""OpenAI chat and completions streams (vLLM, SGLang): the `StreamShape` the observer uses.

What the events look like is in docs/sse.md: `data: <compact json>\\n\\n` events, a role chunk
first on chat (`{"role":"assistant","content":""}`, not generated text), the usage-only chunk
(`"choices":[]`) before `data: [DONE]`, and `data: {"error": {...}}` then `[DONE]` for a
mid-stream error.

The byte scans (`carries_generated`, `USAGE_ONLY`, `fold`) are exact on compact JSON: in JSON an
unescaped `"` cannot occur inside a string, so the bytes `"content":"` can only be that key
followed by a string value, never text the model generated (which arrives as `\\"content\\":`). A
stream that is not compact (`"content": "x"`) never lets the observer stop parsing (the first
content event fails `carries_generated`), and `fold` declines any batch that is not plain
`data: <json>\\n\\n` events without an error object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from app.errors import sse_error_event
from app.proxy.shape import Chunk
from app.proxy.sse import SSEParser, line_ends_before

DONE = b"[DONE]"
USAGE_ONLY = b'"choices":[]'  # the include_usage chunk (and only it, in compact JSON)
_QUOTE = 0x22
_GENERATED_MARKERS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":"', b'"reasoning":"', b'"reasoning_content":"'),
    "completions": (b'"text":"',),
}
_CHAT_GENERATED_FIELDS = ("content", "reasoning", "reasoning_content")
_TOOL_CALLS = b'"tool_calls":[{'
_DATA = b"data: "
_EVENT_END = b"\n\n"
_DONE_EVENT = _DATA + DONE
_USAGE = b'"usage":{'
# choice text as JSON string literals (collecting text implies n == 1: one choice)
_JSON_STRING = rb'("[^"\\]*(?:\\.[^"\\]*)*")'
_TEXT_STRINGS = {"chat": re.compile(rb'"content":' + _JSON_STRING),
                 "completions": re.compile(rb'"text":' + _JSON_STRING)}


class OpenAIShape:
    """`route` is "chat" (`/v1/chat/completions`) or "completions" (`/v1/completions`); `chat`:
    its choices carry chat deltas (a role chunk first, tool calls, reasoning), not `text`."""

    __slots__ = ("route", "chat", "byte_scans", "_markers")

    def __init__(self, route: str, chat: bool) -> None:
        self.route = route
        self.chat = chat
        self.byte_scans = True
        self._markers = _GENERATED_MARKERS[route]

    def classify(self, data: bytes, event: str | None = None) -> Chunk:
        return classify(data, self.route)

    def certainly_empty(self, data: bytes) -> bool:
        return self.chat and is_role_only(data)

    def carries_generated(self, events: bytes) -> bool:
        """Whether compact-JSON SSE bytes hold a non-empty generated string (chat `content`,
        `reasoning`, `reasoning_content`, a `tool_calls` entry; completions `text`). A marker cut
        off at the very end of `events` counts as generated (its value is unknown)."""
        for marker in self._markers:
            i = events.find(marker)
            while i >= 0:
                j = i + len(marker)
                if j >= len(events) or events[j] != _QUOTE:
                    return True
                i = events.find(marker, j)
        return self.chat and _TOOL_CALLS in events

    def drop_usage(self, events: bytes) -> bytes:
        return drop_usage_events(events, self.route) if USAGE_ONLY in events else events

    def fold(self, events: bytes, want_text: bool) -> Chunk | None:
        parts = events.split(_EVENT_END)
        del parts[-1]
        if (events.count(b"\n") != 2 * len(parts) or b'"error"' in events
                or not all(p.startswith(_DATA) for p in parts)):
            return None
        folded = Chunk()
        strings = _TEXT_STRINGS[self.route].findall(events) if want_text else []
        if strings:
            try:
                folded.text = "".join(orjson.loads(b"[" + b",".join(strings) + b"]"))
            except orjson.JSONDecodeError:
                return None
        folded.done = _DONE_EVENT in parts
        at = events.rfind(_USAGE)
        if at >= 0:
            prev_end = events.rfind(_EVENT_END, 0, at)
            start = 0 if prev_end < 0 else prev_end + 2  # the usage event may open the batch
            folded.usage = classify(events[start + len(_DATA):events.find(_EVENT_END, at)], self.route).usage
        return folded

    def error_event(self, error: dict[str, Any]) -> bytes:
        return sse_error_event(error)


SHAPES = {"chat": OpenAIShape("chat", chat=True), "completions": OpenAIShape("completions", chat=False)}


def _stream_option(body: Mapping[str, Any], name: str) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get(name))


def client_wants_usage(body: Mapping[str, Any]) -> bool:
    """The client asked for the stream's usage event (`include_usage`)."""
    return _stream_option(body, "include_usage")


def client_wants_chunk_usage(body: Mapping[str, Any]) -> bool:
    """The client asked for usage on every chunk itself (`continuous_usage_stats` with `include_usage`)."""
    return client_wants_usage(body) and _stream_option(body, "continuous_usage_stats")


def shape_for(route: str) -> OpenAIShape:
    """The stream shape of a route ("chat" | "completions")."""
    return SHAPES[route]


def carries_generated(data: bytes, route: str) -> bool:
    """`OpenAIShape.carries_generated` of the route's shape."""
    return SHAPES[route].carries_generated(data)


def is_role_only(payload: bytes) -> bool:
    """A chat payload that certainly carries no generated text, usage or error: the role chunk
    `{"role":"assistant","content":""}` vLLM and SGLang send first. False means "parse it"."""
    return (payload.count(b'"content":') == 1 and b'"content":""' in payload
            and b'"reasoning' not in payload and b'"tool_calls"' not in payload
            and b'"usage"' not in payload and b'"error"' not in payload and b'"text"' not in payload)


def drop_usage_events(events: bytes, route: str) -> bytes:
    """`events` (whole events) without the usage-only ones, byte-exact otherwise. Only events
    containing `USAGE_ONLY` are parsed, to confirm."""
    if b"\r" in events:  # framing with "\r" line ends: let the parser find the boundaries
        raws = [ev.raw for ev in SSEParser(emit_all=True).feed(events)]
    else:
        raws = [p + _EVENT_END for p in events.split(_EVENT_END)[:-1]]
    return b"".join([raw if USAGE_ONLY not in raw or not _usage_only(raw, route) else line_ends_before(raw)
                     for raw in raws])


# a chunk's usage member in compact JSON: counts and at most one level of nested counts
# (`prompt_tokens_details`); usage holds no strings but its keys, so no brace hides in one
_CHUNK_USAGE = re.compile(rb',"usage":\{(?:[^{}]|\{[^{}]*\})*\}')


def drop_chunk_usage(events: bytes) -> bytes:
    """`events` (whole events) without the `usage` member of chunks that carry choices
    (`continuous_usage_stats`); the usage-only chunk keeps its usage. Byte-exact otherwise: one
    regex pass over the read (an event that is not compact JSON keeps its usage)."""
    if _USAGE not in events:
        return events
    if USAGE_ONLY not in events:
        return _CHUNK_USAGE.sub(b"", events)
    parts = events.split(_EVENT_END)
    return _EVENT_END.join([p if USAGE_ONLY in p else _CHUNK_USAGE.sub(b"", p) for p in parts])


def _usage_only(event: bytes, route: str) -> bool:
    parsed = SSEParser().feed(event)
    return bool(parsed) and parsed[0].data is not None and classify(parsed[0].data, route).usage_only


def classify(payload: bytes, route: str) -> Chunk:
    """Classify one data payload of a chat (`route="chat"`) or completions stream.

    A role-only delta or `{"role": "assistant", "content": ""}` is not generated text: TTFT must
    not stop at the role chunk vLLM/SGLang send before (or with) the first token.
    """
    if payload == DONE:
        return Chunk(done=True)
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return Chunk(parsed=False)
    return classify_obj(obj, route)


def classify_obj(obj: Any, route: str) -> Chunk:
    """`classify` for a payload already decoded from JSON."""
    if not isinstance(obj, dict):
        return Chunk(parsed=False)
    chunk = Chunk()
    usage = obj.get("usage")
    if isinstance(usage, dict):
        chunk.usage = usage
    choices = obj.get("choices")
    if choices is None:
        err = obj.get("error")
        if err is not None:
            chunk.error = err if isinstance(err, dict) else {"message": str(err)}
        return chunk
    if not isinstance(choices, list):
        return chunk
    if not choices:
        chunk.usage_only = chunk.usage is not None
        return chunk
    chat = SHAPES[route].chat
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text, generated = _choice_text(choice, chat)
        if generated:
            chunk.generated = True
        if text and choice.get("index", 0) == 0:
            chunk.text = text
    return chunk


def _choice_text(choice: dict[str, Any], chat: bool) -> tuple[str, bool]:
    """(choice's content text, whether it carries any generated output)."""
    if not chat:
        text = choice.get("text")
        return (text, True) if isinstance(text, str) and text else ("", False)
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return "", False
    content = delta.get("content")
    content = content if isinstance(content, str) else ""
    if content:
        return content, True
    for key in _CHAT_GENERATED_FIELDS[1:]:
        value = delta.get(key)
        if isinstance(value, str) and value:
            return "", True
    return "", bool(delta.get("tool_calls"))
