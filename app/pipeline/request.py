"""One request's path through prefixgate, step by step: read this table first.

app/api/openai.py (the ASGI adapter) reads the body, resolves the tenant, builds the
`RequestContext` and hands it to `RequestPipeline`, which runs the steps below in this order. Each
step writes only its own typed note (app/proxy/context.py); later steps read them.

| #  | step        | code                                    | writes on `ctx`                                   |
|----|-------------|-----------------------------------------|---------------------------------------------------|
| 0  | arrive      | app/api/openai.py (`new_context`)       | arrival (frozen: request_id, dialect, path,       |
|    |             |                                         | tenant, headers, body, model, stream, session_id),|
|    |             |                                         | timings.arrival                                   |
| 1  | admit       | `RequestPipeline._admit`                | (404 `model_not_found` when no replica lists it)  |
| 1b | pin         | app/pipeline/responses_stage.py         | pinned_replica (Responses `previous_response_id`: |
|    |             |                                         | the replica holding it; or vLLM's 404 when gone)  |
| 2  | hygiene     | app/pipeline/hygiene_stage.py           | hygiene (.salt, .findings, .headers, .body on a   |
|    |             |                                         | rewrite); or a 400 (`reject`)                     |
| 3  | fingerprint | prefix stage `before_route`             | fingerprint (the router reads it), prefix         |
|    |             | (prefix_stage.py)                       | (.input, .routed_blocks, .routed_complete,        |
|    |             |                                         | .pending: the rest of a big prompt, in a worker)  |
| 3b | trace start | app/pipeline/tracing_stage.py           | trace (.span; .headers: traceparent, sent         |
|    |             |                                         | upstream)                                         |
| 3c | admission   | `RequestPipeline._admission` ->         | admission (.ticket: the tenant's limit hold,      |
|    |             | app/admission/gate.py                   | .headers, .placed); or a 429 (over a limit) / 503 |
|    |             |                                         | (queue full or past its TTL)                      |
| 4  | encode      | app/pipeline/body.py `forwarded_body`   | (the bytes sent: the client's, salt and           |
|    |             |                                         | include_usage spliced in)                         |
| 5  | route       | app/proxy/forward.py -> router          | decision, attempts; a load hold on the replica    |
|    |             |                                         | (app/routing/load.py)                             |
| 6  | forward     | app/proxy/forward.py -> upstream        | timings.upstream_sent, timings.first_byte         |
| 7  | relay       | app/proxy/relay.py                      | result (`Outcome`: status, outcome, usage, output |
|    |             |                                         | text, response id, upstream failure, delivered    |
|    |             |                                         | before disconnect); timings.first_token / end     |
| 8  | track       | prefix stage `after_response`           | prefix.matched, .predicted_tokens, .observation   |
|    |             |                                         | (in a task: continuity, diagnosis, residency)     |
| 8b | trace end   | tracing stage `after_response`          | trace.span -> None (waits for prefix.observation) |
| 8c | remember    | responses_stage.py `remember`           | (Store: response id -> replica, in a task)        |
| 9  | record      | app/proxy/record.py                     | result.content_chunks; the request's metrics      |

Every API is a dialect (app/dialects/: chat, completions, responses, messages, passthrough) that
the steps ask instead of comparing route names: how its body is parsed, what prompt the engine
renders from it, what hygiene scans and rewrites, its stream and error shapes. `/v1/messages`
(Anthropic) takes every step too: read as the chat body the engine converts it to, streamed through
app/proxy/anthropic_shape.py, refused in Anthropic's shape (docs/agents-apis.md).

Steps 5-7 are one attempt: forward() routes again to a replica not yet tried while nothing has
reached the client (routing.max_retries). Steps 8-9 run once the response ended, whatever the
outcome (`finish`, from the adapter's `finally`), and never block the loop. Passthrough paths
(other /v1/* routes) skip 1-4 and 8: their bytes go to a routed replica as they came.

A stage is optional: a pipeline built without one (tests, `bench/overhead.py --core-only`) skips
its step. `hooks` holds extra observers (tests, recorders): their `before_route` runs after step 3b
and their `after_response` after 8b. Every part is handed in at construction (app/server.py
`build_pipeline` wires them); nothing here reaches into `Services`. docs/pipeline.md tells the
same path in prose.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from app.admission.gate import rate_headers
from app.pipeline.body import forwarded_body
from app.pipeline.responses_stage import ResponseOwners, response_id_of_path
from app.prefix.blocks import predicted_hit_tokens
from app.proxy.clock import StreamClock
from app.proxy.context import ProxyError, RequestContext
from app.proxy.forward import Forwarder, Mode
from app.proxy.openai_shape import client_wants_usage
from app.proxy.record import record_request
from app.proxy.upstream import UpstreamError
from app.routing.base import NoReplicaAvailable, RouteRequest
from app.routing.load import estimated_tokens
from app.telemetry.child import child

if TYPE_CHECKING:
    from app.admission.gate import Admission
    from app.config import Settings
    from app.pipeline.hygiene_stage import HygieneStage
    from app.pipeline.prefix_stage import PrefixStage
    from app.pipeline.tracing_stage import TracingStage
    from app.proxy.context import RequestHook
    from app.routing.health import HealthChecker
    from app.routing.replicas import ReplicaSet
    from app.routing.residency import ReplicaIndex
    from app.telemetry.metrics import Metrics

log = logging.getLogger("prefixgate.pipeline")
_RELEASES: set[asyncio.Task[None]] = set()  # admission releases in flight (referenced until done)


def _int_or(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _prompt_estimate(ctx: RequestContext, size_bytes: int) -> int:
    """The prompt's tokens as routing and admission count them: the fingerprint's estimate, else
    the body's size over BYTES_PER_TOKEN_ESTIMATE (app/routing/load.py)."""
    fp = ctx.fingerprint
    return fp.estimated_tokens if fp is not None and fp.estimated_tokens else estimated_tokens(size_bytes)


