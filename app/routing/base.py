"""The routing seam: what the proxy core asks a router, and what it gets back.

The proxy core calls `Router.choose` once per attempt (retries pass the replicas already tried in
`exclude`), then `Router.on_routed` once the upstream accepted the request, then
`Router.on_finished` when the response ended (only after an accepted one: on_routed came first
when the status was below 400). Policies (one file each in app/routing/) are compositions of
filters (app/routing/filters.py), scorers (app/routing/scorers.py) and a picker, on `BaseRouter`;
docs/routing.md describes each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from app.prefix.fingerprint import Fingerprint
from app.routing.siblings import SiblingView


@dataclass
class Replica:
    """One engine replica as the proxy sees it. Mutable counters are updated by the proxy core
    (in-flight), the health checker (healthy) and the engine scraper (engine_*)."""

    name: str
    url: str  # base URL, no trailing slash, no /v1
    engine: str = "auto"  # auto | vllm | sglang (auto resolved by the scraper)
    block_size: int | None = None
    kv_blocks: int | None = None
    healthy: bool = True
    inflight: int = 0
    queued_prompt_tokens: int = 0  # prompt tokens routed here whose first token has not come yet
    queued_long_tokens: int = 0  # the part of queued_prompt_tokens in the long lane (app/routing/lanes.py)
    engine_waiting: float | None = None
    engine_running: float | None = None
    engine_kv_usage: float | None = None
    # the gateway's in flight here (every worker's: `gateway_inflight`) when engine_waiting/running were read
    inflight_at_scrape: int = 0
    models: frozenset[str] | None = None  # ids in its own /v1/models (health checker); None: unknown
    # `serve --workers N`: the other workers' live counters for this replica (app/routing/siblings.py)
    siblings: SiblingView | None = field(default=None, repr=False, compare=False)

    def publish_load(self) -> None:
        """Show this worker's counters to its siblings (the load owner calls it on every change)."""
        if self.siblings is not None:
            self.siblings.publish(self.inflight, self.queued_prompt_tokens, self.queued_long_tokens)

    def gateway_inflight(self) -> int:
        """Requests in flight here from this gateway: this worker's and its siblings'."""
        return self.inflight + (self.siblings.others()[0] if self.siblings is not None else 0)

    def gateway_queued_tokens(self) -> int:
        """Prompt tokens this gateway routed here whose first token has not come yet (every worker)."""
        return self.queued_prompt_tokens + (self.siblings.others()[1] if self.siblings is not None else 0)

    def gateway_long_tokens(self) -> int:
        """The long lane's part of `gateway_queued_tokens`."""
        return self.queued_long_tokens + (self.siblings.others()[2] if self.siblings is not None else 0)

    def engine_foreign(self) -> tuple[float, float]:
        """(running, waiting): the engine's requests at the last scrape that were not this
        gateway's (its `inflight_at_scrape`, every worker's, taken as running first). The scrape
        is up to an interval old, so this gateway's own requests are counted live
        (`gateway_inflight`, `gateway_queued_tokens`) instead: read from the gauges, a request
        that finished after the scrape would weigh on the replica until the next one."""
        running, waiting = self.engine_running or 0.0, self.engine_waiting or 0.0
        own_running = min(float(self.inflight_at_scrape), running)
        own_waiting = min(self.inflight_at_scrape - own_running, waiting)
        return running - own_running, waiting - own_waiting


@dataclass
class RouteRequest:
    """What a policy may look at. `fingerprint` may be partial (hot path): see Fingerprint."""

    tenant: str
    model: str | None
    session_id: str | None
    fingerprint: Fingerprint | None
    prompt_tokens_estimate: int
    pinned: str | None = None  # the only replica that can answer (Responses API: it holds the id)
    # admission's queue is on: whether a replica has room (a cold prompt goes to one that has)
    room: Callable[[Replica], bool] | None = None


@dataclass
class RouteDecision:
    replica: Replica
    reason: str  # prefix_hit | load_override | cold_spread | session | failover | round_robin | least_load
    matched_blocks: int = 0  # leading blocks predicted resident on `replica`
    available_blocks: int = 0  # leading blocks resident anywhere in the fleet
    scores: dict[str, float] = field(default_factory=dict)  # per-replica cost, for explanations
    # Prompt tokens the chosen replica is predicted to prefill (prompt minus predicted hit). The
    # proxy adds it to replica.queued_prompt_tokens when it forwards and takes it off at the first
    # byte, which is the prefill backlog the cost-based policies read.
    prefill_tokens: int = 0
    lane: str | None = None  # "long" | "short" with routing.lanes (app/routing/lanes.py); None: no lanes
    explanation: str = ""  # one line a person can read: why this replica (no prompt text)
    # when the policy decided (time.monotonic): a session's binding follows its newest decision,
    # whichever request's first byte comes first (app/routing/session.py, `ActiveSessions.routed`)
    decided_at: float = field(default_factory=time.monotonic)


class Router(Protocol):
    async def choose(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> RouteDecision:
        """Pick a healthy replica not in `exclude`; raise NoReplicaAvailable when none."""
        ...

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        """The upstream accepted the request: record residency/bindings (must not block)."""
        ...

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        ...


class BaseRouter:
    """Default hooks for policies that keep no state about routed requests."""

    def on_routed(self, request: RouteRequest, decision: RouteDecision) -> None:
        return None

    def on_finished(self, request: RouteRequest, decision: RouteDecision, ok: bool) -> None:
        return None


class NoReplicaAvailable(Exception):
    """No healthy replica is left to try."""
