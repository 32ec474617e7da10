"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

A key walks the ring clockwise from its position and takes the first replica with room under the
bound, so no replica carries more than (1 + epsilon) x its fair share while keys keep their
replica as long as it has room. In the method the balls are the keys: with m keys on n replicas
each replica holds at most ceil((1 + epsilon) * m / n) of them (`key_bound`; the `session`
policy). `within_bound` is the fractional form for a load share (`prefix_affinity` bounds each
replica's share of recent requests when it spreads cold prefixes). Adding or removing a replica
moves only the keys that hashed near it, and the ring depends only on replica names, so the same
key lands on the same replica across turns and across gateway pods.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence

DEFAULT_VNODES = 64  # virtual nodes per replica: keeps the share of each replica within ~15 %
DEFAULT_EPSILON = 0.25  # load bound slack; ~1.25 max/mean is the imbalance target


def stable_hash(data: bytes) -> int:
    """64-bit hash that is the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def key_hash(key: str | int) -> int:
    if isinstance(key, int):
        return stable_hash(key.to_bytes(8, "big", signed=False) if key >= 0 else str(key).encode())
    return stable_hash(key.encode())


class HashRing:
    def __init__(self, names: Sequence[str], vnodes: int = DEFAULT_VNODES) -> None:
        self.names = tuple(sorted(set(names)))
        points = sorted((stable_hash(f"{n}#{i}".encode()), n) for n in self.names for i in range(vnodes))
        self._points = [p for p, _ in points]
        self._owners = [n for _, n in points]

    def walk(self, key: str | int) -> Iterator[str]:
        """Distinct replica names in ring order starting at the key's position."""
        if not self._points:
            return
        start = bisect.bisect_left(self._points, key_hash(key)) % len(self._points)
        seen: set[str] = set()
        n = len(self._points)
        for i in range(n):
            owner = self._owners[(start + i) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.names):
                    return


def key_bound(keys: int, replicas: int, epsilon: float) -> int:
    """Most keys one replica may hold when `keys` keys (the new one included) share `replicas`
    replicas: ceil((1 + epsilon) * keys / replicas), at least 1."""
    if replicas <= 0:
        return 0
    return max(1, math.ceil((1.0 + epsilon) * keys / replicas - 1e-9))


def load_bound(loads: Mapping[str, float], new_load: float, epsilon: float) -> float:
    """Most load a replica may already carry and still take the new item."""
    if not loads:
        return 0.0
    return (1.0 + epsilon) * (sum(loads.values()) + new_load) / len(loads)


def within_bound(loads: Mapping[str, float], new_load: float, epsilon: float) -> set[str]:
    """Replicas that may take the new item without exceeding (1 + epsilon) x the mean."""
    bound = load_bound(loads, new_load, epsilon)
    return {name for name, load in loads.items() if load <= bound}


def first_on_ring(ring: HashRing, key: str | int, eligible: set[str]) -> tuple[str | None, bool]:
    """(first eligible replica walking from the key, True if it is the key's first choice)."""
    for i, name in enumerate(ring.walk(key)):
        if name in eligible:
            return name, i == 0
    return None, False


class RingCache:
    """Rebuilds the ring only when the set of replica names changes."""

    def __init__(self, vnodes: int = DEFAULT_VNODES) -> None:
        self._vnodes = vnodes
        self._ring = HashRing((), vnodes)

    def get(self, names: Sequence[str]) -> HashRing:
        if tuple(sorted(set(names))) != self._ring.names:
            self._ring = HashRing(names, self._vnodes)
        return self._ring
