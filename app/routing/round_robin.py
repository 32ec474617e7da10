"""Round-robin over healthy replicas: the baseline policy and the fallback of the others."""

from __future__ import annotations

import itertools

from app.routing.base import NoReplicaAvailable, Replica, RouteDecision, RouteRequest
from app.routing.replicas import ReplicaSet


def pick_candidates(replicas: ReplicaSet, exclude: frozenset[str]) -> list[Replica]:
    """Healthy replicas not yet tried; raises NoReplicaAvailable when there are none."""
    candidates = [r for r in replicas.healthy() if r.name not in exclude]
    if not candidates:
        raise NoReplicaAvailable("no healthy replica available")
    return candidates


class RoundRobinRouter:
    def __init__(self, replicas: ReplicaSet) -> None:
        self._replicas = replicas
        self._counter = itertools.count()

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        candidates = pick_candidates(self._replicas, exclude)
        replica = candidates[next(self._counter) % len(candidates)]
        return RouteDecision(replica=replica, reason="failover" if exclude else "round_robin")

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        return None

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        return None
