"""ResilientStore: shared state in Redis that never fails or stalls a request.

It pairs a RedisStore (shared) with a MemoryStore (this pod's local mirror) and keeps three
promises:
- Hot path: a read is at most ONE Redis call bounded by `timeout_s` (plus a per-block allowance
  for residency lookups of long chains); past the budget, or while Redis is down, the answer
  comes from the local mirror. Residency answers merge both (the larger leading run per
  replica), so this pod's own writes count before they reach Redis and survive a Redis restart.
- Writes land in the mirror at once and in a bounded queue; a flusher sends the queue to Redis
  in batches (one MULTI/EXEC per batch; what queues while one batch is in flight forms the next,
  so batches grow with load and a lone write leaves at once). While Redis is down
  the queue keeps the writes (up to `max_pending` weight, oldest dropped first) and replays them
  on reconnect, so counters and history made during an outage are not lost.
- Faults: a connection error, or an over-budget call followed by a PING unanswered within
  `stall_s`, switch to local-only mode (logged once, prefixgate_state_backend_up=0); a background
  task probes with exponential backoff and switches back (logged once, gauge 1), then the queue
  drains. An answered PING means the delay was a burst or this pod's busy event loop, so Redis
  stays in use: only a real stall trips the switch.

Read-your-writes: a binding or a replica's removals still queued are answered from the mirror.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter, deque
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.state import ops
from app.state.base import Store
from app.state.keys import pack_hashes
from app.state.memory import MemoryStore
from app.state.redis import RedisStore
from app.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 0.05
DEFAULT_TIMEOUT_PER_1K_BLOCKS_S = 0.002  # 16k blocks (262k tokens) send 128 KB: about +33 ms
DEFAULT_CONTROL_TIMEOUT_S = 1.0
DEFAULT_FLUSH_INTERVAL_S = 0.0  # batches form on their own: writes queue up while one is in flight
DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_PENDING = 1_000_000
DEFAULT_STALL_S = 0.5
DEFAULT_BACKOFF_S = 0.1
DEFAULT_BACKOFF_MAX_S = 5.0

# Errors that mean "Redis is not there": switch to local-only mode and reconnect.
_LINK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class _Missing:
    pass


_MISSING = _Missing()


class ResilientStore(Store):
    """Store protocol: Redis when it answers within budget, the local mirror otherwise."""

    def __init__(
        self,
        remote: RedisStore,
        local: MemoryStore,
        metrics: Metrics | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        timeout_per_1k_blocks_s: float = DEFAULT_TIMEOUT_PER_1K_BLOCKS_S,
        control_timeout_s: float = DEFAULT_CONTROL_TIMEOUT_S,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_pending: int = DEFAULT_MAX_PENDING,
        stall_s: float = DEFAULT_STALL_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        label: str = "redis",
    ) -> None:
        self.remote = remote
        self.local = local
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.timeout_per_1k_blocks_s = timeout_per_1k_blocks_s
        self.control_timeout_s = control_timeout_s
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.stall_s = stall_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.label = label  # how logs name the backend (never a password)
        self._up = False
        self._closed = False
        self._liveness: asyncio.Task[None] | None = None
        self._queue: deque[ops.WriteOp] = deque()
        self._queued_weight = 0
        self._pending_replica: Counter[str] = Counter()  # replicas with removals/clears queued
        self._pending_binding: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self.dropped_writes = 0
        self.outages = 0
        self._refused_logged = False

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Never raises for an unreachable Redis: the pod starts on local state and reconnects."""
        self._closed = False
        try:
            async with asyncio.timeout(self.control_timeout_s):
                await self.remote.ping()
        except (TimeoutError, RedisError, OSError) as exc:
            self._mark_down(exc)
        else:
            self._mark_up()
        self._flusher = asyncio.create_task(self._flush_loop(), name="state-flusher")

    async def close(self) -> None:
        if self._up:
            await self.flush()
        self._closed = True
        for task in (self._flusher, self._reconnector, self._liveness):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._flusher = self._reconnector = self._liveness = None
        try:
            await self.remote.close()
        except (RedisError, OSError):
            pass

    def up(self) -> bool:
        return self._up

    @property
    def pending_writes(self) -> int:
        return len(self._queue)

    def _mark_up(self) -> None:
        self._up = True
        if self.metrics is not None:
            self.metrics.state_backend_up.set(1)
        if self.outages:
            log.warning("shared state: %s reachable again; sharing resumes (%d queued writes to replay)",
                        self.label, len(self._queue))
        self._wake.set()

    def _mark_down(self, exc: BaseException) -> None:
        was_up = self._up or self.outages == 0
        self._up = False
        if self.metrics is not None:
            self.metrics.state_backend_up.set(0)
        if was_up:
            self.outages += 1
            log.warning("shared state: %s unreachable (%s: %s); serving from local state, reconnecting",
                        self.label, type(exc).__name__, exc)
        if not self._closed and (self._reconnector is None or self._reconnector.done()):
            self._reconnector = asyncio.get_running_loop().create_task(
                self._reconnect_loop(), name="state-reconnect")

    async def _reconnect_loop(self) -> None:
        delay = self.backoff_s
        while not self._closed and not self._up:
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            try:
                async with asyncio.timeout(self.control_timeout_s):
                    await self.remote.ping()
            except (TimeoutError, RedisError, OSError):
                delay = min(delay * 2, self.backoff_max_s)
                continue
            self._mark_up()

    # ------------------------------------------------------------- bounded remote calls
    def _fallback(self, op: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.state_fallbacks.labels(op=op, reason=reason).inc()

    async def _bounded(self, op: str, call: Awaitable[T], budget: float) -> T | _Missing:
        """The call's result within `budget`, or _MISSING (and the fault bookkeeping). The call
        runs in the caller's task: a separate task would cost an extra trip through a busy
        event loop, which is most of what a Redis round trip costs there."""
        try:
            async with asyncio.timeout(budget):
                return await call
        except TimeoutError:
            self._fallback(op, "timeout")
            self._check_liveness()
            return _MISSING
        except _LINK_ERRORS as exc:
            self._fallback(op, "down")
            self._mark_down(exc)
            return _MISSING
        except RedisError as exc:
            self._fallback(op, "error")
            log.warning("shared state: %s failed: %s", op, exc)
            return _MISSING

    def _check_liveness(self) -> None:
        """After an over-budget call: one PING decides. An answer within `stall_s` means Redis is
        alive and the delay was a burst or this pod's busy loop; none means Redis is stuck."""
        if self._liveness is None or self._liveness.done():
            self._liveness = asyncio.get_running_loop().create_task(self._probe(), name="state-liveness")

    async def _probe(self) -> None:
        try:
            async with asyncio.timeout(self.stall_s):
                await self.remote.ping()
        except (TimeoutError, RedisError, OSError):
            if self._up:
                self._mark_down(TimeoutError(f"no answer to PING in {self.stall_s:g} s after a call over budget"))

    async def _remote_read(self, op: str, call_factory: Any, budget: float) -> Any:
        if not self._up:
            self._fallback(op, "down")
            return _MISSING
        return await self._bounded(op, call_factory(), budget)

    # ------------------------------------------------------------- write queue
    def _enqueue(self, op: ops.WriteOp) -> None:
        self._queue.append(op)
        self._queued_weight += ops.weight(op)
        self._track(op, +1)
        while self._queued_weight > self.max_pending and len(self._queue) > 1:
            self._forget(self._queue.popleft())
            self.dropped_writes += 1
            if self.metrics is not None:
                self.metrics.state_dropped_writes.inc()
        self._gauge()
        self._wake.set()

    def _track(self, op: ops.WriteOp, delta: int) -> None:
        if isinstance(op, ops.ResidencyRemove | ops.ResidencyClear):
            self._pending_replica[op.replica] += delta
            if self._pending_replica[op.replica] <= 0:
                del self._pending_replica[op.replica]
        elif isinstance(op, ops.BindingSet):
            self._pending_binding[op.key] += delta
            if self._pending_binding[op.key] <= 0:
                del self._pending_binding[op.key]

    def _forget(self, op: ops.WriteOp) -> None:
        self._queued_weight -= ops.weight(op)
        self._track(op, -1)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.state_pending_writes.set(len(self._queue))

    async def _flush_once(self) -> bool:
        """Sends one batch; False when Redis failed (the batch stays queued, in order)."""
        async with self._flush_lock:
            if not self._queue or not self._up:
                return False
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            try:
                async with asyncio.timeout(self.control_timeout_s):
                    await self.remote.apply(batch)
            except (TimeoutError, *_LINK_ERRORS) as exc:
                self._queue.extendleft(reversed(batch))
                self._mark_down(exc)
                return False
            except RedisError as exc:  # a command Redis refused (OOM, ...): retrying would not help
                self.dropped_writes += len(batch)
                if self.metrics is not None:
                    self.metrics.state_dropped_writes.inc(len(batch))
                if not self._refused_logged:  # once until a batch goes through again
                    self._refused_logged = True
                    log.warning("shared state: Redis refused a batch of %d writes: %s", len(batch), exc)
            else:
                self._refused_logged = False
            for op in batch:
                self._forget(op)
            self._gauge()
            return True

    async def flush(self) -> None:
        """Sends everything queued now (bounded by control_timeout_s per batch). A batch the
        flusher has in flight lands first: "queued now" includes it, or a caller that flushes
        to read its own writes could read before them."""
        async with self._flush_lock:
            pass
        while self._queue and self._up:
            if not await self._flush_once():
                return

    async def _flush_loop(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            # let writes of the same loop tick (or of flush_interval_s) join the batch
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    # ------------------------------------------------------------- residency
    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        self.local.set_capacity(replica, capacity_blocks)
        self.remote.set_capacity(replica, capacity_blocks)
        self._enqueue(ops.CapacityTrim(replica))

    def lookup_budget(self, blocks: int) -> float:
        """The time a residency lookup may take: the base budget plus a per-block allowance, as a
        long chain is 8 bytes a block on the wire (prefilling it takes a thousand times longer)."""
        return self.timeout_s + blocks / 1000 * self.timeout_per_1k_blocks_s

    async def residency_lookup(self, block_hashes: Sequence[int], replicas: list[str]) -> dict[str, int]:
        local = self.local.residency_lookup_sync(block_hashes, replicas)
        if not block_hashes or not replicas:
            return local
        remote = await self._remote_read(
            "residency_lookup", lambda: self.remote.residency_lookup(block_hashes, replicas),
            self.lookup_budget(len(block_hashes)))
        if isinstance(remote, _Missing):
            return local
        return {r: local[r] if r in self._pending_replica else max(local[r], remote.get(r, 0))
                for r in replicas}

    async def residency_add(self, replica: str, block_hashes: Sequence[int]) -> None:
        await self.local.residency_add(replica, block_hashes)
        self._enqueue(self.remote.residency_add_op(replica, block_hashes))

    async def residency_touch(self, replica: str, block_hashes: Sequence[int]) -> None:
        await self.local.residency_touch(replica, block_hashes)
        self._enqueue(self.remote.residency_add_op(replica, block_hashes, only_present=True))

    async def residency_remove(self, replica: str, block_hashes: list[int]) -> None:
        await self.local.residency_remove(replica, block_hashes)
        self._enqueue(ops.ResidencyRemove(replica, pack_hashes(block_hashes)))

    async def residency_clear(self, replica: str) -> None:
        await self.local.residency_clear(replica)
        self.local.set_capacity(replica, self.remote.capacity(replica))  # MemoryStore's clear forgets it
        self._enqueue(ops.ResidencyClear(replica))

    def residency_size(self, replica: str) -> int:
        return self.local.residency_size(replica)

    def residency_hashes(self, replica: str) -> set[int]:
        return self.local.residency_hashes(replica)

    # ------------------------------------------------------------- recent placements
    async def recent_add(self, replica: str) -> None:
        await self.local.recent_add(replica)
        self._enqueue(ops.RecentAdd(replica))

    async def recent_values(self, replicas: list[str]) -> dict[str, float]:
        remote = await self._remote_read("recent_values", lambda: self.remote.recent_values(replicas), self.timeout_s)
        return await self.local.recent_values(replicas) if isinstance(remote, _Missing) else remote

    # ------------------------------------------------------------- bindings
    async def binding_get(self, key: str) -> str | None:
        local = await self.local.binding_get(key)
        if key in self._pending_binding:
            return local
        remote = await self._remote_read("binding_get", lambda: self.remote.binding_get(key), self.timeout_s)
        if isinstance(remote, _Missing) or remote is None:
            return local
        return remote

    async def binding_set(self, key: str, replica: str) -> None:
        await self.local.binding_set(key, replica)
        self._enqueue(ops.BindingSet(key, replica))

    # ------------------------------------------------------------- tenant history and counters
    async def history_append(self, tenant: str, record: dict) -> None:
        op = self.remote.history_op(tenant, record)  # serialises first: a bad record fails here
        await self.local.history_append(tenant, record)
        self._enqueue(op)

    async def counter_incr(self, tenant: str, field: str, amount: float = 1.0) -> None:
        await self.local.counter_incr(tenant, field, amount)
        self._enqueue(self.remote.counter_op(tenant, field, amount))

    async def _control_read(self, op: str, call_factory: Any) -> Any:
        """Control-plane reads (hygiene, tracker): flush our own queue first so this pod reads
        its writes, then one bounded read."""
        if self._up:
            await self.flush()
        return await self._remote_read(op, call_factory, self.control_timeout_s)

    async def history_recent(self, tenant: str, limit: int) -> list[dict]:
        remote = await self._control_read("history_recent", lambda: self.remote.history_recent(tenant, limit))
        return await self.local.history_recent(tenant, limit) if isinstance(remote, _Missing) else remote

    async def counters(self, tenant: str) -> dict[str, float]:
        remote = await self._control_read("counters", lambda: self.remote.counters(tenant))
        return await self.local.counters(tenant) if isinstance(remote, _Missing) else remote

    async def tenants(self) -> list[str]:
        remote = await self._control_read("tenants", self.remote.tenants)
        return await self.local.tenants() if isinstance(remote, _Missing) else remote
