"""The live load of a gateway's other worker processes (`serve --workers N`), per replica.

Each worker counts its own requests live (app/routing/load.py) and everything else on a replica
from the engine's last scrape (`Replica.engine_foreign`). Without this table a sibling worker's
request is "foreign": a scrape that caught it kept weighing on its replica, as a waiting request
priced at 2,048 tokens, until the next scrape up to `scrape.interval_s` later, long after it had
finished, and could move a conversation's next turn off the replica holding its prefix
(`load_override`; docs/operations.md).

`SiblingLoads` is one anonymous shared memory mapping, made by the master before it forks the
workers, so every worker maps the same pages. Layout: SLOTS keys (a replica name's 16-byte
BLAKE2b digest, assigned under a lock once per name and worker), then one row of SLOTS x 3
int64 counters per worker (in flight, queued prompt tokens, queued long-lane tokens). A worker
writes only its own row; each counter is one aligned 8-byte store, so a reader never sees a torn
value, only a row that is a few instructions old. Reading a replica's siblings costs N - 1 rows'
three loads: O(workers), no system call, no lock.

A worker that dies leaves its row behind, but the master then stops the others (app/workers.py).
Past SLOTS distinct replica names (discovery churn), a new replica is not shared: its siblings
read as none, as before this table existed, and a warning says so once.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import multiprocessing

log = logging.getLogger("prefixgate.routing.siblings")

SLOTS = 1024  # replica names a gateway's workers can share load for
KEY_BYTES = 16
FIELDS = 3  # in flight, queued prompt tokens, queued long-lane tokens


class SiblingLoads:
    """The shared table (see the module docstring). Made before the fork; each worker then calls
    `bind(index)` on its inherited copy."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.index = -1  # this process's row; -1 until `bind`
        self._keys_bytes = SLOTS * KEY_BYTES
        self._map = mmap.mmap(-1, self._keys_bytes + workers * SLOTS * FIELDS * 8)  # MAP_SHARED
        self._counts = memoryview(self._map)[self._keys_bytes:].cast("q")
        self._lock = multiprocessing.get_context("fork").Lock()
        self._slots: dict[str, int | None] = {}
        self._warned = False

    def bind(self, index: int) -> None:
        if not 0 <= index < self.workers:
            raise ValueError(f"worker index {index} out of 0..{self.workers - 1}")
        self.index = index

    def view(self, name: str) -> SiblingView | None:
        """The counters of replica `name` (None when the table is full)."""
        slot = self._slot(name)
        return SiblingView(self, slot) if slot is not None else None

    def _slot(self, name: str) -> int | None:
        if name in self._slots:
            return self._slots[name]
        key = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES).digest()
        slot: int | None = None
        with self._lock:
            at = 0
            while True:  # a digest found at a slot boundary; anything else is a chance match across slots
                at = self._map.find(key, at, self._keys_bytes)
                if at < 0 or at % KEY_BYTES == 0:
                    break
                at += 1
            if at >= 0:
                slot = at // KEY_BYTES
            else:
                free = self._map.find(bytes(KEY_BYTES), 0, self._keys_bytes)
                while free >= 0 and free % KEY_BYTES:
                    free = self._map.find(bytes(KEY_BYTES), free + 1, self._keys_bytes)
                if free >= 0:
                    self._map[free:free + KEY_BYTES] = key
                    slot = free // KEY_BYTES
        if slot is None and not self._warned:
            self._warned = True
            log.warning("sibling load table full (%d replica names): replica %s is not shared between workers",
                        SLOTS, name)
        self._slots[name] = slot
        return slot

    def close(self) -> None:
        self._counts.release()
        self._map.close()


class SiblingView:
    """One replica's counters: this worker writes its own, reads the others' sums."""

    __slots__ = ("_counts", "_own", "_others")

    def __init__(self, table: SiblingLoads, slot: int) -> None:
        self._counts = table._counts
        row = SLOTS * FIELDS
        base = slot * FIELDS
        self._own = table.index * row + base
        self._others = [w * row + base for w in range(table.workers) if w != table.index]

    def publish(self, inflight: int, queued: int, long_queued: int) -> None:
        counts, at = self._counts, self._own
        counts[at] = inflight
        counts[at + 1] = queued
        counts[at + 2] = long_queued

    def others(self) -> tuple[int, int, int]:
        """(in flight, queued prompt tokens, queued long-lane tokens) of the other workers."""
        counts = self._counts
        inflight = queued = long_queued = 0
        for at in self._others:
            inflight += counts[at]
            queued += counts[at + 1]
            long_queued += counts[at + 2]
        return max(0, inflight), max(0, queued), max(0, long_queued)

