"""The gateway queue: requests wait here, bounded and with a TTL, while every eligible replica is
saturated, and leave in weighted fair order across tenants, then by priority (docs/admission.md).

Fairness is start-time fair queuing over tenants: each tenant has a virtual time that grows by
1/weight per request served; the waiting tenant with the lowest virtual time goes next, and a
tenant that starts waiting joins at the current minimum (no credit for having been idle). So a
tenant that floods the queue gets its weight's share of the departures, not the whole queue.
Within a tenant the higher priority leaves first, then the cheaper predicted prefill (`cost`: a
short prompt is not held behind a long cold one; callers that do not rank by cost pass 0), then
the earlier arrival. A request that keeps losing on cost is bounded by the queue's TTL.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

MAX_IDLE_TENANTS = 10_000


@dataclass(order=True)
class _Waiter:
    sort: tuple[int, int, int]  # (-priority, predicted prefill tokens, arrival order)
    future: asyncio.Future[None] = field(compare=False)


class FairQueue:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self._tenants: dict[str, list[_Waiter]] = {}
        self._vtime: dict[str, float] = {}
        self._seq = itertools.count()
        self.depth = 0

    def full(self) -> bool:
        return self.depth >= self.max_depth

    def push(self, tenant: str, priority: int, cost: int = 0) -> asyncio.Future[None]:
        """A future resolved when this request's turn comes (the caller awaits it with its TTL)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heap = self._tenants.setdefault(tenant, [])
        if not heap:
            floor = min((self._vtime[t] for t in self._tenants if self._tenants[t] and t != tenant), default=0.0)
            self._vtime[tenant] = max(self._vtime.get(tenant, 0.0), floor)
        heapq.heappush(heap, _Waiter((-priority, cost, next(self._seq)), fut))
        self.depth += 1
        return fut

    def pop(self, weight_of: dict[str, float] | None = None) -> bool:
        """Release the next waiter in fair order; False when none is waiting."""
        while True:
            live = [t for t, h in self._tenants.items() if h]
            if not live:
                return False
            tenant = min(live, key=lambda t: (self._vtime.get(t, 0.0), t))
            heap = self._tenants[tenant]
            waiter = heapq.heappop(heap)
            self.depth -= 1
            if not heap:
                del self._tenants[tenant]
                if len(self._vtime) > MAX_IDLE_TENANTS:  # bounded: idle tenants' clocks reset
                    self._vtime = {t: v for t, v in self._vtime.items() if t in self._tenants or t == tenant}
            if waiter.future.done():  # timed out or cancelled: not a departure
                continue
            weight = (weight_of or {}).get(tenant, 1.0)
            self._vtime[tenant] = self._vtime.get(tenant, 0.0) + 1.0 / weight
            waiter.future.set_result(None)
            return True

    def forget(self, fut: asyncio.Future[None]) -> None:
        """A waiter that gave up (TTL, client gone): drop it now so depth stays true."""
        for tenant, heap in self._tenants.items():
            for i, w in enumerate(heap):
                if w.future is fut:
                    heap.pop(i)
                    heapq.heapify(heap)
                    self.depth -= 1
                    if not heap:
                        del self._tenants[tenant]
                    return
