"""The seam between the stream observer and one API's SSE vocabulary: a per-route "shape".

The observer (app/proxy/observer.py) knows SSE framing, the clock and what to keep; a shape knows
what one API's events mean. OpenAI chat and completions (what vLLM and SGLang serve, see
docs/sse.md) are app/proxy/openai_shape.py. Another API with another stream shape (`event:` lines,
no `[DONE]`, its own error event) plugs in as another `StreamShape`, without touching the relay or
the observer; a shape whose bytes cannot be scanned exactly sets `byte_scans = False` and gets every
event parsed: `ParsedShape` is that kind's common part (the Responses and Messages shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def count(value: Any) -> int | None:
    """A token count as an engine reports one: a non-negative int, not a bool. Anything else (a
    string, a float, -1, null) is an unknown count, never a number that looks like data."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_counts(usage: Any) -> dict[str, Any] | None:
    """A chat-completions usage with its counts checked: a malformed count is dropped (absent),
    and `prompt_tokens_details` keeps only a well-formed `cached_tokens`. Other members stay as
    sent. None for a usage that is not an object."""
    if not isinstance(usage, dict):
        return None
    out = {k: v for k, v in usage.items() if k not in COUNTS and k != "prompt_tokens_details"}
    for key in COUNTS:
        if count(usage.get(key)) is not None:
            out[key] = usage[key]
    details = usage.get("prompt_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


@dataclass(slots=True)
class Chunk:
    """What one event (or a batch of events, folded) means to the observer."""

    done: bool = False  # the stream's end marker (OpenAI: `data: [DONE]`)
    error: dict[str, Any] | None = None  # an error event from the upstream
    generated: bool = False  # carries generated output (text, reasoning, tool calls)
    text: str = ""  # choice 0's generated text
    usage: dict[str, Any] | None = None
    usage_only: bool = False  # the usage-only event the proxy may have asked for (and then drops)
    parsed: bool = True
    response_id: str | None = None  # the id a stateful API (Responses) gave the response


class StreamShape(Protocol):
    """One API's stream, as the observer needs it. Methods taking `events` get whole,
    blank-line-terminated SSE events (one or several, as one byte string)."""

    byte_scans: bool  # the byte checks below are exact for this shape: the observer may stop parsing

    def classify(self, data: bytes, event: str | None) -> Chunk:
        """One event's data (its `data:` lines joined) and `event:` name."""
        ...

    def certainly_empty(self, data: bytes) -> bool:
        """A cheap check that an event carries nothing to observe (no parse needed)."""
        ...

    def carries_generated(self, events: bytes) -> bool:
        """Whether the events hold generated output (byte scan, after the first token)."""
        ...

    def drop_usage(self, events: bytes) -> bytes:
        """The events minus the usage-only ones, byte-exact otherwise."""
        ...

    def fold(self, events: bytes, want_text: bool) -> Chunk | None:
        """The events folded into one Chunk by byte scans (the last usage, the end marker, the
        concatenated text when `want_text`); None when they need per-event parsing."""
        ...

    def error_event(self, error: dict[str, Any]) -> bytes:
        """The bytes that end a stream the upstream broke: the error event, then the end marker."""
        ...


class ParsedShape:
    """The common part of a shape whose every event is parsed (`byte_scans = False`: the
    observer never byte-scans it, so the byte checks below are never consulted): the event's
    JSON object and its type (the `type` member when a string, else the `event:` name) go to
    `meaning`."""

    __slots__ = ("byte_scans",)

    def __init__(self) -> None:
        self.byte_scans = False

    def classify(self, data: bytes, event: str | None = None) -> Chunk:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return Chunk(parsed=False)
        if not isinstance(obj, dict):
            return Chunk(parsed=False)
        kind = obj.get("type")
        return self.meaning(obj, kind if isinstance(kind, str) and kind else event)

    def meaning(self, obj: dict[str, Any], kind: str | None) -> Chunk:
        """What one parsed event means (the shape's own vocabulary)."""
        raise NotImplementedError

    def certainly_empty(self, data: bytes) -> bool:
        return False

    def carries_generated(self, events: bytes) -> bool:
        return False

    def drop_usage(self, events: bytes) -> bytes:
        return events  # the proxy never asks these APIs for extra usage events: nothing to drop

    def fold(self, events: bytes, want_text: bool) -> Chunk | None:
        return None
