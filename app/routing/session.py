"""Session affinity: the `session` policy, and the bindings prefix_affinity keeps for sessions.

`session`: sticky placement by the request's session id (`routing.session_keys`,
app/routing/session_keys.py; else the tenant), with bounded loads.

Composition: the default filters, then consistent hashing with bounded loads (Mirrokni, Thorup,
Zadimoghaddam) where the balls are the *keys*: a replica may hold at most
ceil((1 + epsilon) * m / n) of the m sessions active now (with a request in flight from this
gateway) over the n candidates. One session's concurrent requests are one key, so a session
keeps its replica however many requests it has in flight, and moves only when other sessions
fill that replica past the bound (reason `load_override`) or it is gone (`failover`).

The key's replica is kept in the Store (shared across gateway pods) and refreshed on every
routed request; a new key takes the first replica on its ring walk that is within the bound.

`SessionBindings`: under `prefix_affinity`, a request with a session id goes to its session's
bound replica while that replica is not saturated (it has room by admission's definition,
docs/admission.md); a session not bound yet takes the first replica on its key's ring walk that
has room and holds no more than its bounded share of the active sessions (so concurrent first
turns agree, and new sessions spread instead of all following the shared system prompt); a
saturated one is placed by the policy as any request.

Binding keys are tenant-scoped: two tenants' equal session ids never share a binding.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from urllib.parse import quote

from app.routing.background import BackgroundWrites
from app.routing.base import BaseRouter, RouteDecision, RouteRequest
from app.routing.filters import candidates
from app.routing.replicas import ReplicaSet
from app.routing.ring import DEFAULT_EPSILON, RingCache, first_on_ring, key_bound
from app.routing.scorers import ReplicaCost
from app.state.base import Store

BINDING_PREFIX = "session:"
PENDING_S = 30.0  # a new session's placement counts this long before its first token at most
FIRST_BYTE_BOUND_S = 600.0  # limits.first_byte_timeout_s's default: no routed request is older


def binding_key(tenant: str, session_id: str | None) -> str:
    """The Store key of a binding: the session id within its tenant (the tenant is quoted, so it
    holds no `:` and no two (tenant, id) pairs share a key), else the tenant itself."""
    if session_id:
        return f"{BINDING_PREFIX}id:{quote(tenant, safe='')}:{session_id}"
    return f"{BINDING_PREFIX}tenant:{tenant}"


def session_key(request: RouteRequest) -> str:
    return binding_key(request.tenant, request.session_id)


class ActiveSessions:
    """Sessions with requests in flight, per replica: key -> (replica, requests in flight); and
    which routed request is its session's newest.

    A binding is written when a request's first byte arrives, and an older request can get its
    first byte after a newer one (its long prefill is why its replica was saturated and the newer
    request went elsewhere): only the newest decision (`RouteDecision.decided_at`) rebinds the
    session, and an older request counts as its activity only on the newest's replica. Entries
    of that map older than `FIRST_BYTE_BOUND_S` are dropped once there are more than `MAX_KEYS`:
    no first byte comes that late."""

    MAX_KEYS = 65_536

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[str, int]] = {}
        self._per_replica: dict[str, int] = {}
        self._counted: dict[int, tuple[str, str]] = {}  # id(decision) -> (key, replica) until done
        # key -> (decided_at, replica) of its newest routed decision, least recently routed first
        self._newest: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def routed(self, key: str, decision: RouteDecision) -> bool:
        """A request of session `key` got its first byte: count it where it belongs; True when it
        is the session's newest decision (the caller rebinds the session to its replica)."""
        replica = decision.replica.name
        newest = self._newest.get(key)
        if newest is not None and decision.decided_at < newest[0]:
            if replica == newest[1]:
                self._count(key, decision)
            return False
        self._newest[key] = (decision.decided_at, replica)
        self._newest.move_to_end(key)
        if len(self._newest) > self.MAX_KEYS:
            horizon = time.monotonic() - FIRST_BYTE_BOUND_S
            while self._newest and next(iter(self._newest.values()))[0] < horizon:
                self._newest.popitem(last=False)
        self._count(key, decision)
        return True

    def done(self, decision: RouteDecision) -> None:
        """The request of `decision` finished (counted or not)."""
        counted = self._counted.pop(id(decision), None)
        if counted is not None:
            self.finish(*counted)

    def _count(self, key: str, decision: RouteDecision) -> None:
        self.start(key, decision.replica.name)
        self._counted[id(decision)] = (key, decision.replica.name)

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


