"""`RedisLimiter`: the limits of app/admission/limits.py shared by every gateway pod, and
`ResilientLimiter`, which falls back to this pod's share when Redis does not answer.

One EVAL per decision (check all three limits, take from each only if all pass), so two pods can
never both take the last slot. Time comes from Redis (`TIME`), so pods with skewed clocks agree.
The fallback logs once per outage and never fails the request: Redis gone means per-pod limits
(`admission.pods` pods, each 1/pods of the global limit), never a 5xx.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis

from app.admission.limits import CONCURRENT_RETRY_S, Limiter, LocalLimiter, Verdict
from app.config import TenantLimits

log = logging.getLogger("prefixgate.admission")

# KEYS: requests bucket, tokens bucket, leases zset.
# ARGV: rps (0: none), tpm (0: none), tokens, concurrent (0: none), lease id, lease ttl ms, key ttl ms.
# Returns {admitted(0/1), reason, retry_ms, remaining_req(-1: none), remaining_tok, reset_req_ms, reset_tok_ms}.
_ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rps, tpm, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local conc, ttl, keyttl = tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function level(key, cap, rate_ms)
  local v = redis.call('HMGET', key, 'l', 's')
  local l, s = tonumber(v[1]), tonumber(v[2])
  if l == nil then return cap end
  return math.min(cap, l + (now - s) * rate_ms)
end
local function wait(l, cap, rate_ms, n)
  if l >= n or l >= cap then return 0 end
  return math.ceil((math.min(n, cap) - l) / rate_ms)
end
local reason, worst = '', 0
local rl, tl, rcap = -1, -1, 0
if rps > 0 then
  rcap = math.max(1, rps)
  rl = level(KEYS[1], rcap, rps / 1000)
  local w = wait(rl, rcap, rps / 1000, 1)
  if w > worst then worst = w; reason = 'requests_per_s' end
end
if tpm > 0 then
  tl = level(KEYS[2], tpm, tpm / 60000)
  local w = wait(tl, tpm, tpm / 60000, need)
  if w > worst then worst = w; reason = 'prompt_tokens_per_min' end
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc and tonumber(ARGV[8]) > worst then
    worst = tonumber(ARGV[8]); reason = 'concurrent'
  end
end
local function reset(l, cap, rate) if l < 0 then return -1 end return math.ceil((cap - l) / rate) end
if worst > 0 then
  return {0, reason, worst, math.floor(rl), math.floor(tl), reset(rl, rcap, rps / 1000), reset(tl, tpm, tpm / 60000)}
end
if rps > 0 then
  rl = rl - 1
  redis.call('HSET', KEYS[1], 'l', tostring(rl), 's', now); redis.call('PEXPIRE', KEYS[1], keyttl)
end
if tpm > 0 then
  tl = tl - need
  redis.call('HSET', KEYS[2], 'l', tostring(tl), 's', now); redis.call('PEXPIRE', KEYS[2], keyttl)
end
if conc > 0 then
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[5]); redis.call('PEXPIRE', KEYS[3], ttl * 2)
end
return {1, '', 0, math.floor(rl), math.max(0, math.floor(tl)), reset(rl, rcap, rps / 1000), reset(tl, tpm, tpm / 60000)}
"""

# KEYS: tokens bucket. ARGV: delta tokens, capacity. Returns nothing.
_SETTLE_LUA = """
local v = redis.call('HGET', KEYS[1], 'l')
if v then redis.call('HSET', KEYS[1], 'l', tostring(math.min(tonumber(ARGV[2]), tonumber(v) + tonumber(ARGV[1])))) end
return 0
"""

