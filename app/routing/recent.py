"""Recent request share per replica: exponentially decayed counts, decayed per routed request.

Cold placement bounds each replica's share of *recent* requests, not only its instantaneous load:
affinity keeps a tenant's later turns on the replica its first turn went to, so a replica that
hosts chatty tenants keeps receiving their traffic, and new tenants must go elsewhere for the
fleet to stay balanced over minutes. Decaying per request rather than per second makes the window
independent of the request rate and of a simulator's time scale.
"""

from __future__ import annotations

DEFAULT_WINDOW = 128  # requests: the weight of a request halves after ~0.7 x WINDOW newer ones
_RESCALE_AT = 1e12


class RecentRequests:
    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self._growth = 1.0 / (1.0 - 1.0 / max(2, window))
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
