"""The one owner of a replica's load counters: what the proxy and the Endpoint Picker hold.

`Replica.inflight`, `queued_prompt_tokens` and `queued_long_tokens` are what the cost scorers
(app/routing/scorers.py), the long-prefill lane (app/routing/lanes.py) and the admission queue
(app/admission/gate.py) read, and under `serve --workers N` the other workers too
(`Replica.publish_load`, app/routing/siblings.py). Only `LoadHold` changes them: a request that a replica holds takes
one `hold` when it is routed there, gives its queued prefill back at its first byte
(`prefill_done`: the engine has prefilled it) and the rest at its end (`release`). Each change
sets `prefixgate_backend_inflight` and calls `on_lighter` (the admission queue's `kick`) once,
whichever data plane carried the bytes: `serve`'s forward (app/proxy/forward.py) or the EPP's
ext_proc exchange (app/epp/exchange.py).

It also keeps, per replica, the holds still waiting for their first byte, so each hold knows the
predicted prefill tokens of the other requests whose prefill overlapped its own
(`shared_prefill_tokens`): an engine step computes every scheduled request's prompt tokens, so a
request prefilled beside a long one takes the long one's time too. The prefill model
(app/telemetry/prefill_model.py) takes that term apart from the request's own cost.
"""

from __future__ import annotations

from collections.abc import Callable

from app.routing.base import Replica, RouteDecision
from app.routing.lanes import LONG
from app.telemetry.child import child
from app.telemetry.metrics import Metrics

# routing's prompt-size estimate where no fingerprint counted tokens (a passthrough body, a
# pending or missing fingerprint): bytes over this
BYTES_PER_TOKEN_ESTIMATE = 4


def estimated_tokens(size_bytes: int) -> int:
    """A body's token estimate from its size alone."""
    return size_bytes // BYTES_PER_TOKEN_ESTIMATE


class ReplicaLoad:
    """Hands out `LoadHold`s; built once per gateway."""

    def __init__(self, metrics: Metrics, on_lighter: Callable[[], None] | None = None) -> None:
        self.metrics = metrics
        self.on_lighter = on_lighter  # a replica's load went down (the admission queue re-checks)
        self._prefilling: dict[str, set[LoadHold]] = {}  # per replica: holds before their first byte

    def hold(self, decision: RouteDecision) -> LoadHold:
        """`decision`'s replica now holds the request: one routing decision counted, one more in
        flight, its predicted prefill queued (in the long lane's counter too when it is long)."""
        replica = decision.replica
        child(self.metrics.route_decisions, replica.name, decision.reason).inc()
        replica.inflight += 1
        child(self.metrics.backend_inflight, replica.name).set(replica.inflight)
        queued = decision.prefill_tokens
        long_queued = queued if decision.lane == LONG else 0
        replica.queued_prompt_tokens += queued
        replica.queued_long_tokens += long_queued
        replica.publish_load()
        hold = LoadHold(self, replica, queued, long_queued)
        prefilling = self._prefilling.setdefault(replica.name, set())
        for other in prefilling:  # their prefill and this one overlap: each counts the other's
            other.shared_prefill_tokens += queued
            hold.shared_prefill_tokens += other.queued
        prefilling.add(hold)
        return hold

    def _prefilled(self, hold: LoadHold) -> None:
        prefilling = self._prefilling.get(hold.replica.name)
        if prefilling is not None:
            prefilling.discard(hold)
            if not prefilling:
                del self._prefilling[hold.replica.name]

    def _lighter(self) -> None:
        if self.on_lighter is not None:
            self.on_lighter()


class LoadHold:
    """One request's load on one replica, given back once: `prefill_done`, then `release`."""

    __slots__ = ("load", "replica", "queued", "long_queued", "released", "shared_prefill_tokens")

    def __init__(self, load: ReplicaLoad, replica: Replica, queued: int, long_queued: int) -> None:
        self.load = load
        self.replica = replica
        self.queued = queued
        self.long_queued = long_queued
        self.released = False
        # the predicted prefill tokens of other requests on this replica whose wait for a first
        # byte overlapped this one's (final once `prefill_done` or `release` ran)
        self.shared_prefill_tokens = 0

    def _unqueue(self) -> None:
        self.load._prefilled(self)
        self.replica.queued_prompt_tokens -= self.queued
        self.replica.queued_long_tokens -= self.long_queued
        self.queued = self.long_queued = 0
        self.replica.publish_load()

    def prefill_done(self) -> None:
        """The first byte came: the engine prefilled it, a queued request may take its place."""
        if self.released:
            return
        self._unqueue()
        self.load._lighter()

    def release(self) -> None:
        """The request left the replica (any outcome); idempotent."""
        if self.released:
            return
        self.released = True
        self._unqueue()
        replica = self.replica
        replica.inflight -= 1
        replica.publish_load()
        child(self.load.metrics.backend_inflight, replica.name).set(replica.inflight)
        self.load._lighter()