# KEYS: leases zset. ARGV: lease id, ttl ms. Renews a lease that still exists, and the set's own
# expiry with it: a stream longer than two TTLs with no other request of its tenant would otherwise
# lose its slot with the whole set
_RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
end
return 0
"""

RETRY_S = 1.0  # while Redis is down, try it again this often
KEY_TTL_MS = 120_000  # an idle tenant's buckets are refilled by then anyway


def _opt(value: int) -> int | None:
    return None if value < 0 else int(value)


class RedisLimiter:
    """The Limiter contract on Redis; raises on any Redis failure (ResilientLimiter handles it)."""

    def __init__(self, client: aioredis.Redis, namespace: str, lease_ttl_s: float) -> None:
        self.client = client
        self.prefix = f"{namespace}:v1:adm:"
        self.lease_ttl_ms = int(lease_ttl_s * 1000)

    def _keys(self, tenant: str) -> list[str]:
        return [f"{self.prefix}{tenant}:rps", f"{self.prefix}{tenant}:tpm", f"{self.prefix}{tenant}:leases"]

    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease: str) -> Verdict:
        out = await self.client.eval(
            _ACQUIRE_LUA, 3, *self._keys(tenant), limits.requests_per_s or 0,
            limits.prompt_tokens_per_min or 0, tokens, limits.concurrent or 0, lease,
            self.lease_ttl_ms, KEY_TTL_MS, int(CONCURRENT_RETRY_S * 1000))
        admitted, reason, retry_ms, rem_req, rem_tok, reset_req, reset_tok = out
        reason_s = reason.decode() if isinstance(reason, bytes) else str(reason)
        return Verdict(
            None if admitted else reason_s, int(retry_ms) / 1000, _opt(int(rem_req)), _opt(int(rem_tok)),
            None if int(reset_req) < 0 else int(reset_req) / 1000,
            None if int(reset_tok) < 0 else int(reset_tok) / 1000)

    async def settle(self, tenant: str, limits: TenantLimits, delta_tokens: int) -> None:
        if limits.prompt_tokens_per_min:
            await self.client.eval(_SETTLE_LUA, 1, self._keys(tenant)[1], delta_tokens,
                                   limits.prompt_tokens_per_min)

    async def renew(self, tenant: str, limits: TenantLimits, lease: str) -> None:
        if limits.concurrent:
            await self.client.eval(_RENEW_LUA, 1, self._keys(tenant)[2], lease, self.lease_ttl_ms)

    async def release(self, tenant: str, limits: TenantLimits, lease: str) -> None:
        if limits.concurrent:
            await self.client.zrem(self._keys(tenant)[2], lease)


class ResilientLimiter:
    """Redis first, within `timeout_s`; on any failure this pod's share (`LocalLimiter`). Logs once
    when Redis goes away and once when it answers again."""

    def __init__(self, remote: Limiter, local: LocalLimiter, timeout_s: float, retry_s: float = RETRY_S) -> None:
        self.remote = remote
        self.local = local
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.down = False
        self._retry_at = 0.0

    def _failed(self, exc: BaseException) -> None:
        if not self.down:
            log.warning("admission: Redis unreachable (%s); enforcing this pod's share of each limit",
                        type(exc).__name__)
        self.down = True
        self._retry_at = time.monotonic() + self.retry_s

    def _skip_remote(self) -> bool:
        """While down, Redis is tried again only every `retry_s` (a stalled Redis costs each try its timeout)."""
        return self.down and time.monotonic() < self._retry_at

    def _ok(self) -> None:
        if self.down:
            log.info("admission: Redis answers again; limits are global")
        self.down = False

    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease: str) -> Verdict:
        if self._skip_remote():
            return await self.local.acquire(tenant, limits, tokens, lease)
        try:
            verdict = await asyncio.wait_for(self.remote.acquire(tenant, limits, tokens, lease), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 -- any Redis failure means local limits, never an error
            self._failed(exc)
            return await self.local.acquire(tenant, limits, tokens, lease)
        self._ok()
        return verdict

    async def _both(self, op: str, tenant: str, limits: TenantLimits, arg: int | str) -> None:
        await getattr(self.local, op)(tenant, limits, arg)  # harmless when the lease is not local
        if self._skip_remote():
            return
        try:
            await asyncio.wait_for(getattr(self.remote, op)(tenant, limits, arg), self.timeout_s)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)

    async def settle(self, tenant: str, limits: TenantLimits, delta_tokens: int) -> None:
        await self._both("settle", tenant, limits, delta_tokens)

    async def renew(self, tenant: str, limits: TenantLimits, lease: str) -> None:
        await self._both("renew", tenant, limits, lease)

    async def release(self, tenant: str, limits: TenantLimits, lease: str) -> None:
        await self._both("release", tenant, limits, lease)
