"""Filters: which replicas may take a request at all, before any scorer looks at them.

Each filter narrows a list of replicas for one request; `candidates` applies them in order
(healthy, serves the model, not tried yet) and raises NoReplicaAvailable when none is left. A
retry passes through the same filters, so it never lands on a replica that was already tried,
is down, or does not serve the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.routing.base import NoReplicaAvailable, Replica, RouteRequest
from app.routing.replicas import ReplicaSet

Filter = Callable[[list[Replica], RouteRequest], list[Replica]]


def healthy(replicas: list[Replica], request: RouteRequest) -> list[Replica]:
    return [r for r in replicas if r.healthy]


def serves_model(replicas: list[Replica], request: RouteRequest) -> list[Replica]:
    """Replicas whose own /v1/models lists the request's model (a base model or a LoRA adapter).
    Until some replica has reported its list nothing is known and nothing is filtered out; after
    that, a replica whose list is unknown is not taken to serve the model."""
    if request.model is None or all(r.models is None for r in replicas):
        return replicas
    return [r for r in replicas if r.models is not None and request.model in r.models]


def pinned(replicas: list[Replica], request: RouteRequest) -> list[Replica]:
    """Only the replica the request is pinned to (a stored Responses API id lives there alone)."""
    if request.pinned is None:
        return replicas
    return [r for r in replicas if r.name == request.pinned]


DEFAULT_FILTERS: tuple[Filter, ...] = (healthy, serves_model, pinned)


def candidates(replicas: ReplicaSet, request: RouteRequest, exclude: frozenset[str] = frozenset(),
               filters: Sequence[Filter] = DEFAULT_FILTERS) -> list[Replica]:
    """Replicas that pass every filter and were not tried yet; NoReplicaAvailable when none."""
    out = replicas.all()
    for keep in filters:
        out = keep(out, request)
    out = [r for r in out if r.name not in exclude]
    if not out:
        raise NoReplicaAvailable(f"no healthy replica serving {request.model!r} left to try"
                                 if request.model else "no healthy replica available")
    return out
