"""Memoised metric children: the hot path's `metric.labels(...)` without its lock and dict walk."""

from __future__ import annotations

from typing import Any

CHILD_CACHE_CAP = 4096  # memoised label sets; the cache starts over beyond it

_children: dict[tuple[Any, ...], Any] = {}


def child(metric: Any, *values: str) -> Any:
    """`metric.labels(*values)`, memoised. The key holds the metric itself (not its id), so a
    dead registry's metric is never confused with a new one. Invariant: nothing calls
    `metric.remove()`/`clear()` on these metrics (a removed child would stay cached)."""
    key = (metric, *values)
    found = _children.get(key)
    if found is None:
        if len(_children) >= CHILD_CACHE_CAP:
            _children.clear()
        found = _children[key] = metric.labels(*values)
    return found
