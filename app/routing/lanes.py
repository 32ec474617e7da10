"""The long-prefill lane (`routing.lanes`): a filter that keeps short requests from queueing
behind long uncached prefills (docs/admission.md).

Under load a request's TTFT is mostly the prefill queued in front of it on its replica, and the
long *uncached* prompts set that queue: chunked prefill spreads a 16k prompt over steps but the
engine still runs those steps before a request that arrives after it. The gateway knows each
request's predicted prefill (prompt minus the prefix predicted resident, from the residency
index) before it forwards, so it can sort requests into lanes:

- a request is **long** when its predicted uncached prefill, on the replica holding most of its
  prefix, exceeds `long_prefill_tokens` (a warm 200k prompt is short; a cold 16k one is long);
- **dedicated** mode (`replicas` set): long requests go only to those replicas, short ones only
  to the others (either side falls back to the whole pool when none of its replicas is left);
- **shared** mode (no `replicas`): at most `max_share` of the candidate replicas (at least one)
  may hold a long prefill at once, and a replica holds at most one long prefill at a time unless
  every long-capable replica already does; short requests avoid replicas with a long prefill in
  flight while another replica has none. So a short request waits behind at most one long one,
  and never more than `max_share` of the fleet is busy with long prefills.

Inside a lane the policy's own scorers still decide (affinity applies). A replica's long prefill
in flight is `Replica.queued_long_tokens`, held like `queued_prompt_tokens` by the one load owner
(app/routing/load.py) that `serve`'s forward and the Endpoint Picker both use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.config import Lanes
from app.routing.base import Replica

LONG = "long"
SHORT = "short"


@dataclass(frozen=True)
class LaneOptions:
    long_prefill_tokens: int = 8192
    replicas: frozenset[str] = frozenset()
    max_share: float = 0.5


class LongPrefillLane:
    def __init__(self, options: LaneOptions) -> None:
        self.options = options

    @classmethod
    def from_config(cls, lanes: Lanes) -> LongPrefillLane:
        """The lane `routing.lanes` configures (the router and the admission queue share it)."""
        return cls(LaneOptions(lanes.long_prefill_tokens, frozenset(lanes.replicas), lanes.max_share))

    def lane_of(self, predicted_prefill_tokens: int) -> str:
        return LONG if predicted_prefill_tokens > self.options.long_prefill_tokens else SHORT

    def keep(self, pool: list[Replica], lane: str) -> list[Replica]:
        """The replicas of `pool` a request of `lane` may go to (never empty when pool is not)."""
        if self.options.replicas:
            return self._dedicated(pool, lane)
        return self._shared(pool, lane)

    def _dedicated(self, pool: list[Replica], lane: str) -> list[Replica]:
        names = self.options.replicas
        out = [r for r in pool if (r.name in names) == (lane == LONG)]
        return out or pool

    def _shared(self, pool: list[Replica], lane: str) -> list[Replica]:
        busy = [r for r in pool if r.queued_long_tokens > 0]
        free = [r for r in pool if r.queued_long_tokens <= 0]
        if lane == SHORT:
            return free or pool
        cap = max(1, math.floor(self.options.max_share * len(pool)))
        if len(busy) < cap and free:
            return free
        # the long share is used up: queue behind the least long work already there, so the
        # replicas without a long prefill stay free for short requests
        least = min(r.queued_long_tokens for r in busy)
        return [r for r in busy if r.queued_long_tokens == least]