class RequestPipeline:
    """Drives one request through the steps of the table above."""

    def __init__(self, settings: Settings, metrics: Metrics, health: HealthChecker, replicas: ReplicaSet,
                 residency: ReplicaIndex, forwarder: Forwarder, responses: ResponseOwners, *,
                 hygiene: HygieneStage | None = None, prefix: PrefixStage | None = None,
                 tracing: TracingStage | None = None, admission: Admission | None = None,
                 hooks: list[RequestHook] | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.health = health
        self.replicas = replicas
        self.residency = residency
        self.forwarder = forwarder
        self.responses = responses
        self.hygiene = hygiene
        self.prefix = prefix
        self.tracing = tracing
        self.admission = admission
        self.hooks = hooks if hooks is not None else []  # the caller's list: observers added later count

    async def run(self, ctx: RequestContext, raw: bytes, send: Any, clock: StreamClock) -> None:
        """Steps 1-7 for a parsed API (chat, completions, responses, messages). Raises ProxyError
        (or the last upstream error) when nothing was sent to the client yet; the adapter turns it
        into an error in the dialect's shape."""
        body, request, drop_usage = await self.prepare(ctx, raw, chunk_usage=self.forwarder.may_continue(ctx))
        mode: Mode = "stream" if ctx.stream else "buffered"
        try:
            await self.forwarder.forward(ctx, send, body, request, clock, method="POST", path=ctx.path,  # 5-7
                                         mode=mode, drop_usage=drop_usage)
        except (UpstreamError, NoReplicaAvailable) as exc:
            previous = ctx.dialect.previous_response_id(ctx.body)
            if ctx.pinned_replica is None or previous is None:
                raise
            raise self.responses.unreachable(previous, exc) from exc

    async def prepare(self, ctx: RequestContext, raw: bytes, *,
                      chunk_usage: bool = False) -> tuple[bytes, RouteRequest, bool]:
        """Steps 1-4: the bytes to send upstream, what the router reads, and whether the usage
        chunk the gateway asked for must be dropped from the stream. Shared by `run` and the
        Endpoint Picker (app/epp/exchange.py), whose data plane does steps 5-7's transport.
        `chunk_usage`: ask for usage on every chunk (a stream the forwarder may continue elsewhere
        counts the tokens already sent with it; the forwarder takes it out again)."""
        self._admit(ctx)  # 1
        previous = ctx.dialect.previous_response_id(ctx.body)
        if previous is not None:  # 1b: the replica that holds it, or its 404
            ctx.pinned_replica = await self.responses.pin(previous)
        if self.hygiene is not None:
            await self.hygiene.before_route(ctx)  # 2
        if self.prefix is not None:
            await self.prefix.before_route(ctx)  # 3
        if self.tracing is not None:
            await self.tracing.before_route(ctx)  # 3b
        for hook in self.hooks:
            await hook.before_route(ctx)
        if self.admission is not None:
            await self._admission(ctx, len(raw))  # 3c
        # OpenAI streams report usage only when asked; a Messages stream always does (message_start,
        # message_delta), so nothing is added to, or dropped from, it
        drop_usage = ctx.stream and ctx.dialect.asks_usage and not client_wants_usage(ctx.body)
        body = forwarded_body(raw, ctx.body, changed=ctx.body_changed, salt=ctx.salt,  # 4
                              include_usage=drop_usage, chunk_usage=chunk_usage)
        fp = ctx.fingerprint
        estimate = _prompt_estimate(ctx, len(body))
        room = self.admission.room if self.admission is not None and self.admission.queueing else None
        return body, RouteRequest(ctx.tenant, ctx.model, ctx.session_id, fp, estimate,
                                  pinned=ctx.pinned_replica, room=room), drop_usage

    async def passthrough(self, ctx: RequestContext, raw: bytes, send: Any, clock: StreamClock, *,
                          method: str, path: str) -> None:
        """Steps 5-7 for any other /v1/* path: the client's bytes, routed and relayed as they are."""
        response_id = response_id_of_path(ctx.path)
        pinned = await self.responses.pin(response_id) if response_id is not None else None
        # ctx.model: set for paths routed by model (/v1/messages/count_tokens), else None (any replica)
        request = RouteRequest(ctx.tenant, ctx.model, ctx.session_id, None, estimated_tokens(len(raw)),
                               pinned=pinned)
        try:
            await self.forwarder.forward(ctx, send, raw, request, clock, method=method, path=path, mode="raw")
        except (UpstreamError, NoReplicaAvailable) as exc:
            if pinned is None or response_id is None:
                raise
            raise self.responses.unreachable(response_id, exc) from exc

    def finish(self, ctx: RequestContext, clock: StreamClock) -> None:
        """Steps 8-9, once the response ended (any outcome). A failing observer is logged, never
        allowed to break the proxy or the steps after it."""
        ctx.mark_placed()  # a request that ended before it held a replica frees its queue room
        if ctx.dialect.stores_responses:
            self.responses.remember(ctx)  # 8c: id -> replica, for previous_response_id / GET / cancel
        for stage in (self.prefix, self.tracing, *self.hooks):  # 8, 8b, observers
            if stage is None:
                continue
            try:
                stage.after_response(ctx)
            except Exception:
                log.exception("after_response of %s failed", type(stage).__name__)
                kind = "prefix" if stage is self.prefix else "tracing" if stage is self.tracing else "hook"
                self.metrics.observation_errors.labels(kind).inc()
        try:
            record_request(self.metrics, ctx, clock)  # 9
            if ctx.decision is not None and ctx.dialect.parses:
                child(self.metrics.prefill_tokens, ctx.route, self.metrics.tenant_label(ctx.tenant)).observe(
                    ctx.decision.prefill_tokens)
        except Exception:
            log.exception("recording metrics failed")
            self.metrics.observation_errors.labels("metrics").inc()
        if ctx.admission.ticket is not None and self.admission is not None:
            task = asyncio.get_running_loop().create_task(self.admission.done(ctx.admission.ticket, ctx.prompt_tokens))
            _RELEASES.add(task)
            task.add_done_callback(_RELEASES.discard)

    async def _admission(self, ctx: RequestContext, raw_bytes: int) -> None:
        """Limits first (a refusal never waits), then the queue while every replica is saturated.
        The estimate is the fingerprint's token count, else the body size over 4."""
        admission = self.admission
        assert admission is not None
        estimate = _prompt_estimate(ctx, raw_bytes)
        anthropic = ctx.dialect.anthropic  # Anthropic's header names, 429 and 529 shapes
        note = ctx.admission
        note.ticket = ticket = await admission.admit(ctx.tenant, estimate, anthropic)
        if ticket is not None:
            note.headers.update(rate_headers(ticket.limits, ticket.verdict, anthropic))
        tenant_cfg = self.settings.tenants.config_for(ctx.tenant)
        priority = _int_or(ctx.headers.get(self.settings.admission.priority_header.lower()),
                           tenant_cfg.priority)
        note.placed = await admission.wait_turn(ctx.tenant, priority, self.replicas.all, ctx.model,
                                               lambda: self._predicted_prefill(ctx, estimate), anthropic)

    async def _predicted_prefill(self, ctx: RequestContext, estimate: int) -> int:
        """The prompt minus the longest prefix predicted resident on any replica (for the queue's order)."""
        fp = ctx.fingerprint
        prompt = fp.num_tokens if fp is not None and fp.complete and fp.num_tokens else estimate
        if fp is None or not fp.block_hashes:
            return prompt
        matched = await self.residency.lookup(fp.block_hashes[:], self.replicas.names())  # a snapshot
        return max(0, prompt - predicted_hit_tokens(max(matched.values(), default=0), prompt, fp.block_size))

    def _admit(self, ctx: RequestContext) -> None:
        known = self.health.known_models()
        if known is not None and ctx.model not in known:
            raise ProxyError(404, f"The model `{ctx.model}` does not exist.", type="NotFoundError",
                             param="model", code="model_not_found")
