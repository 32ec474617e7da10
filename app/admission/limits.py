"""Per-tenant limits: requests/s and prompt tokens/min as token buckets, concurrent streams as
leases. One decision checks all three and takes nothing unless all pass (docs/admission.md).

Two backends share one contract (`Limiter`):
- `LocalLimiter`: this pod's memory; with `share` < 1 it enforces that fraction of the global
  limit (the fallback when Redis is unreachable: each of `admission.pods` pods takes its share).
- `RedisLimiter`: one Lua script per decision, so every gateway pod draws from the same buckets.
  Concurrency slots are sorted-set members scored by their expiry: a pod that crashed stops
  renewing, its leases expire after `lease_ttl_s`, and its tenants get their slots back.

Buckets start full and refill continuously: requests at `requests_per_s` (capacity one second's
worth), tokens at `prompt_tokens_per_min` / 60 per second (capacity one minute's worth). A request
reserves its estimated prompt tokens; `settle` returns or charges the difference once the engine's
`usage` says how many there were. A request larger than the whole bucket passes when the bucket
is full (else it could never pass) and leaves it in debt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from app.config import TenantLimits

# a stream's slot frees when it ends, which no one can predict: ask the client to retry soon
CONCURRENT_RETRY_S = 1.0


@dataclass(frozen=True)
class Verdict:
    """One admission decision. `reason` is None when admitted; remaining/reset are for the
    x-ratelimit-* headers (None: that limit is not configured)."""

    reason: str | None
    retry_after_s: float = 0.0
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None


class Limiter(Protocol):
    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease: str) -> Verdict: ...
    async def settle(self, tenant: str, limits: TenantLimits, delta_tokens: int) -> None: ...
    async def renew(self, tenant: str, limits: TenantLimits, lease: str) -> None: ...
    async def release(self, tenant: str, limits: TenantLimits, lease: str) -> None: ...


@dataclass
class _Bucket:
    level: float
    stamp: float

    def refill(self, now: float, capacity: float, rate: float) -> None:
        self.level = min(capacity, self.level + (now - self.stamp) * rate)
        self.stamp = now


def _bucket_check(level: float, capacity: float, rate: float, need: float) -> float:
    """Seconds until `need` can be taken from a bucket at `level` (0: now)."""
    if level >= need or level >= capacity:
        return 0.0
    return (min(need, capacity) - level) / rate


class LocalLimiter:
    """Limits held in this process; `share` scales every limit (a pod's part of the global one)."""

    def __init__(self, share: float = 1.0, lease_ttl_s: float = 30.0) -> None:
        self.share = share
        self.lease_ttl_s = lease_ttl_s
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self._leases: dict[str, dict[str, float]] = {}

    def _scaled(self, limits: TenantLimits) -> tuple[float | None, float | None, int | None]:
        rps = limits.requests_per_s * self.share if limits.requests_per_s else None
        tpm = limits.prompt_tokens_per_min * self.share if limits.prompt_tokens_per_min else None
        conc = max(1, int(limits.concurrent * self.share)) if limits.concurrent else None
        return rps, tpm, conc

    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease: str) -> Verdict:
        now = time.monotonic()
        rps, tpm, conc = self._scaled(limits)
        waits: dict[str, float] = {}
        req = tok = None
        if rps:
            req = self._requests.setdefault(tenant, _Bucket(max(1.0, rps), now))
            req.refill(now, max(1.0, rps), rps)
            waits["requests_per_s"] = _bucket_check(req.level, max(1.0, rps), rps, 1.0)
        if tpm:
            tok = self._tokens.setdefault(tenant, _Bucket(tpm, now))
            tok.refill(now, tpm, tpm / 60.0)
            waits["prompt_tokens_per_min"] = _bucket_check(tok.level, tpm, tpm / 60.0, tokens)
        leases = self._leases.setdefault(tenant, {})
        if conc:
            for k in [k for k, exp in leases.items() if exp <= now]:
                del leases[k]
            waits["concurrent"] = 0.0 if len(leases) < conc else CONCURRENT_RETRY_S
        remaining_req = int(req.level) if req is not None else None
        remaining_tok = int(tok.level) if tok is not None else None
        reset_req = (max(1.0, rps) - req.level) / rps if req is not None and rps else None
        reset_tok = (tpm - tok.level) / (tpm / 60.0) if tok is not None and tpm else None
        blocked = {k: v for k, v in waits.items() if v > 0}
        if blocked:
            reason = max(blocked, key=lambda k: blocked[k])
            return Verdict(reason, max(blocked.values()), remaining_req, remaining_tok, reset_req, reset_tok)
        if req is not None:
            req.level -= 1.0
            remaining_req = int(req.level)
        if tok is not None:
            tok.level -= tokens
            remaining_tok = max(0, int(tok.level))
        if conc:
            leases[lease] = now + self.lease_ttl_s
        return Verdict(None, 0.0, remaining_req, remaining_tok, reset_req, reset_tok)

    async def settle(self, tenant: str, limits: TenantLimits, delta_tokens: int) -> None:
        bucket = self._tokens.get(tenant)
        if bucket is not None and limits.prompt_tokens_per_min:
            cap = limits.prompt_tokens_per_min * self.share
            bucket.level = min(cap, bucket.level + delta_tokens)

    async def renew(self, tenant: str, limits: TenantLimits, lease: str) -> None:
        leases = self._leases.get(tenant)
        if leases is not None and lease in leases:
            leases[lease] = time.monotonic() + self.lease_ttl_s

    async def release(self, tenant: str, limits: TenantLimits, lease: str) -> None:
        leases = self._leases.get(tenant)
        if leases is not None:
            leases.pop(lease, None)
