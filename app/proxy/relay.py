"""Relaying one upstream response to the client, observing it on the side.

`StreamObserver` watches SSE bytes for the clock (first content chunk, gaps), usage, the
`[DONE]` sentinel, mid-stream error events and the generated text of choice 0. Bytes reach the
client unchanged and as soon as they arrive, except when the proxy itself added
`stream_options.include_usage`: then whole events are forwarded and the usage-only event is
dropped, so the client sees exactly what it asked for.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from app.api.errors import sse_error_event
from app.proxy.clock import StreamClock
from app.proxy.context import ProxyError, RequestContext
from app.proxy.sse import SSEParser, classify
from app.proxy.upstream import DROP_RESPONSE, UpstreamError, classify_exception

MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # cap on ctx.attrs["output_text"]

Send = Any  # ASGI send callable


class StreamObserver:
    """Per-event observer of one SSE response (chat or completions)."""

    __slots__ = ("route", "clock", "drop_usage", "collect_text", "parser", "done", "error", "usage",
                 "text_parts", "text_len")

    def __init__(self, route: str, clock: StreamClock, drop_usage: bool, collect_text: bool) -> None:
        self.route = route
        self.clock = clock
        self.drop_usage = drop_usage
        self.collect_text = collect_text
        self.parser = SSEParser(emit_all=drop_usage)
        self.done = False
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.text_parts: list[str] = []
        self.text_len = 0

    def feed(self, data: bytes, now: float) -> bytes:
        """Observe one read; returns the bytes to forward to the client."""
        events = self.parser.feed(data)
        kept: list[bytes] | None = [] if self.drop_usage else None
        for ev in events:
            if ev.data is None:
                if kept is not None:
                    kept.append(ev.raw)
                continue
            chunk = classify(ev.data, self.route)
            if chunk.done:
                self.done = True
            elif chunk.error is not None:
                self.error = chunk.error
            if chunk.usage is not None:
                self.usage = chunk.usage
            if chunk.generated:
                self.clock.content(now, len(chunk.text))
            if chunk.text and self.collect_text and self.text_len < MAX_OUTPUT_CHARS:
                self.text_parts.append(chunk.text)
                self.text_len += len(chunk.text)
            if kept is not None and not (chunk.usage_only and self.drop_usage):
                kept.append(ev.raw)
        if kept is None:
            return data
        return b"".join(kept)

    def flush(self) -> bytes:
        """Undispatched bytes at the end of the stream (filtering mode only)."""
        return self.parser.pending() if self.drop_usage else b""

    @property
    def output_text(self) -> str:
        return "".join(self.text_parts)[:MAX_OUTPUT_CHARS]


def response_headers(resp: aiohttp.ClientResponse, ctx: RequestContext) -> list[tuple[bytes, bytes]]:
    """The upstream's headers (minus framing) plus the proxy's own."""
    out: list[tuple[bytes, bytes]] = []
    for key, value in resp.raw_headers:
        name = key.lower()
        if name.decode("latin-1") in DROP_RESPONSE or name.startswith(b"x-prefixgate-") or name == b"x-request-id":
            continue
        out.append((name, value))
    return out + proxy_headers(ctx)


def proxy_headers(ctx: RequestContext) -> list[tuple[bytes, bytes]]:
    out = [(b"x-request-id", ctx.request_id.encode("latin-1"))]
    if ctx.decision is not None:
        out.append((b"x-prefixgate-backend", ctx.decision.replica.name.encode("latin-1")))
        if ctx.fingerprint is not None:
            total = len(ctx.fingerprint.block_hashes)
            out.append((b"x-prefixgate-prefix", f"{ctx.decision.matched_blocks}/{total}".encode()))
    for key, value in ctx.response_headers.items():
        out.append((key.lower().encode("latin-1"), str(value).encode("latin-1", "replace")))
    return out


async def relay_stream(ctx: RequestContext, resp: aiohttp.ClientResponse, first: bytes, send: Send,
                       observer: StreamObserver) -> None:
    """Relay an SSE response whose first bytes (`first`) already arrived. Never raises for
    upstream failures: mid-stream death becomes an error event plus `[DONE]` for the client."""
    clock = observer.clock
    clock.first_byte(time.perf_counter())  # no-op when the caller stamped it on arrival
    out = observer.feed(first, clock.timings.first_byte or time.perf_counter())
    ctx.status = resp.status
    await send({"type": "http.response.start", "status": resp.status, "headers": response_headers(resp, ctx)})
    if out:
        await send({"type": "http.response.body", "body": out, "more_body": True})
    failure: UpstreamError | None = None
    content = resp.content
    while True:
        try:
            data = await content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            kind = classify_exception(exc)
            kind = "timeout" if kind == "timeout" else "midstream"
            failure = UpstreamError(kind, ctx.decision.replica.name if ctx.decision else "?",
                                    f"upstream failed mid-stream ({type(exc).__name__})")
            break
        if not data:
            break
        now = time.perf_counter()
        out = observer.feed(data, now)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
    tail = observer.flush()
    if failure is None and not observer.done:
        failure = UpstreamError("midstream", ctx.decision.replica.name if ctx.decision else "?",
                                "upstream closed the stream without [DONE]")
    if observer.error is not None and ctx.outcome == "ok":
        ctx.outcome = "midstream_error"
    if failure is not None:
        ctx.outcome = "midstream_error"
        ctx.attrs["upstream_failure"] = failure
        tail += sse_error_event(ProxyError(502, str(failure), type="server_error",
                                           code=f"upstream_{failure.kind}"))
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    ctx.usage = observer.usage
    if observer.collect_text:
        ctx.attrs["output_text"] = observer.output_text


def output_text_of(payload: dict[str, Any], route: str) -> str | None:
    choices = payload.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if route == "chat":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    return text[:MAX_OUTPUT_CHARS] if isinstance(text, str) else None


async def relay_buffered(ctx: RequestContext, resp: aiohttp.ClientResponse, send: Send,
                         clock: StreamClock, parse: bool) -> None:
    """Relay a non-streamed response (JSON). `parse`: read usage and output text from it."""
    try:
        body = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamError(classify_exception(exc), ctx.decision.replica.name if ctx.decision else "?",
                            f"upstream failed while sending the response ({type(exc).__name__})") from exc
    now = time.perf_counter()
    clock.first_byte(now)
    if parse and resp.status == 200:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        if isinstance(payload, dict):
            usage = payload.get("usage")
            ctx.usage = usage if isinstance(usage, dict) else None
            text = output_text_of(payload, ctx.route)
            if text is not None:
                ctx.attrs["output_text"] = text
    ctx.status = resp.status
    headers = response_headers(resp, ctx) + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def relay_raw(ctx: RequestContext, resp: aiohttp.ClientResponse, first: bytes, send: Send,
                    clock: StreamClock) -> None:
    """Pass-through relay for other /v1/* paths: bytes as they come, nothing parsed."""
    clock.first_byte(time.perf_counter())
    ctx.status = resp.status
    await send({"type": "http.response.start", "status": resp.status, "headers": response_headers(resp, ctx)})
    if first:
        await send({"type": "http.response.body", "body": first, "more_body": True})
    while True:
        try:
            data = await resp.content.readany()
        except (aiohttp.ClientError, TimeoutError):
            ctx.outcome = "midstream_error"
            break
        if not data:
            break
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
