"""The page's per-tenant row, computed from a tenant report (app/prefix/tracker.py
`tenant_report`). Shared by `/hygiene/tenants` and the `prefixgate lint --html` report. Pure."""

from __future__ import annotations

from typing import Any

from app.telemetry.metrics import prompt_bucket

SUMMARY_KEYS = ("tenant", "requests", "window", "continuity", "breaks", "new_sessions", "compactions",
                "breaks_by_cause", "bill")


def nearest_rank(values: list[float], q: float) -> float:
    """The q-quantile of `values` by nearest rank: always one of the observed values."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(q * n), at least 1
    return ordered[int(rank) - 1]


def ttft_by_bucket(recent: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Client-side TTFT p50/p95 per prompt-length bucket over the window's requests that have
    both figures (buckets as in `prefixgate_ttft_seconds`; a non-streamed response has no
    TTFT); a bucket without samples is absent."""
    samples: dict[str, list[float]] = {}
    for r in recent:
        ttft, tokens = r.get("ttft_s"), r.get("prompt_tokens")
        if isinstance(ttft, int | float) and isinstance(tokens, int):
            samples.setdefault(prompt_bucket(tokens), []).append(float(ttft))
    return {bucket: {"n": len(v), "p50": nearest_rank(v, 0.5), "p95": nearest_rank(v, 0.95)}
            for bucket, v in samples.items()}


def tenant_summary(report: dict[str, Any]) -> dict[str, Any]:
    """One tenant's row: the report's totals, per-request continuity, TTFT, its last break."""
    recent = report.get("recent") or []
    out = {k: report.get(k) for k in SUMMARY_KEYS}
    out["recent"] = [{"seq": r.get("seq"), "continuity": r.get("continuity"), "cause": r.get("cause")}
                     for r in recent]
    out["ttft_by_bucket"] = ttft_by_bucket(recent)
    out["last_break"] = (report.get("last_breaks") or [None])[0]
    return out
