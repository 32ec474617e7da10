"""The `/v1/*` hot path's ASGI adapter (dispatched before FastAPI, see app/server.py).

It does only what needs the ASGI protocol: read the body (size limit), parse and validate it
(the path's dialect, app/dialects/), resolve the tenant, build the `RequestContext`, hand it to the pipeline
(app/pipeline/request.py: the table of steps), and map every failure to an OpenAI-shaped error. A
client disconnect cancels the pipeline (and with it the upstream request) through a watcher on
`receive`.

Raw ASGI rather than a FastAPI route because the streaming relay's per-chunk cost is the proxy's
throughput (docs/pipeline.md: FastAPI+httpx collapses from ~64 concurrent streams; raw ASGI +
aiohttp keeps 0.89x of direct throughput at 128).

Passthrough bodies (any other /v1/* path) are never parsed: they are relayed as bytes, so their
tenant comes from the tenant header or the API key only (app/api/tenant.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from app.api.errors import send_error, to_proxy_error
from app.api.tenant import resolve_tenant
from app.dialects import Dialect, dialect_of
from app.proxy.clock import StreamClock
from app.proxy.context import Arrival, ProxyError, RequestContext, Timings
from app.routing.session_keys import find_session_key

if TYPE_CHECKING:
    from app.config import Settings
    from app.pipeline.request import RequestPipeline
    from app.services import Services


_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
DRAIN_BYTES = 64 * 1024 * 1024  # an over-limit body read and dropped before its 413, at most
DRAIN_S = 2.0
UNAUTHENTICATED = "unauthenticated"  # tenant label of requests rejected for a missing/invalid key


def request_id_from(headers: dict[str, str]) -> str:
    """The client's x-request-id when it is sane, else a fresh one."""
    given = headers.get("x-request-id")
    if given and _REQUEST_ID.match(given):
        return given
    return uuid.uuid4().hex


async def read_body(scope: dict[str, Any], receive: Any, headers: dict[str, str], limit: int) -> bytes:
    """The whole request body; ProxyError(413) as soon as it exceeds `limit` bytes."""
    declared = headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise await _too_large(receive, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                more = message.get("more_body", False)
                raise await _too_large(receive if more else None, f"request body exceeds the limit of {limit} bytes")
            parts.append(chunk)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _too_large(receive: Any, message: str) -> ProxyError:
    """The 413, once the rest of the body is read and dropped (at most DRAIN_BYTES, DRAIN_S): a
    connection closed while its body is still arriving is reset by the kernel, and the client
    then loses the response (it sees ECONNRESET or a broken pipe instead of this error)."""
    if receive is not None:
        dropped = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_S):
                while dropped <= DRAIN_BYTES:
                    event = await receive()
                    dropped += len(event.get("body", b""))
                    if event["type"] == "http.disconnect" or not event.get("more_body", False):
                        break
    return ProxyError(413, message, code="request_too_large")


def new_context(settings: Settings, request_id: str, dialect: Dialect, path: str, headers: dict[str, str],
                body: dict[str, Any], clock: StreamClock, model: str | None = None) -> RequestContext:
    """Step 0's context for a parsed request (also the Endpoint Picker's, app/epp/exchange.py);
    raises ProxyError(401) when keys are configured and none is valid. `model`: a passthrough
    path's model, for the paths routed by it (`Dialect.routed_by_model`)."""
    arrival = Arrival(
        request_id=request_id, dialect=dialect, path=path,
        tenant=resolve_tenant(headers, body, settings.tenants), headers=headers, body=body,
        model=body.get("model") if dialect.parses else model, stream=bool(body.get("stream")),
        session_id=find_session_key(settings.routing.session_keys, settings.routing.session_header, headers, body,
                                    dialect.body_session_keys),
    )
    return RequestContext(arrival, clock.timings)


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


class _TrackedSend:
    """Wraps ASGI `send` to know when the response is complete: uvicorn's `receive` also returns
    `http.disconnect` after a complete response, which must not count as the client leaving.
    `raw` is the unwrapped send, for body chunks that cannot complete the response (the relay's
    per-chunk path saves a coroutine per chunk with it)."""

    __slots__ = ("send", "raw", "complete")

    def __init__(self, send: Any) -> None:
        self.send = send
        self.raw = getattr(send, "raw", send)  # an outer wrapper's own fast path (app/server.py)
        self.complete = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.send(message)


class OpenAIProxy:
    """ASGI app for every `/v1/*` path except `/v1/models` (control plane)."""

    def __init__(self, services: Services, pipeline: RequestPipeline) -> None:
        self.services = services
        self.pipeline = pipeline
        self.active = 0  # requests not yet finished (hooks and metrics included); tests settle on 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        arrival = time.perf_counter()
        self.active += 1
        try:
            await self._handle(scope, receive, send, arrival)
        finally:
            self.active -= 1

    async def _handle(self, scope: dict[str, Any], receive: Any, send: Any, arrival: float) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        dialect = dialect_of(path)
        request_id = request_id_from(headers)
        settings = self.services.settings
        clock = StreamClock(Timings(arrival=arrival))
        ctx: RequestContext | None = None
        disconnected = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        send = _TrackedSend(send)
        try:
            raw = await read_body(scope, receive, headers, settings.limits.max_body_bytes)
            if dialect.parses and scope["method"] != "POST":
                raise ProxyError(405, f"{path} only accepts POST", code="method_not_allowed")
            body = dialect.parse(raw) if dialect.parses else {}  # passthrough: bytes only
            ctx = new_context(settings, request_id, dialect, path, headers, body, clock, dialect.model_of(raw))
            watcher = asyncio.create_task(
                _watch_disconnect(receive, asyncio.current_task(), disconnected, send))
            if dialect.parses:
                await self.pipeline.run(ctx, raw, send, clock)
            else:
                query = scope.get("query_string") or b""
                target = path + ("?" + query.decode("latin-1") if query else "")
                await self.pipeline.passthrough(ctx, raw, send, clock, method=scope["method"], path=target)
        except ClientGone:
            if ctx is not None:
                ctx.result.client_left()
            self.services.metrics.requests.labels(dialect.name, "499").inc()
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if ctx is not None and not ctx.delivered_before_disconnect:
                ctx.result.client_left()
        except Exception as exc:  # every failure becomes an OpenAI-shaped error response
            err = to_proxy_error(exc)
            if err.status == 401:
                self.services.metrics.rejections.labels(dialect.name, UNAUTHENTICATED, err.code or "auth").inc()
            if ctx is not None:
                ctx.result.refused(err.status)
            id_header = [(b"x-request-id", request_id.encode("latin-1"))]
            with contextlib.suppress(Exception):
                await send_error(send, err, id_header, dialect)
            if ctx is None:
                self.services.metrics.requests.labels(dialect.name, str(err.status)).inc()
        finally:
            if watcher is not None:
                watcher.cancel()
            clock.end(time.perf_counter())
            if ctx is not None:
                self.pipeline.finish(ctx, clock)  # steps 8-9


async def _watch_disconnect(receive: Any, task: asyncio.Task[Any] | None, flag: asyncio.Event,
                            send: _TrackedSend) -> None:
    """Cancel the request's task when the client goes away (uvicorn's `send` silently drops
    writes to a closed connection, so without this a stalled upstream would never be cancelled)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if send.complete:
                return
            flag.set()
            if task is not None and not task.done():
                task.cancel()
            return
