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

`auto` (the default for both numbers) derives them from the predicted prefill of the last
`window` routed requests (`PrefillWindow`), so no one has to know the trace: the threshold is
where the log-sizes split best into two groups (Otsu's criterion), kept only when the groups'
geometric means are SEPARATION apart and never below `min_long_prefill_tokens`; the long lane
gets ceil(long share of the prefill tokens x N) of the N replicas (at most N - 1), so it runs no
hotter than the fleet. Until MIN_SAMPLES requests were seen, or when the sizes do not split, no
request is long.

Inside a lane the policy's own scorers still decide (affinity applies). A replica's long prefill
in flight is `Replica.queued_long_tokens`, held like `queued_prompt_tokens` by the one load owner
(app/routing/load.py) that `serve`'s forward and the Endpoint Picker both use, and read with the
other workers' (`Replica.gateway_long_tokens`, app/routing/siblings.py).
One lane per `routing.lanes` section (`from_config`): the router, which feeds the window, and the
admission queue, which asks the same lane, see the same threshold.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from app.config import Lanes
from app.routing.base import Replica

LONG = "long"
SHORT = "short"
AUTO = "auto"
MIN_SAMPLES = 64  # requests seen before `auto` calls any long
SEPARATION = 4.0  # the long group's geometric mean prefill over the short group's, at least
RECOMPUTE_EVERY = 16  # requests between two derivations (a sort of the window)


@dataclass(frozen=True)
class LaneOptions:
    long_prefill_tokens: int | str = AUTO  # an int, or "auto"
    replicas: frozenset[str] = frozenset()
    max_share: float | str = AUTO  # in (0, 1], or "auto"
    window: int = 512
    min_long_prefill_tokens: int = 2048


@dataclass(frozen=True)
class Derived:
    """What the window says: the threshold (None: nothing is long) and the long requests' share
    of the window's predicted prefill tokens."""

    long_prefill_tokens: int | None
    long_token_share: float


def split(values: Sequence[int], min_long: int, fixed: int | None = None) -> Derived:
    """Otsu's threshold over log(prefill): the cut between two sorted values that maximises the
    between-group variance; no cut when fewer than MIN_SAMPLES values, or the groups' geometric
    means are less than SEPARATION apart. The threshold is the geometric midpoint of the two
    values either side of the cut, raised to `min_long`. With a `fixed` threshold (configured),
    only the long share is derived."""
    if len(values) < MIN_SAMPLES:
        return Derived(fixed, 0.0)
    if fixed is not None:
        return Derived(fixed, sum(v for v in values if v > fixed) / max(1, sum(values)))
    xs = sorted(math.log(max(1, v)) for v in values)
    n, total = len(xs), math.fsum(xs)
    best, cut, below, means = 0.0, 0, 0.0, (0.0, 0.0)
    for i in range(1, n):
        below += xs[i - 1]
        if xs[i] == xs[i - 1]:
            continue
        m0, m1 = below / i, (total - below) / (n - i)
        between = (i / n) * (1 - i / n) * (m1 - m0) ** 2
        if between > best:
            best, cut, means = between, i, (m0, m1)
    if cut == 0 or means[1] - means[0] < math.log(SEPARATION):
        return Derived(None, 0.0)
    threshold = max(min_long, int(math.exp((xs[cut - 1] + xs[cut]) / 2)))
    long_tokens = sum(v for v in values if v > threshold)
    return Derived(threshold if long_tokens else None, long_tokens / max(1, sum(values)))


class PrefillWindow:
    """The predicted prefill of the last `size` routed requests, and what `split` derives from it."""

    def __init__(self, size: int, min_long: int, fixed: int | None = None) -> None:
        self.values: deque[int] = deque(maxlen=size)
        self.min_long = min_long
        self.fixed = fixed
        self.derived = Derived(fixed, 0.0)
        self._since = 0

    def add(self, tokens: int) -> None:
        self.values.append(max(0, int(tokens)))
        self._since += 1
        if self._since >= RECOMPUTE_EVERY or len(self.values) == MIN_SAMPLES:
            self._since = 0
            self.derived = split(self.values, self.min_long, self.fixed)


# one lane per `routing.lanes` section object, for as long as that section lives
_LANES: dict[int, LongPrefillLane] = {}


class LongPrefillLane:
    def __init__(self, options: LaneOptions) -> None:
        self.options = options
        fixed = options.long_prefill_tokens
        self.window = PrefillWindow(options.window, options.min_long_prefill_tokens,
                                    fixed if isinstance(fixed, int) else None)

    @classmethod
    def from_config(cls, lanes: Lanes) -> LongPrefillLane:
        """The lane `routing.lanes` configures: the same object for the router and the admission
        queue of one gateway (both build theirs from the same section), so they share its window."""
        lane = _LANES.get(id(lanes))
        if lane is None:
            lane = _LANES[id(lanes)] = cls(LaneOptions(
                lanes.long_prefill_tokens, frozenset(lanes.replicas), lanes.max_share, lanes.window,
                lanes.min_long_prefill_tokens))
            weakref.finalize(lanes, _LANES.pop, id(lanes), None)
        return lane

    def observe(self, predicted_prefill_tokens: int) -> None:
        """One routed request's predicted prefill (the router's, once per request)."""
        self.window.add(predicted_prefill_tokens)

    def threshold(self) -> int | None:
        """Prefill tokens above which a request is long now (None: none is)."""
        configured = self.options.long_prefill_tokens
        return configured if isinstance(configured, int) else self.window.derived.long_prefill_tokens

    def long_replicas(self, n: int) -> int:
        """How many of `n` replicas may hold a long prefill at once (shared mode)."""
        share = self.options.max_share
        if isinstance(share, str):  # auto: the long lane runs no hotter than the fleet
            cap = math.ceil(self.window.derived.long_token_share * n)
            return max(1, min(n - 1, cap))
        return max(1, math.floor(share * n))

    def lane_of(self, predicted_prefill_tokens: int) -> str:
        threshold = self.threshold()
        return LONG if threshold is not None and predicted_prefill_tokens > threshold else SHORT

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
        long_tokens = {r.name: r.gateway_long_tokens() for r in pool}
        busy = [r for r in pool if long_tokens[r.name] > 0]
        free = [r for r in pool if long_tokens[r.name] <= 0]
        if lane == SHORT:
            return free or pool
        cap = self.long_replicas(len(pool))
        if len(busy) < cap and free:
            return free
        # the long share is used up: queue behind the least long work already there, so the
        # replicas without a long prefill stay free for short requests
        least = min(long_tokens[r.name] for r in busy)
        return [r for r in busy if long_tokens[r.name] == least]
