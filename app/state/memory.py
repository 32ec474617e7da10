"""In-process Store: the embedded default (one gateway pod, or the sidecar).

Residency per replica is a tree of runs (app/prefix/runs.py) bounded at the replica's KV capacity,
with a TTL: prefix-closed by construction, evicted from the least recent leaf run tail first, as
vLLM's free queue frees a finished request's blocks; an add or a hit costs a step per run on the
chain's path plus the new blocks, never a step per known block. Adding whole chains, touching
(never inserting) on a hit and removing whole subtrees is the caller's part: the residency owner
(app/routing/residency.py, docs/routing.md) is the only writer.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import islice

from app.prefix.runs import RunTree
from app.routing.recent import RecentRequests
from app.state.base import Store

DEFAULT_CAPACITY_BLOCKS = 4096
DEFAULT_TTL_S = 3600.0
DEFAULT_HISTORY = 64
DEFAULT_MAX_TENANTS = 10_000
DEFAULT_MAX_BINDINGS = 100_000


class MemoryStore(Store):
    """Store protocol (app/state/base.py) on plain dicts; every structure is bounded."""

    never_waits = True

    def __init__(
        self,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        ttl_s: float = DEFAULT_TTL_S,
        history_len: int = DEFAULT_HISTORY,
        max_tenants: int = DEFAULT_MAX_TENANTS,
        max_bindings: int = DEFAULT_MAX_BINDINGS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default_capacity = capacity_blocks
        self.ttl_s = ttl_s
        self.history_len = history_len
        self.max_tenants = max_tenants
        self.max_bindings = max_bindings
        self._clock = clock
        self._residency: dict[str, RunTree] = {}
        self._bindings: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._history: OrderedDict[str, deque[dict]] = OrderedDict()
        self._counters: dict[str, dict[str, float]] = {}
        self._recent = RecentRequests()
        self.evicted_tenants = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def up(self) -> bool:
        return True

    # ------------------------------------------------------------- residency
    def _replica(self, replica: str) -> RunTree:
        res = self._residency.get(replica)
        if res is None:
            res = self._residency[replica] = RunTree(self.default_capacity, self.ttl_s, self._clock)
        return res

    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        res = self._replica(replica)
        res.capacity = max(1, capacity_blocks)
        res.add([])  # trims to the new bound

    async def residency_lookup(self, block_hashes: Sequence[int], replicas: list[str]) -> dict[str, int]:
        return self.residency_lookup_sync(block_hashes, replicas)

    def residency_lookup_sync(self, block_hashes: Sequence[int], replicas: list[str]) -> dict[str, int]:
        return {r: (self._residency[r].leading(block_hashes) if r in self._residency else 0) for r in replicas}

    async def residency_add(self, replica: str, block_hashes: Sequence[int]) -> None:
        """One step, no slices: only the new blocks are copied (at C speed), the known part of the
        chain costs a step per run on its path (see the module docstring)."""
        self._replica(replica).add(block_hashes)

    async def residency_touch(self, replica: str, block_hashes: Sequence[int]) -> None:
        """Mark the leading resident run of a chain as just used, as the engine does on a hit
        (absent blocks stay absent)."""
        res = self._residency.get(replica)
        if res is not None:
            res.touch(block_hashes)

    async def residency_remove(self, replica: str, block_hashes: list[int]) -> None:
        """Remove the blocks, each with its descendants (the owner passes them anyway)."""
        res = self._residency.get(replica)
        if res is not None:
            res.remove(block_hashes)

    async def residency_clear(self, replica: str) -> None:
        res = self._residency.get(replica)
        if res is not None:
            res.clear()  # keep the replica's capacity (AllBlocksCleared is not a resize)

    def residency_size(self, replica: str) -> int:
        res = self._residency.get(replica)
        return res.size if res else 0

    def residency_hashes(self, replica: str) -> set[int]:
        res = self._residency.get(replica)
        return res.held() if res else set()

    def residency_bytes(self) -> int:
        """Bytes the residency index holds, every replica (RUN_BYTES, WHERE_ENTRY_BYTES)."""
        return sum(res.nbytes() for res in self._residency.values())

    # ------------------------------------------------------------- recent placements
    async def recent_add(self, replica: str) -> None:
        self._recent.add(replica)

    async def recent_values(self, replicas: list[str]) -> dict[str, float]:
        return {r: self._recent.value(r) for r in replicas}

    # ------------------------------------------------------------- bindings
    async def binding_get(self, key: str) -> str | None:
        item = self._bindings.get(key)
        if item is None:
            return None
        replica, expiry = item
        if expiry < self._clock():
            del self._bindings[key]
            return None
        return replica

    async def binding_set(self, key: str, replica: str) -> None:
        self._bindings[key] = (replica, self._clock() + self.ttl_s)
        self._bindings.move_to_end(key)
        while len(self._bindings) > self.max_bindings:
            self._bindings.popitem(last=False)

    # ------------------------------------------------------------- tenant history and counters
    async def history_append(self, tenant: str, record: dict) -> None:
        hist = self._history.get(tenant)
        if hist is None:
            hist = self._history[tenant] = deque(maxlen=self.history_len)
            while len(self._history) > self.max_tenants:
                evicted, _ = self._history.popitem(last=False)
                self._counters.pop(evicted, None)
                self.evicted_tenants += 1
        self._history.move_to_end(tenant)
        hist.append(record)

    async def history_recent(self, tenant: str, limit: int) -> list[dict]:
        hist = self._history.get(tenant)
        if not hist:
            return []
        return list(islice(reversed(hist), limit))[::-1]  # not a copy of the whole history

    async def counter_incr(self, tenant: str, field: str, amount: float = 1.0) -> None:
        counters = self._counters.setdefault(tenant, {})
        counters[field] = counters.get(field, 0.0) + amount

    async def counters(self, tenant: str) -> dict[str, float]:
        return dict(self._counters.get(tenant, {}))

    async def tenants(self) -> list[str]:
        return list(dict.fromkeys([*self._history, *self._counters]))
