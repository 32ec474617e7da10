"""Pickers: the last step of a policy, one replica out of the filtered and scored candidates.

- `lowest_cost`: the lowest total of the scorers (prefix_affinity); ties go to the longer
  resident prefix, then fewer requests in flight, then the name, so the pick is deterministic.
- `Turns`: a rotating start, for round-robin and for breaking ties so an idle fleet is spread.
- Bounded-load hashing (`app/routing/ring.py`, `first_on_ring`): the first replica on a key's
  ring walk among those with room (session, and prefix_affinity's cold prompts).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

from app.routing.scorers import ReplicaCost

T = TypeVar("T")


def lowest_cost(costs: list[ReplicaCost]) -> ReplicaCost:
    return min(costs, key=lambda c: (c.total, -c.matched_blocks, c.replica.gateway_inflight(), c.replica.name))


class Turns:
    """Round-robin positions: `next(items)` is the item whose turn it is; `offsets(n)` the
    distance of each of n positions from this turn's start (for tie-breaking)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next(self, items: Sequence[T]) -> T:
        return items[next(self._counter) % len(items)]

    def offsets(self, n: int) -> list[int]:
        turn = next(self._counter)
        return [(i - turn) % n for i in range(n)]
