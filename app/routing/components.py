"""The routing side's background components for the app's lifespan: DNS discovery (when
`discovery` is configured) and the KV-event subscriber (routing.kv_events with endpoints)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.config import Settings
from app.engines.kv_events import KVEventSubscriber
from app.routing.background import BackgroundWrites
from app.routing.base import Replica
from app.routing.discovery import DnsDiscovery
from app.routing.replicas import ReplicaSet
from app.routing.residency import ReplicaIndex
from app.telemetry.metrics import Metrics


def forget_removed(residency: ReplicaIndex) -> Callable[[list[Replica], list[str]], None]:
    """An endpoint source's `on_change`: removed replicas' residency is cleared (a pod that comes
    back under the same IP starts cold). Shared by DNS discovery and the EPP's pool watch."""
    writes = BackgroundWrites(in_place=residency.store.never_waits)

    def forget(_added: list[Replica], removed: list[str]) -> None:
        for name in removed:
            writes.spawn(residency.learn_cleared(name))

    return forget


def build_routing_components(settings: Settings, replicas: ReplicaSet, residency: ReplicaIndex,
                             metrics: Metrics) -> list[Any]:
    """Objects with async start()/stop(), in start order."""
    out: list[Any] = []
    if settings.discovery is not None:
        out.append(DnsDiscovery(settings.discovery, replicas, on_change=forget_removed(residency)))
    routing = settings.routing
    if routing.kv_events and routing.kv_events_endpoints:
        out.append(KVEventSubscriber(routing.kv_events_endpoints, residency, metrics))
    return out
