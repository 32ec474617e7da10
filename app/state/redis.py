"""RedisStore: the Store protocol on one Redis, shared by every gateway pod.

Semantics equal MemoryStore's (the conformance suite, tests/test_store_conformance.py, runs every Store):
- residency per replica is a sorted set of packed block hashes scored by last use in
  microseconds (keys.chain_scores), trimmed to the replica's capacity, with per-member TTL as a
  score cutoff and a key TTL for idle replicas. Lookup is ONE script call for all replicas: a
  binary search over the chain inside Redis (O(log n) ZSCOREs per replica), because the sets are
  prefix-closed (their only writer, app/routing/residency.py, keeps them so: docs/routing.md). The chain travels once, 8 bytes per block.
- bindings are plain keys with PX; history a list trimmed to `history_len`; counters a hash;
  the tenant registry a sorted set by last write, trimmed to `max_tenants` (evicted tenants'
  history and counters are deleted with them).

This class does no fault handling: every method raises redis errors. ResilientStore
(app/state/resilient.py) adds the local fallback, the time budget and the batched writes.
Records must be JSON-serialisable (they cross processes); they come back as JSON round-trips.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from app.routing import recent
from app.state import ops
from app.state.base import Store
from app.state.keys import DEFAULT_NAMESPACE, KeySpace, next_base, pack_hashes, unpack_members
from app.state.memory import (
    DEFAULT_CAPACITY_BLOCKS,
    DEFAULT_HISTORY,
    DEFAULT_MAX_TENANTS,
    DEFAULT_TTL_S,
)

DEFAULT_SOCKET_TIMEOUT_S = 2.0  # a backstop; callers bound each call with their own budget
# How stale a chain's recency may get in a residency set before an add rewrites it (seconds):
# `state_options.residency_refresh_s`, docs/routing.md, "The Redis set"
DEFAULT_REFRESH_S = 1.0

# KEYS: residency keys; ARGV[1]: packed chain, ARGV[2]: score cutoff (expired below it).
# Returns the leading resident run per key. Relies on the sets being prefix-closed.
_LOOKUP_LUA = """
local blob = ARGV[1]
local cutoff = tonumber(ARGV[2])
local n = math.floor(#blob / 8)
local out = {}
for k = 1, #KEYS do
  local lo, hi = 0, n
  if redis.call('EXISTS', KEYS[k]) == 1 then
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      local s = redis.call('ZSCORE', KEYS[k], string.sub(blob, (mid - 1) * 8 + 1, mid * 8))
      if s and tonumber(s) >= cutoff then lo = mid else hi = mid - 1 end
    end
  else
    lo = 0
  end
  out[k] = lo
end
return out
"""


# KEYS[1]: a residency key; ARGV: packed chain, base score, expiry cutoff, capacity, key TTL ms,
# "XX" for a touch (refresh present members only) or "" for an add, and the fresh floor (a score).
# Block i scores base - i (keys.chain_scores); GT keeps newer scores. Scores are formatted with
# %d because Lua would print a 16-digit number with only 14 significant digits.
# What it writes follows what is new (docs/routing.md, "The Redis set"):
# - a chain is cut at the capacity: a block at position >= capacity can never be held;
# - k, the leading run present and unexpired, and m <= k, its leading blocks scored at or above
#   the fresh floor (used within `residency_refresh_s`), are each found by a binary search (scores
#   fall along a chain);
# - blocks [m, n) (a touch: [m, k)) are written, continuing the scores of block m - 1 when m > 0
#   (its base), else from `base`: the recent head is not rewritten, and every parent still
#   outscores its children.
_ADD_LUA = """
local key = KEYS[1]
local blob = ARGV[1]
local base = tonumber(ARGV[2])
local cutoff = tonumber(ARGV[3])
local fresh = tonumber(ARGV[7])
local n = math.min(math.floor(#blob / 8), tonumber(ARGV[4]))
local function score(j)
  local s = redis.call('ZSCORE', key, string.sub(blob, j * 8 + 1, j * 8 + 8))
  if s then return tonumber(s) end
  return nil
end
local function leading(hi, floor)
  local lo = 0
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    local s = score(mid - 1)
    if s and s >= floor then lo = mid else hi = mid - 1 end
  end
  return lo
end
local k = leading(n, cutoff)
local from = 0
if k > 0 and fresh < base then
  local m = leading(k, fresh)
  if m > 0 then
    base = score(m - 1) + m - 1
    from = m
  end
end
if ARGV[6] == 'XX' then n = k end
local i = from
while i < n do
  local args = {'GT'}
  local last = math.min(n, i + 1000)
  for j = i, last - 1 do
    args[#args + 1] = string.format('%d', base - j)
    args[#args + 1] = string.sub(blob, j * 8 + 1, j * 8 + 8)
  end
  redis.call('ZADD', key, unpack(args))
  i = last
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. ARGV[3])
redis.call('ZREMRANGEBYRANK', key, 0, -tonumber(ARGV[4]) - 1)
redis.call('PEXPIRE', key, ARGV[5])
return n - from
"""


# KEYS: a tenant's history list and counters hash; ARGV: key TTL ms, history length, the number r
# of records, the r records (oldest first), then field/amount pairs. What a batch writes for one
# tenant in one command (each command of a pipeline costs the gateway ~15-20 µs of Python).
_TENANT_LUA = """
local r = tonumber(ARGV[3])
if r > 0 then
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 4, 3 + r))
  redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
if #ARGV > 3 + r then
  for i = 4 + r, #ARGV, 2 do
    redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1])
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return r
"""


# KEYS[1]: the recent hash; ARGV: replica, growth, rescale bound, key TTL ms. The arithmetic of
# app/routing/recent.py's RecentRequests.add: the unit grows per request, the replica gains it,
# and every weight is divided by the unit once it passes the bound. Field "" holds the unit.
_RECENT_LUA = """
local key = KEYS[1]
local unit = tonumber(redis.call('HGET', key, '') or '1') * tonumber(ARGV[2])
redis.call('HINCRBYFLOAT', key, ARGV[1], string.format('%.17g', unit))
if unit > tonumber(ARGV[3]) then
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if all[i] ~= '' then
      redis.call('HSET', key, all[i], string.format('%.17g', tonumber(all[i + 1]) / unit))
    end
  end
  unit = 1
