"""Recent request share per replica: exponentially decayed counts, decayed per routed request.

Cold placement bounds each replica's share of *recent* requests, not only its instantaneous load:
affinity keeps a tenant's later turns on the replica its first turn went to, so a replica that
hosts chatty tenants keeps receiving their traffic, and new tenants must go elsewhere for the
fleet to stay balanced over minutes. Decaying per request rather than per second makes the window
independent of the request rate and of a simulator's time scale.

The counts are fleet-wide: they live in the Store (`recent_add` / `recent_values`, one hash in
Redis updated by a script with the same arithmetic as `RecentRequests`), so several gateway pods
or EPP replicas behind one data plane place a cold prefix exactly as one gateway that saw every
request would (docs/epp.md, "Several EPPs, restarts"). `RecentRequests` is the in-process form
the MemoryStore keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.state.base import Store

DEFAULT_WINDOW = 128  # requests: the weight of a request halves after ~0.7 x WINDOW newer ones
_RESCALE_AT = 1e12


def growth(window: int = DEFAULT_WINDOW) -> float:
    """How much heavier each request is than the one before it (the decay, inverted)."""
    return 1.0 / (1.0 - 1.0 / max(2, window))


RESCALE_AT = _RESCALE_AT


class RecentRequests:
    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self._growth = growth(window)
        self._unit = 1.0  # weight of the next request; older ones keep their (smaller) weight
        self._counts: dict[str, float] = {}

    def add(self, name: str) -> None:
        self._unit *= self._growth
        self._counts[name] = self._counts.get(name, 0.0) + self._unit
        if self._unit > _RESCALE_AT:
            self._counts = {k: v / self._unit for k, v in self._counts.items()}
            self._unit = 1.0

    def value(self, name: str) -> float:
        """Decayed count in units of the newest request."""
        return self._counts.get(name, 0.0) / self._unit

    def forget(self, name: str) -> None:
        self._counts.pop(name, None)


class RecentShares:
    """The router's view of the fleet-wide counts, through the Store (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def add(self, name: str) -> None:
        await self.store.recent_add(name)

    async def values(self, names: list[str]) -> dict[str, float]:
        return await self.store.recent_values(names)
