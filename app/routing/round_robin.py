"""`round_robin`: the default filters, then the next replica in turn. The baseline policy."""

from __future__ import annotations

from app.routing.base import BaseRouter, RouteDecision, RouteRequest
from app.routing.filters import candidates
from app.routing.pickers import Turns
from app.routing.replicas import ReplicaSet


class RoundRobinRouter(BaseRouter):
    def __init__(self, replicas: ReplicaSet) -> None:
        self._replicas = replicas
        self._turns = Turns()

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        pool = candidates(self._replicas, request, exclude)
        replica = self._turns.next(pool)
        # it looks at no residency: the predicted prefill is the whole prompt
        return RouteDecision(replica=replica, reason="failover" if exclude else "round_robin",
                             prefill_tokens=request.prompt_tokens_estimate)
