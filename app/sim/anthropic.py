"""The simulator's Anthropic Messages surface (`POST /v1/messages`, `/v1/messages/count_tokens`).

Like vLLM (docs/agents-apis.md), the body is converted to chat messages
(app/sim/anthropic_convert.py, the simulator's own conversion, independent of the gateway's) and
rendered with the chat template; the billing-header system block is dropped unless the replica runs with
`strip_billing_header=False` (`--no-strip-billing-header`: an engine that keeps it, as SGLang).

Stream, in vLLM's order: `message_start` (with the first generated token; usage carries the
prompt), then per block `content_block_start` / `content_block_delta`s (`thinking_delta` for the
reasoning tokens, `text_delta` after) / `content_block_stop`, `message_delta` (stop reason, final
usage), `message_stop`. Usage in Anthropic's meaning, as vLLM 0.32 maps it (`_usage`):
`message_start` carries `input_tokens` = the whole prompt and no cache fields (the first chunk
has no details); the final usage `input_tokens = prompt - cached - created`,
`cache_read_input_tokens` = cached, `cache_creation_input_tokens` = the prompt tokens this
request newly cached. An engine error mid-stream is
`event: error`; a `die_midstream` fault cuts the connection after K events.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from app.sim.anthropic_convert import messages_to_chat
from app.sim.asgi import SSE_HEADERS, EventSender, Receive, Send, StreamDied, cut_connection, send_json
from app.sim.engine import SimEngine
from app.sim.options import SimOptions
from app.sim.protocol import ApiError, ParsedRequest, parse_chat, validate_cache_salt
from app.sim.request import SimRequest
from app.sim.responder import body_due
from app.sim.tool_dump import dump_tools

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class RequestInvalid(ApiError):
    """A body vLLM's request model refuses (a field missing or of the wrong type): FastAPI answers
    it before the Messages handler runs, so in the OpenAI shape, `type` "Bad Request" and `param`
    "body.<field>" (captured: tests/fixtures/real_vllm_agents/messages_400_max_tokens.json)."""

    MESSAGES = {"missing": "Field required", "list_type": "Input should be a valid list",
                "int_type": "Input should be a valid integer"}

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(400, f"1 validation error:\n  {{'type': '{problem}', 'loc': 'body.{field}', "
                              f"'msg': '{self.MESSAGES[problem]}'}}", f"body.{field}", "Bad Request")


def error_body(exc: ApiError) -> dict[str, Any]:
    """vLLM 0.32's error answer on this route: an engine or handler error is translated to
    Anthropic's shape with the OpenAI error's type (`NotFoundError`, `BadRequestError`, ...); a
    request-model refusal keeps the OpenAI shape (`RequestInvalid`)."""
    if isinstance(exc, RequestInvalid):
        return {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}}
    return {"type": "error", "error": {"type": exc.kind, "message": exc.message}}


def parse_messages(body: dict[str, Any], served_model: str, strip_billing: bool, count_only: bool = False,
                   merge_inline_system: bool = False) -> ParsedRequest:
    """A Messages body as the chat request the engine builds from it."""
    if "messages" not in body:
        raise RequestInvalid("messages", "missing")
    if not isinstance(body["messages"], list) or not body["messages"]:
        raise RequestInvalid("messages", "list_type")
    max_tokens = body.get("max_tokens")
    if not count_only and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0):
        raise RequestInvalid("max_tokens", "missing" if max_tokens is None else "int_type")
    chat = messages_to_chat(body, strip_billing, merge_inline_system)
    chat["model"] = body.get("model", served_model)
    if not count_only:
        chat["max_tokens"] = max_tokens
        chat["stream"] = bool(body.get("stream"))
    parsed = parse_chat(chat, served_model)
    parsed.tools = dump_tools(parsed.tools)  # vLLM's chat request model, as on its chat route
    parsed.cache_salt = validate_cache_salt(body.get("cache_salt"))
    return parsed


def _usage(req: SimRequest, options: SimOptions, output: int, details: bool = True) -> dict[str, Any]:
    """vLLM 0.32's mapping of the chat usage: without prompt token details (disabled, or the first
    stream chunk, which carries none) `input_tokens` is the whole prompt and the cache fields are
    absent; with them, `input_tokens = prompt - cached - created`."""
    prompt = req.num_prompt_tokens
    if not (details and options.enable_prompt_tokens_details):
        return {"input_tokens": prompt, "output_tokens": output}
    cached = max(req.num_cached_tokens, 0)
    created = req.created_cache_tokens
    return {"input_tokens": max(0, prompt - cached - created), "output_tokens": output,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": created}


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


async def respond(engine: SimEngine, req: SimRequest, model: str, send: Send, receive: Receive,
                  die_after: int | None) -> None:
    """Non-streamed: one Messages response body."""
    if not await body_due(req, send, receive, die_after, error_body):
        return
    r = engine.options.reasoning_tokens
    content: list[dict[str, Any]] = []
    if r and req.output_text[:r]:
        content.append({"type": "thinking", "thinking": "".join(req.output_text[:r]), "signature": uuid.uuid4().hex})
    text = "".join(req.output_text[r:])
    if text:
        content.append({"type": "text", "text": text})
    await send_json(send, 200, {
        "id": f"msg_{req.request_id}", "type": "message", "role": "assistant", "content": content,
        "model": model, "stop_reason": STOP_REASONS.get(req.finish_reason or "stop", "end_turn"),
        "usage": _usage(req, engine.options, len(req.output_ids))})  # vLLM dumps it without its None fields


async def stream(engine: SimEngine, req: SimRequest, model: str, send: Send, receive: Receive,
                 die_after: int | None) -> None:
    o = engine.options
    r = o.reasoning_tokens
    k = o.deltas_per_chunk
    emit = EventSender(send, die_after)

    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    try:
        started = False
        block: str | None = None
        index = 0
        sent = 0
        while True:
            await req.event.wait()
            req.event.clear()
            if req.finish_reason == "abort":
                return
            if req.finish_reason == "error":
                await emit(_event("error", {"type": "error", "error": {"type": "internal_error",
                                                                        "message": req.error or "engine error"}}))
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            available = len(req.output_ids)
            if not started and (available or req.finished):
                await emit(_event("message_start", {"type": "message_start", "message": {
                    "id": f"msg_{req.request_id}", "type": "message", "role": "assistant", "content": [],
                    "model": model, "stop_reason": None, "stop_sequence": None,
                    "usage": _usage(req, o, 0, details=False)}}))
                started = True
            while available - sent >= k or (req.finished and sent < available):
                end = min(sent + k, available)
                if sent < r < end:
                    end = r  # reasoning and text never share an event
                kind = "thinking" if sent < r else "text"
                if block != kind:
                    if block is not None:
                        await emit(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
                        index += 1
                    await emit(_event("content_block_start", {"type": "content_block_start", "index": index,
                                                              "content_block": {"type": kind, kind: ""}}))
                    block = kind
                piece = "".join(req.output_text[sent:end])
                delta = {"type": "thinking_delta", "thinking": piece} if kind == "thinking" else \
                    {"type": "text_delta", "text": piece}
                await emit(_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                          "delta": delta}))
                sent = end
            if req.finished:
                break
        if block is not None:
            await emit(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        await emit(_event("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": STOP_REASONS.get(req.finish_reason or "stop", "end_turn"), "stop_sequence": None},
            "usage": _usage(req, o, len(req.output_ids))}))
        await emit(_event("message_stop", {"type": "message_stop"}))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except StreamDied:
        engine.abort(req)
        await cut_connection(send, receive)
