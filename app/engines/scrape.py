"""The engine scraper: every replica's /metrics, in the background, into gauges and Replica fields.

Serving must never wait on it. One asyncio task per replica sleeps a jittered interval between
scrapes (replicas drift apart instead of being hit in lockstep); every scrape is bounded by one
hard deadline (`scrape.timeout_s`, covering connect, a body that trickles forever and parsing);
the text is parsed in a worker thread so a large exposition does not stall the event loop that
relays streams. A failed scrape marks the backend stale, clears its live load figures (routing
then falls back to its own in-flight counts) and keeps the windowed figures with `stale=1`.

The scraper also teaches the rest of the proxy the engine's real geometry: `Replica.block_size`
becomes the token granularity cache hits land on (vLLM `cache_hit_alignment_tokens`, else the
block size; SGLang the page size) and `Replica.kv_blocks` the blocks the engine can cache, in
those units (vLLM: num_gpu_blocks less each pool's null block), unless the backend's config pinned
them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from prometheus_client import Gauge

from app.config import Settings
from app.engines import sglang, vllm
from app.engines.rates import CounterWindow, SumWindow, acceptance_length, hit_ratio, prompt_tokens_per_s
from app.engines.sample import (
    BLOCK_SIZE,
    CACHE_QUERIES,
    HIT_ALIGNMENT,
    KV_BLOCKS,
    KV_RESERVED_BLOCKS,
    KV_USAGE,
    PROMPT_TOKENS,
    RUNNING,
    SPEC_ACCEPT_LENGTH,
    SPEC_DRAFTS,
    WAITING,
    EngineSample,
    detect_engine,
    parse_exposition,
)
from app.engines.status import BY_CONFIG, BY_NO_QUERIES, EngineView, decide_caching, likely_causes
from app.routing.base import Replica
from app.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # SGLang; the older name second


class ReplicaSource(Protocol):
    def all(self) -> list[Replica]: ...


class ScrapeError(Exception):
    """A scrape that produced no usable sample (status, size, timeout, parse)."""


@dataclass
class _Track:
    """Per-backend scraper state. `pinned_*` remember what the config fixed before any scrape."""

    view: EngineView
    window: CounterWindow
    fidelity: SumWindow
    pinned_engine: str | None = None
    pinned_block_size: int | None = None
    pinned_kv_blocks: int | None = None
    server_info: dict[str, Any] | None = None
    fidelity_lock: threading.Lock = field(default_factory=threading.Lock)


def _set_or_clear(gauge: Gauge, backend: str, value: float | None) -> None:
    """Absent data is an absent series, never a fake zero."""
    if value is None:
        gauge.remove(backend)
    else:
        gauge.labels(backend).set(value)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | httpx.TimeoutException):
        return "timeout"
    text = str(exc) or type(exc).__name__
    return text[:200]


class EngineScraper:
    """Scrapes every replica's engine /metrics; see the module docstring for the guarantees."""

    def __init__(self, replicas: ReplicaSource, metrics: Metrics, settings: Settings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._replicas = replicas
        self._metrics = metrics
        self._opts = settings.scrape
        self._clock = clock
        self._tracks: dict[str, _Track] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._supervisor is not None:
            return
        if self._client is None:
            # building the client loads the TLS trust store: 140-220 ms of CPU measured, which would
            # stall every relayed stream if it happened on the loop at the first scrape
            self._client = await asyncio.to_thread(self._new_client)
        self._supervisor = asyncio.create_task(self._supervise(), name="engine-scrape-supervisor")

    async def stop(self) -> None:
        tasks = [t for t in (self._supervisor, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._supervisor = None
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def scrape_once(self) -> None:
        """One concurrent round over all replicas; returns within about `scrape.timeout_s`."""
        replicas = self._replicas.all()
        self._prune({r.name for r in replicas})
        await asyncio.gather(*(self._scrape(r) for r in replicas))

    # --- read side -------------------------------------------------------------------------
    def status(self) -> dict[str, dict[str, Any]]:
        """backend -> gauges, window figures, verdict and likely causes (GET /hygiene/engines)."""
        out: dict[str, dict[str, Any]] = {}
        for replica in self._replicas.all():
            track = self._track(replica)
            self._update_fidelity(replica.name, track)
            out[replica.name] = track.view.to_dict()
        return out

    def record_prediction(self, backend: str, predicted: int, delivered: int) -> None:
        """Called by the proxy once per finished request: proxy-predicted vs engine-reported
        (`usage.prompt_tokens_details.cached_tokens`) cached tokens. O(1), thread-safe."""
        track = self._tracks.get(backend)
        if track is None:  # first request before the first scrape: rare, so a scan is fine
            replica = next((r for r in self._replicas.all() if r.name == backend), None)
            if replica is None:
                return
            track = self._track(replica)
        with track.fidelity_lock:
            track.fidelity.add(self._clock(), float(predicted), float(delivered))

    # --- the loop --------------------------------------------------------------------------
    async def _supervise(self) -> None:
        """Starts a task for each new replica and retires the tasks of removed ones (discovery)."""
        while True:
            replicas = {r.name: r for r in self._replicas.all()}
            self._prune(set(replicas))
            for name in replicas:
                if name not in self._tasks:
                    self._tasks[name] = asyncio.create_task(self._loop(name), name=f"engine-scrape:{name}")
            await asyncio.sleep(self._opts.interval_s)

    async def _loop(self, name: str) -> None:
        interval, jitter = self._opts.interval_s, self._opts.jitter
        await asyncio.sleep(random.uniform(0.0, min(1.0, interval * jitter)))
        while True:
            replica = next((r for r in self._replicas.all() if r.name == name), None)
            if replica is None:
                return
            await self._scrape(replica)
            await asyncio.sleep(interval * random.uniform(1.0 - jitter, 1.0 + jitter))

    def _prune(self, current: set[str]) -> None:
        for name in [n for n in self._tracks if n not in current]:
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
            del self._tracks[name]
            for gauge in self._gauges():
                gauge.remove(name)

    # --- one scrape ------------------------------------------------------------------------
    async def _scrape(self, replica: Replica) -> None:
        track = self._track(replica)
        try:
            async with asyncio.timeout(self._opts.timeout_s):
                text = await self._get_text(f"{replica.url}/metrics")
                samples = await asyncio.to_thread(parse_exposition, text)
                engine = track.pinned_engine or detect_engine(samples)
                if engine == "sglang" and track.server_info is None:
                    track.server_info = await self._server_info(replica.url)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is a stale scrape, never an error upstream
            self._mark_stale(replica, track, _describe(exc))
            return
        if engine == "vllm":
            sample = vllm.adapt(samples)
        elif engine == "sglang":
            sample = sglang.adapt(samples, track.server_info)
        else:
            sample = EngineSample(engine="unknown")
        self._apply(replica, track, sample)

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._opts.timeout_s, follow_redirects=True)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # scrape_once() without start(), e.g. in tests
            self._client = self._new_client()
        return self._client

    async def _get_text(self, url: str) -> str:
        limit = self._opts.max_bytes
        async with self._http().stream("GET", url) as response:
            if response.status_code != 200:
                raise ScrapeError(f"HTTP {response.status_code} from {url}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise ScrapeError(f"/metrics body over {limit} bytes")
        return body.decode("utf-8", "replace")

    async def _server_info(self, base_url: str) -> dict[str, Any]:
        """SGLang's server args (disable_radix_cache, page_size, max_total_num_tokens); {} when
        the engine has no such endpoint. Fetched once per process (again after a restart)."""
        for path in SERVER_INFO_PATHS:
            try:
                response = await self._http().get(f"{base_url}{path}")
                if response.status_code == 200:
                    data = response.json()
                    if isinstance(data, dict):
                        return data
            except (httpx.HTTPError, ValueError):
                continue
        return {}

    # --- state updates ---------------------------------------------------------------------
    def _track(self, replica: Replica) -> _Track:
        track = self._tracks.get(replica.name)
        if track is None:
            window_s = self._opts.window_s
            track = _Track(
                view=EngineView(backend=replica.name), window=CounterWindow(window_s),
                fidelity=SumWindow(window_s),
                pinned_engine=replica.engine if replica.engine in ("vllm", "sglang") else None,
                pinned_block_size=replica.block_size, pinned_kv_blocks=replica.kv_blocks)
            track.view.configured_block_size = replica.block_size
            self._tracks[replica.name] = track
        return track

    def _mark_stale(self, replica: Replica, track: _Track, error: str) -> None:
        view = track.view
        if not view.stale or view.error is None:
            log.warning("engine metrics of backend %s unavailable (%s); its engine data is stale",
                        replica.name, error)
        view.stale, view.error = True, error
        view.waiting = view.running = view.kv_usage = None
        replica.engine_waiting = replica.engine_running = replica.engine_kv_usage = None
        self._update_fidelity(replica.name, track)
        self._publish(view)

    def _apply(self, replica: Replica, track: _Track, sample: EngineSample) -> None:
        view = track.view
        if view.stale and view.error is not None:
            log.info("engine metrics of backend %s available again", replica.name)
        restarted = track.window.add(self._clock(), sample.counters, sample.process_start)
        if restarted:
            log.info("backend %s restarted (counters went back); its rate window starts over", replica.name)
            if sample.engine == "sglang":
                track.server_info = None  # its flags may have changed with the restart
        window = track.window.deltas()

        view.engine, view.stale, view.error = sample.engine, False, None
        view.scraped_at = time.time()
        view.restarts = track.window.restarts
        view.cache_config = dict(sample.cache_config)
        view.hash_algo = sample.hash_algo
        gauges = sample.gauges
        view.waiting, view.running, view.kv_usage = gauges.get(WAITING), gauges.get(RUNNING), gauges.get(KV_USAGE)
        view.block_size = _int(gauges.get(BLOCK_SIZE))
        view.hit_alignment_tokens = _int(gauges.get(HIT_ALIGNMENT))
        view.kv_capacity_blocks = _int(gauges.get(KV_BLOCKS))

        view.window_s = window.span_s if window else None
        view.window_prompt_tokens = window.get(PROMPT_TOKENS) if window else None
        view.window_queried_tokens = window.get(CACHE_QUERIES) if window else None
        view.prompt_tokens_per_s = prompt_tokens_per_s(window) if window else None
        self._update_ratios(view, sample, window)
        self._update_caching(replica.name, view, sample, window)
        self._update_replica(replica, track, sample)
        self._update_fidelity(replica.name, track)
        self._publish(view)

    @staticmethod
    def _update_ratios(view: EngineView, sample: EngineSample, window: Any) -> None:
        """A ratio whose family is absent is cleared; one whose window saw no traffic keeps its
        last value (the verdict says so) rather than flapping to nothing between bursts."""
        if CACHE_QUERIES not in sample.counters:
            view.hit_ratio = None
        elif window is not None and (ratio := hit_ratio(window)) is not None:
            view.hit_ratio = ratio
        if sample.engine == "sglang":
            view.spec_acceptance_length = sample.gauges.get(SPEC_ACCEPT_LENGTH)
        elif SPEC_DRAFTS not in sample.counters:
            view.spec_acceptance_length = None
        elif window is not None and (length := acceptance_length(window)) is not None:
            view.spec_acceptance_length = length

    @staticmethod
    def _update_caching(backend: str, view: EngineView, sample: EngineSample, window: Any) -> None:
        enabled, reason = decide_caching(sample.prefix_caching_configured, window, view.caching_enabled,
                                         view.caching_reason, sample.counters.get(CACHE_QUERIES))
        if enabled is False and reason == BY_NO_QUERIES and window is not None:
            view.off_prompt_tokens_per_s = prompt_tokens_per_s(window)
        flipped_off = enabled is False and view.caching_enabled is not False
        if enabled is True and view.caching_enabled is False:
            log.info("prefix cache on again on backend %s", backend)
        view.caching_enabled, view.caching_reason = enabled, reason
        if flipped_off:  # one warning per flip, not one per scrape
            log.warning("prefix cache OFF on backend %s: %s; likely causes: %s", backend,
                        "the engine's config says disabled" if reason == BY_CONFIG
                        else "prompt tokens flow but the engine's cache-query counter stays at 0",
                        "; ".join(likely_causes(view)))

    @staticmethod
    def _update_replica(replica: Replica, track: _Track, sample: EngineSample) -> None:
        if track.pinned_engine is None and sample.engine in ("vllm", "sglang"):
            replica.engine = sample.engine
        unit = _int(sample.gauges.get(HIT_ALIGNMENT)) or _int(sample.gauges.get(BLOCK_SIZE))
        if track.pinned_block_size is None and unit:
            replica.block_size = unit
        engine_blocks, engine_block = _int(sample.gauges.get(KV_BLOCKS)), _int(sample.gauges.get(BLOCK_SIZE))
        if track.pinned_kv_blocks is None and engine_blocks and engine_block and replica.block_size:
            cacheable = engine_blocks - (_int(sample.gauges.get(KV_RESERVED_BLOCKS)) or 0)
            replica.kv_blocks = cacheable * engine_block // replica.block_size
        replica.engine_waiting = sample.gauges.get(WAITING)
        replica.engine_running = sample.gauges.get(RUNNING)
        replica.inflight_at_scrape = replica.gateway_inflight()  # every worker's: the engine counts them all
        replica.engine_kv_usage = sample.gauges.get(KV_USAGE)

    def _update_fidelity(self, backend: str, track: _Track) -> None:
        with track.fidelity_lock:
            predicted, delivered = track.fidelity.totals(self._clock())
        view = track.view
        view.predicted_tokens, view.delivered_tokens = predicted, delivered
        view.prediction_fidelity = delivered / predicted if predicted > 0 else None
        _set_or_clear(self._metrics.prediction_fidelity, backend, view.prediction_fidelity)

    def _gauges(self) -> tuple[Gauge, ...]:
        m = self._metrics
        return (m.engine_stale, m.engine_hit_ratio, m.engine_caching_enabled, m.engine_spec_acceptance,
                m.engine_waiting, m.engine_running, m.engine_kv_usage, m.engine_block_size,
                m.engine_kv_blocks, m.prediction_fidelity)

    def _publish(self, view: EngineView) -> None:
        m, name = self._metrics, view.backend
        m.engine_stale.labels(name).set(1.0 if view.stale else 0.0)
        values: Mapping[Gauge, float | None] = {
            m.engine_hit_ratio: view.hit_ratio,
            m.engine_caching_enabled: None if view.caching_enabled is None else float(view.caching_enabled),
            m.engine_spec_acceptance: view.spec_acceptance_length,
            m.engine_waiting: view.waiting,
            m.engine_running: view.running,
            m.engine_kv_usage: view.kv_usage,
            m.engine_block_size: view.block_size,
            m.engine_kv_blocks: view.kv_capacity_blocks,
        }
        for gauge, value in values.items():
            _set_or_clear(gauge, name, value)


def _int(value: float | None) -> int | None:
    return int(value) if value else None
