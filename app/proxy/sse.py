"""Incremental Server-Sent Events parsing and the OpenAI chunk classifier.

The relay forwards upstream bytes unchanged; this module only *observes* them. `SSEParser.feed`
accepts arbitrary TCP reads (an event split across reads, `\\r\\n` or `\\r` line ends, comments,
multi-line `data:`) and returns the events completed by that read, each with its raw bytes so a
caller that must filter one event out (the usage chunk the proxy added) can forward the rest
byte-for-byte. `classify` turns one `data:` payload into the facts the clock needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

DONE = b"[DONE]"
_LF = 0x0A


@dataclass(slots=True)
class SSEEvent:
    data: bytes | None  # data lines joined with b"\n"; None for a block without data (comments)
    event: str | None  # the `event:` field, when any
    raw: bytes  # the event's bytes as received, blank-line terminator included


class SSEParser:
    """Stateful, incremental SSE parser (the WHATWG event-stream grammar, minus `retry`/`id`).

    Invariant between feeds: `_line` holds an unterminated line, `_raw` the bytes of the current
    (not yet dispatched) event already consumed, `_data`/`_event` its fields so far.
    """

    __slots__ = ("_line", "_raw", "_data", "_event", "_has_data", "_pending_cr", "_emit_all")

    def __init__(self, emit_all: bool = False) -> None:
        """`emit_all`: also return blocks without data (comments, bare fields) as events with
        `data=None`, so a filtering relay can forward every byte it does not mean to drop."""
        self._emit_all = emit_all
        self._line = b""
        self._raw = bytearray()
        self._data: list[bytes] = []
        self._event: str | None = None
        self._has_data = False
        self._pending_cr = False  # the previous read ended in "\r": a following "\n" belongs to it

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not chunk:
            return events
        buf = chunk
        start = 0
        if self._pending_cr:
            self._pending_cr = False
            if buf[0] == _LF:
                self._raw += b"\n"
                start = 1
        if self._line:
            buf = self._line + buf[start:]
            start = 0
            self._line = b""
        n = len(buf)
        pos = start
        raw_from = start  # bytes of buf not yet copied into _raw
        while pos < n:
            nl = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, nl if nl >= 0 else n)
            if cr >= 0:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == _LF else cr + 1
                else:
                    nxt = cr + 1
                    self._pending_cr = True
            elif nl >= 0:
                end, nxt = nl, nl + 1
            else:
                break
            line = buf[pos:end]
            pos = nxt
            if line:
                self._field(line)
                continue
            # blank line: dispatch
            self._raw += buf[raw_from:pos]
            raw_from = pos
            if self._has_data:
                events.append(SSEEvent(b"\n".join(self._data), self._event, bytes(self._raw)))
            elif self._emit_all and self._raw:
                events.append(SSEEvent(None, self._event, bytes(self._raw)))
            self._raw.clear()
            self._data = []
            self._event = None
            self._has_data = False
        self._raw += buf[raw_from:pos]
        self._line = buf[pos:]
        return events

    def _field(self, line: bytes) -> None:
        if line[0] == 0x3A:  # ":" comment
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")

    def pending(self) -> bytes:
        """Bytes received but not yet part of a dispatched event (for filtering relays)."""
        return bytes(self._raw) + self._line


@dataclass(slots=True)
class Chunk:
    """What one `data:` payload means to the clock."""

    done: bool = False  # the `[DONE]` sentinel
    error: dict[str, Any] | None = None  # `data: {"error": ...}` (vLLM/SGLang mid-stream errors)
    generated: bool = False  # carries generated text: content/reasoning/tool_calls or text
    text: str = ""  # choice 0's generated content (chat `content`, completions `text`)
    usage: dict[str, Any] | None = None
    usage_only: bool = False  # `choices: []` + usage: the include_usage chunk
    parsed: bool = True


_CHAT_GENERATED_FIELDS = ("content", "reasoning", "reasoning_content")


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
    """`classify` for a payload already decoded from JSON (the end-of-stream batch parse)."""
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
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text, generated = _choice_text(choice, route)
        if generated:
            chunk.generated = True
        if text and choice.get("index", 0) == 0:
            chunk.text = text
    return chunk


def _choice_text(choice: dict[str, Any], route: str) -> tuple[str, bool]:
    """(choice's content text, whether it carries any generated output)."""
    if route != "chat":
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
