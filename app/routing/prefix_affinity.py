"""`prefix_affinity` (the default policy): send a request where its prefix is resident, unless the
queue there costs more than the prefill it saves.

Composition: the default filters (healthy, serves the model, not tried), the residency lookup,
the scorers, then one of two pickers (lowest cost, or bounded-load hashing for cold prompts).
Per candidate replica the cost is the sum of the scorers (app/routing/scorers.py), all in prefill
tokens: the prompt tokens not resident there (from the residency index, one Store round trip for
all replicas), its prefill backlog and its decode load; the first two priced by the replica's
fitted prefill model where it has one (app/routing/prefill_cost.py). The lowest cost wins:
- `prefix_hit`: the winner holds the longest resident prefix among the candidates;
- `load_override`: another replica holds more of the prefix, but its load outweighs the saving;
- `cold_spread`: no candidate holds a meaningful share of the prompt (< `cold_match_ratio`), so
  the request is placed by bounded-load consistent hashing of its first blocks: the same prefix
  lands on the same replica across turns and gateway pods, among the replicas whose queued work
  plus its own cold prefill there is within one prefill chunk of the least (a cold prompt pays its
  whole prefill, so waiting is TTFT; with fitted prefill models a slower replica's prefill counts
  more, so a long cold prompt goes to a faster one) and whose share of recent requests is within
  (1 + epsilon) x the mean (app/routing/recent.py): cold traffic never piles onto one replica,
  and sticky tenants do not leave the fleet unbalanced; with the gateway queue on
  (app/admission/gate.py), only among the replicas with room when any has;
- `session`: the request carries a session id (`routing.session_keys`) and its session is bound
  to a replica that is not saturated, or it is a new session (or a saturated one's cold prompt),
  placed on the session key's ring walk (app/routing/session.py `SessionBindings`); a saturated
  bound replica leaves a warm request to the rules above, and the session is rebound where it went;
- `failover`: a retry (the previous replicas are in `exclude`).

`on_routed` tells the residency owner (app/routing/residency.py) right away (off the hot path, a
task): the known prompt blocks become resident there, so a tenant's next turn or a concurrent
request finds them before the full chain is known; in KV-event mode only the resident head the
lookup found is marked used, as the engine does on a hit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from app.prefix.blocks import predicted_hit_tokens
from app.routing.background import BackgroundWrites
from app.routing.base import BaseRouter, Replica, RouteDecision, RouteRequest
from app.routing.filters import candidates
from app.routing.lanes import LongPrefillLane
from app.routing.pickers import lowest_cost
from app.routing.prefill_cost import TOKEN_PRICES, PrefillPrices
from app.routing.recent import RecentShares
from app.routing.replicas import ReplicaSet
from app.routing.residency import ReplicaIndex
from app.routing.ring import DEFAULT_EPSILON, RingCache, first_on_ring, within_bound
from app.routing.scorers import ReplicaCost, ScoreWeights, load_value, replica_costs
from app.routing.session import SessionBindings

DEFAULT_COLD_KEY_TOKENS = 4096
DEFAULT_COLD_MATCH_RATIO = 0.25
DEFAULT_COLD_SLACK_TOKENS = 2048  # one prefill chunk (vLLM's default max_num_batched_tokens order)


@dataclass(frozen=True)
class AffinityOptions:
    block_size: int = 16
    weights: ScoreWeights = ScoreWeights()
    epsilon: float = DEFAULT_EPSILON
    cold_key_tokens: int = DEFAULT_COLD_KEY_TOKENS
    cold_match_ratio: float = DEFAULT_COLD_MATCH_RATIO
    cold_slack_tokens: float = DEFAULT_COLD_SLACK_TOKENS
    default_kv_blocks: int | None = None


def cold_key(block_hashes: Sequence[int], block_size: int, key_tokens: int, tenant: str) -> str | int:
    """The chained hash over the first `key_tokens` tokens (one hash covers all earlier blocks),
    or the tenant when the prompt has no full block yet."""
    if not block_hashes:
        return f"tenant:{tenant}"
    n = max(1, min(len(block_hashes), key_tokens // max(1, block_size)))
    return block_hashes[n - 1]


def prompt_tokens_of(request: RouteRequest) -> int:
    fp = request.fingerprint
    if fp is not None and fp.complete and fp.num_tokens is not None:
        return fp.num_tokens
    known = len(fp.block_hashes) * fp.block_size if fp is not None else 0
    return max(request.prompt_tokens_estimate, known, 1)


class PrefixAffinityRouter(BaseRouter):
    def __init__(self, replicas: ReplicaSet, residency: ReplicaIndex, options: AffinityOptions | None = None,
                 lane: LongPrefillLane | None = None, prices: PrefillPrices = TOKEN_PRICES) -> None:
        self._replicas = replicas
        self.lane = lane
        self.prices = prices
        self.residency = residency
        self.options = options or AffinityOptions()
        self._ring = RingCache()
        self.writes = BackgroundWrites(in_place=residency.store.never_waits)
        self.recent = RecentShares(residency.store)  # fleet-wide, through the Store
        self.sessions = SessionBindings(residency.store, self.writes, self.options.epsilon)  # routing.session_keys

    def _sync_capacity(self, replicas: Sequence[Replica]) -> None:
        """Bound each replica's index at its KV capacity once the scraper (or config) knows it."""
        for r in replicas:
            blocks = r.kv_blocks or self.options.default_kv_blocks
            if blocks:
                self.residency.set_capacity(r.name, blocks)

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        pool = candidates(self._replicas, request, exclude)
        self._sync_capacity(pool)
        fp = request.fingerprint
        hashes = fp.block_hashes if fp is not None else []
        block_size = fp.block_size if fp is not None else self.options.block_size
        prompt = prompt_tokens_of(request)
        if request.session_id:  # the residency lookup and the session's binding, side by side
            matched, bound_name = await asyncio.gather(self._matched(request, hashes), self.sessions.binding(request))
        else:
            matched, bound_name = await self._matched(request, hashes), None
        available = max(matched.values(), default=0)
        costs = replica_costs(pool, matched, prompt, block_size, self.options.weights, self.prices)
        lane = None
        if self.lane is not None:  # the lane is set by the cheapest prefill the fleet offers
            best = max((c.matched_blocks for c in costs), default=0)
            prefill = prompt - predicted_hit_tokens(best, prompt, block_size)
            if not exclude:  # a retry is the same request
                self.lane.observe(prefill)
            lane = self.lane.lane_of(prefill)
            keep = {r.name for r in self.lane.keep([c.replica for c in costs], lane)}
            costs = [c for c in costs if c.replica.name in keep]
        best_match = max(c.matched_blocks for c in costs)
        cold = predicted_hit_tokens(best_match, prompt, block_size) < self.options.cold_match_ratio * prompt

        bound = self.sessions.keep(request, bound_name, costs)
        if bound is not None:  # the session's replica, while it has room
            chosen, reason = bound, "session"
        elif request.session_id and (bound_name is None or cold):  # a new session: hashed on its key
            chosen, reason = self.sessions.place(request, costs, self._replicas.names()), "session"
        elif cold:
            key = cold_key(hashes, block_size, self.options.cold_key_tokens, request.tenant)
            recent = await self.recent.values([c.replica.name for c in costs])
            # with the gateway queue on, among the replicas with room (late binding: a request it
            # released goes where the room is, not behind the backlog it waited out)
            roomy = [c for c in costs if request.room(c.replica)] if request.room is not None else []
            chosen = self._cold_pick(key, roomy or costs, recent, prompt)
            reason = "cold_spread"
        else:
            chosen = lowest_cost(costs)
            reason = "prefix_hit" if chosen.matched_blocks == best_match else "load_override"
        if exclude:
            reason = "failover"
        hit = predicted_hit_tokens(chosen.matched_blocks, prompt, block_size)
        return RouteDecision(
            replica=chosen.replica, reason=reason, matched_blocks=chosen.matched_blocks,
            available_blocks=available, scores={c.replica.name: c.total for c in costs},
            prefill_tokens=max(0, prompt - hit), lane=lane,
            explanation=f"{reason}{f' ({lane} lane)' if lane else ''}; " + chosen.explain())

    async def _matched(self, request: RouteRequest, hashes: list[int]) -> dict[str, int]:
        """Leading resident blocks per replica; every replica serving the model counts for
        `available`, tried ones included."""
        if not hashes:
            return {}
        return await self.residency.lookup(hashes, [r.name for r in candidates(self._replicas, request)])

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        self.sessions.finished(decision)

    def _cold_pick(self, key: str | int, costs: list[ReplicaCost], recent: dict[str, float],
                   prompt: int) -> ReplicaCost:
        """Bounded-load hashing over two loads: the work before the prompt's first token (the work
        queued now plus the prompt's whole prefill, in prefill-token equivalents) and the share of
        recent requests; the first replica on the key's ring walk within both bounds wins (within
        the first alone if none is, else the one that would start it soonest).

        The bound on the work is tight (the least plus one prefill chunk): a cold prompt pays its
        whole prefill, so waiting behind another one shows up directly in its TTFT; hashing only
        decides between replicas that are about as idle. The prompt's own prefill is the same
        everywhere at token prices; a replica's fitted model makes a slow replica's dearer."""
        eps = self.options.epsilon
        weights, prices = self.options.weights, self.prices
        now = {c.replica.name: load_value(c.replica, weights, prices)
               + weights.uncached * prices.prefill(c.replica.name, prompt, 0)[0] for c in costs}
        least = min(now.values())
        ok_now = {n for n, v in now.items() if v <= least + self.options.cold_slack_tokens}
        ring = self._ring.get(self._replicas.names())
        name, _ = first_on_ring(ring, key, ok_now & within_bound(recent, 1.0, eps))
        if name is None:
            name, _ = first_on_ring(ring, key, ok_now)
        if name is None:
            name = min(now, key=lambda n: (now[n], n))
        return next(c for c in costs if c.replica.name == name)

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        self.writes.spawn(self.recent.add(decision.replica.name))
        self.sessions.routed(request, decision)
        fp = request.fingerprint
        if fp is None or not fp.block_hashes:
            return
        # a hit refreshes the LRU position of the resident head, as the engine does
        self.writes.spawn(self.residency.learn_routed(decision.replica.name, fp.block_hashes[:],
                                                      decision.matched_blocks))
