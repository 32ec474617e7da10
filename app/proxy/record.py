"""Turning one finished request into metric observations (called once, after the response).

Observations happen here, not while relaying, so the hot path only stamps times; the prompt
bucket needs `usage.prompt_tokens`, which arrives with the last chunk anyway. Labelled children
are memoised (`child`) and a request's inter-token gaps go into their histogram in one pass
(`observe_many`): per-call label resolution and per-gap `observe` were ~8% of the proxy's CPU at
128 streams (py-spy, bench/overhead.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from app.proxy.clock import StreamClock
from app.proxy.context import RequestContext
from app.telemetry.child import child
from app.telemetry.metrics import Metrics, prompt_bucket

NO_BACKEND = "none"
CLIENT_CLOSED = "499"  # nginx's convention for "client closed the request"
__all__ = ["child", "observe_many", "record_request", "status_label"]


def observe_many(histogram_child: Any, values: Sequence[float]) -> None:
    """Observe every value: one bucket count and one sum update per pass instead of per value.
    Reads prometheus_client's Histogram internals; falls back to `observe` if they change."""
    bounds = getattr(histogram_child, "_upper_bounds", None)
    buckets = getattr(histogram_child, "_buckets", None)
    total = getattr(histogram_child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram_child.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect_left(bounds, value)] += 1  # first bound >= value: prometheus's `value <= bound`
    total.inc(sum(values))
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)


def status_label(ctx: RequestContext) -> str:
    if ctx.outcome == "client_disconnect":
        return CLIENT_CLOSED
    return str(ctx.status or 500)


def record_request(metrics: Metrics, ctx: RequestContext, clock: StreamClock) -> None:
    status = status_label(ctx)
    route = ctx.route
    child(metrics.requests, route, status).inc()
    model = ctx.model or "unknown"
    backend = ctx.decision.replica.name if ctx.decision is not None else NO_BACKEND
    duration = clock.duration
    if duration is not None:
        child(metrics.request_duration, route, model, backend, status).observe(duration)
    if ctx.decision is None:
        return
    overhead = clock.overhead
    if overhead is not None:
        child(metrics.proxy_overhead, route).observe(overhead)
    first_byte = clock.first_byte_latency
    if first_byte is not None:
        child(metrics.first_byte, route, model, backend).observe(first_byte)
    prompt_tokens = ctx.prompt_tokens
    ttft = clock.ttft
    if ttft is not None:
        child(metrics.ttft, route, model, backend, prompt_bucket(prompt_tokens)).observe(ttft)
    parts = ctx.result.ttft_parts or {}
    for part, seconds in parts.items():
        child(metrics.ttft_part, part, prompt_bucket(prompt_tokens), route).observe(seconds)
    cached = ctx.engine_cached_tokens
    if "prefill" in parts and isinstance(prompt_tokens, int) and isinstance(cached, int) and 0 <= cached <= prompt_tokens:
        metrics.prefill_models.add(backend, prompt_tokens - cached, cached, parts["prefill"],
                                   ctx.result.shared_prefill_tokens or 0)
    engine_prefill = ctx.result.engine_prefill_s
    if engine_prefill is not None:
        child(metrics.tenant_prefill_seconds, metrics.tenant_label(ctx.tenant)).inc(engine_prefill)
    if clock.gaps:
        observe_many(child(metrics.inter_token, route, model, backend), clock.gaps)
    usage = ctx.usage or {}
    output_text = ctx.output_text
    rate = clock.decode_rate(usage.get("completion_tokens"), len(output_text) if output_text else None)
    if rate is not None:
        child(metrics.decode_rate, route, model, backend).observe(rate)
    ctx.result.content_chunks = clock.content_chunks
    if isinstance(prompt_tokens, int) and prompt_tokens > 0:
        tenant = metrics.tenant_label(ctx.tenant)
        child(metrics.prompt_tokens, route, model, tenant).inc(prompt_tokens)
        cached = ctx.engine_cached_tokens
        if isinstance(cached, int) and cached >= 0:
            child(metrics.cached_tokens, route, model, tenant, "engine").inc(cached)
