"""`least_load`: the default filters, the load scorers, the lowest total: the replica with the
least prefill backlog plus decode load, ignoring prefixes.

The same load scorers as `prefix_affinity` (app/routing/scorers.py) without the uncached-prompt
term, so the two policies differ only in whether cache residency counts. Ties go to fewer
requests in flight, then round-robin order, so an idle fleet is still spread evenly.
"""

from __future__ import annotations

from app.routing.base import BaseRouter, RouteDecision, RouteRequest
from app.routing.filters import candidates
from app.routing.pickers import Turns
from app.routing.prefill_cost import TOKEN_PRICES, PrefillPrices
from app.routing.replicas import ReplicaSet
from app.routing.scorers import ScoreWeights, load_scores


class LeastLoadRouter(BaseRouter):
    def __init__(self, replicas: ReplicaSet, weights: ScoreWeights | None = None,
                 prices: PrefillPrices = TOKEN_PRICES) -> None:
        self._replicas = replicas
        self._weights = weights or ScoreWeights()
        self._prices = prices  # the backlog priced by each replica's fitted prefill model
        self._turns = Turns()

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        pool = candidates(self._replicas, request, exclude)
        scored = []
        for r, offset in zip(pool, self._turns.offsets(len(pool)), strict=True):
            parts = load_scores(r, self._weights, self._prices)
            scored.append((sum(p.value for p in parts), r.gateway_inflight(), offset, r, parts))
        total, _, _, replica, parts = min(scored, key=lambda t: t[:3])
        why = " + ".join(f"{p.name} {p.why}" for p in parts)
        return RouteDecision(
            replica=replica, reason="failover" if exclude else "least_load",
            scores={t[3].name: t[0] for t in scored}, prefill_tokens=request.prompt_tokens_estimate,
            explanation=f"least_load; {replica.name}: {total:.0f} = {why}")
