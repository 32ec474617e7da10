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
`"delta"` members whose meaning depends on the event type, so no byte scan is exact.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.proxy.shape import Chunk

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
    if isinstance(usage.get("input_tokens"), int):
        out["prompt_tokens"] = usage["input_tokens"]
    if isinstance(usage.get("output_tokens"), int):
        out["completion_tokens"] = usage["output_tokens"]
    if isinstance(usage.get("total_tokens"), int):
        out["total_tokens"] = usage["total_tokens"]
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
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


class ResponsesShape:
    """The one Responses stream shape (stateless: the observer keeps what a stream said)."""

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
        kind = obj.get("type") or event
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

    def certainly_empty(self, data: bytes) -> bool:
        return False

    def carries_generated(self, events: bytes) -> bool:  # never called: byte_scans is False
        return False

    def drop_usage(self, events: bytes) -> bytes:
        return events  # usage rides on response.completed: nothing to drop

    def fold(self, events: bytes, want_text: bool) -> Chunk | None:
        return None

    def error_event(self, error: dict[str, Any]) -> bytes:
        """The Responses API's own error event (what vLLM streams for a generation error and the
        openai SDK yields as `ResponseErrorEvent`): no `[DONE]` follows."""
        payload = {"type": "error", "code": error.get("code"), "message": error.get("message", ""),
                   "param": error.get("param")}
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


RESPONSES_SHAPE = ResponsesShape()
