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

import logging
import time
from typing import TYPE_CHECKING, Any, Literal

import orjson

from app.proxy.clock import StreamClock
from app.proxy.context import RequestContext
from app.proxy.migrate import Migrator, RecordingObserver
from app.proxy.observer import StreamObserver
from app.proxy.openai_shape import client_wants_chunk_usage
from app.proxy.relay import Response, relay_buffered, relay_raw, relay_stream
from app.proxy.upstream import UpstreamError, let_go, upstream_headers
from app.routing.base import NoReplicaAvailable, Replica, RouteRequest

if TYPE_CHECKING:
    from app.config import MigrateMidstream
    from app.proxy.upstream import Upstream
    from app.routing.base import Router
    from app.routing.health import HealthChecker
    from app.routing.load import ReplicaLoad
    from app.telemetry.metrics import Metrics

Mode = Literal["stream", "buffered", "raw"]
_ERROR_SNIPPET = 200
# every attempt's routing decision in one line (`--log-level debug`): replica names and token
# counts, never prompt text
route_log = logging.getLogger("prefixgate.route")


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


class Forwarder:
    """Steps 5-7 for one request: route, send, relay, retry. Built once with what it uses."""

    def __init__(self, router: Router, upstream: Upstream, health: HealthChecker, load: ReplicaLoad,
                 metrics: Metrics, *, api_key: str | None, max_retries: int,
                 migrate: MigrateMidstream | None = None) -> None:
        """`migrate`: continue a broken stream elsewhere (app/proxy/migrate.py) when enabled."""
        self.router = router
        self.upstream = upstream
        self.health = health
        self.load = load
        self.metrics = metrics
        self.api_key = api_key
        self.attempts = 1 + max(0, max_retries)
        self.migrate = migrate if migrate is not None and migrate.enabled else None

    def may_continue(self, ctx: RequestContext) -> bool:
        """Whether a break of this request's stream would be continued on another replica."""
        return self.migrate is not None and ctx.stream and ctx.dialect.continues_answers

    async def forward(self, ctx: RequestContext, send: Any, body: bytes, request: RouteRequest,
                      clock: StreamClock, *, method: str, path: str, mode: Mode,
                      drop_usage: bool = False) -> None:
        """Forward `body` and relay the answer. Raises (nothing sent yet) NoReplicaAvailable when no
        replica could be tried, or the last UpstreamError when every attempt failed."""
        metrics, router = self.metrics, self.router
        headers = upstream_headers(ctx.upstream_headers, ctx.request_id, self.api_key)
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        for _ in range(self.attempts):
            try:
                decision = await router.choose(request, frozenset(tried))
            except NoReplicaAvailable:
                if last_error is not None:
                    raise last_error from None
                raise
            replica = decision.replica
            if route_log.isEnabledFor(logging.DEBUG):
                route_log.debug("%s attempt %d: %s (costs %s)", ctx.request_id, len(tried) + 1, decision.explanation,
                                ", ".join(f"{name} {cost:.0f}" for name, cost in decision.scores.items()))
            tried.add(replica.name)
            ctx.decision = decision
            ctx.attempts += 1
            hold = self.load.hold(decision)  # inflight + prefill backlog, until first byte / end
            ctx.mark_placed()
            resp: Response | None = None
            committed = ok = False
            try:
                clock.upstream_sent(time.perf_counter())
                resp = await self.upstream.open(replica, method, path, body, headers)
                if resp.status >= 500:
                    raise await _status_error(replica, resp)
                first = b""
                if resp.status < 400:  # 2xx/3xx: the first body byte, still retryable (bounded wait)
                    first = await self.upstream.first_chunk(replica, resp)
                    clock.first_byte(time.perf_counter())  # before routing callbacks run
                hold.prefill_done()  # a queued request may take its place
                ctx.result.prefilled_beside(hold.shared_prefill_tokens)
                committed = True
                self.health.mark_success(replica)
                if resp.status < 400:
                    router.on_routed(request, decision)
                if mode == "stream" and resp.status == 200:
                    shape, collect_text = ctx.dialect.stream_shape(), int(ctx.body.get("n") or 1) == 1
                    migrator: Migrator | None = None
                    observer: StreamObserver
                    if self.may_continue(ctx):
                        migrator = Migrator(self, ctx, request, body, headers, method, path, tried)
                        observer = RecordingObserver(shape, clock, drop_usage, collect_text,
                                                     strip_chunk_usage=not client_wants_chunk_usage(ctx.body))
                    else:
                        observer = StreamObserver(shape, clock, drop_usage, collect_text)
                    await relay_stream(ctx, resp, first, send, observer, migrator)
                elif mode == "raw":
                    await relay_raw(ctx, resp, first, send)
                else:
                    await relay_buffered(ctx, resp, first, send, parse=True)
                failure = ctx.upstream_failure
                if failure is not None:  # the replica that broke last (a continuation's, after a migration)
                    metrics.upstream_errors.labels(failure.backend, failure.kind).inc()
                ctx.result.settled()
                ok = ctx.outcome == "ok"
                return
            except UpstreamError as exc:
                metrics.upstream_errors.labels(replica.name, exc.kind).inc()
                self.health.mark_failure(replica, exc.kind)
                if committed:
                    ctx.result.upstream_failed()
                    raise
                clock.attempt_failed(time.perf_counter())
                last_error = exc
            finally:
                if resp is not None:
                    let_go(resp, ok)
                hold.release()
                if committed:
                    router.on_finished(request, decision, ok)
        assert last_error is not None
        raise last_error
