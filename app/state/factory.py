"""Builds the configured Store: `memory` (default) or `redis://…` (shared across gateway pods)."""

from __future__ import annotations

from app.config import Settings
from app.state.base import Store
from app.state.memory import MemoryStore
from app.telemetry.metrics import Metrics


def build_store(settings: Settings, metrics: Metrics) -> Store:
    if settings.state.startswith(("redis://", "rediss://", "unix://")):
        raise NotImplementedError("Redis state lands with the shared-state issue")
    metrics.state_backend_up.set(1)
    return MemoryStore(capacity_blocks=settings.routing.kv_blocks, ttl_s=settings.routing.index_ttl_s,
                       max_tenants=settings.tenants.max_tenants)
