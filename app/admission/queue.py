"""The gateway queue: requests wait here, bounded and with a TTL, while every replica *their
class* may go to is saturated, and leave in weighted fair order across tenants, then by priority,
then cheapest prefill (docs/admission.md).

Fairness is start-time fair queuing over tenants: each tenant has a virtual time that grows by
1/weight per request served; the waiting tenant with the lowest virtual time goes next, and a
tenant that starts waiting joins at the current minimum (no credit for having been idle). So a
tenant that floods the queue gets its weight's share of the departures, not the whole queue.

A request's class is its lane (`long` / `short` under `routing.lanes`, None without): the two
lanes go to different replica sets, so a departure is only for a class whose set has room (the
caller's `admissible`). Within a tenant the higher priority leaves first; then the cheaper
predicted prefill (`cost`: callers that do not rank by cost pass 0), then the earlier arrival.
Cheapest first is what keeps the short requests' TTFT tail low: a replica that frees goes to the
request that holds it least (a 2k prompt, not a 16k one that would make every request after it
wait its whole prefill). So that a stream of cheaper requests cannot hold an expensive one until
its TTL, a request that has waited `age_s` (the gateway passes half the queue TTL) leaves before
every cheaper one that has not.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_IDLE_TENANTS = 10_000


@dataclass(order=True)
class _Waiter:
    sort: tuple[int, int, int]  # (-priority, predicted prefill tokens, arrival order)
    future: asyncio.Future[None] = field(compare=False)
    klass: str | None = field(default=None, compare=False)
    since: float = field(default=0.0, compare=False)  # loop time it was queued


def _joined(clock: dict, key, waiting: list) -> None:
    """Start-time fair queuing: a key that starts waiting joins at the waiting keys' minimum."""
    floor = min((clock.get(k, 0.0) for k in waiting if k != key), default=0.0)
    clock[key] = max(clock.get(key, 0.0), floor)


class FairQueue:
    def __init__(self, max_depth: int, age_s: float = math.inf) -> None:
        self.max_depth = max_depth
        self.age_s = age_s
        self._tenants: dict[str, list[_Waiter]] = {}
        self._vtime: dict[str, float] = {}
        self._class_depth: dict[str | None, int] = {}
        self._seq = itertools.count()
        self.depth = 0

    def full(self) -> bool:
        return self.depth >= self.max_depth

    def waiting(self, klass: str | None) -> int:
        """How many requests of `klass` are queued."""
        return self._class_depth.get(klass, 0)

    def push(self, tenant: str, priority: int, cost: int = 0, klass: str | None = None) -> asyncio.Future[None]:
        """A future resolved when this request's turn comes (the caller awaits it with its TTL)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        waiters = self._tenants.setdefault(tenant, [])
        if not waiters:
            _joined(self._vtime, tenant, [t for t, w in self._tenants.items() if w])
        waiters.append(_Waiter((-priority, cost, next(self._seq)), fut, klass, loop.time()))
        self._class_depth[klass] = self._class_depth.get(klass, 0) + 1
        self.depth += 1
        return fut

    def pop(self, weight_of: dict[str, float] | None = None,
            admissible: Callable[[str | None], bool] | None = None) -> bool:
        """Release the next waiter in fair order among the classes `admissible` accepts (every
        class when None); False when none of those is waiting."""
        ok = admissible or (lambda _k: True)
        while True:
            live = [t for t, ws in self._tenants.items() if any(ok(w.klass) for w in ws)]
            if not live:
                return False
            tenant = min(live, key=lambda t: (self._vtime.get(t, 0.0), t))
            waiter = self._next_of(self._tenants[tenant], ok)
            self._remove(tenant, waiter)
            if len(self._vtime) > MAX_IDLE_TENANTS:  # bounded: idle tenants' clocks reset
                self._vtime = {t: v for t, v in self._vtime.items() if t in self._tenants or t == tenant}
            if waiter.future.done():  # timed out or cancelled: not a departure
                continue
            weight = (weight_of or {}).get(tenant, 1.0)
            self._vtime[tenant] = self._vtime.get(tenant, 0.0) + 1.0 / weight
            waiter.future.set_result(None)
            return True

    def _next_of(self, waiters: list[_Waiter], ok: Callable[[str | None], bool]) -> _Waiter:
        """A tenant's next: highest priority, then the ones waiting `age_s` or more (earliest
        first), then cheapest, then earliest."""
        aged_before = asyncio.get_running_loop().time() - self.age_s
        return min((w for w in waiters if ok(w.klass)),
                   key=lambda w: (w.sort[0], w.since > aged_before, w.sort[1] if w.since > aged_before else 0,
                                  w.sort[2]))

    def _remove(self, tenant: str, waiter: _Waiter) -> None:
        waiters = self._tenants[tenant]
        waiters.remove(waiter)
        self.depth -= 1
        self._class_depth[waiter.klass] -= 1
        if not waiters:
            del self._tenants[tenant]

    def forget(self, fut: asyncio.Future[None]) -> None:
        """A waiter that gave up (TTL, client gone): drop it now so depth stays true."""
        for tenant, waiters in self._tenants.items():
            for w in waiters:
                if w.future is fut:
                    self._remove(tenant, w)
                    return
