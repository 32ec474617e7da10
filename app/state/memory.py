"""In-process Store: the embedded default (one gateway pod, or the sidecar).

Residency per replica is an LRU of block hashes with a TTL, bounded at the replica's KV capacity.
Chains are inserted tail-first so that block 0 is the most recently used: eviction then removes
tail blocks before the head, as vLLM's free queue does (blocks of a finished request are freed in
reverse order). Every add is a whole chain from its root, so each block's parent is present and
more recent than it: the resident set stays prefix-closed, and `residency_lookup` binary-searches
the leading resident run instead of scanning a 15k-block chain. Adding whole chains, touching
(never inserting) on a hit and removing whole subtrees is the caller's part: the residency owner
(app/routing/residency.py, docs/routing.md) is the only writer.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from app.routing.recent import RecentRequests
from app.state.base import Store

DEFAULT_CAPACITY_BLOCKS = 4096
DEFAULT_TTL_S = 3600.0
DEFAULT_HISTORY = 64
DEFAULT_MAX_TENANTS = 10_000
DEFAULT_MAX_BINDINGS = 100_000
ADD_SLICE_BLOCKS = 4096  # ~0.3 ms of LRU moves: the longest a residency write holds the event loop


class _Residency:
    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self.blocks: OrderedDict[int, float] = OrderedDict()  # hash -> expiry; last = most recent
        self.writers = 0  # sliced adds in flight (MemoryStore.residency_add): trims wait for them

    def add(self, hashes: list[int]) -> int:
        self.refresh(hashes, self._clock() + self.ttl_s)
        return self.trim()

    def refresh(self, hashes: list[int], expiry: float, only_present: bool = False) -> None:
        """Insert or refresh `hashes` as the most recent, tail first (no trim). `only_present`:
        refresh the ones present and insert none (a touch: a block removed meanwhile stays so)."""
        blocks = self.blocks
        move = blocks.move_to_end
        for h in reversed(hashes):
            if only_present and h not in blocks:
                continue
            blocks[h] = expiry
            move(h)

    async def refresh_sliced(self, hashes: list[int], expiry: float, only_present: bool = False) -> None:
        """`refresh` in slices of ADD_SLICE_BLOCKS from the tail, yielding between them."""
        end = len(hashes)
        while end > 0:
            self.refresh(hashes[max(0, end - ADD_SLICE_BLOCKS):end], expiry, only_present)
            end -= ADD_SLICE_BLOCKS
            if end > 0:
                await asyncio.sleep(0)

    def insert(self, hashes: list[int], expiry: float) -> None:
        """Make `hashes` present, in order (new ones become the most recent), without moving
        the ones already present."""
        blocks = self.blocks
        for h in hashes:
            blocks[h] = expiry

    def trim(self) -> int:
        if self.writers:
            return 0  # the last sliced add in flight trims
        evicted = 0
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
            evicted += 1
        return evicted

    def has(self, h: int, now: float) -> bool:
        expiry = self.blocks.get(h)
        if expiry is None:
            return False
        if expiry < now:
            del self.blocks[h]
            return False
        return True

    def leading(self, hashes: list[int]) -> int:
        """Length of the leading resident run: a binary search, exact because the set is
        prefix-closed (app/routing/residency.py, the only writer, keeps it so)."""
        now = self._clock()
        lo, hi = 0, len(hashes)  # invariant: hashes[:lo] resident, hashes[hi:] not known resident
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.has(hashes[mid - 1], now):
                lo = mid
            else:
                hi = mid - 1
        return lo


class MemoryStore(Store):
    """Store protocol (app/state/base.py) on plain dicts; every structure is bounded."""

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
        self._residency: dict[str, _Residency] = {}
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
    def _replica(self, replica: str) -> _Residency:
        res = self._residency.get(replica)
        if res is None:
            res = self._residency[replica] = _Residency(self.default_capacity, self.ttl_s, self._clock)
        return res

    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        res = self._replica(replica)
        res.capacity = max(1, capacity_blocks)
        res.add([])  # trims to the new bound

    async def residency_lookup(self, block_hashes: list[int], replicas: list[str]) -> dict[str, int]:
        return self.residency_lookup_sync(block_hashes, replicas)

    def residency_lookup_sync(self, block_hashes: list[int], replicas: list[str]) -> dict[str, int]:
        return {r: (self._residency[r].leading(block_hashes) if r in self._residency else 0) for r in replicas}

    async def residency_add(self, replica: str, block_hashes: list[int]) -> None:
        """Adds the chain in slices of ADD_SLICE_BLOCKS, yielding to the event loop between them
        (a 1 MB prompt is ~25k blocks: ~2 ms of OrderedDict moves in one go), in two passes so
        that every state a concurrent lookup can see is one a single pass could leave:
        1. the blocks after the leading resident run become present head first, so the
           resident set stays prefix-closed (the binary search in `leading` stays exact);
        2. the whole chain moves to the most recent end tail first, which changes only the order,
           ending in the single pass's order (block 0 most recent).
        Trims wait until no sliced add is in flight: one evicting between two slices of pass 2
        would take this chain's not-yet-refreshed head before its tail."""
        res = self._replica(replica)
        expiry = self._clock() + self.ttl_s
        n = len(block_hashes)
        if n <= ADD_SLICE_BLOCKS:
            res.refresh(block_hashes, expiry)
            res.trim()
            return
        res.writers += 1
        try:
            start = res.leading(block_hashes)
            while start < n:
                res.insert(block_hashes[start:start + ADD_SLICE_BLOCKS], expiry)
                start += ADD_SLICE_BLOCKS
                await asyncio.sleep(0)
            await res.refresh_sliced(block_hashes, expiry)
        finally:
            res.writers -= 1
        res.trim()

    async def residency_touch(self, replica: str, block_hashes: list[int]) -> None:
        """Mark the resident blocks of a chain as just used, as the engine does on a hit: present
        ones move to the most recent end tail first (absent ones stay absent), in slices like
        `residency_add`'s second pass."""
        res = self._residency.get(replica)
        if res is None:
            return
        res.writers += 1
        try:
            await res.refresh_sliced(block_hashes, self._clock() + self.ttl_s, only_present=True)
        finally:
            res.writers -= 1
        res.trim()  # an add that ran meanwhile left its trim to the last writer

    async def residency_remove(self, replica: str, block_hashes: list[int]) -> None:
        res = self._residency.get(replica)
        if res is not None:
            for h in block_hashes:
                res.blocks.pop(h, None)

    async def residency_clear(self, replica: str) -> None:
        res = self._residency.get(replica)
        if res is not None:
            res.blocks.clear()  # keep the replica's capacity (AllBlocksCleared is not a resize)

    def residency_size(self, replica: str) -> int:
        res = self._residency.get(replica)
        return len(res.blocks) if res else 0

    def residency_hashes(self, replica: str) -> set[int]:
        res = self._residency.get(replica)
        return set(res.blocks) if res else set()

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
        return list(hist)[-limit:]

    async def counter_incr(self, tenant: str, field: str, amount: float = 1.0) -> None:
        counters = self._counters.setdefault(tenant, {})
        counters[field] = counters.get(field, 0.0) + amount

    async def counters(self, tenant: str) -> dict[str, float]:
        return dict(self._counters.get(tenant, {}))

    async def tenants(self) -> list[str]:
        return list(dict.fromkeys([*self._history, *self._counters]))
