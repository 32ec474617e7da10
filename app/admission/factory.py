"""Builds the admission step: Redis-shared limits when `state` is a Redis URL, else local ones."""

from __future__ import annotations

from app.admission.gate import Admission
from app.admission.limits import Limiter, LocalLimiter
from app.admission.redis_limits import RedisLimiter, ResilientLimiter
from app.config import Settings
from app.state.factory import is_redis_url
from app.state.redis import connect
from app.telemetry.metrics import Metrics

MIN_TIMEOUT_S = 0.25  # a decision waits at most this for Redis before using this pod's share


def build_admission(settings: Settings, metrics: Metrics) -> Admission | None:
    options = settings.admission
    if not options.enabled:
        return None
    limiter: Limiter
    if is_redis_url(settings.state):
        timeout = max(MIN_TIMEOUT_S, settings.state_options.redis_timeout_s)
        remote = RedisLimiter(connect(settings.state, socket_timeout_s=timeout),
                              settings.state_options.namespace, options.lease_ttl_s)
        limiter = ResilientLimiter(remote, LocalLimiter(1.0 / options.pods, options.lease_ttl_s), timeout)
    else:
        limiter = LocalLimiter(1.0, options.lease_ttl_s)
    return Admission(settings, limiter, metrics)
