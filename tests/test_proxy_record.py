"""Metric recording helpers: memoised children and the one-pass histogram update must export
exactly what per-call `labels(...).observe(...)` would."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, Histogram

from app.proxy.gctune import YOUNG_THRESHOLD, tune_for_serving
from app.proxy.record import child, observe_many

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect() for s in family.samples if not s.name.endswith("_created")}


def test_observe_many_equals_observe_each() -> None:
    values = [0.0005, 0.001, 0.0011, 0.05, 0.1, 0.7, 2.5, 0.01]  # edges land in their own bucket
    regs = [CollectorRegistry(), CollectorRegistry()]
    hists = [Histogram("gap_seconds", "gaps", ["backend"], buckets=BUCKETS, registry=r) for r in regs]
    for v in values:
        hists[0].labels("b").observe(v)
    observe_many(hists[1].labels("b"), values)
    assert samples(regs[0]) == samples(regs[1])
    assert samples(regs[1])[("gap_seconds_bucket", (("backend", "b"), ("le", "0.001")))] == 2


def test_child_is_memoised_per_metric_and_labels() -> None:
    a = Histogram("a_seconds", "a", ["x"], registry=CollectorRegistry())
    b = Histogram("a_seconds", "a", ["x"], registry=CollectorRegistry())  # same name, other registry
    assert child(a, "1") is child(a, "1") is a.labels("1")
    assert child(b, "1") is b.labels("1") and child(b, "1") is not child(a, "1")


def test_tune_for_serving_freezes_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        tune_for_serving()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
