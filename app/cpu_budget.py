"""A share of one core for optional work (break diagnosis), as a bucket of CPU seconds.

The bucket refills at `share` CPU-seconds per second of wall time and holds at most
`share * burst_s`. Work may start while it is not empty and is charged afterwards with the CPU it
measured, so one long job can take it below zero; what follows waits for the refill. Over any
stretch of time the work started costs at most `share` of a core plus the burst and one job.
Thread-safe: the event loop asks, the thread that did the work charges.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BURST_S = 2.0  # the bucket holds this many seconds of refill: a burst of breaks after a quiet spell


class CpuBudget:
    def __init__(self, share: float, burst_s: float = BURST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.share = max(0.0, share)
        self.capacity = self.share * burst_s
        self._level = self.capacity
        self._clock = clock
        self._at = clock()
        self._lock = threading.Lock()

    def allows(self) -> bool:
        """May work start now (the bucket, refilled to now, is not empty)?"""
        with self._lock:
            now = self._clock()
            self._level = min(self.capacity, self._level + (now - self._at) * self.share)
            self._at = now
            return self._level > 0

    def charge(self, cpu_s: float) -> None:
        """Take what a job measured from the bucket."""
        with self._lock:
            self._level -= cpu_s
