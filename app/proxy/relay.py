"""Moving one upstream response's bytes to the client (the relay stack is in docs/relay.md).

The relay only moves bytes: a streamed response's reads go through the stream observer
(app/proxy/observer.py), which says what to send (whole events only) and what the stream said;
a mid-stream failure ends the stream with the observer's error event (docs/relay.md: the error
contract). Non-streamed responses are read whole and sent with a content-length; other `/v1/*`
paths are passed through untouched.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from app.engines.request_metrics import client_wants_metrics, take_from_body
from app.proxy.context import ProxyError, RequestContext
from app.proxy.h1 import H1Response
from app.proxy.ledger import ttft_parts
from app.proxy.observer import StreamObserver
from app.proxy.upstream import DROP_RESPONSE, UpstreamError, classify_exception
from app.tasks import drive, finish_driven
from app.telemetry.tracing import add_ttft_parts

if TYPE_CHECKING:
    from app.proxy.migrate import Migrator, RecordingObserver

Send = Any  # ASGI send callable
Response = aiohttp.ClientResponse | H1Response


def response_headers(resp: Response, ctx: RequestContext) -> list[tuple[bytes, bytes]]:
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


async def relay_stream(ctx: RequestContext, resp: Response, first: bytes, send: Send,
                       observer: StreamObserver, migrator: Migrator | None = None) -> None:
    """Relay an SSE response whose first bytes (`first`) already arrived. Never raises for
    upstream failures: a stream that breaks before its end marker is continued on another
    replica when `migrator` can (app/proxy/migrate.py), else ends, for the client, with the
    whole events it sent, then an error event and `[DONE]`."""
    clock = observer.clock
    observer.strip_metrics = not client_wants_metrics(ctx.headers)
    out = observer.feed(first, clock.timings.first_byte or time.perf_counter())
    ctx.result.answered(resp.status)
    await send({"type": "http.response.start", "status": resp.status, "headers": response_headers(resp, ctx)})
    if out:
        await send({"type": "http.response.body", "body": out, "more_body": True})
    send_more = getattr(send, "raw", send)  # chunks with more_body=True need no completion tracking
    try:
        if isinstance(resp, H1Response):
            failure = await _relay_pushed(ctx, resp, send_more, observer)
        else:
            failure = await _relay_rest(ctx, resp.content, send_more, observer)
        if migrator is not None:
            failure = await _carry_on(ctx, observer, failure, migrator, send_more)
    except asyncio.CancelledError:
        # The client went away. If it already had the end marker (clients may close before the
        # final empty write), the response was delivered: keep its accounting, and say so.
        observer.finish()
        if observer.done and observer.error is None:
            ctx.result.delivered_then_left()
            take_results(ctx, observer)
        raise
    observer.finish()
    tail = b""
    if observer.done:
        failure = None  # the end marker reached the client: a transport error after it changes nothing
    elif failure is None:
        failure = UpstreamError("midstream", _backend(ctx), "upstream closed the stream before its end marker")
    if observer.error is not None and ctx.outcome == "ok":
        ctx.result.broke()
    if failure is not None:
        ctx.result.broke(failure)
        tail = observer.end_after_failure(ProxyError(502, str(failure), type="server_error",
                                                     code=f"upstream_{failure.kind}").body()["error"])
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    take_results(ctx, observer)


async def _carry_on(ctx: RequestContext, observer: StreamObserver, failure: UpstreamError | None,
                    migrator: Migrator, send_more: Send) -> UpstreamError | None:
    """A stream that ended without its end marker (and no error event of the upstream's own) is
    continued elsewhere when the migrator can; the failure left to end it with, if any."""
    observer.finish()
    if observer.done or observer.error is not None:
        return failure
    if failure is None:
        failure = UpstreamError("midstream", _backend(ctx), "upstream closed the stream before its end marker")
    recording: RecordingObserver = observer  # type: ignore[assignment]  # forward.py pairs them
    return await migrator.carry_on(failure, recording, send_more)


def take_results(ctx: RequestContext, observer: StreamObserver) -> None:
    """What a finished stream observed, onto the request (also the Endpoint Picker's), with the
    TTFT ledger (app/proxy/ledger.py) on the request and its span."""
    ctx.result.observed(observer.usage, observer.output_text if observer.collect_text else None,
                        observer.response_id)
    ctx.result.ledgered(ttft_parts(ctx.timings, observer.engine_timing))
    ctx.result.engine_timed(observer.engine_timing)
    span = ctx.trace.span if ctx.trace is not None else None
    if span is not None and ctx.result.ttft_parts:
        add_ttft_parts(span, ctx.result.ttft_parts)


def _backend(ctx: RequestContext) -> str:
    return ctx.decision.replica.name if ctx.decision else "?"


async def _relay_rest(ctx: RequestContext, content: aiohttp.StreamReader, send_more: Send,
                      observer: StreamObserver) -> UpstreamError | None:
    """Relay upstream reads until EOF; the upstream failure, if the stream broke."""
    while True:
        try:
            data = await content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _midstream_failure(ctx, exc)
        if not data:
            return None
        out = observer.feed(data, time.perf_counter())
        if out:
            await send_more({"type": "http.response.body", "body": out, "more_body": True})


def _midstream_failure(ctx: RequestContext, exc: BaseException) -> UpstreamError:
    kind = "timeout" if classify_exception(exc) == "timeout" else "midstream"
    return UpstreamError(kind, _backend(ctx), f"upstream failed mid-stream ({type(exc).__name__})")


class _Pushed:
    """What the read callback left for the relay's task: a client write that has to wait
    (backpressure), an exception of the relay's own, the end of the body."""

    __slots__ = ("wake", "pending", "backlog", "error", "ended", "failure")

    def __init__(self) -> None:
        self.wake: asyncio.Future[None] | None = None
        self.pending: Any = None
        self.backlog: list[bytes] = []
        self.error: BaseException | None = None
        self.ended = False
        self.failure: BaseException | None = None

    def notify(self) -> None:
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)


async def _relay_pushed(ctx: RequestContext, resp: H1Response, send_more: Send,
                        observer: StreamObserver) -> UpstreamError | None:
    """`_relay_rest` for the small client (app/proxy/h1.py): each upstream read is observed and
    written to the client from the read callback, with no task wakeup per read. A client write
    that has to wait (the client reads slower than the replica writes) pauses the replica and is
    finished here, in the request's task, before reading resumes."""
    state = _Pushed()

    def sink(data: bytes) -> None:
        if state.pending is not None or state.error is not None:
            state.backlog.append(data)  # arrived while the client was catching up: sent after
            return
        try:
            out = observer.feed(data, time.perf_counter())
            if out:
                state.pending = drive(send_more, {"type": "http.response.body", "body": out, "more_body": True})
        except Exception as exc:  # noqa: BLE001 - raised in the request's task below
            state.error = exc
        if state.pending is not None or state.error is not None:
            resp.pause()
            state.notify()

    def end(exc: BaseException | None) -> None:
        state.ended = True
        state.failure = exc
        state.notify()

    resp.pump(sink, end)
    loop = asyncio.get_running_loop()
    while True:
        if state.pending is not None:
            pending, state.pending = state.pending, None
            await finish_driven(pending)
            while state.backlog and state.pending is None and state.error is None:
                sink(state.backlog.pop(0))
            if state.pending is None and state.error is None:
                resp.resume()
            continue
        if state.error is not None:
            raise state.error
        if state.ended:
            return None if state.failure is None else _midstream_failure(ctx, state.failure)
        state.wake = loop.create_future()
        await state.wake
        state.wake = None


async def relay_buffered(ctx: RequestContext, resp: Response, first: bytes, send: Send,
                         parse: bool) -> None:
    """Relay a non-streamed response (JSON) whose first body bytes (`first`) already arrived:
    read the rest, then send it whole. `parse`: read usage and output text from it."""
    try:
        rest = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamError(classify_exception(exc), _backend(ctx),
                            f"upstream failed while sending the response ({type(exc).__name__})") from exc
    body = first + rest if first else rest
    if parse and resp.status == 200:
        observe_buffered(ctx, body)
        if ctx.dialect.engine_metrics:  # vLLM's per-request metrics: read, and removed unless asked for
            body, timing = take_from_body(body, strip=not client_wants_metrics(ctx.headers))
            ctx.result.engine_timed(timing)
    ctx.result.answered(resp.status)
    headers = response_headers(resp, ctx) + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def observe_buffered(ctx: RequestContext, body: bytes) -> None:
    """Usage, output text (and a Responses id) of a whole 200 JSON answer, read by the request's
    dialect (also the Endpoint Picker's, app/epp/exchange.py)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if not isinstance(payload, dict):
        return
    answer = ctx.dialect.whole_answer(payload)
    ctx.result.observed(answer.usage, answer.text, answer.response_id)


async def relay_raw(ctx: RequestContext, resp: Response, first: bytes, send: Send) -> None:
    """Pass-through relay for other /v1/* paths: bytes as they come, nothing parsed."""
    ctx.result.answered(resp.status)
    await send({"type": "http.response.start", "status": resp.status, "headers": response_headers(resp, ctx)})
    if first:
        await send({"type": "http.response.body", "body": first, "more_body": True})
    while True:
        try:
            data = await resp.content.readany()
        except (aiohttp.ClientError, TimeoutError):
            ctx.result.broke()
            break
        if not data:
            break
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
