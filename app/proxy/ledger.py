"""The TTFT ledger: where one streamed request's first-token time went (docs/ttft-ledger.md).

Client TTFT (arrival -> the first chunk with generated text, the gateway's clock) split into:
- `gateway`: arrival -> the last attempt's request written upstream, minus failed attempts
  (the proxy overhead, app/proxy/clock.py `overhead_of`);
- `retries`: the time earlier attempts spent on replicas that failed (only when there were any);
- `queue`, `prefill`: the engine's own report (vLLM `--enable-per-request-metrics`);
- `rest`: what is left (network both ways, the engine's front end and tokenisation, detokenising
  and flushing the first chunk), only when both engine parts are known and it is not negative.
A part that was not measured is absent, never zero. Pure arithmetic.
"""

from __future__ import annotations

from app.engines.request_metrics import EngineTiming
from app.proxy.clock import overhead_of
from app.proxy.context import Timings

PARTS = ("gateway", "retries", "queue", "prefill", "rest")


def ttft_parts(timings: Timings, engine: EngineTiming | None) -> dict[str, float]:
    """The measured parts of the client TTFT, in seconds ({} without a client TTFT)."""
    if timings.first_token is None:
        return {}
    ttft = timings.first_token - timings.arrival
    parts: dict[str, float] = {}
    gateway = overhead_of(timings)
    if gateway is None:
        return {}
    parts["gateway"] = gateway
    if timings.failed_attempts > 0:
        parts["retries"] = timings.failed_attempts
    if engine is not None and engine.queue_s is not None:
        parts["queue"] = engine.queue_s
    if engine is not None and engine.prefill_s is not None:
        parts["prefill"] = engine.prefill_s
    if "queue" in parts and "prefill" in parts:
        rest = ttft - sum(parts.values())
        if rest >= 0:
            parts["rest"] = rest
    return parts
