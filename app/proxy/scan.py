"""Byte-level scans of compact OpenAI SSE, and the end-of-stream summary: the relay's fast path.

Until the first content token the relay parses every event (the clock must stamp TTFT exactly);
after it, parsing each event's JSON on the loop was the largest cost per relayed chunk we could
remove. So afterwards the relay only scans bytes (`carries_generated` for inter-token gaps,
`USAGE_ONLY` to drop the usage chunk the proxy added) and `StreamSummary` reads the retained bytes
in batches: `[DONE]` and the last usage event by byte search, choice 0's text by one regex over
the batch and one `orjson.loads` of the matched JSON strings (no per-event parse at all).

Why byte checks are exact here: in JSON an unescaped `"` cannot occur inside a string, so in
compact JSON (`"key":"value"`, what vLLM and SGLang emit) the bytes `"content":"` can only be that
key followed by a string value, never text the model generated (which arrives as `\\"content\\":`).
A stream that is not compact (`"content": "x"`) or not `\\n`-framed never takes the fast path
(relay.py decides on the first content event), and `StreamSummary` falls back to the full parser
whenever a batch is not plain `data: <json>\\n\\n` events.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from app.proxy.sse import DONE, Chunk, SSEParser, classify

_QUOTE = 0x22
_GENERATED_MARKERS: dict[str, tuple[bytes, ...]] = {
    "chat": (b'"content":"', b'"reasoning":"', b'"reasoning_content":"'),
    "completions": (b'"text":"',),
}
_TOOL_CALLS = b'"tool_calls":[{'
USAGE_ONLY = b'"choices":[]'  # the include_usage chunk (and only it, in compact JSON)
_DATA = b"data: "
_EVENT_END = b"\n\n"
_DONE_EVENT = _DATA + DONE
_USAGE = b'"usage":{'
# choice text as JSON string literals (`collect_text` implies n == 1: one choice)
_JSON_STRING = rb'("[^"\\]*(?:\\.[^"\\]*)*")'
_TEXT_STRINGS = {"chat": re.compile(rb'"content":' + _JSON_STRING),
                 "completions": re.compile(rb'"text":' + _JSON_STRING)}
DECODE_BATCH_BYTES = 256 * 1024  # retained bytes decoded at once; bounds memory per stream


def carries_generated(data: bytes, route: str) -> bool:
    """Whether compact-JSON SSE bytes hold a non-empty generated string (chat `content`,
    `reasoning`, `reasoning_content`, a `tool_calls` entry; completions `text`).

    A marker cut off at the very end of `data` counts as generated (its value is unknown).
    """
    for marker in _GENERATED_MARKERS.get(route, _GENERATED_MARKERS["chat"]):
        i = data.find(marker)
        while i >= 0:
            j = i + len(marker)
            if j >= len(data) or data[j] != _QUOTE:
                return True
            i = data.find(marker, j)
    return route == "chat" and _TOOL_CALLS in data


def is_role_only(payload: bytes) -> bool:
    """A chat payload that certainly carries no generated text, usage or error: the role chunk
    `{"role":"assistant","content":""}` vLLM and SGLang send first. False means "parse it"."""
    return (payload.count(b'"content":') == 1 and b'"content":""' in payload
            and b'"reasoning' not in payload and b'"tool_calls"' not in payload
            and b'"usage"' not in payload and b'"error"' not in payload and b'"text"' not in payload)


def drop_usage_events(events: bytes, route: str) -> bytes:
    """`events` (complete `\\n\\n`-terminated events) without the usage-only ones, byte-exact
    otherwise. Only events containing `USAGE_ONLY` are parsed, to confirm."""
    parts = events.split(_EVENT_END)
    kept = [p for p in parts[:-1] if USAGE_ONLY not in p or not _usage_only(p, route)]
    return b"".join([p + _EVENT_END for p in kept])


def _usage_only(event: bytes, route: str) -> bool:
    parsed = SSEParser().feed(event + _EVENT_END)
    return bool(parsed) and parsed[0].data is not None and classify(parsed[0].data, route).usage_only


class StreamSummary:
    """What a stream said, folded from classified chunks: usage, `[DONE]`, the last error event
    and choice 0's text (bounded by `max_chars`).

    The relay folds the events it parsed itself with `take`, and hands every later read to
    `add_bytes`; `finish` decodes what is left. Events must reach it in stream order.
    """

    __slots__ = ("route", "collect_text", "max_chars", "text_parts", "text_len", "usage", "done", "error",
                 "_buf", "_buf_len", "_parser")

    def __init__(self, route: str, collect_text: bool, max_chars: int) -> None:
        self.route = route
        self.collect_text = collect_text
        self.max_chars = max_chars
        self.text_parts: list[str] = []
        self.text_len = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self._buf: list[bytes] = []
        self._buf_len = 0
        self._parser: SSEParser | None = None  # set once a batch needed the full parser

    def take(self, chunk: Chunk) -> None:
        if chunk.done:
            self.done = True
        elif chunk.error is not None:
            self.error = chunk.error
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.text and self.collect_text and self.text_len < self.max_chars:
            self.text_parts.append(chunk.text)
            self.text_len += len(chunk.text)

    def add_bytes(self, data: bytes) -> None:
        """Raw stream bytes (any split); decoded once `DECODE_BATCH_BYTES` have gathered."""
        self._buf.append(data)
        self._buf_len += len(data)
        if self._buf_len >= DECODE_BATCH_BYTES:
            self._decode()

    def finish(self) -> None:
        """Decode the retained bytes; an unterminated last event is ignored (as the parser does)."""
        self._decode()

    @property
    def text(self) -> str:
        return "".join(self.text_parts)[:self.max_chars]

    def _decode(self) -> None:
        if not self._buf:
            return
        blob = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf.clear()
        self._buf_len = 0
        parser = self._parser
        if parser is None:
            if b"\r" in blob:  # the framing itself needs the parser, from here on
                parser = self._parser = SSEParser()
            else:
                end = blob.rfind(_EVENT_END) + 2
                if end < 2:  # no complete event yet
                    self._buf.append(blob)
                    self._buf_len = len(blob)
                    return
                if end < len(blob):
                    self._buf.append(blob[end:])
                    self._buf_len = len(blob) - end
                    blob = blob[:end]
                if self._take_compact(blob):
                    return
                parser = SSEParser()  # complete plain events the scan declined (comments, errors)
        for event in parser.feed(blob):
            if event.data is not None:
                self.take(classify(event.data, self.route))

    def _take_compact(self, events: bytes) -> bool:
        """Fold complete events without parsing each: True when every event is one `data: `
        line with no error object, so `[DONE]`, the last usage and the text can be read by
        byte scans (the usage event parsed alone, the text strings decoded in one array)."""
        parts = events.split(_EVENT_END)
        del parts[-1]
        if (events.count(b"\n") != 2 * len(parts) or b'"error"' in events
                or not all(p.startswith(_DATA) for p in parts)):
            return False
        strings = _TEXT_STRINGS[self.route].findall(events) if self.collect_text else []
        if strings and self.text_len < self.max_chars:
            try:
                decoded = orjson.loads(b"[" + b",".join(strings) + b"]")
            except orjson.JSONDecodeError:
                return False
            text = "".join(decoded)
            if text:
                self.text_parts.append(text)
                self.text_len += len(text)
        if _DONE_EVENT in parts:
            self.done = True
        at = events.rfind(_USAGE)
        if at >= 0:
            prev_end = events.rfind(_EVENT_END, 0, at)
            start = 0 if prev_end < 0 else prev_end + 2  # the usage event may open the batch
            usage = classify(events[start + len(_DATA):events.find(_EVENT_END, at)], self.route).usage
            if usage is not None:
                self.usage = usage
        return True
