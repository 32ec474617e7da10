"""vLLM's per-request metrics object (`--enable-per-request-metrics`), as the simulator writes it.

The arithmetic is vLLM 0.32's `build_per_request_timing_metrics`
(vllm/entrypoints/generate/base/serving.py, docs/ttft-ledger.md): milliseconds between the
engine's own stamps; `time_to_first_token_ms` runs from the first scheduling, not from the queue.
A member whose stamps are missing is left out of a stream's usage chunk and is `null` in a whole
body (vLLM dumps streams with exclude_none, bodies with every member).
"""

from __future__ import annotations

from typing import Any

from app.sim.request import SimRequest


def per_request_metrics(req: SimRequest, streamed: bool) -> dict[str, Any]:
    queued, scheduled, first, last = req.queued_time, req.scheduled_time, req.first_token_time, None
    if first is not None:
        last = req.last_token_time
    generated = len(req.output_ids)
    out: dict[str, Any] = {"time_to_first_token_ms": None, "generation_time_ms": None,
                           "queue_time_ms": None, "mean_itl_ms": None, "tokens_per_second": None}
    if scheduled is not None and first is not None:
        out["time_to_first_token_ms"] = (first - scheduled) * 1000
    if first is not None and last is not None:
        out["generation_time_ms"] = (last - first) * 1000
    if queued is not None and scheduled is not None:
        out["queue_time_ms"] = (scheduled - queued) * 1000
    if first is not None and last is not None and generated > 1:
        out["mean_itl_ms"] = (last - first) / (generated - 1) * 1000
    if scheduled is not None and last is not None and last > scheduled:
        out["tokens_per_second"] = generated / ((last - scheduled) * 1000) * 1000
    if streamed:
        return {k: v for k, v in out.items() if v is not None}
    out["speculative_decoding"] = None
    return out
