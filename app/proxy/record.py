"""Turning one finished request into metric observations (called once, after the response).

Observations happen here, not while relaying, so the hot path only stamps times; the prompt
bucket needs `usage.prompt_tokens`, which arrives with the last chunk anyway.
"""

from __future__ import annotations

from app.proxy.clock import StreamClock
from app.proxy.context import RequestContext
from app.telemetry.metrics import Metrics, prompt_bucket

NO_BACKEND = "none"
CLIENT_CLOSED = "499"  # nginx's convention for "client closed the request"


def status_label(ctx: RequestContext) -> str:
    if ctx.outcome == "client_disconnect":
        return CLIENT_CLOSED
    return str(ctx.status or 500)


def record_request(metrics: Metrics, ctx: RequestContext, clock: StreamClock) -> None:
    status = status_label(ctx)
    metrics.requests.labels(ctx.route, status).inc()
    model = ctx.model or "unknown"
    backend = ctx.decision.replica.name if ctx.decision is not None else NO_BACKEND
    duration = clock.duration
    if duration is not None:
        metrics.request_duration.labels(model, backend, status).observe(duration)
    if ctx.decision is None:
        return
    overhead = clock.overhead
    if overhead is not None:
        metrics.proxy_overhead.observe(overhead)
    first_byte = clock.first_byte_latency
    if first_byte is not None:
        metrics.first_byte.labels(model, backend).observe(first_byte)
    prompt_tokens = ctx.prompt_tokens
    ttft = clock.ttft
    if ttft is not None:
        metrics.ttft.labels(model, backend, prompt_bucket(prompt_tokens)).observe(ttft)
    if clock.gaps:
        child = metrics.inter_token.labels(model, backend)
        for gap in clock.gaps:
            child.observe(gap)
    usage = ctx.usage or {}
    output_text = ctx.attrs.get("output_text")
    rate = clock.decode_rate(usage.get("completion_tokens"), len(output_text) if output_text else None)
    if rate is not None:
        metrics.decode_rate.labels(model, backend).observe(rate)
    ctx.content_chunks = clock.content_chunks
    if isinstance(prompt_tokens, int) and prompt_tokens > 0:
        tenant = metrics.tenant_label(ctx.tenant)
        metrics.prompt_tokens.labels(model, tenant).inc(prompt_tokens)
        cached = ctx.engine_cached_tokens
        if isinstance(cached, int) and cached >= 0:
            metrics.cached_tokens.labels(model, tenant, "engine").inc(cached)