end
redis.call('HSET', key, '', string.format('%.17g', unit))
redis.call('PEXPIRE', key, ARGV[4])
return 1
"""


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)


def connect(url: str, socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S) -> aioredis.Redis:
    """A client that retries once, at once: a pooled connection that went stale (Redis restarted)
    reconnects within the caller's budget, and a Redis that is really gone still fails fast."""
    return aioredis.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
        retry=Retry(NoBackoff(), 1), decode_responses=False,
        health_check_interval=0)


class RedisStore(Store):
    """Store protocol on Redis; raises on any Redis failure (see module docstring)."""

    def __init__(
        self,
        client: aioredis.Redis | str,
        namespace: str = DEFAULT_NAMESPACE,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        ttl_s: float = DEFAULT_TTL_S,
        key_ttl_s: float = DEFAULT_TTL_S,
        history_len: int = DEFAULT_HISTORY,
        max_tenants: int = DEFAULT_MAX_TENANTS,
        clock: Callable[[], float] = time.time,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        self.client = connect(client) if isinstance(client, str) else client
        # an add does not rewrite a chain's head used within this many seconds (_ADD_LUA);
        # 0: every add rewrites the whole chain (exact LRU, a write per block)
        self.refresh_s = refresh_s
        self.keys = KeySpace(namespace)
        self.default_capacity = capacity_blocks
        self.ttl_s = ttl_s
        self.key_ttl_s = key_ttl_s
        self.history_len = history_len
        self.max_tenants = max_tenants
        self._clock = clock
        self._capacity: dict[str, int] = {}
        self._last_base = 0
        self._lookup = self.client.register_script(_LOOKUP_LUA)
        self.evicted_tenants = 0

    async def start(self) -> None:
        await self.client.ping()

    async def close(self) -> None:
        await self.client.aclose()

    def up(self) -> bool:
        return True

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    # ------------------------------------------------------------- op constructors (no I/O)
    def capacity(self, replica: str) -> int:
        return self._capacity.get(replica, self.default_capacity)

    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        """Takes effect at the replica's next write (or an applied ops.CapacityTrim)."""
        self._capacity[replica] = max(1, capacity_blocks)

    def residency_add_op(self, replica: str, block_hashes: Sequence[int], only_present: bool = False) -> ops.ResidencyAdd:
        block_hashes = block_hashes[:self.capacity(replica)]  # the rest can never be held (the script cuts too)
        n = len(block_hashes)
        self._last_base = next_base(_us(self._clock()), self._last_base, n)
        return ops.ResidencyAdd(replica, pack_hashes(block_hashes), self._last_base, only_present)

    def history_op(self, tenant: str, record: dict) -> ops.HistoryAppend:
        return ops.HistoryAppend(tenant, orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS), self._clock())

    def counter_op(self, tenant: str, field: str, amount: float) -> ops.CounterIncr:
        return ops.CounterIncr(tenant, field, float(amount), self._clock())

    # ------------------------------------------------------------- batched writes
    async def apply(self, batch: list[ops.WriteOp]) -> None:
        """Every op of `batch` in one MULTI/EXEC round trip (all or nothing), then, only when the
        tenant registry outgrew its bound, one more to evict the oldest tenants. What the batch
        writes for a tenant (its history records and counters, in order) is one script call, and
        the tenants it touched are registered in one ZADD: a request's batch was 39 commands (MULTI
        and EXEC included), 17 of them PEXPIRE; it is 9."""
        if not batch:
            return
        pipe = self.client.pipeline(transaction=True)
        tenants: dict[str, _TenantWrites] = {}
        for op in batch:
            if isinstance(op, ops.HistoryAppend | ops.CounterIncr):
                writes = tenants.get(op.tenant)
                if writes is None:
                    writes = tenants[op.tenant] = _TenantWrites()
                writes.add(op)
            else:
                self._queue(pipe, op)
        ttl_ms = int(self.key_ttl_s * 1000)
        for tenant, writes in tenants.items():
            pipe.eval(_TENANT_LUA, 2, self.keys.history(tenant), self.keys.counters(tenant), ttl_ms,
                      self.history_len, len(writes.records), *writes.records, *writes.increments)
        if tenants:
            pipe.zadd(self.keys.tenants(), {t: w.at for t, w in tenants.items()}, gt=True)  # GT still adds new members
            pipe.pexpire(self.keys.tenants(), ttl_ms)
            pipe.zcard(self.keys.tenants())
        results = await pipe.execute()
        if tenants and int(results[-1]) > self.max_tenants:
            await self._evict_tenants(int(results[-1]) - self.max_tenants)

    def _queue(self, pipe: Any, op: ops.WriteOp) -> None:
        """Adds a residency, placement or binding op's commands to the pipeline."""
        ttl_ms = int(self.key_ttl_s * 1000)
        if isinstance(op, ops.ResidencyAdd | ops.CapacityTrim):
            # EVAL, not EVALSHA: a Redis restarted between two batches has no script cache, and
            # a NOSCRIPT inside MULTI would half-apply the batch. Redis caches the compiled body.
            blob = op.blob if isinstance(op, ops.ResidencyAdd) else b""
            base = op.base_us if isinstance(op, ops.ResidencyAdd) else 0
            touch = "XX" if isinstance(op, ops.ResidencyAdd) and op.only_present else ""
            pipe.eval(_ADD_LUA, 1, self.keys.residency(op.replica), blob, base,
                      _us(self._clock() - self.ttl_s), self.capacity(op.replica), int(self.ttl_s * 1000), touch,
                      base - _us(self.refresh_s))
        elif isinstance(op, ops.ResidencyRemove):
            if op.blob:
                pipe.zrem(self.keys.residency(op.replica), *unpack_members(op.blob))
        elif isinstance(op, ops.ResidencyClear):
            pipe.delete(self.keys.residency(op.replica))
        elif isinstance(op, ops.RecentAdd):
            pipe.eval(_RECENT_LUA, 1, self.keys.recent(), op.replica, repr(recent.growth()),
                      repr(recent.RESCALE_AT), ttl_ms)
        elif isinstance(op, ops.BindingSet):
            pipe.set(self.keys.binding(op.key), op.replica.encode(), px=int(self.ttl_s * 1000))
        else:  # pragma: no cover - exhaustive over ops.WriteOp (tenant writes: apply)
            raise TypeError(f"unknown op {op!r}")

    async def _evict_tenants(self, excess: int) -> None:
        popped = await self.client.zpopmin(self.keys.tenants(), excess)
        names = [member.decode() for member, _ in popped]
        if names:
            await self.client.delete(*[k for t in names for k in (self.keys.history(t), self.keys.counters(t))])
            self.evicted_tenants += len(names)

    # ------------------------------------------------------------- residency
    async def residency_lookup(self, block_hashes: Sequence[int], replicas: list[str]) -> dict[str, int]:
        if not replicas:
            return {}
        if not block_hashes:
            return dict.fromkeys(replicas, 0)
        cutoff = _us(self._clock() - self.ttl_s)
        held = max(self.capacity(r) for r in replicas)  # no set holds a block past its capacity
        counts = await self._lookup(keys=[self.keys.residency(r) for r in replicas],
                                    args=[pack_hashes(block_hashes[:held]), cutoff])
        return {r: int(c) for r, c in zip(replicas, counts, strict=True)}

    async def residency_add(self, replica: str, block_hashes: Sequence[int]) -> None:
        await self.apply([self.residency_add_op(replica, block_hashes)])

    async def residency_touch(self, replica: str, block_hashes: Sequence[int]) -> None:
        await self.apply([self.residency_add_op(replica, block_hashes, only_present=True)])

    async def residency_remove(self, replica: str, block_hashes: list[int]) -> None:
        await self.apply([ops.ResidencyRemove(replica, pack_hashes(block_hashes))])

    async def residency_clear(self, replica: str) -> None:
        await self.apply([ops.ResidencyClear(replica)])

    async def residency_count(self, replica: str) -> int:
        """Members held for the replica (expired ones included until the next write prunes them)."""
        return int(await self.client.zcard(self.keys.residency(replica)))

    # ------------------------------------------------------------- recent placements
    async def recent_add(self, replica: str) -> None:
        await self.apply([ops.RecentAdd(replica)])

    async def recent_values(self, replicas: list[str]) -> dict[str, float]:
        values = await self.client.hmget(self.keys.recent(), ["", *replicas])
        unit = float(values[0]) if values[0] is not None else 1.0
        return {r: (float(v) / unit if v is not None else 0.0) for r, v in zip(replicas, values[1:], strict=True)}

    # ------------------------------------------------------------- bindings
    async def binding_get(self, key: str) -> str | None:
        value = await self.client.get(self.keys.binding(key))
        return value.decode("utf-8", "replace") if value is not None else None  # no replica has a bent name

    async def binding_set(self, key: str, replica: str) -> None:
        await self.apply([ops.BindingSet(key, replica)])

    # ------------------------------------------------------------- tenant history and counters
    async def history_append(self, tenant: str, record: dict) -> None:
        await self.apply([self.history_op(tenant, record)])

    async def history_recent(self, tenant: str, limit: int) -> list[dict]:
        """The newest records; one that is not a JSON object (another writer's, a hand edit) is
        left out rather than failing the read (the tracker checks the members it reads)."""
        raw = await self.client.lrange(self.keys.history(tenant), -limit if limit > 0 else 0, -1)
        out = []
        for item in raw:
            try:
                record = orjson.loads(item)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    async def counter_incr(self, tenant: str, field: str, amount: float = 1.0) -> None:
        await self.apply([self.counter_op(tenant, field, amount)])

    async def counters(self, tenant: str) -> dict[str, float]:
        raw = await self.client.hgetall(self.keys.counters(tenant))
        out = {}
        for k, v in raw.items():  # a field that is no finite number (a hand edit) is left out
            try:
                value = float(v)
                key = k.decode()
            except (ValueError, UnicodeDecodeError):
                continue
            if math.isfinite(value):
                out[key] = value
        return out

    async def tenants(self) -> list[str]:
        return [t.decode() for t in await self.client.zrange(self.keys.tenants(), 0, -1)]


class _TenantWrites:
    """A batch's history records and counter increments for one tenant, in order, and its latest
    write's time (the tenant registry's score)."""

    __slots__ = ("records", "increments", "at")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.increments: list[str | float] = []  # field, amount, field, amount, ...
        self.at = -math.inf

    def add(self, op: ops.HistoryAppend | ops.CounterIncr) -> None:
        if isinstance(op, ops.HistoryAppend):
            self.records.append(op.record)
        else:
            self.increments += (op.field, op.amount)
        self.at = max(self.at, op.at)
