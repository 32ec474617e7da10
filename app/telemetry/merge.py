"""One gateway's /metrics from the expositions of its workers (`serve --workers N`).

A scrape reaches one worker (the kernel spreads connections over them); that worker answers with
its own registry merged with every other worker's (docs/performance.md, "Metrics with workers"):
counters and histograms are summed per series, so rates and quantiles are the gateway's; gauges
of per-worker quantities (in-flight requests, memory, queued writes) are summed; every other gauge
describes a shared thing each worker observes for itself (a backend's health, an engine's
scraped state, the drain flag) and shows the largest value any worker reports. Names, labels and
types stay exactly those of a single-process gateway, so dashboards and alerts need no change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

SUMMED_GAUGES = frozenset({
    "prefixgate_backend_inflight_requests",
    "prefixgate_memory_used_bytes",
    "prefixgate_memory_budget_bytes",
    "prefixgate_state_pending_writes",
})


def merge_expositions(texts: Iterable[str]) -> bytes:
    """The Prometheus text exposition of the merged series of `texts` (one per worker)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            series = values.setdefault(family.name, {})
            summed = family.type != "gauge" or family.name in SUMMED_GAUGES
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in series:
                    series[key] = sample.value
                elif sample.name.endswith("_created"):  # when the series began: the earliest
                    series[key] = min(series[key], sample.value)
                elif summed:
                    series[key] += sample.value
                else:
                    series[key] = max(series[key], sample.value)
    for name, series in values.items():
        for (sample_name, labels), value in series.items():
            families[name].add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)
