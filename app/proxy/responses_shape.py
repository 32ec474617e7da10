"""OpenAI Responses API streams (`POST /v1/responses`, vLLM 0.32): the `StreamShape` the observer uses.

What the events look like (docs/agents-responses.md): each is `event: <type>` + `data: <json>`
with the same `type` inside; `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added` carry no generated text (the role
chunk's equivalents); generated output arrives as `response.output_text.delta`,
`response.reasoning_text.delta` (and summary deltas) or `response.function_call_arguments.delta`;
the stream ends with `response.completed` (usage inside `response`), `response.incomplete`
or `response.failed`, never with `data: [DONE]`; an engine error mid-stream is an `error` event.

The usage is mapped onto the chat names every metric reads (`prompt_tokens`,
`completion_tokens`, `prompt_tokens_details.cached_tokens`); a member the engine did not send
stays absent. Every event is parsed (`byte_scans = False`): a Responses stream carries its text in
`"delta"` members whose meaning depends on the event type, so no byte scan is exact. Parsing
every event is also what lets the shape follow the stream's `sequence_number`, which the error
event the gateway appends after a broken upstream continues; so there is one shape per stream.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.proxy.shape import Chunk, ParsedShape, count

GENERATED_TYPES = frozenset({
    "response.output_text.delta", "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta", "response.refusal.delta",
})
TEXT_TYPE = "response.output_text.delta"
END_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})
ID_TYPES = frozenset({"response.created", "response.in_progress"})


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses usage object under the chat usage names (absent members stay absent)."""
    if not isinstance(usage, dict):
        return None
    out: dict[str, Any] = {}
    for ours, theirs in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens"),
                         ("total_tokens", "total_tokens")):
        if count(usage.get(theirs)) is not None:
            out[ours] = usage[theirs]
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and count(details.get("cached_tokens")) is not None:
        out["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    return out


def output_text(response: dict[str, Any]) -> str | None:
    """The text of a (non-streamed) response's message output items, concatenated."""
    items = response.get("output")
    if not isinstance(items, list):
        return None
    texts: list[str] = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return "".join(texts)


class ResponsesShape(ParsedShape):
    """One Responses stream's shape (one instance per stream: it follows the stream's
    `sequence_number`s, which the error event it may have to append continues)."""

    __slots__ = ("_next_sequence",)

    def __init__(self) -> None:
        super().__init__()
        self._next_sequence = 0  # the number the next event takes

    def meaning(self, obj: dict[str, Any], kind: str | None) -> Chunk:
        seq = obj.get("sequence_number")
        # vLLM numbers its events 0, 1, 2, ...; a stream without numbers is counted instead
        self._next_sequence = seq + 1 if isinstance(seq, int) and not isinstance(seq, bool) else self._next_sequence + 1
        chunk = Chunk()
        if kind in GENERATED_TYPES:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                chunk.generated = True
                if kind == TEXT_TYPE:
                    chunk.text = delta
            return chunk
        response = obj.get("response")
        if kind in END_TYPES and isinstance(response, dict):
            chunk.done = True
            chunk.usage = chat_usage(response.get("usage"))
            chunk.response_id = response.get("id") if isinstance(response.get("id"), str) else None
            if kind == "response.failed":
                err = response.get("error")
                chunk.error = err if isinstance(err, dict) else {"message": "response failed"}
        elif kind in ID_TYPES and isinstance(response, dict) and isinstance(response.get("id"), str):
            chunk.response_id = response["id"]
        elif kind == "error" or (kind is None and "error" in obj):
            err = obj.get("error", obj)
            chunk.error = err if isinstance(err, dict) else {"message": str(err)}
        return chunk

    def error_event(self, error: dict[str, Any]) -> bytes:
        """The Responses API's error event, as the openai SDK's `ResponseErrorEvent` defines it
        (its fields in its order), numbered after the last event the client got; no `[DONE]`
        follows (docs/agents-responses.md: what vLLM 0.32 itself does there)."""
        payload = {"code": error.get("code"), "message": error.get("message", ""), "param": error.get("param"),
                   "sequence_number": self._next_sequence, "type": "error"}
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
