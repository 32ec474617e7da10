"""Relaying one upstream response to the client, observing it on the side.

`StreamObserver` watches SSE bytes for the clock (first content chunk, gaps), usage, the
`[DONE]` sentinel, mid-stream error events and the generated text of choice 0. Bytes reach the
client unchanged and as soon as they arrive, except when the proxy itself added
`stream_options.include_usage`: then only whole events are forwarded and the usage-only event is
dropped, so the client sees exactly what it asked for.

Until the first content token every event is parsed (TTFT must stop exactly there). After it,
for compact `\n`-framed streams (vLLM, SGLang), nothing is parsed per event: reads are scanned as
bytes (app/proxy/scan.py) and decoded in batches by `StreamSummary` (measured: a 34-read vLLM-shaped
stream costs the observer ~48 µs instead of ~71 µs; per read after the first token ~1.5 µs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from app.api.errors import sse_error_event
from app.proxy.clock import StreamClock
from app.proxy.context import ProxyError, RequestContext
from app.proxy.scan import USAGE_ONLY, StreamSummary, carries_generated, drop_usage_events, is_role_only
from app.proxy.sse import SSEParser, classify
from app.proxy.upstream import DROP_RESPONSE, UpstreamError, classify_exception

MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # cap on ctx.attrs["output_text"]

Send = Any  # ASGI send callable


class StreamObserver:
    """Observer of one SSE response (chat or completions): parses events until the first
    content token, then scans bytes (see the module docstring)."""

    __slots__ = ("route", "clock", "drop_usage", "summary", "parser", "fast", "saw_cr", "held", "framer")

    def __init__(self, route: str, clock: StreamClock, drop_usage: bool, collect_text: bool) -> None:
        self.route = route
        self.clock = clock
        self.drop_usage = drop_usage
        self.summary = StreamSummary(route, collect_text, MAX_OUTPUT_CHARS)
        self.parser = SSEParser(emit_all=drop_usage)
        self.fast = False  # past the first content token of a compact, \n-framed stream
        self.saw_cr = False
        self.held = b""  # fast + drop_usage: the incomplete last event, forwarded once complete
        self.framer: SSEParser | None = None  # fast + drop_usage after a "\r" showed up: full framing

    def feed(self, data: bytes, now: float) -> bytes:
        """Observe one read; returns the bytes to forward to the client."""
        if self.fast:
            if carries_generated(data, self.route):
                self.clock.content(now)
            self.summary.add_bytes(data)
            return self._filter(data) if self.drop_usage else data
        return self._feed_parsed(data, now)

    def _feed_parsed(self, data: bytes, now: float) -> bytes:
        if not self.saw_cr and b"\r" in data:
            self.saw_cr = True
        kept: list[bytes] | None = [] if self.drop_usage else None
        go_fast = False
        chat = self.route == "chat"
        for ev in self.parser.feed(data):
            if ev.data is None or (chat and is_role_only(ev.data)):
                if kept is not None:
                    kept.append(ev.raw)
                continue
            chunk = classify(ev.data, self.route)
            if chunk.generated:
                if self.clock.timings.first_token is None:
                    go_fast = not self.saw_cr and carries_generated(ev.data, self.route)
                self.clock.content(now, len(chunk.text))
            self.summary.take(chunk)
            if kept is not None and not chunk.usage_only:
                kept.append(ev.raw)
        if go_fast:
            self._go_fast()
        if kept is None:
            return data
        return b"".join(kept)

    def _go_fast(self) -> None:
        self.fast = True
        pending = self.parser.pending()
        if pending:
            self.summary.add_bytes(pending)
            if self.drop_usage:
                self.held = pending  # not forwarded yet: the event is incomplete

    def _filter(self, data: bytes) -> bytes:
        """Fast-path forwarding when the usage chunk must be dropped: whole events only."""
        if not self.held and self.framer is None and data.endswith(b"\n\n") and b"\r" not in data:
            return drop_usage_events(data, self.route) if USAGE_ONLY in data else data  # the usual read
        if self.framer is None and b"\r" not in data:
            buf = self.held + data if self.held else data
            end = buf.rfind(b"\n\n") + 2
            if end < 2:
                self.held = buf
                return b""
            self.held = buf[end:]
            out = buf[:end] if end < len(buf) else buf
            return drop_usage_events(out, self.route) if USAGE_ONLY in out else out
        if self.framer is None:  # a "\r" line end: let the full parser find the event boundaries
            self.framer = SSEParser(emit_all=True)
            data, self.held = self.held + data, b""
        kept = [ev.raw for ev in self.framer.feed(data)
                if ev.data is None or USAGE_ONLY not in ev.raw or not classify(ev.data, self.route).usage_only]
        return b"".join(kept)

    def flush(self) -> bytes:
        """Undispatched bytes at the end of the stream (filtering mode only)."""
        if not self.drop_usage:
            return b""
        if not self.fast:
            return self.parser.pending()
        return self.held + (self.framer.pending() if self.framer is not None else b"")

    def finish(self) -> None:
        """The stream ended: decode what the fast path retained."""
        self.summary.finish()

    @property
    def done(self) -> bool:
        return self.summary.done

    @property
    def error(self) -> dict[str, Any] | None:
        return self.summary.error

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.summary.usage

    @property
    def collect_text(self) -> bool:
        return self.summary.collect_text

    @property
    def output_text(self) -> str:
        return self.summary.text


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
    content = resp.content
    send_more = getattr(send, "raw", send)  # chunks with more_body=True need no completion tracking
    try:
        failure = await _relay_rest(ctx, content, send_more, observer)
    except asyncio.CancelledError:
        # The client went away. If it already had `[DONE]` (clients may close before the final
        # empty write), the response was delivered: keep its accounting, and say so to the caller.
        observer.flush()
        observer.finish()
        if observer.done and observer.error is None:
            ctx.attrs["delivered_before_disconnect"] = True
            ctx.usage = observer.usage
            if observer.collect_text:
                ctx.attrs["output_text"] = observer.output_text
        raise
    tail = observer.flush()
    observer.finish()
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


async def _relay_rest(ctx: RequestContext, content: aiohttp.StreamReader, send_more: Send,
                      observer: StreamObserver) -> UpstreamError | None:
    """Relay upstream reads until EOF; the upstream failure, if the stream broke."""
    while True:
        try:
            data = await content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            kind = classify_exception(exc)
            kind = "timeout" if kind == "timeout" else "midstream"
            return UpstreamError(kind, ctx.decision.replica.name if ctx.decision else "?",
                                 f"upstream failed mid-stream ({type(exc).__name__})")
        if not data:
            return None
        out = observer.feed(data, time.perf_counter())
        if out:
            await send_more({"type": "http.response.body", "body": out, "more_body": True})


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
