"""Builds the configured routing policy (settings.routing.policy)."""

from __future__ import annotations

from app.config import Settings
from app.routing.base import Router
from app.routing.replicas import ReplicaSet
from app.routing.round_robin import RoundRobinRouter
from app.state.base import Store
from app.telemetry.metrics import Metrics


def build_router(settings: Settings, replicas: ReplicaSet, store: Store, metrics: Metrics) -> Router:
    policy = settings.routing.policy
    # The affinity policies land with the routing issue; until then every policy is round-robin.
    del store, metrics, policy
    return RoundRobinRouter(replicas)
