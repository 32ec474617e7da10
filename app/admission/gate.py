"""Admission, the pipeline step between fingerprint and forward (app/pipeline/request.py step 3c):
per-tenant limits, then the gateway queue while every eligible replica is saturated.

- Limits (`tenants.default.limits`, `tenants.overrides.<t>.limits`): a request over any of them is
  refused with a 429 carrying `Retry-After` and the rate-limit headers (OpenAI's `x-ratelimit-*`,
  on /v1/messages Anthropic's `anthropic-ratelimit-*`; the body is shaped per route by
  app/api/errors.py); it never waits. The prompt-token bucket is charged the request's estimate (the fingerprint's token
  count, or the body-size estimate while it is pending) and settled on the engine's `usage`.
- Queue (`admission.queue`): when every healthy replica serving the model that the request's
  lane may use is saturated (its engine reports more than `saturated_waiting` waiting requests,
  or this gateway has `saturated_inflight` requests in flight on it, or more than
  `saturated_prefill_tokens` of prefill wait for their first token there, the tokens priced by the
  replica's fitted prefill model as the router prices them), the request waits in a
  bounded fair queue (app/admission/queue.py); a full queue or a wait past `ttl_s` is a 503 with
  `Retry-After` (on /v1/messages Anthropic's 529 `overloaded_error`). Under `routing.lanes` the
  lane and its replica set are the router's own (app/routing/lanes.py), so a short request is
  never held by saturated long-lane replicas, and a long one leaves when a long-lane replica
  has room. With `saturated_prefill_tokens` or lanes the request's predicted prefill (prompt
  minus the longest prefix resident on any replica: one residency lookup, only when some
  replica is saturated) sets its lane and its rank.
- Late binding (docs/admission.md): a released request's room counts as taken until it holds a
  replica (`unplaced`, `AdmissionNote.placed`); the router places a cold prompt on a replica
  with room (`room`, passed as `RouteRequest.room`); and the proxy `kick`s the queue when a first
  token or an end frees a replica, so queued requests re-check at once, not at their next poll.
- A concurrency slot is a lease renewed while the request runs and released at its end.

Nothing here fails a request because Redis is gone (app/admission/redis_limits.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.admission.limits import Limiter, Verdict
from app.admission.queue import FairQueue
from app.config import Settings, TenantLimits
from app.errors import ProxyError
from app.routing.base import Replica
from app.routing.lanes import LongPrefillLane
from app.routing.prefill_cost import PrefillPrices
from app.telemetry.metrics import Metrics

POLL_S = 0.02  # a queued request re-checks saturation this often, and at every kick()
RENEW_FRACTION = 3  # leases are renewed every lease_ttl_s / 3


@dataclass
class Ticket:
    """What a request holds from admission until it ends."""

    tenant: str
    limits: TenantLimits
    lease: str
    reserved_tokens: int
    verdict: Verdict


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `1s`, `6m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    s = math.ceil(seconds)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def _instant(seconds: float) -> str:
    """Anthropic's reset format: the RFC 3339 UTC instant `seconds` from now."""
    at = datetime.now(UTC) + timedelta(seconds=max(0.0, seconds))
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


