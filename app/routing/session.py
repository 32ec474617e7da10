"""`session`: sticky placement by `x-session-id` (else the tenant), with bounded loads.

The key is bound to a replica in the Store (shared across gateway pods) the first time it is
seen; the replica comes from consistent hashing with bounded loads (app/routing/ring.py), so a
new key never lands on a replica carrying more than (1 + epsilon) x the mean in-flight requests.
A bound key keeps its replica while that replica is healthy and within the same bound; otherwise
it is re-placed and re-bound (reason `failover` when its replica is gone, `load_override` when
it is overloaded).
"""

from __future__ import annotations

from app.routing.background import BackgroundWrites
from app.routing.base import RouteDecision, RouteRequest
from app.routing.replicas import ReplicaSet
from app.routing.ring import DEFAULT_EPSILON, RingCache, load_bound, pick_bounded
from app.routing.round_robin import pick_candidates
from app.state.base import Store

BINDING_PREFIX = "session:"


def session_key(request: RouteRequest) -> str:
    return f"{BINDING_PREFIX}{request.session_id}" if request.session_id else f"{BINDING_PREFIX}tenant:{request.tenant}"


class SessionRouter:
    def __init__(self, replicas: ReplicaSet, store: Store, epsilon: float = DEFAULT_EPSILON) -> None:
        self._replicas = replicas
        self._store = store
        self._epsilon = epsilon
        self._ring = RingCache()
        self.writes = BackgroundWrites()

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        candidates = pick_candidates(self._replicas, exclude)
        loads = {r.name: float(r.inflight) for r in candidates}
        key = session_key(request)
        bound_name = await self._store.binding_get(key)
        reason = "session"
        if bound_name is not None:
            if bound_name in loads and loads[bound_name] <= load_bound(loads, 1.0, self._epsilon):
                replica = next(r for r in candidates if r.name == bound_name)
                return RouteDecision(replica=replica, reason="failover" if exclude else "session",
                                     scores=loads, prefill_tokens=request.prompt_tokens_estimate,
                                     explanation=f"session; {key} bound to {bound_name}")
            reason = "load_override" if bound_name in loads else "failover"
        name, _ = pick_bounded(self._ring.get(self._replicas.names()), key, loads, 1.0, self._epsilon)
        if exclude:
            reason = "failover"
        replica = next(r for r in candidates if r.name == name)
        return RouteDecision(replica=replica, reason=reason, scores=loads,
                             prefill_tokens=request.prompt_tokens_estimate,
                             explanation=f"{reason}; hashed to {name} (in flight {loads[name]:g})")

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        # (re)bind on every request: a new or re-placed key gets its replica, a kept one a fresh TTL
        self.writes.spawn(self._store.binding_set(session_key(request), decision.replica.name))

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        return None
