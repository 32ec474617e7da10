"""Replica health: active `/health` checks, passive marking on failures, a small circuit breaker.

Active: every `routing.health_interval_s` each replica's `GET /health` is probed; 200 marks it
healthy. The same pass reads `GET /v1/models`: each replica's own list (`Replica.models`) is what
the serves-the-model filter routes on (app/routing/filters.py), and their union is the proxy's
`/v1/models` and its 404 check. Passive: a connect failure on the hot path opens the replica's breaker
at once (it leaves rotation until a probe succeeds); other failures count, and `FAILURE_THRESHOLD`
consecutive ones open it too. A probe that times out on a healthy replica counts only after
`PROBE_TIMEOUTS_TO_FAIL` in a row: under heavy load /health answers late without the engine being
down. Open breakers are probed every `OPEN_PROBE_S`, not every interval,
so a replica that restarts is back within a second or so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import aiohttp

from app.routing.base import Replica
from app.routing.replicas import ReplicaSet
from app.tasks import cancel_and_wait
from app.telemetry.metrics import Metrics

log = logging.getLogger("prefixgate.health")

FAILURE_THRESHOLD = 3  # consecutive non-connect failures that open the breaker
PROBE_TIMEOUTS_TO_FAIL = 2  # consecutive probe timeouts before a healthy replica leaves rotation
OPEN_PROBE_S = 1.0  # probe period for replicas whose breaker is open
PROBE_TIMEOUT_S = 2.0


def served_models(data: list) -> list[dict]:
    """The entries of a replica's `/v1/models` the gateway lists as its own: objects with a string
    `id`, and nothing strict JSON cannot hold (a NaN `max_model_len` made `/v1/models` a 500)."""
    out = []
    for model in data:
        if isinstance(model, dict) and isinstance(model.get("id"), str):
            try:
                json.dumps(model, allow_nan=False)
            except (TypeError, ValueError):
                continue
            out.append(model)
    return out


class HealthChecker:
    def __init__(self, replicas: ReplicaSet, metrics: Metrics, interval_s: float,
                 probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.replicas = replicas
        self.metrics = metrics
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self.failures: dict[str, int] = {}
        self.probe_timeouts: dict[str, int] = {}
        self.models: dict[str, list[dict]] = {}  # replica -> its /v1/models `data`
        self._last_probe: dict[str, float] = {}
        self._answered_at: dict[str, float] = {}  # replica -> when it last answered proxied traffic
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Probe every replica once before returning, so the gateway starts serving (and /readyz
        answers) knowing which replicas are up and which models each serves. Without it a request
        in the first pass's window saw some lists known and others not, and the serves-the-model
        filter left out a replica that serves it. The pass is bounded by the probe timeout."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.probe_timeout_s))
        for replica in self.replicas.all():
            self._publish(replica)
        await self._check_all_logged()
        self._task = asyncio.create_task(self._loop(), name="prefixgate-health")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ passive signals (hot path)
    def mark_failure(self, replica: Replica, kind: str) -> None:
        count = self.failures.get(replica.name, 0) + 1
        self.failures[replica.name] = count
        if replica.healthy and (kind == "connect" or count >= FAILURE_THRESHOLD):
            log.warning("replica %s marked unhealthy after %s failure", replica.name, kind)
            replica.healthy = False
            self._publish(replica)
            self._wake.set()

    def mark_success(self, replica: Replica) -> None:
        """A proxied request got its answer's first byte from `replica`."""
        self._answered_at[replica.name] = time.monotonic()
        if self.failures.get(replica.name):
            self.failures[replica.name] = 0

    # ------------------------------------------------------------ model list
    def known_models(self) -> set[str] | None:
        """Model ids some replica of the fleet lists (healthy or not: a model whose replicas are all
        down exists, and gets 503, not 404); None when no replica reported a list yet."""
        lists = [r.models for r in self.replicas.all() if r.models is not None]
        if not lists:
            return None
        return set().union(*lists)

    def model_union(self) -> list[dict]:
        seen: dict[str, dict] = {}
        for replica in self.replicas.healthy():
            for model in self.models.get(replica.name, []):
                seen.setdefault(model["id"], model)
        return list(seen.values())

    # ------------------------------------------------------------ active checks
    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(r) for r in self.replicas.all()))

    async def check(self, replica: Replica) -> bool:
        assert self._session is not None
        previous_probe = self._last_probe.get(replica.name)
        self._last_probe[replica.name] = time.monotonic()
        ok = False
        try:
            async with self._session.get(replica.url + "/health") as resp:
                ok = resp.status == 200
            if ok:
                async with self._session.get(replica.url + "/v1/models") as resp:
                    if resp.status == 200:
                        payload = await resp.json(content_type=None)
                        data = payload.get("data") if isinstance(payload, dict) else None
                        if isinstance(data, list):
                            self.models[replica.name] = listed = served_models(data)
                            replica.models = frozenset(m["id"] for m in listed)
            self.probe_timeouts[replica.name] = 0
        except TimeoutError:
            # A busy engine (hundreds of streams, a long prefill) can answer /health late; one slow
            # probe is not an outage. Refused connections and non-200s still count at once. A slow
            # probe of a replica that answered proxied traffic since the previous probe does not
            # count at all: it is serving (SGLang's /health generates a token behind the running
            # batch, so on busy cores it is late exactly while the replica works).
            answered = self._answered_at.get(replica.name)
            serving = answered is not None and previous_probe is not None and answered >= previous_probe
            timeouts = self.probe_timeouts.get(replica.name, 0) + (0 if serving else 1)
            self.probe_timeouts[replica.name] = timeouts
            ok = replica.healthy and timeouts < PROBE_TIMEOUTS_TO_FAIL
        except (aiohttp.ClientError, ValueError):
            ok = False
        if ok != replica.healthy:
            log.warning("replica %s is now %s", replica.name, "healthy" if ok else "unhealthy")
        replica.healthy = ok
        if ok:
            self.failures[replica.name] = 0
        self._publish(replica)
        return ok

    def _publish(self, replica: Replica) -> None:
        self.metrics.backend_healthy.labels(replica.name).set(1 if replica.healthy else 0)

    async def _check_all_logged(self) -> None:
        try:
            await self.check_all()
        except Exception:  # a bug in one pass must not end health checking
            log.exception("health check pass failed")

    async def _loop(self) -> None:
        """Wait an interval (probing open breakers every `OPEN_PROBE_S`), then probe every replica;
        start() ran the first pass."""
        while True:
            deadline = time.monotonic() + self.interval_s
            while (remaining := deadline - time.monotonic()) > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(remaining, OPEN_PROBE_S))
                unhealthy = [r for r in self.replicas.all() if not r.healthy]
                if unhealthy:
                    await asyncio.gather(*(self.check(r) for r in unhealthy))
            await self._check_all_logged()