# (limit, remaining, reset) header names per API: OpenAI's `x-ratelimit-*`, Anthropic's
# `anthropic-ratelimit-*` (the prompt-token limit is Anthropic's input-tokens limit)
_HEADER_NAMES = {
    False: (("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
            ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")),
    True: (("anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset"),
           ("anthropic-ratelimit-input-tokens-limit", "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset")),
}


def rate_headers(limits: TenantLimits, verdict: Verdict, anthropic: bool = False) -> dict[str, str]:
    """The rate-limit headers under the names the client's API uses (`anthropic`: /v1/messages).
    The request limit is the request bucket's size (one second of `requests_per_s`), the token
    limit `prompt_tokens_per_min`; reset is when the bucket is full again (OpenAI: a duration,
    Anthropic: an RFC 3339 instant). A header is absent when its limit is not configured."""
    reset = _instant if anthropic else _duration
    (req_limit, req_left, req_reset), (tok_limit, tok_left, tok_reset) = _HEADER_NAMES[anthropic]
    out: dict[str, str] = {}
    if limits.requests_per_s:
        out[req_limit] = str(max(1, int(limits.requests_per_s)))
        if verdict.remaining_requests is not None:
            out[req_left] = str(max(0, verdict.remaining_requests))
        if verdict.reset_requests_s is not None:
            out[req_reset] = reset(verdict.reset_requests_s)
    if limits.prompt_tokens_per_min:
        out[tok_limit] = str(limits.prompt_tokens_per_min)
        if verdict.remaining_tokens is not None:
            out[tok_left] = str(max(0, verdict.remaining_tokens))
        if verdict.reset_tokens_s is not None:
            out[tok_reset] = reset(verdict.reset_tokens_s)
    return out


_REFUSALS = {
    "requests_per_s": ("requests", "requests per second"),
    "prompt_tokens_per_min": ("tokens", "prompt tokens per minute"),
    "concurrent": ("requests", "concurrent requests"),
}
# Anthropic's status for "overloaded, retry later" (its SDK raises OverloadedError on it); the
# OpenAI routes answer a shed with 503 (docs/admission.md)
ANTHROPIC_OVERLOADED = 529


def rate_limited(tenant: str, limits: TenantLimits, verdict: Verdict, anthropic: bool = False) -> ProxyError:
    """The 429 for a refused request; its body is shaped per route by app/api/errors.py."""
    kind, what = _REFUSALS[verdict.reason or "requests_per_s"]
    retry = max(1, math.ceil(verdict.retry_after_s))
    headers = {"retry-after": str(retry), **rate_headers(limits, verdict, anthropic)}
    return ProxyError(429, f"Rate limit reached for tenant {tenant} on {what}. Please try again in {retry}s.",
                      type=kind, code="rate_limit_exceeded", headers=headers)


def shed(message: str, code: str, retry_s: float, anthropic: bool) -> ProxyError:
    """The queue's refusal: 503 on the OpenAI routes, Anthropic's 529 `overloaded_error` on /v1/messages."""
    return ProxyError(ANTHROPIC_OVERLOADED if anthropic else 503, message, type="server_error", code=code,
                      headers={"retry-after": str(max(1, math.ceil(retry_s)))})


class Admission:
    def __init__(self, settings: Settings, limiter: Limiter, metrics: Metrics) -> None:
        self.settings = settings
        self.options = settings.admission
        self.limiter = limiter
        self.metrics = metrics
        # the router's prices (app/routing/prefill_cost.py): a slower replica's queued token weighs more
        self.prices = PrefillPrices(metrics.prefill_models)
        # a request that waited half the TTL leaves before cheaper ones (app/admission/queue.py)
        self.queue = FairQueue(self.options.queue.max_depth, age_s=self.options.queue.ttl_s / 2)
        # requests released from the queue that hold no replica yet: each will take one of the
        # replicas with room, so a departure needs more of those than there are unplaced ones
        self.unplaced = 0
        self._tick: asyncio.Future[None] | None = None  # resolved by kick(): queued requests re-check
        # the router's lane (lanes apply only inside prefix_affinity): the queue holds a request
        # while the replicas *its* lane may use are saturated
        routing = settings.routing
        self.lane = (LongPrefillLane.from_config(routing.lanes)
                     if routing.lanes is not None and routing.policy == "prefix_affinity" else None)
        self._active: dict[str, Ticket] = {}
        self._renewer: asyncio.Task[None] | None = None

    # --- limits ---
    async def admit(self, tenant: str, estimate_tokens: int, anthropic: bool = False) -> Ticket | None:
        """A ticket when a limit applies to the tenant; raises the 429 (headers named for the
        route's API: `anthropic` on /v1/messages) when one is exceeded."""
        limits = self.settings.tenants.config_for(tenant).limits
        if not (limits.requests_per_s or limits.prompt_tokens_per_min or limits.concurrent):
            return None
        lease = uuid.uuid4().hex
        verdict = await self.limiter.acquire(tenant, limits, estimate_tokens, lease)
        if verdict.reason is not None:
            self.metrics.admission_rejections.labels(self.metrics.tenant_label(tenant), verdict.reason).inc()
            raise rate_limited(tenant, limits, verdict, anthropic)
        ticket = Ticket(tenant, limits, lease, estimate_tokens, verdict)
        if limits.concurrent:
            self._active[lease] = ticket
            self._ensure_renewer()
        return ticket

    async def done(self, ticket: Ticket, prompt_tokens: int | None) -> None:
        """The request ended: free its slot, settle the token reservation on `usage`."""
        self._active.pop(ticket.lease, None)
        if ticket.limits.concurrent:
            await self.limiter.release(ticket.tenant, ticket.limits, ticket.lease)
        if ticket.limits.prompt_tokens_per_min and prompt_tokens is not None:
            delta = ticket.reserved_tokens - prompt_tokens
            if delta:
                await self.limiter.settle(ticket.tenant, ticket.limits, delta)

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        period = self.options.lease_ttl_s / RENEW_FRACTION
        while self._active:
            await asyncio.sleep(period)
            for ticket in list(self._active.values()):
                with contextlib.suppress(Exception):
                    await self.limiter.renew(ticket.tenant, ticket.limits, ticket.lease)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    # --- queue ---
    def saturated(self, replica: Replica) -> bool:
        waiting = replica.engine_waiting
        if waiting is not None and waiting > self.options.saturated_waiting:
            return True
        backlog = self.options.saturated_prefill_tokens
        if backlog is not None and self.prices.backlog(replica.name, replica.queued_prompt_tokens) > backlog:
            return True
        return replica.inflight >= self.options.saturated_inflight

    def _pool(self, replicas: Iterable[Replica], model: str | None) -> list[Replica]:
        """The healthy replicas serving `model` (the router's candidates before its filters)."""
        return [r for r in replicas if r.healthy and (model is None or r.models is None or model in r.models)]

    @property
    def queueing(self) -> bool:
        """Whether the gateway queue is on (a saturated fleet holds requests rather than 503)."""
        return self.options.queue.max_depth > 0

    def room(self, replica: Replica) -> bool:
        """Whether `replica` has room (the router prefers these for a cold prompt: late binding)."""
        return not self.saturated(replica)

    def has_room(self, replicas: Iterable[Replica], model: str | None, lane: str | None,
                 taken: int = 0) -> bool:
        """Whether a replica the router would pick from for a request of `lane` has room, beyond
        `taken` of them already promised: the lane's set (app/routing/lanes.py) of the healthy
        replicas serving the model."""
        pool = self._pool(replicas, model)
        if lane is not None and self.lane is not None:
            pool = self.lane.keep(pool, lane)
        return not pool or sum(1 for r in pool if self.room(r)) > taken

    def kick(self) -> None:
        """A replica's load went down (a first token, a request's end): queued requests re-check
        now rather than at their next poll (POLL_S stays the fallback, for engine scrapes)."""
        tick, self._tick = self._tick, None
        if tick is not None and not tick.done():
            tick.set_result(None)

    def _next_tick(self) -> asyncio.Future[None]:
        if self._tick is None:
            self._tick = asyncio.get_running_loop().create_future()
        return self._tick

    def _placed(self) -> None:
        """A request released from the queue holds a replica now: its room is no longer promised.
        Called once per release (`RequestContext.mark_placed` is the caller's once-only guard)."""
        self.unplaced -= 1

    async def wait_turn(self, tenant: str, priority: int, replicas_fn, model: str | None,
                        cost_fn: Callable[[], Awaitable[int]] | None = None,
                        anthropic: bool = False) -> Callable[[], None]:
        """Return when a replica of the request's lane has room (at once when one has and no
        request of its lane waits); a shed (`shed`: 503, or 529 on /v1/messages) when the queue
        is full or the wait passed `ttl_s`. `replicas_fn()` lists the replicas (they change
        with discovery); `cost_fn()` is the predicted prefill, asked only when a replica is
        saturated. Returns what the caller calls once the request holds a replica (a no-op
        unless it was queued): until then the room it was released for counts as taken."""
        pool = self._pool(replicas_fn(), model)
        if not any(self.saturated(r) for r in pool) and self.queue.depth == 0:
            return _nothing
        ranked = cost_fn is not None and (self.options.saturated_prefill_tokens is not None or self.lane is not None)
        cost = await cost_fn() if ranked and cost_fn is not None else 0
        lane = self.lane.lane_of(cost) if self.lane is not None and cost_fn is not None else None
        if self.has_room(replicas_fn(), model, lane, self.unplaced) and self.queue.waiting(lane) == 0:
            return _nothing
        label = self.metrics.tenant_label(tenant)
        if self.queue.full():
            self.metrics.admission_rejections.labels(label, "queue_full").inc()
            raise shed("Every replica is saturated and the gateway queue is full; retry shortly.",
                       "queue_full", self.options.queue.ttl_s / 2, anthropic)
        start = time.perf_counter()
        fut = self.queue.push(tenant, priority, cost, lane)  # cost is 0 when not ranked
        self.metrics.admission_queue_depth.set(self.queue.depth)
        deadline = start + self.options.queue.ttl_s
        weights = {t: o.weight for t, o in self.settings.tenants.overrides.items()}
        rooms: dict[str | None, bool] = {}

        def admissible(klass: str | None) -> bool:
            if klass not in rooms:
                rooms[klass] = self.has_room(replicas_fn(), model, klass, self.unplaced)
            return rooms[klass]

        try:
            while not fut.done():
                rooms.clear()
                if admissible(lane) and self.queue.pop(weights, admissible):
                    self.unplaced += 1  # the one released (maybe this request) takes a room
                    if fut.done():
                        break
                    self.kick()  # the one released wakes (and the others re-check)
                left = deadline - time.perf_counter()
                if left <= 0:
                    self.metrics.admission_rejections.labels(label, "queue_ttl").inc()
                    raise shed(f"Queued {self.options.queue.ttl_s:g}s for a free replica; retry shortly.",
                               "queue_timeout", self.options.queue.ttl_s, anthropic)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._next_tick()), min(left, POLL_S))
        except BaseException:
            if fut.done() and not fut.cancelled():  # released, but leaving without a replica
                self.unplaced -= 1
            raise
        finally:
            if not fut.done():
                fut.cancel()
                self.queue.forget(fut)
            self.metrics.admission_queue_depth.set(self.queue.depth)
            self.metrics.admission_wait.observe(time.perf_counter() - start)
        return self._placed


def _nothing() -> None:
    """The placement callback of a request that was never queued."""
