"""One scrape of an engine's /metrics, reduced to the few numbers prefixgate needs.

The engine adapters (vllm.py, sglang.py) map engine-specific metric names onto the canonical keys
below, so the rate, status and scrape code never mention an engine's metric names.

Parsing keys samples by their *sample* name (`vllm:prefix_cache_hits_total`), not by family:
prometheus_client's text parser files a counter's `_total`/`_created` samples under separate
untyped families when the `# TYPE` line names the bare family, and engines differ in whether the
declared name carries `_total` (vLLM does not, SGLang does). Sample names are what every exporter
agrees on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = Mapping[str, str]
Samples = dict[str, list[tuple[dict[str, str], float]]]

# Canonical counter keys (monotonic; windowed deltas are taken from them).
CACHE_QUERIES = "cache_queries"  # prompt tokens that went through a prefix-cache lookup
CACHE_HITS = "cache_hits"  # of those, tokens served from cache
PROMPT_TOKENS = "prompt_tokens"  # prompt tokens the engine admitted (cache hits included)
SPEC_DRAFTS = "spec_drafts"  # vLLM: speculative proposals (one per verify step)
SPEC_ACCEPTED = "spec_accepted"  # vLLM: accepted draft tokens
COUNTER_KEYS = (CACHE_QUERIES, CACHE_HITS, PROMPT_TOKENS, SPEC_DRAFTS, SPEC_ACCEPTED)

# Canonical gauge keys (point-in-time).
WAITING = "waiting"
RUNNING = "running"
KV_USAGE = "kv_usage"  # 0..1
BLOCK_SIZE = "block_size"  # engine block / page size, tokens
HIT_ALIGNMENT = "hit_alignment"  # tokens a cache hit is a multiple of (vLLM cache_hit_alignment_tokens)
KV_BLOCKS = "kv_blocks"  # KV capacity in engine blocks
KV_RESERVED_BLOCKS = "kv_reserved_blocks"  # of those, never cached (vLLM: one null block per engine)
SPEC_ACCEPT_LENGTH = "spec_accept_length"  # SGLang's own windowed gauge

PROCESS_START = "process_start_time_seconds"  # the default prometheus_client process collector


@dataclass(frozen=True)
class EngineSample:
    """An engine's /metrics reduced to canonical keys. A key missing from `counters`/`gauges` means
    the engine did not expose it (that is different from 0 and must stay visible as absent)."""

    engine: str  # "vllm" | "sglang" | "unknown"
    counters: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    cache_config: Mapping[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels
    prefix_caching_configured: bool | None = None  # what the engine's config says, None = unknown
    hash_algo: str | None = None
    process_start: float | None = None  # changes on restart when the engine exports it


def _slim(text: str) -> str:
    """Drops comment lines and histogram buckets before parsing: none of them is read here, and
    they are most of an engine's exposition (a real vLLM 0.32 page: 12 ms to parse whole, 3 ms
    slimmed). Without `# TYPE` lines every sample keeps its exact name, which is how it is keyed."""
    kept = [line for line in text.splitlines()
            if line and not line.startswith("#") and "_bucket{" not in line]
    return "\n".join(kept) + "\n"


def parse_exposition(text: str) -> Samples:
    """Prometheus text -> {sample name: [(labels, value), ...]}. `_created` samples (counter
    creation stamps) and histogram buckets are dropped: they are not values we use. So is a NaN,
    an infinity or a negative value: every value read here is a count, a size, a ratio or a time,
    and such a value is an unknown one (absent), never a number that looks like data."""
    samples: Samples = {}
    for family in text_string_to_metric_families(_slim(text)):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            value = float(s.value)
            if math.isfinite(value) and value >= 0:
                samples.setdefault(s.name, []).append((dict(s.labels), value))
    return samples


def detect_engine(samples: Samples) -> str:
    """vllm | sglang | unknown, from the metric name prefixes."""
    vllm = sglang = 0
    for name in samples:
        if name.startswith("vllm:"):
            vllm += 1
        elif name.startswith("sglang:"):
            sglang += 1
    if not vllm and not sglang:
        return "unknown"
    return "vllm" if vllm >= sglang else "sglang"


LabelFilter = Callable[[Labels], bool]


def _picked(samples: Samples, name: str, where: LabelFilter | None) -> list[float]:
    """The values of a sample whose labels pass `where` (all of them without one); [] when absent."""
    return [v for labels, v in samples.get(name, ()) if where is None or where(labels)]


def total(samples: Samples, name: str, where: LabelFilter | None = None) -> float | None:
    """Sum of a sample over its label sets (e.g. vLLM data-parallel engines); None when absent."""
    picked = _picked(samples, name, where)
    return float(sum(picked)) if picked else None


def mean(samples: Samples, name: str, where: LabelFilter | None = None) -> float | None:
    """Mean over label sets: for ratios such as KV usage, where a sum would exceed 1."""
    picked = _picked(samples, name, where)
    return float(sum(picked) / len(picked)) if picked else None


def first_labels(samples: Samples, name: str) -> dict[str, str] | None:
    rows = samples.get(name)
    return dict(rows[0][0]) if rows else None


def parse_int(value: str | None) -> int | None:
    """Label values are strings; engines write `None` for unset options."""
    if value is None:
        return None
    try:
        number = int(float(value))
    except ValueError:
        return None
    return number if number > 0 else None


def parse_bool(value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    return None


def put(target: dict[str, float], key: str, value: float | None) -> None:
    """Adds a value only when present, so absent families stay absent; a KV usage past 1 (it is a
    fraction) is not a value either."""
    if value is not None and not (key == KV_USAGE and value > 1):
        target[key] = value
