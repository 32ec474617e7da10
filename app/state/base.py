"""The shared-state seam. In-memory (default, one process), the embedded shared store of
`serve --workers N` and Redis (several gateway pods) implement it. Every method is async (but
`up` and `set_capacity`) and must degrade gracefully: a Store that lost its backend keeps
answering from local state and reports `up() == False`.

What is shared: the per-replica residency index (block hashes, TTL/LRU bounded), the recent
placements cold prefixes are spread by, session/tenant -> replica bindings, response owners,
per-tenant continuity history (bounded), and the counters behind /hygiene.

`Store` is an abstract base, not a structural protocol: every implementation subclasses it, and a
class that misses a method, or defines one with another parameter list or sync where the contract
is async, is a TypeError when its module is imported, never an AttributeError at a customer's
request. The contract each method keeps is tested once for every implementation
(tests/test_store_conformance.py).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

RESPONSE_OWNER_KEY = "response:"  # binding-key prefix of response owners (never a session/tenant key)
LIFECYCLE = frozenset({"start", "close", "up"})  # the methods that are not the shared data


def response_owner_key(response_id: str) -> str:
    return RESPONSE_OWNER_KEY + response_id


class Store(ABC):
    # True when no method ever waits on I/O (the in-memory store): the routers' background writes
    # are then done in place, with no task each (app/routing/background.py)
    never_waits: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        problems = contract_problems(cls)
        if problems:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} breaks the Store contract: " + "; ".join(problems))

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def up(self) -> bool: ...

    # residency index: replica -> set of block hashes (bounded per replica, with TTL). The sets
    # must be prefix-closed; app/routing/residency.py, their only writer, keeps them so.
    @abstractmethod
    async def residency_lookup(self, block_hashes: Sequence[int], replicas: list[str]) -> dict[str, int]:
        """Leading blocks of `block_hashes` resident per replica (one round trip)."""

    @abstractmethod
    async def residency_add(self, replica: str, block_hashes: Sequence[int]) -> None:
        """Insert or refresh a whole chain, head first (the head becomes the most recent)."""

    @abstractmethod
    async def residency_touch(self, replica: str, block_hashes: Sequence[int]) -> None:
        """Refresh the blocks of a chain that are present (a hit); never insert one."""

    @abstractmethod
    def set_capacity(self, replica: str, capacity_blocks: int) -> None: ...

    @abstractmethod
    async def residency_remove(self, replica: str, block_hashes: list[int]) -> None: ...

    @abstractmethod
    async def residency_clear(self, replica: str) -> None: ...

    # recent placements: decayed request counts per replica, fleet-wide (app/routing/recent.py)
    @abstractmethod
    async def recent_add(self, replica: str) -> None: ...

    @abstractmethod
    async def recent_values(self, replicas: list[str]) -> dict[str, float]: ...

    # bindings: key (session or tenant) -> replica name, with the Store's TTL; the last set wins
    @abstractmethod
    async def binding_get(self, key: str) -> str | None: ...

    @abstractmethod
    async def binding_set(self, key: str, replica: str) -> None: ...

    # response owners (Responses API `store`): response id -> the replica that holds it. A binding
    # in its own key space (same TTL and bounds, shared wherever bindings are), so every Store
    # gets it from its bindings and none can lack it.
    async def response_owner_get(self, response_id: str) -> str | None:
        return await self.binding_get(response_owner_key(response_id))

    async def response_owner_set(self, response_id: str, replica: str) -> None:
        await self.binding_set(response_owner_key(response_id), replica)

    # tenant history: recent records per tenant (bounded, oldest first), report counters, and the
    # tenants known (bounded: evicting a tenant drops its history and counters together)
    @abstractmethod
    async def history_append(self, tenant: str, record: dict) -> None: ...

    @abstractmethod
    async def history_recent(self, tenant: str, limit: int) -> list[dict]: ...

    @abstractmethod
    async def counter_incr(self, tenant: str, field: str, amount: float = 1.0) -> None: ...

    @abstractmethod
    async def counters(self, tenant: str) -> dict[str, float]: ...

    @abstractmethod
    async def tenants(self) -> list[str]: ...


def contract_methods() -> frozenset[str]:
    """Every method of the contract (the abstract ones and those the base implements)."""
    return frozenset(name for name, member in vars(Store).items()
                     if inspect.isfunction(member) and not name.startswith("_"))


def contract_problems(cls: type) -> list[str]:
    """How `cls` departs from the contract: a method missing, sync where the contract is async (or
    the other way round), or with other parameters. Empty for a conforming class."""
    problems = []
    for name in sorted(contract_methods()):
        want, have = getattr(Store, name), getattr(cls, name, None)
        if have is None or getattr(have, "__isabstractmethod__", False):
            problems.append(f"{name} missing")
        elif inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(have):
            problems.append(f"{name} must be {'async' if inspect.iscoroutinefunction(want) else 'sync'}")
        elif _parameters(want) != _parameters(have):
            problems.append(f"{name}{_parameters(have)} is not {name}{_parameters(want)}")
    return problems


def _parameters(fn: Callable[..., object]) -> str:
    """The parameter names and defaults, as written: `(self, tenant, field, amount=1.0)`."""
    params = inspect.signature(fn).parameters.values()
    return "(" + ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params) + ")"
