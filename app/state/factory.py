"""Builds the configured Store: `memory` (default) or `redis://…` (shared across gateway pods).

A Redis URL gives a ResilientStore: RedisStore for the shared view, a MemoryStore with the same
bounds as the local mirror and fallback. Nothing connects here; `await store.start()` does, and
an unreachable Redis at start is not an error (the pod serves on local state and reconnects).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from app.config import Settings
from app.state.base import Store
from app.state.memory import MemoryStore
from app.state.redis import RedisStore, connect
from app.state.resilient import ResilientStore
from app.state.shared import SharedStore
from app.telemetry.metrics import Metrics

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def is_redis_url(state: str) -> bool:
    return state.startswith(REDIS_SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def build_memory_store(settings: Settings) -> MemoryStore:
    return MemoryStore(capacity_blocks=settings.routing.kv_blocks, ttl_s=settings.routing.index_ttl_s,
                       max_tenants=settings.tenants.max_tenants)


def build_store(settings: Settings, metrics: Metrics, shared_path: str | None = None) -> Store:
    """`shared_path`: a worker of `serve --workers N` without Redis, served by the master's store."""
    if not is_redis_url(settings.state):
        if settings.state != "memory":
            raise ValueError(f"state must be 'memory' or a redis:// URL, not {redacted(settings.state)!r}")
        metrics.state_backend_up.set(1)
        if shared_path is not None:
            return SharedStore(shared_path, build_memory_store(settings), metrics.state_backend_up.set)
        return build_memory_store(settings)
    opts = settings.state_options
    remote = RedisStore(
        connect(settings.state, socket_timeout_s=max(opts.control_timeout_s, opts.redis_timeout_s)),
        namespace=opts.namespace, capacity_blocks=settings.routing.kv_blocks,
        ttl_s=settings.routing.index_ttl_s, key_ttl_s=opts.key_ttl_s,
        max_tenants=settings.tenants.max_tenants, refresh_s=opts.residency_refresh_s)
    metrics.state_backend_up.set(0)  # until start() reached Redis
    return ResilientStore(
        remote, build_memory_store(settings), metrics, timeout_s=opts.redis_timeout_s,
        timeout_per_1k_blocks_s=opts.redis_timeout_per_1k_blocks_s,
        control_timeout_s=opts.control_timeout_s, flush_interval_s=opts.flush_interval_s,
        max_pending=opts.max_pending_writes, stall_s=opts.stall_s,
        backoff_s=opts.reconnect_backoff_s, backoff_max_s=opts.reconnect_backoff_max_s,
        label=redacted(settings.state))
