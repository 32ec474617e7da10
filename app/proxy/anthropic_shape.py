"""Anthropic Messages streams (`POST /v1/messages` on vLLM / SGLang): the `StreamShape` for them.

What the events look like is in docs/agents-apis.md: every event is `event: <name>` + `data:
<json>` whose `type` repeats the name; `message_start` (the message, with the prompt's usage),
`content_block_start`, `ping` and `content_block_stop` carry no generated text; a
`content_block_delta` carries text in `text_delta.text`, `thinking_delta.thinking` or
`input_json_delta.partial_json`; `message_delta` carries the stop reason and the final usage;
`message_stop` ends the stream (there is no `data: [DONE]`); a failure is `event: error` with
`{"type": "error", "error": {"type", "message"}}`, after which nothing follows.

Usage has Anthropic's meaning: `input_tokens` EXCLUDES the prompt tokens read from or written to
the cache, so the prompt is `input_tokens + cache_read_input_tokens +
cache_creation_input_tokens` and the cached part is `cache_read_input_tokens`. `openai_usage`
maps that onto the chat-completions usage every metric reads (`prompt_tokens`,
`prompt_tokens_details.cached_tokens`, `completion_tokens`); a count the engine did not send
stays absent (older vLLM sends no cache fields: cached tokens are then unknown, not zero).

A shape object holds the stream's usage so far (message_start's, updated by message_delta), so
there is one per stream (`AnthropicShape()`), unlike the stateless OpenAI shapes. Its events are
never byte-scanned (`byte_scans = False`): they are few, and each is parsed.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.proxy.shape import Chunk, ParsedShape, count

_DELTA_TEXT = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
API_ERROR = "api_error"


def openai_usage(usage: Any) -> dict[str, Any] | None:
    """Anthropic usage as chat-completions usage (see the module docstring); None without an
    `input_tokens` count (the prompt size is then unknown)."""
    if not isinstance(usage, dict):
        return None
    inp = count(usage.get("input_tokens"))
    out: dict[str, Any] = {}
    read = count(usage.get("cache_read_input_tokens"))
    if inp is not None:
        out["prompt_tokens"] = inp + (read or 0) + (count(usage.get("cache_creation_input_tokens")) or 0)
        if read is not None:
            out["prompt_tokens_details"] = {"cached_tokens": read}
    produced = count(usage.get("output_tokens"))
    if produced is not None:
        out["completion_tokens"] = produced
    return out or None


def error_payload(message: str, kind: str = API_ERROR) -> dict[str, Any]:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def output_text(payload: dict[str, Any]) -> str | None:
    """The text blocks of a non-streamed Messages response, concatenated."""
    content = payload.get("content")
    if not isinstance(content, list):
        return None
    return "".join(b["text"] for b in content
                   if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


class AnthropicShape(ParsedShape):
    """One Messages stream's shape (one instance per stream: it merges usage across events)."""

    __slots__ = ("_usage",)

    def __init__(self) -> None:
        super().__init__()
        self._usage: dict[str, Any] = {}

    def meaning(self, obj: dict[str, Any], kind: str | None) -> Chunk:
        chunk = Chunk()
        if kind == "content_block_delta":
            delta = obj.get("delta")
            delta_type = delta.get("type") if isinstance(delta, dict) else None
            field = _DELTA_TEXT.get(delta_type) if isinstance(delta_type, str) else None
            value = delta.get(field) if field else None  # type: ignore[union-attr]
            if isinstance(value, str) and value:
                chunk.generated = True
                if field == "text":
                    chunk.text = value
        elif kind == "message_start":
            message = obj.get("message")
            chunk.usage = self._merge(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "message_delta":
            chunk.usage = self._merge(obj.get("usage"))
        elif kind == "message_stop":
            chunk.done = True
        elif kind == "error":
            err = obj.get("error")
            chunk.error = err if isinstance(err, dict) else {"type": API_ERROR, "message": str(err)}
            chunk.done = True  # Anthropic's error event is terminal: nothing follows it
        return chunk

    def _merge(self, usage: Any) -> dict[str, Any] | None:
        if isinstance(usage, dict):
            for key in _USAGE_KEYS:
                if count(usage.get(key)) is not None:
                    self._usage[key] = usage[key]
        return openai_usage(self._usage)

    def certainly_empty(self, data: bytes) -> bool:
        return data == b'{"type":"ping"}'

    def error_event(self, error: dict[str, Any]) -> bytes:
        message = str(error.get("message") or "upstream failed mid-stream")
        return b"event: error\ndata: " + orjson.dumps(error_payload(message)) + b"\n\n"
