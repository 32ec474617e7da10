"""One HTTP request as the Endpoint Picker sees it: one ext_proc stream, message by message.

The data plane carries the bytes; this class runs the same pipeline steps `serve` runs
(app/pipeline/request.py) at the points of the stream where their inputs are known:

| ext_proc message (data plane -> EPP)   | what runs                                  | answer                       |
|----------------------------------------|--------------------------------------------|------------------------------|
| request_headers                        | arrival stamp, headers kept                | (held until the body's end)  |
| request_body (until end_of_stream)     | buffered (limits.max_body_bytes)           | (held)                       |
| request_body end_of_stream             | steps 0-4 (`RequestPipeline.prepare`), the | request_headers (pick:       |
|                                        | pick (`router.choose`, subset honoured)    | header + envoy.lb metadata), |
|                                        |                                            | request_body (the bytes)     |
|                                        | reject / no endpoint                       | immediate_response 400 / 503 |
| response_headers (+ served metadata)   | the serving replica and status are known   | response_headers             |
| response_body chunk                    | step 7's observer (TTFT, usage, whole      | response_body (the observer's|
|                                        | events), first byte -> router.on_routed    | bytes), as it arrives        |
| response_body end_of_stream / stream   | steps 8-9 (`RequestPipeline.finish`),      |                              |
| closed                                 | router.on_finished                         |                              |

Every route `serve` takes (chat, completions, Messages, Responses) is read with `serve`'s stream
shape and buffered parser, and refused in its error shape; other paths are picked at their headers
(a `/v1/responses/{id}` by the replica that holds it) and pass untouched.

Every endpoint the EPP lists is a replica the router chose (primary first, then fallbacks
excluding the ones before), so when the data plane's retry lands on the second one the
served-endpoint metadata names a decision the router made and the accounting follows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.api.errors import to_proxy_error
from app.api.openai import new_context, request_id_from
from app.dialects import PASSTHROUGH, Dialect, dialect_of
from app.epp import protocol
from app.pipeline.responses_stage import response_id_of_path
from app.proxy.clock import StreamClock
from app.proxy.context import ProxyError, RequestContext, Timings
from app.proxy.observer import StreamObserver
from app.proxy.relay import observe_buffered, proxy_headers, take_results
from app.proxy.upstream import UpstreamError
from app.routing.base import NoReplicaAvailable, RouteDecision, RouteRequest
from app.routing.load import LoadHold

if TYPE_CHECKING:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    from app.config import Settings
    from app.pipeline.request import RequestPipeline
    from app.routing.base import Router
    from app.routing.health import HealthChecker
    from app.routing.load import ReplicaLoad
    from app.routing.replicas import ReplicaSet
    from app.services import Services
    from app.telemetry.metrics import Metrics

MAX_BUFFERED_RESPONSE = 8 * 1024 * 1024  # a non-streamed answer parsed for usage, at most


@dataclass(frozen=True, slots=True)
class ExchangeParts:
    """What every exchange works with, handed over once when the EPP is built (app/epp/server.py)
    rather than looked up in `Services` while a stream runs."""

    settings: Settings
    pipeline: RequestPipeline  # the steps `serve` runs (app/pipeline/request.py)
    replicas: ReplicaSet
    router: Router
    load: ReplicaLoad  # the one owner of the replicas' load counters
    health: HealthChecker
    metrics: Metrics

    @classmethod
    def of(cls, services: Services, pipeline: RequestPipeline) -> ExchangeParts:
        return cls(services.settings, pipeline, services.replicas, services.router, services.load,
                   services.health, services.metrics)


class Exchange:
    """The state of one ext_proc stream. `handle` answers each message; `close` ends the request
    (idempotent), whatever the point the stream stopped at."""

    def __init__(self, parts: ExchangeParts) -> None:
        self.settings = parts.settings
        self.pipeline = parts.pipeline
        self.replicas = parts.replicas
        self.router = parts.router
        self.load = parts.load
        self.health = parts.health
        self.metrics = parts.metrics
        self.clock = StreamClock(Timings(arrival=time.perf_counter()))
        self.headers: dict[str, str] = {}
        self.dialect: Dialect = PASSTHROUGH  # the path's API, known at the request headers
        self.parts: list[bytes] = []
        self.size = 0
        self.subset: list[str] | None = None
        self.ctx: RequestContext | None = None
        self.request: RouteRequest | None = None
        self.decisions: list[RouteDecision] = []
        self.active: RouteDecision | None = None  # the decision whose replica holds the request
        self.hold: LoadHold | None = None  # its load on that replica (app/routing/load.py)
        self.observer: StreamObserver | None = None
        self.buffered: list[bytes] | None = None
        self.passthrough = False
        self.got_first = False
        self.ended = False
        self.closed = False

    # ------------------------------------------------------------------ request side
    async def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            return await self._request_headers(msg)
        if kind == "request_body":
            return await self._request_body(msg)
        if kind == "response_headers":
            return self._response_headers(msg)
        if kind == "response_body":
            return self._response_body(msg)
        if kind in ("request_trailers", "response_trailers"):
            return [protocol.trailers(kind)]
        return []

    async def _request_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        self.clock.timings.arrival = time.perf_counter()
        self.headers = protocol.header_dict(msg.request_headers)
        self.subset = protocol.subset_hint(msg.metadata_context)
        self.dialect = dialect_of(self.headers.get(":path", "").split("?", 1)[0])
        if not self.dialect.parses or self.headers.get(":method", "POST") != "POST":
            # other paths: picked without a prompt, their bytes passed on untouched
            self.passthrough = True
            return await self._pick_passthrough()
        if msg.request_headers.end_of_stream:
            return await self._decide()
        return []

    async def _request_body(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        body = msg.request_body
        if self.passthrough:
            return [protocol.streamed_body("request_body", body.body, body.end_of_stream)]
        if body.body:
            self.size += len(body.body)
            limit = self.settings.limits.max_body_bytes
            if self.size > limit:
                return self._reject(ProxyError(413, f"request body exceeds the limit of {limit} bytes",
                                               code="request_too_large"))
            self.parts.append(body.body)
        if body.end_of_stream:
            return await self._decide()
        return []

    async def _decide(self) -> list[pb.ProcessingResponse]:
        raw = b"".join(self.parts)
        self.parts.clear()
        path = self.headers.get(":path", "").split("?", 1)[0]
        settings = self.settings
        try:
            body = self.dialect.parse(raw)
            self.ctx = new_context(settings, request_id_from(self.headers), self.dialect, path, self.headers, body,
                                   self.clock)
            forwarded, request, drop_usage = await self.pipeline.prepare(self.ctx, raw)
            self.request = request
            await self._pick(request)
        except Exception as exc:  # every refusal is the error serve gives, in the route's shape
            return self._reject(to_proxy_error(self._pinned_gone(exc)))
        ctx = self.ctx
        if ctx.stream:
            self.observer = StreamObserver(ctx.dialect.stream_shape(), self.clock, drop_usage,
                                           collect_text=int(ctx.body.get("n") or 1) == 1)
        else:
            self.buffered = []
        self.clock.upstream_sent(time.perf_counter())
        endpoints = [protocol.endpoint_of(d.replica.url) for d in self.decisions]
        return [protocol.picked(endpoints, len(forwarded)),
                protocol.streamed_body("request_body", forwarded, True)]

    def _pinned_gone(self, exc: Exception) -> Exception:
        """A Responses turn pinned by `previous_response_id` whose replica cannot be picked: the
        engine's 404, as `serve` answers it (app/pipeline/request.py `run`)."""
        ctx = self.ctx
        previous = ctx.dialect.previous_response_id(ctx.body) if ctx is not None else None
        if isinstance(exc, NoReplicaAvailable) and ctx is not None and ctx.pinned_replica and previous is not None:
            return self.pipeline.responses.unreachable(previous, exc)
        return exc

    def _allowed(self) -> frozenset[str]:
        """Replica names outside the data plane's subset (the router's `exclude`)."""
        if self.subset is None:
            return frozenset()
        allowed = set(self.subset)
        return frozenset(r.name for r in self.replicas.all()
                         if protocol.endpoint_of(r.url) not in allowed)

    async def _pick(self, request: RouteRequest) -> None:
        """The primary and up to `routing.max_retries` fallbacks, each the router's own choice."""
        router = self.router
        excluded = set(self._allowed())
        for i in range(1 + max(0, self.settings.routing.max_retries)):
            try:
                decision = await router.choose(request, frozenset(excluded))
            except NoReplicaAvailable:
                if i == 0:
                    raise
                break
            self.decisions.append(decision)
            excluded.add(decision.replica.name)
        self._hold(self.decisions[0])

    def _hold(self, decision: RouteDecision) -> None:
        """`decision`'s replica now holds the request: the load owner's hold, as `serve`'s forward
        takes it (inflight, prefill backlog and its long-lane part, decision metric)."""
        self.active = decision
        self.hold = self.load.hold(decision)
        if self.ctx is not None:
            self.ctx.decision = decision
            self.ctx.attempts += 1
            self.ctx.mark_placed()

    def _release(self) -> None:
        if self.hold is not None:
            self.hold.release()  # the admission queue re-checks now
        self.hold = None
        self.active = None

    async def _pick_passthrough(self) -> list[pb.ProcessingResponse]:
        """Any replica, or for `/v1/responses/{id}` (retrieve, cancel) the one that holds the id."""
        response_id = response_id_of_path(self.headers.get(":path", "").split("?", 1)[0])
        try:
            pinned = await self.pipeline.responses.pin(response_id) if response_id is not None else None
            request = RouteRequest("passthrough", None, None, None, 0, pinned=pinned)
            decision = await self.router.choose(request, self._allowed())
        except Exception as exc:
            if response_id is not None:
                exc = self.pipeline.responses.unreachable(response_id, exc)
            return self._reject(to_proxy_error(exc))
        return [protocol.picked([protocol.endpoint_of(decision.replica.url)], None)]

    def _reject(self, err: ProxyError) -> list[pb.ProcessingResponse]:
        if self.ctx is not None:
            self.ctx.result.refused(err.status)
        else:
            self.metrics.requests.labels(self.dialect.name, str(err.status)).inc()
        request_id = self.ctx.request_id if self.ctx else request_id_from(self.headers)
        headers = [("x-request-id", request_id), *err.headers.items()]
        out = [protocol.immediate(err.status, self.dialect.error_body(err), headers)]
        self.close()
        return out

    # ------------------------------------------------------------------ response side
    def _response_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        ctx = self.ctx
        if ctx is None:
            if self.passthrough:  # counted as serve counts it: by the status the replica answered
                status = protocol.header_dict(msg.response_headers).get(":status", "")
                if len(status) == 3 and status.isdigit():
                    self.metrics.requests.labels("passthrough", status).inc()
            return [protocol.continue_headers("response_headers")]
        headers = protocol.header_dict(msg.response_headers)
        status = int(headers.get(":status", "200") or 200)
        ctx.result.answered(status)
        self._follow_served(protocol.served_endpoint(msg.metadata_context))
        replica = self.active.replica if self.active else None
        if status >= 500 and replica is not None:
            self.health.mark_failure(replica, "status_5xx")
            self.metrics.upstream_errors.labels(replica.name, "status_5xx").inc()
        if status != 200:
            self.observer = None
            self.buffered = None
        out = [protocol.continue_headers(
            "response_headers",
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in proxy_headers(ctx)])]
        if msg.response_headers.end_of_stream:
            self.ended = True
            self.close()
        return out

    def _follow_served(self, served: str | None) -> None:
        """The data plane's retry may have walked the list: move the hold to the replica that served."""
        if served is None or self.active is None:
            return
        if protocol.endpoint_of(self.active.replica.url) == served:
            return
        for decision in self.decisions:
            if protocol.endpoint_of(decision.replica.url) == served:
                failed = self.active.replica
                self.health.mark_failure(failed, "connect")
                self.metrics.upstream_errors.labels(failed.name, "connect").inc()
                self._release()
                self.clock.attempt_failed(time.perf_counter())
                self.clock.upstream_sent(time.perf_counter())
                self._hold(decision)
                return

    def _response_body(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        body = msg.response_body
        data, eos = body.body, body.end_of_stream
        now = time.perf_counter()
        ctx = self.ctx
        if ctx is not None and not self.got_first and (data or eos):
            self._first_byte(now)
        out = data
        if self.observer is not None:
            out = self.observer.feed(data, now) if data else b""
        elif self.buffered is not None and data:
            if sum(map(len, self.buffered)) + len(data) <= MAX_BUFFERED_RESPONSE:
                self.buffered.append(data)
        if eos:
            self.ended = True
            if self.observer is not None:
                self.observer.finish()
                if not self.observer.done and ctx is not None:
                    ctx.result.broke(UpstreamError("midstream", self._backend(),
                                                   "upstream closed the stream before its end marker"))
            self.close()
        return [protocol.streamed_body("response_body", out, eos)]

    def _first_byte(self, now: float) -> None:
        self.got_first = True
        decision, request = self.active, self.request
        if decision is None or request is None or self.ctx is None:
            return
        status = self.ctx.status or 200
        if status < 400:
            self.clock.first_byte(now)
            self.health.mark_success(decision.replica)
            self.router.on_routed(request, decision)
        if self.hold is not None:
            self.hold.prefill_done()
            self.ctx.result.prefilled_beside(self.hold.shared_prefill_tokens)

    def _backend(self) -> str:
        return self.active.replica.name if self.active else "?"

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Steps 8-9 once, at the response's end or wherever the stream stopped."""
        if self.closed:
            return
        self.closed = True
        ctx = self.ctx
        if ctx is None:
            return
        if not self.ended and ctx.outcome == "ok" and ctx.status is None:
            ctx.result.client_left()  # the data plane ended the exchange before any answer
        elif not self.ended and ctx.outcome == "ok":  # the stream stopped before its end (a replica or client gone)
            ctx.result.broke(UpstreamError("midstream", self._backend(), "the response stopped before its end"))
        if self.observer is not None:
            if not self.ended:
                self.observer.finish()
            take_results(ctx, self.observer)
            if self.observer.error is not None and ctx.outcome == "ok":
                ctx.result.broke()
        elif self.buffered and ctx.status == 200:
            observe_buffered(ctx, b"".join(self.buffered))
        ctx.result.settled()
        if ctx.upstream_failure is not None and self.active is not None:
            self.metrics.upstream_errors.labels(self.active.replica.name, ctx.upstream_failure.kind).inc()
        decision, request = self.active, self.request
        self._release()
        if decision is not None and request is not None and self.got_first:
            self.router.on_finished(request, decision, ctx.outcome == "ok")
        self.clock.end(time.perf_counter())
        self.pipeline.finish(ctx, self.clock)
