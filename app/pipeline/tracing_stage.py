"""The tracing stage: one OpenTelemetry span per proxied request (app/pipeline/request.py).

Off by default (`tracing.enabled`); the exporter is configured only by the standard OTEL_* env
(app/telemetry/tracing.py builds the provider). The span starts at the request's arrival
(back-dated from `ctx.timings.arrival`) and is kept in the stage's note `ctx.trace` until it ends;
it is a child of the client's W3C `traceparent` when one came in, and its context goes into
`ctx.trace.headers` (which the proxy adds to the headers it forwards upstream), so vLLM/SGLang
spans join the same trace. Attributes follow
the GenAI semantic conventions (gen_ai.*) plus prefixgate.* for what only the proxy knows. Prompt
text never becomes an attribute.

Continuity and break cause are computed by the prefix stage after the response, in a task (exact
tokens off the hot path). When that work is pending the span is ended by a small task that waits
for `ctx.prefix.observation` (bounded by OBSERVATION_WAIT_S); the span's end time is still the
response's end, so waiting never stretches its duration.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.config import Settings
from app.proxy.clock import overhead_of
from app.proxy.context import RequestContext, TraceNote
from app.telemetry.tracing import build_provider

OBSERVATION_WAIT_S = 5.0

_PROPAGATOR = TraceContextTextMapPropagator()


def _wall_ns(perf_stamp: float) -> int:
    """A time.perf_counter() stamp as epoch nanoseconds (spans carry wall-clock times)."""
    return time.time_ns() - int((time.perf_counter() - perf_stamp) * 1e9)


def request_attributes(ctx: RequestContext) -> dict[str, Any]:
    """Attributes known before routing."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": ctx.dialect.operation or ctx.route,
        "gen_ai.request.stream": ctx.stream,
        "prefixgate.tenant": ctx.tenant,
        "prefixgate.request_id": ctx.request_id,
        "http.request.method": "POST",
        "url.path": ctx.path,
    }
    if ctx.model:
        attrs["gen_ai.request.model"] = ctx.model
    max_tokens = ctx.body.get("max_completion_tokens") or ctx.body.get("max_tokens")
    if isinstance(max_tokens, int):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    return attrs


def response_attributes(ctx: RequestContext) -> dict[str, Any]:
    """Attributes known once the response ended: usage, latency, routing, prefix continuity."""
    attrs: dict[str, Any] = {"prefixgate.outcome": ctx.outcome, "prefixgate.attempts": ctx.attempts}
    if ctx.status is not None:
        attrs["http.response.status_code"] = ctx.status
    usage = ctx.usage or {}
    if isinstance(usage.get("prompt_tokens"), int):
        attrs["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        attrs["gen_ai.usage.output_tokens"] = usage["completion_tokens"]
    cached = ctx.engine_cached_tokens
    if isinstance(cached, int):
        attrs["gen_ai.usage.cache_read.input_tokens"] = cached
        attrs["prefixgate.cached_tokens"] = cached
    t = ctx.timings
    if t.first_token is not None:
        ttft = t.first_token - t.arrival
        attrs["gen_ai.response.time_to_first_chunk"] = ttft
        attrs["prefixgate.ttft_s"] = ttft
    overhead = overhead_of(t)
    if overhead is not None:
        attrs["prefixgate.proxy_overhead_s"] = overhead
    decision = ctx.decision
    if decision is not None:
        attrs["prefixgate.backend"] = decision.replica.name
        attrs["prefixgate.route_reason"] = decision.reason
        attrs["prefixgate.prefix.matched_blocks"] = decision.matched_blocks
        attrs["prefixgate.prefix.available_blocks"] = decision.available_blocks
        if decision.replica.engine in ("vllm", "sglang"):
            attrs["gen_ai.provider.name"] = decision.replica.engine
    findings = ctx.hygiene.findings
    if findings:
        attrs["prefixgate.hygiene.findings"] = sorted({f.kind for f in findings})
    prefix = ctx.prefix
    if prefix is not None and prefix.predicted_tokens is not None:
        attrs["prefixgate.predicted_cached_tokens"] = prefix.predicted_tokens
    obs = prefix.observation if prefix is not None else None
    if obs is not None and obs.continuity is not None:
        attrs["prefixgate.prefix.continuity"] = float(obs.continuity)
    if obs is not None and obs.diagnosis is not None and obs.diagnosis.cause is not None:
        attrs["prefixgate.prefix.break_cause"] = obs.diagnosis.cause
    return attrs


def observation_pending(ctx: RequestContext) -> bool:
    """True when the prefix stage will publish an observation for this request later."""
    return (ctx.prefix is not None and ctx.prefix.observation is None
            and ctx.outcome == "ok" and ctx.decision is not None)


class TracingStage:
    """Starts the request span in `before_route`, ends it in `after_response`. Cheap: no I/O on
    the hot path (the batch processor exports from its own thread)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("prefixgate")
        self._pending: dict[asyncio.Task[None], tuple[RequestContext, Span, int]] = {}

    async def before_route(self, ctx: RequestContext) -> None:
        parent = _PROPAGATOR.extract(ctx.headers)
        operation = ctx.dialect.operation or ctx.route
        name = f"{operation} {ctx.model}" if ctx.model else ctx.route
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER,
                                      attributes=request_attributes(ctx),
                                      start_time=_wall_ns(ctx.timings.arrival))
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        ctx.trace = TraceNote(span, carrier)  # its headers go upstream: the engine's spans join this trace

    def after_response(self, ctx: RequestContext) -> None:
        note = ctx.trace
        span = note.span if note is not None else None
        if note is None or span is None:
            return
        note.span = None
        end = ctx.timings.end if ctx.timings.end is not None else time.perf_counter()
        end_ns = _wall_ns(end)
        if observation_pending(ctx):
            try:
                task = asyncio.get_running_loop().create_task(self._end_after_observation(ctx, span, end_ns))
            except RuntimeError:  # no loop (called from a thread): end now
                pass
            else:
                self._pending[task] = (ctx, span, end_ns)
                task.add_done_callback(lambda t: self._pending.pop(t, None))
                return
        self._end(ctx, span, end_ns)

    async def _end_after_observation(self, ctx: RequestContext, span: Span, end_ns: int) -> None:
        delay, deadline = 0.005, time.monotonic() + OBSERVATION_WAIT_S
        while ctx.prefix is not None and ctx.prefix.observation is None and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        self._end(ctx, span, end_ns)

    @staticmethod
    def _end(ctx: RequestContext, span: Span, end_ns: int) -> None:
        span.set_attributes(response_attributes(ctx))
        if ctx.outcome != "ok" or (ctx.status is not None and ctx.status >= 500):
            span.set_status(Status(StatusCode.ERROR, ctx.outcome))
        span.end(end_time=end_ns)

    async def drain(self) -> None:
        """Wait for spans still waiting on their prefix observation (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    def shutdown(self) -> None:
        """Flush and stop the exporter (call from the app's lifespan on exit). Spans still waiting
        for an observation are ended now with what they have."""
        for task, (ctx, span, end_ns) in list(self._pending.items()):
            task.cancel()
            self._end(ctx, span, end_ns)
        self._pending.clear()
        self.provider.shutdown()


def build_tracing_stage(settings: Settings, exporter: SpanExporter | None = None) -> TracingStage | None:
    """The stage when `tracing.enabled` (and OTEL_SDK_DISABLED is not true), else None."""
    if not settings.tracing.enabled:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    return TracingStage(build_provider(exporter))
