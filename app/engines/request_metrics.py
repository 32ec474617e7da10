"""vLLM's per-request metrics (`--enable-per-request-metrics`): reading them from a response, and
taking them out of what the client gets. Pure functions over bytes and JSON; no I/O.

What vLLM 0.32 writes (docs/ttft-ledger.md has the sources): a top-level `metrics` object on a
chat or completions answer (the non-streamed body; a stream's final usage chunk, `choices: []`),
only for one prompt and n == 1. Its timing members are milliseconds measured by the engine core:
`queue_time_ms` = scheduled - queued, `time_to_first_token_ms` = first token - scheduled (the
prefill, despite its name: it excludes the queue), `generation_time_ms`, `mean_itl_ms`,
`tokens_per_second`; `speculative_decoding` when a drafter runs. A member vLLM could not measure
is absent (streams) or null (bodies); so is the whole object without the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

METRICS_KEY = b'"metrics":{'  # compact JSON: only the top-level member can match unescaped
CLIENT_OPT_IN_HEADER = "x-prefixgate-engine-metrics"  # "1"/"true": keep the engine's metrics for the client
_EVENT_END = b"\n\n"
_DATA = b"data: "


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """The engine's own timing of one request, in seconds; None where it did not report one."""

    queue_s: float | None = None  # queued -> first scheduled (engine core)
    prefill_s: float | None = None  # first scheduled -> first token (vLLM's `time_to_first_token_ms`)
    generation_s: float | None = None  # first token -> last token
    mean_itl_s: float | None = None


def _seconds(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value) / 1000.0


def parse_metrics(obj: Any) -> EngineTiming | None:
    """The timing in a response's `metrics` member; None when there is none (flag off, n > 1,
    SGLang) or it carries no timing (speculative decoding stats alone)."""
    if not isinstance(obj, dict):
        return None
    timing = EngineTiming(_seconds(obj, "queue_time_ms"), _seconds(obj, "time_to_first_token_ms"),
                          _seconds(obj, "generation_time_ms"), _seconds(obj, "mean_itl_ms"))
    return None if timing == EngineTiming() else timing


def client_wants_metrics(headers: dict[str, str]) -> bool:
    """Whether the client asked to see the engine's metrics (lower-case header names)."""
    return headers.get(CLIENT_OPT_IN_HEADER, "").strip().lower() in ("1", "true", "yes")


def without_metrics(payload: bytes, obj: dict[str, Any]) -> bytes:
    """The JSON `payload` (parsed: `obj`) without its top-level `metrics` member. Byte-exact
    where vLLM puts it (the last member, compact); re-serialised otherwise."""
    at = payload.rfind(b',' + METRICS_KEY)
    if at >= 0 and payload.endswith(b"}"):
        try:
            tail = orjson.loads(payload[at + 1 + len(METRICS_KEY) - 1:-1])
        except orjson.JSONDecodeError:
            tail = None
        if tail == obj.get("metrics"):
            return payload[:at] + b"}"
    return orjson.dumps({k: v for k, v in obj.items() if k != "metrics"})


def take_from_body(body: bytes, strip: bool) -> tuple[bytes, EngineTiming | None]:
    """A whole JSON answer: (the bytes for the client, the engine's timing). `strip`: remove a
    `metrics` object (a `null` one is left as vLLM wrote it: it says nothing)."""
    if METRICS_KEY not in body:
        return body, None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, None
    if not isinstance(obj, dict) or not isinstance(obj.get("metrics"), dict):
        return body, None
    timing = parse_metrics(obj["metrics"])
    return (without_metrics(body, obj) if strip else body), timing


def take_from_events(events: bytes, strip: bool) -> tuple[bytes, EngineTiming | None]:
    """Whole SSE events (`data: <json>\\n\\n`, as vLLM writes them): (the bytes for the client,
    the timing of the last event carrying `metrics`). Events without the member pass untouched."""
    if METRICS_KEY not in events:
        return events, None
    timing: EngineTiming | None = None
    parts = events.split(_EVENT_END)
    tail = parts.pop()  # b"" for whole events
    out: list[bytes] = []
    for raw in parts:
        if METRICS_KEY in raw and raw.startswith(_DATA) and b"\n" not in raw:
            kept, found = take_from_body(raw[len(_DATA):], strip)
            if found is not None:
                timing = found
            raw = _DATA + kept
        out.append(raw)
    out.append(tail)
    return _EVENT_END.join(out), timing
