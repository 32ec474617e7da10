"""`session`: sticky placement by `x-session-id` (else the tenant), with bounded loads.

Composition: the default filters, then consistent hashing with bounded loads (Mirrokni, Thorup,
Zadimoghaddam) where the balls are the *keys*: a replica may hold at most
ceil((1 + epsilon) * m / n) of the m sessions active now (with a request in flight from this
gateway) over the n candidates. One session's concurrent requests are one key, so a session
keeps its replica however many requests it has in flight, and moves only when other sessions
fill that replica past the bound (reason `load_override`) or it is gone (`failover`).

The key's replica is kept in the Store (shared across gateway pods) and refreshed on every
routed request; a new key takes the first replica on its ring walk that is within the bound.
"""

from __future__ import annotations

from app.routing.background import BackgroundWrites
from app.routing.base import BaseRouter, RouteDecision, RouteRequest
from app.routing.filters import candidates
from app.routing.replicas import ReplicaSet
from app.routing.ring import DEFAULT_EPSILON, RingCache, first_on_ring, key_bound
from app.state.base import Store

BINDING_PREFIX = "session:"


def session_key(request: RouteRequest) -> str:
    return f"{BINDING_PREFIX}{request.session_id}" if request.session_id else f"{BINDING_PREFIX}tenant:{request.tenant}"


class ActiveSessions:
    """Sessions with requests in flight, per replica: key -> (replica, requests in flight)."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[str, int]] = {}
        self._per_replica: dict[str, int] = {}

    def start(self, key: str, replica: str) -> None:
        held, count = self._by_key.get(key, (replica, 0))
        if held != replica:  # the session moved while an older request still runs: count it once
            self._drop(key, held)
            count = 0
        if count == 0:
            self._per_replica[replica] = self._per_replica.get(replica, 0) + 1
        self._by_key[key] = (replica, count + 1)

    def finish(self, key: str, replica: str) -> None:
        held, count = self._by_key.get(key, (None, 0))
        if held != replica:
            return
        if count <= 1:
            self._drop(key, replica)
        else:
            self._by_key[key] = (replica, count - 1)

    def _drop(self, key: str, replica: str) -> None:
        self._by_key.pop(key, None)
        left = self._per_replica.get(replica, 0) - 1
        if left > 0:
            self._per_replica[replica] = left
        else:
            self._per_replica.pop(replica, None)

    def others(self, key: str, names: list[str]) -> dict[str, int]:
        """Active sessions per replica, not counting `key` itself."""
        held = self._by_key.get(key, (None, 0))[0]
        return {n: self._per_replica.get(n, 0) - (1 if n == held else 0) for n in names}

    def total(self) -> int:
        return len(self._by_key)

    def is_active(self, key: str) -> bool:
        return key in self._by_key


class SessionRouter(BaseRouter):
    def __init__(self, replicas: ReplicaSet, store: Store, epsilon: float = DEFAULT_EPSILON) -> None:
        self._replicas = replicas
        self._store = store
        self._epsilon = epsilon
        self._ring = RingCache()
        self.writes = BackgroundWrites()
        self.active = ActiveSessions()
        self._counted: dict[int, tuple[str, str]] = {}  # id(decision) -> (key, replica) until finished

    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        pool = candidates(self._replicas, request, exclude)
        names = [r.name for r in pool]
        key = session_key(request)
        sessions = self.active.total() + (0 if self.active.is_active(key) else 1)
        bound = key_bound(sessions, len(pool), self._epsilon)
        others = self.active.others(key, names)
        room = {n for n in names if others[n] + 1 <= bound}
        scores = {n: float(v) for n, v in others.items()}
        bound_name = await self._store.binding_get(key)
        reason = "session"
        if bound_name is not None:
            if bound_name in room:
                replica = next(r for r in pool if r.name == bound_name)
                return RouteDecision(replica=replica, reason="failover" if exclude else "session",
                                     scores=scores, prefill_tokens=request.prompt_tokens_estimate,
                                     explanation=f"session; {key} bound to {bound_name}")
            reason = "load_override" if bound_name in names else "failover"
        ring = self._ring.get(self._replicas.names())
        name, _ = first_on_ring(ring, key, room)
        if name is None:  # cannot happen with epsilon >= 0 (the bound covers the mean); kept for safety
            name = min(names, key=lambda n: (others[n], n))
        if exclude:
            reason = "failover"
        replica = next(r for r in pool if r.name == name)
        return RouteDecision(replica=replica, reason=reason, scores=scores,
                             prefill_tokens=request.prompt_tokens_estimate,
                             explanation=f"{reason}; hashed to {name} ({others[name]} other sessions, "
                                         f"bound {bound})")

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        key = session_key(request)
        self.active.start(key, decision.replica.name)
        self._counted[id(decision)] = (key, decision.replica.name)
        # (re)bind on every request: a new or re-placed key gets its replica, a kept one a fresh TTL
        self.writes.spawn(self._store.binding_set(key, decision.replica.name))

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        counted = self._counted.pop(id(decision), None)
        if counted is not None:
            self.active.finish(*counted)
