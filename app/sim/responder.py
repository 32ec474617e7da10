"""Writing one generation's response: SSE events as the engine produces tokens, or one JSON body.

Event rules (vLLM 0.32/0.33): the role event goes out with the first token (or at arrival with
`role_chunk_early`); content events carry `deltas_per_chunk` tokens each (the last one carries
the finish reason); reasoning and content never share an event; the usage event (`choices: []`)
comes when asked for or forced; `data: [DONE]` ends the stream. A `die_midstream` fault aborts
the connection after K events; an engine-side abort (client gone) ends quietly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.sim.asgi import SSE_HEADERS, EventSender, Receive, Send, StreamDied, cut_connection, send_json
from app.sim.engine import SimEngine
from app.sim.options import SimOptions
from app.sim.protocol import ApiError, ParsedRequest
from app.sim.request import SimRequest
from app.sim.request_metrics import per_request_metrics
from app.sim.shapes import DONE, Shaper


def usage_for(req: SimRequest, shaper: Shaper, options: SimOptions, final_response: bool = False) -> dict[str, Any]:
    cached = max(req.num_cached_tokens, 0) if options.enable_prompt_tokens_details else None
    return shaper.usage(req.num_prompt_tokens, len(req.output_ids), cached, req.created_cache_tokens,
                        final_response)


async def body_due(req: SimRequest, send: Send, receive: Receive, die_after: int | None,
                   error_body: Callable[[ApiError], Any] = ApiError.body) -> bool:
    """Wait for a non-streamed request to end. True: the caller sends its body. Otherwise the
    answer is settled here, the same on every route: nothing after an abort, the route's 500
    (`error_body`) after an engine error, a cut connection where a fault was asked for."""
    while not req.finished:
        await req.event.wait()
        req.event.clear()
    if req.finish_reason == "abort":
        return False
    if req.finish_reason == "error":
        await send_json(send, 500, error_body(ApiError(500, req.error or "engine error")))
        return False
    if die_after is not None:
        await cut_connection(send, receive)
        return False
    return True


async def respond(engine: SimEngine, req: SimRequest, shaper: Shaper, send: Send, receive: Receive,
                  die_after: int | None) -> None:
    """Non-streamed: wait for the end, then one JSON body."""
    if not await body_due(req, send, receive, die_after):
        return
    r = engine.options.reasoning_tokens
    reasoning = "".join(req.output_text[:r]) if r and req.output_text else None
    content = "".join(req.output_text[r:])
    metrics = per_request_metrics(req, streamed=False) if engine.options.enable_per_request_metrics and shaper.vllm else None
    await send_json(send, 200, shaper.full_response(content, reasoning, req.finish_reason or "stop",
                                                    usage_for(req, shaper, engine.options, True), metrics))


async def stream(engine: SimEngine, parsed: ParsedRequest, req: SimRequest, shaper: Shaper, send: Send,
                 receive: Receive, die_after: int | None) -> None:
    o = engine.options
    chat = parsed.kind == "chat"
    usage_on = parsed.include_usage or o.include_usage_always
    continuous = parsed.continuous_usage
    k = o.deltas_per_chunk
    r = o.reasoning_tokens
    emit = EventSender(send, die_after)

    def running_usage(upto: int) -> dict[str, Any] | None:
        return shaper.usage(req.num_prompt_tokens, upto, None) if continuous else None

    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    try:
        role_sent = False
        if chat and o.role_chunk_early:
            await emit(shaper.role_event(running_usage(0)))
            role_sent = True
        sent = 0
        while True:
            await req.event.wait()
            req.event.clear()
            if req.finish_reason == "abort":
                return
            if req.finish_reason == "error":
                await emit(shaper.error_event(req.error or "engine error"))
                break
            available = len(req.output_ids)
            finished = req.finished
            if chat and not role_sent and available:
                await emit(shaper.role_event(running_usage(0)))
                role_sent = True
            while available - sent >= k or (finished and sent < available):
                end = min(sent + k, available)
                if sent < r < end:
                    end = r  # reasoning and content never share an event
                # SGLang closes a chat choice with its own empty-delta event (real captures)
                last = finished and end == available and not (chat and not shaper.vllm)
                text = "".join(req.output_text[sent:end])
                await emit(shaper.delta_event(text, reasoning=sent < r,
                                              finish_reason=req.finish_reason if last else None,
                                              usage=running_usage(end)))
                sent = end
            if finished:
                if available == 0 or (chat and not shaper.vllm):
                    await emit(shaper.finish_event(req.finish_reason or "stop"))
                break
        if usage_on:
            metrics = per_request_metrics(req, streamed=True) if o.enable_per_request_metrics and shaper.vllm else None
            await emit(shaper.usage_event(usage_for(req, shaper, o), metrics))
        await emit(DONE)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except StreamDied:
        engine.abort(req)
        await cut_connection(send, receive)
