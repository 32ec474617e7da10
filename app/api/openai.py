"""The `/v1/*` hot path as a raw ASGI handler (dispatched before FastAPI, see app/server.py).

Raw ASGI rather than a FastAPI route because the streaming relay's per-chunk cost is the proxy's
throughput (ARCHITECTURE.md: FastAPI+httpx collapses from ~64 streams; raw ASGI + aiohttp keeps
0.89x of direct at 128). Order per request: read body (size limit) -> parse/validate -> tenant ->
RequestContext -> hooks.before_route -> model check -> forward (route, retry, relay) ->
hooks.after_response -> metrics. A client disconnect cancels the forward (and with it the upstream
request) through a watcher on `receive`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from app.api.errors import send_error, to_proxy_error
from app.api.tenant import resolve_tenant
from app.api.validation import client_wants_usage, parse_body, with_include_usage
from app.proxy.clock import StreamClock
from app.proxy.context import ProxyError, RequestContext, Timings
from app.proxy.forward import Mode, forward
from app.proxy.record import record_request
from app.routing.base import RouteRequest

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("prefixgate.api")

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
BYTES_PER_TOKEN_ESTIMATE = 4
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
    if declared and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                         code="request_too_large")
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
                raise ProxyError(413, f"request body exceeds the limit of {limit} bytes",
                                 code="request_too_large")
            parts.append(chunk)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


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

    def __init__(self, services: Services) -> None:
        self.services = services
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
        route = ROUTES.get(path)
        request_id = request_id_from(headers)
        settings = self.services.settings
        clock = StreamClock(Timings(arrival=arrival))
        ctx: RequestContext | None = None
        disconnected = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        send = _TrackedSend(send)
        try:
            raw = await read_body(scope, receive, headers, settings.limits.max_body_bytes)
            if route is not None and scope["method"] != "POST":
                raise ProxyError(405, f"{path} only accepts POST", code="method_not_allowed")
            body = parse_body(raw, route) if route is not None else _maybe_json(raw)
            tenant = resolve_tenant(headers, body, settings.tenants)
            ctx = RequestContext(
                request_id=request_id, route=route or "passthrough", path=path, tenant=tenant,
                headers=headers, body=body if isinstance(body, dict) else {},
                model=body.get("model") if isinstance(body, dict) and route else None,
                stream=bool(body.get("stream")) if route and isinstance(body, dict) else False,
                timings=clock.timings, session_id=headers.get(settings.routing.session_header.lower()),
            )
            watcher = asyncio.create_task(
                _watch_disconnect(receive, asyncio.current_task(), disconnected, send))
            if route is not None:
                await self._chat_or_completions(ctx, raw, send, clock)
            else:
                await self._passthrough(ctx, scope, raw, send, clock)
        except ClientGone:
            if ctx is not None:
                ctx.outcome = "client_disconnect"
            self.services.metrics.requests.labels(route or "passthrough", "499").inc()
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if ctx is not None and not ctx.attrs.get("delivered_before_disconnect"):
                ctx.outcome = "client_disconnect"
                ctx.status = ctx.status or 499
        except Exception as exc:  # every failure becomes an OpenAI-shaped error response
            err = to_proxy_error(exc)
            if err.status == 401:
                self.services.metrics.rejections.labels(UNAUTHENTICATED, err.code or "auth").inc()
            if ctx is not None:
                ctx.status = err.status
                ctx.outcome = "client_error" if err.status < 500 else "upstream_error"
            id_header = [(b"x-request-id", request_id.encode("latin-1"))]
            with contextlib.suppress(Exception):
                await send_error(send, err, id_header)
            if ctx is None:
                self.services.metrics.requests.labels(route or "passthrough", str(err.status)).inc()
        finally:
            if watcher is not None:
                watcher.cancel()
            clock.end(time.perf_counter())
            if ctx is not None:
                self._finish(ctx, clock)

    async def _chat_or_completions(self, ctx: RequestContext, raw: bytes, send: Any, clock: StreamClock) -> None:
        services = self.services
        known = services.health.known_models()
        if known is not None and ctx.model not in known:
            raise ProxyError(404, f"The model `{ctx.model}` does not exist.", type="NotFoundError",
                             param="model", code="model_not_found")
        for hook in services.hooks:
            await hook.before_route(ctx)
        drop_usage = ctx.stream and not client_wants_usage(ctx.body)
        if ctx.body_changed:
            body = ctx.body
            if drop_usage:
                body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
            raw = orjson.dumps(body)
        elif drop_usage:
            raw = with_include_usage(raw, ctx.body)
        fp = ctx.fingerprint
        estimate = fp.estimated_tokens if fp is not None and fp.estimated_tokens else len(raw) // BYTES_PER_TOKEN_ESTIMATE
        request = RouteRequest(ctx.tenant, ctx.model, ctx.session_id, fp, estimate)
        mode: Mode = "stream" if ctx.stream else "buffered"
        await forward(services, ctx, send, raw, request, clock, method="POST", path=ctx.path, mode=mode,
                      drop_usage=drop_usage)

    async def _passthrough(self, ctx: RequestContext, scope: dict[str, Any], raw: bytes, send: Any,
                           clock: StreamClock) -> None:
        query = scope.get("query_string") or b""
        path = ctx.path + ("?" + query.decode("latin-1") if query else "")
        request = RouteRequest(ctx.tenant, None, ctx.session_id, None, len(raw) // BYTES_PER_TOKEN_ESTIMATE)
        await forward(self.services, ctx, send, raw, request, clock, method=scope["method"], path=path,
                      mode="raw")

    def _finish(self, ctx: RequestContext, clock: StreamClock) -> None:
        for hook in self.services.hooks:
            try:
                hook.after_response(ctx)
            except Exception:  # a broken observer must not break the proxy
                log.exception("after_response hook %s failed", type(hook).__name__)
        try:
            record_request(self.services.metrics, ctx, clock)
        except Exception:
            log.exception("recording metrics failed")


def _maybe_json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


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