class SessionBindings:
    """Session -> replica bindings for a load-aware policy (prefix_affinity), in the Store so that
    every gateway pod follows them, with the `session` policy's bounded loads: a replica may hold
    at most ceil((1 + epsilon) * m / n) of the m sessions with a request in flight from this pod.
    Only requests with a session id are bound."""

    def __init__(self, store: Store, writes: BackgroundWrites, epsilon: float = DEFAULT_EPSILON) -> None:
        self._store = store
        self._writes = writes
        self._epsilon = epsilon
        self._ring = RingCache()
        self.active = ActiveSessions()
        self._pending: dict[str, tuple[str, float]] = {}  # key -> (replica, until): placed, not routed yet

    async def binding(self, request: RouteRequest) -> str | None:
        """The replica the request's session is bound to (None: no session id, or not bound)."""
        return await self._store.binding_get(session_key(request)) if request.session_id else None

    def _eligible(self, request: RouteRequest, costs: Sequence[ReplicaCost]) -> set[str]:
        """Replicas with room (admission's saturation) and within the bound of sessions: those
        with a request in flight, and those placed in the last PENDING_S that have not reached
        their first token yet (a long prefill: without them, sessions arriving together would all
        see an idle fleet)."""
        key = session_key(request)
        names = [c.replica.name for c in costs]
        others = self.active.others(key, names)
        now = time.monotonic()
        self._pending = {k: v for k, v in self._pending.items() if v[1] > now and not self.active.is_active(k)}
        for k, (name, _) in self._pending.items():
            if k != key and name in others:
                others[name] += 1
        sessions = self.active.total() + len(self._pending) + \
            (0 if self.active.is_active(key) or key in self._pending else 1)
        bound = key_bound(sessions, len(names), self._epsilon)
        return {c.replica.name for c in costs if others[c.replica.name] + 1 <= bound
                and (request.room is None or request.room(c.replica))}

    @staticmethod
    def keep(request: RouteRequest, bound: str | None, costs: Sequence[ReplicaCost]) -> ReplicaCost | None:
        """The bound replica among `costs` while it is not saturated (admission's `room`). None
        when there is none, it is saturated, or it is no longer a candidate. (The share of active
        sessions places new sessions only: moving a long session off an idle replica would cost
        its whole prefill.)"""
        chosen = next((c for c in costs if c.replica.name == bound), None) if bound is not None else None
        if chosen is None or (request.room is not None and not request.room(chosen.replica)):
            return None
        return chosen

    def place(self, request: RouteRequest, costs: Sequence[ReplicaCost], names: Sequence[str]) -> ReplicaCost:
        """A session without a usable binding: the first replica on its key's ring walk that has
        room and is within the bound (with room only, when none is; any, when none has room). A
        function of the key and the replicas' loads, so a session's concurrent first turns agree
        before any binding is written. `names`: every replica's name (the ring, as on every pod)."""
        ring = self._ring.get(names)
        key = session_key(request)
        roomy = {c.replica.name for c in costs if request.room is None or request.room(c.replica)}
        for eligible in (self._eligible(request, costs), roomy, {c.replica.name for c in costs}):
            name, _ = first_on_ring(ring, key, eligible)
            if name is not None:
                self._pending[key] = (name, time.monotonic() + PENDING_S)
                return next(c for c in costs if c.replica.name == name)
        raise AssertionError("no candidate")  # costs is never empty

    def routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        """(Re)bind the session to where it was routed (a new or moved session gets its replica,
        a kept one a fresh TTL; off the hot path) and count it active there."""
        if not request.session_id:
            return
        key = session_key(request)
        if self.active.routed(key, decision):  # not an older request whose first byte came late
            self._pending.pop(key, None)
            self._writes.spawn(self._store.binding_set(key, decision.replica.name))

    def finished(self, decision: RouteDecision) -> None:
        self.active.done(decision)


class SessionRouter(BaseRouter):
    def __init__(self, replicas: ReplicaSet, store: Store, epsilon: float = DEFAULT_EPSILON) -> None:
        self._replicas = replicas
        self._store = store
        self._epsilon = epsilon
        self._ring = RingCache()
        self.writes = BackgroundWrites(in_place=store.never_waits)
        self.active = ActiveSessions()

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
        # (re)bind on every request: a new or re-placed key gets its replica, a kept one a fresh
        # TTL; not an older request whose first byte came after a newer one's
        if self.active.routed(key, decision):
            self.writes.spawn(self._store.binding_set(key, decision.replica.name))

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        self.active.done(decision)
