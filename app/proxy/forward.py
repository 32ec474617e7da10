"""The attempt loop: route, send, retry on another replica while nothing reached the client
(docs/relay.md: attempts, the error contract).

A failure before the first upstream body byte (connect refused, timeout, 5xx, a stream closed
before its first byte) is retried on a replica not yet tried, up to `routing.max_retries` extra
attempts; after that the caller turns the last `UpstreamError` into a 502 (or `NoReplicaAvailable`
into a 503). Once the first body byte arrived the response is committed: later failures become an
SSE error event (relay.py) or a 502, never a retry. Each attempt stamps its send on the clock and a
failed one says so, so the proxy overhead never includes a failed attempt's wait.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

import orjson

from app.proxy.anthropic_shape import AnthropicShape
from app.proxy.clock import StreamClock
from app.proxy.context import RequestContext
from app.proxy.migrate import Migrator, RecordingObserver
from app.proxy.observer import StreamObserver
from app.proxy.openai_shape import shape_for
from app.proxy.record import child
from app.proxy.relay import Response, relay_buffered, relay_raw, relay_stream
from app.proxy.responses_shape import ResponsesShape
from app.proxy.shape import StreamShape
from app.proxy.upstream import UpstreamError, upstream_headers
from app.routing.base import NoReplicaAvailable, Replica, RouteRequest

if TYPE_CHECKING:
    from app.services import Services

Mode = Literal["stream", "buffered", "raw"]
_ERROR_SNIPPET = 200


def stream_shape(route: str) -> StreamShape:
    """The stream shape of a route's SSE answer, one per stream (also the Endpoint Picker's,
    app/epp/exchange.py)."""
    if route == "responses":
        return ResponsesShape()
    if route == "messages":
        return AnthropicShape()
    return shape_for(route)


async def _status_error(replica: Replica, resp: Response) -> UpstreamError:
    """A 5xx answer as an UpstreamError carrying the upstream's own error message (bounded)."""
    message = ""
    try:
        body = await resp.read()
        payload = orjson.loads(body)
        err = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message", ""))[:_ERROR_SNIPPET]
        elif isinstance(payload, dict) and "detail" in payload:
            message = str(payload["detail"])[:_ERROR_SNIPPET]
    except Exception:  # the message is a courtesy; the status is the fact
        message = ""
    detail = f": {message}" if message else ""
    return UpstreamError("status_5xx", replica.name, f"{replica.name} returned HTTP {resp.status}{detail}",
                         status=resp.status)


async def forward(services: Services, ctx: RequestContext, send: Any, body: bytes, request: RouteRequest,
                  clock: StreamClock, *, method: str, path: str, mode: Mode,
                  drop_usage: bool = False) -> None:
    """Forward `body` and relay the answer. Raises (nothing sent yet) NoReplicaAvailable when no
    replica could be tried, or the last UpstreamError when every attempt failed."""
    metrics = services.metrics
    headers = upstream_headers(ctx.headers, ctx.request_id, services.settings.upstream.api_key)
    tried: set[str] = set()
    last_error: UpstreamError | None = None
    for _ in range(1 + max(0, services.settings.routing.max_retries)):
        try:
            decision = await services.router.choose(request, frozenset(tried))
        except NoReplicaAvailable:
            if last_error is not None:
                raise last_error from None
            raise
        replica = decision.replica
        tried.add(replica.name)
        ctx.decision = decision
        ctx.attempts += 1
        child(metrics.route_decisions, replica.name, decision.reason).inc()
        replica.inflight += 1
        child(metrics.backend_inflight, replica.name).set(replica.inflight)
        queued = decision.prefill_tokens  # prefill backlog the cost-based routers read (until first byte)
        replica.queued_prompt_tokens += queued
        long_queued = queued if decision.lane == "long" else 0
        replica.queued_long_tokens += long_queued
        ctx.mark_placed()
        resp: Response | None = None
        committed = ok = False
        try:
            clock.upstream_sent(time.perf_counter())
            resp = await services.upstream.open(replica, method, path, body, headers)
            if resp.status >= 500:
                raise await _status_error(replica, resp)
            first = b""
            if resp.status < 400:  # 2xx/3xx: the first body byte, still retryable (bounded wait)
                first = await services.upstream.first_chunk(replica, resp)
                clock.first_byte(time.perf_counter())  # before routing callbacks run
            replica.queued_prompt_tokens -= queued
            replica.queued_long_tokens -= long_queued
            queued = long_queued = 0
            if services.admission is not None:
                services.admission.kick()  # its prefill is done: a queued request may take its place
            committed = True
            services.health.mark_success(replica)
            if resp.status < 400:
                services.router.on_routed(request, decision)
            if mode == "stream" and resp.status == 200:
                migrator = Migrator.of(services, ctx, request, body, headers, method, path, tried)
                observer = (RecordingObserver if migrator else StreamObserver)(
                    stream_shape(ctx.route), clock, drop_usage, collect_text=int(ctx.body.get("n") or 1) == 1)
                await relay_stream(ctx, resp, first, send, observer, migrator)
            elif mode == "raw":
                await relay_raw(ctx, resp, first, send)
            else:
                await relay_buffered(ctx, resp, first, send, parse=True)
            failure = ctx.upstream_failure
            if failure is not None:
                metrics.upstream_errors.labels(failure.backend, failure.kind).inc()
            if resp.status >= 400 and ctx.outcome == "ok":
                ctx.outcome = "client_error"
            ok = ctx.outcome == "ok"
            return
        except UpstreamError as exc:
            metrics.upstream_errors.labels(replica.name, exc.kind).inc()
            services.health.mark_failure(replica, exc.kind)
            if committed:
                ctx.outcome = "upstream_error"
                raise
            clock.attempt_failed(time.perf_counter())
            last_error = exc
        finally:
            if resp is not None:
                if ok:
                    resp.release()
                else:
                    resp.close()
            replica.inflight -= 1
            replica.queued_prompt_tokens -= queued
            replica.queued_long_tokens -= long_queued
            child(metrics.backend_inflight, replica.name).set(replica.inflight)
            if services.admission is not None:
                services.admission.kick()
            if committed:
                services.router.on_finished(request, decision, ok)
    assert last_error is not None
    raise last_error
