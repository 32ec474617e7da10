"""The reuse funnel: one answered request's reusable prompt tokens, split into the stages of
`prefixgate_prefix_reuse_tokens_total{stage}`.

All stages of a request are counted together, once, after its response (app/pipeline/prefix_stage.py),
on the same chain and the same rule (`predicted_hit_tokens`), so a stage is never measured on more
than the one before it:

- available: the most leading prompt tokens resident on any replica when the proxy knew the
  prompt's chain (at routing; for a chain finished in the worker pool while the request was in
  flight, when it was finished);
- captured: of those, resident on the replica it was sent to (the proxy's prediction);
- delivered: cached tokens the engine reported, up to `available`;
- beyond_available: what the engine reported past `available`: blocks cached after the proxy
  looked (an earlier request with the same head still in prefill when this one was routed) or that
  the index did not hold. Named apart, so no stage reads above 100% of available and
  delivered + beyond_available is everything the engine reported.

A request the engine reported no cached count for adds to available and captured only.
"""

from __future__ import annotations

from prometheus_client import Counter

from app.telemetry.child import child

STAGES = ("available", "captured", "delivered", "beyond_available")


def reuse_parts(available: int, captured: int, delivered: int | None) -> dict[str, int]:
    """One request's tokens per stage (all tokens, in the engine's hit rule)."""
    captured = min(captured, available)
    parts = {"available": available, "captured": captured}
    if delivered is not None and delivered >= 0:
        parts["delivered"] = min(delivered, available)
        parts["beyond_available"] = max(0, delivered - available)
    return parts


def count_reuse(counter: Counter, available: int, captured: int, delivered: int | None) -> None:
    """Add one request to the funnel's counter."""
    for stage, tokens in reuse_parts(available, captured, delivered).items():
        child(counter, stage).inc(tokens)  # the counter's one label
