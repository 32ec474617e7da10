"""`least_load`: the replica with the least prefill backlog plus decode load, ignoring prefixes.

The same load scorers as `prefix_affinity` (app/routing/scorers.py) without the uncached-prompt
term, so the two policies differ only in whether cache residency counts. Ties go to fewer
requests in flight, then round-robin order, so an idle fleet is still spread evenly.
"""

from __future__ import annotations

import itertools

from app.routing.base import RouteDecision, RouteRequest
from app.routing.replicas import ReplicaSet
from app.routing.round_robin import pick_candidates
from app.routing.scorers import ScoreWeights, load_scores


class LeastLoadRouter:
    def __init__(self, replicas: ReplicaSet, weights: ScoreWeights | None = None) -> None:
        self._replicas = replicas
        self._weights = weights or ScoreWeights()
        self._counter = itertools.count()

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        candidates = pick_candidates(self._replicas, exclude)
        turn = next(self._counter)
        n = len(candidates)
        scored = []
        for i, r in enumerate(candidates):
            parts = load_scores(r, self._weights)
            scored.append((sum(p.value for p in parts), r.inflight, (i - turn) % n, r, parts))
        total, _, _, replica, parts = min(scored, key=lambda t: t[:3])
        why = " + ".join(f"{p.name} {p.why}" for p in parts)
        return RouteDecision(
            replica=replica, reason="failover" if exclude else "least_load",
            scores={t[3].name: t[0] for t in scored}, prefill_tokens=request.prompt_tokens_estimate,
            explanation=f"least_load; {replica.name}: {total:.0f} = {why}")

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        return None

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        return None
