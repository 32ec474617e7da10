"""`prefixgate serve`: the proxy app and the wiring of its parts.

`create_app(settings)` returns one ASGI app that dispatches on the path *before* any framework:
`/v1/*` (except `/v1/models`) goes to the raw ASGI hot path (app/api/openai.py), everything else
to FastAPI (control plane, /hygiene, /ui), with the admin gate at that door (app/api/admin.py).
The lifespan starts and stops the shared parts held in `Services` (app/services.py): the upstream
session, the state store, background components (health checker, engine scraper) and hooks; on
the way out it flushes their background work. The `prefixgate serve` command that runs it (one
process, or `--workers N`) is app/serve.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.admission.factory import build_admission
from app.api.admin import AdminGate, build_metrics_router, build_probe_router, is_admin_path, scope_headers
from app.api.engines import build_engines_router
from app.api.errors import error_body, send_error, sse_error_event
from app.api.hygiene import build_hygiene_router
from app.api.openai import OpenAIProxy
from app.config import Settings
from app.engines.kv_events import KVEventSubscriber
from app.engines.scrape import EngineScraper
from app.errors import ProxyError
from app.pipeline.hygiene_stage import build_hygiene_stage
from app.pipeline.prefix_stage import build_prefix_stage
from app.pipeline.request import RequestPipeline
from app.pipeline.responses_stage import ResponseOwners
from app.pipeline.tracing_stage import build_tracing_stage
from app.proxy.forward import Forwarder
from app.proxy.upstream import Upstream
from app.routing.components import build_routing_components
from app.routing.factory import build_residency, build_router
from app.routing.health import HealthChecker
from app.routing.load import ReplicaLoad
from app.routing.replicas import ReplicaSet
from app.routing.siblings import SiblingLoads
from app.services import Background, Services
from app.state.factory import build_store
from app.telemetry.metrics import Metrics

log = logging.getLogger("prefixgate.server")


def build_services(settings: Settings, store_path: str | None = None,
                   siblings: SiblingLoads | None = None) -> Services:
    """`store_path`: a worker of `serve --workers N` uses the master's shared store there;
    `siblings`: its table of the other workers' live load (app/routing/siblings.py)."""
    metrics = Metrics(settings.metrics.tenant_label_cap)
    replicas = ReplicaSet.from_backends(settings.backends, siblings)
    store = build_store(settings, metrics, shared_path=store_path)
    residency = build_residency(settings, store)
    router = build_router(settings, replicas, store, metrics, residency)
    health = HealthChecker(replicas, metrics, settings.routing.health_interval_s)
    scraper = EngineScraper(replicas, metrics, settings)
    admission = build_admission(settings, metrics)
    load = ReplicaLoad(metrics, on_lighter=admission.kick if admission is not None else None)
    services = Services(settings=settings, metrics=metrics, replicas=replicas, store=store,
                        residency=residency, router=router, upstream=Upstream(settings.limits),
                        health=health, scraper=scraper, load=load, admission=admission)

    # --- background components (started in order, stopped in reverse): one line each ---
    # endpoint sources first: the health checker's first pass (in its start) then probes every
    # replica they found before the gateway serves
    for component in build_routing_components(settings, replicas, residency, metrics):
        services.background.append(component)
        if isinstance(component, KVEventSubscriber):
            services.kv_events = component
    services.background.append(health)
    services.background.append(scraper)

    # --- the pipeline's stages (their order is app/pipeline/request.py's): one line each ---
    services.hygiene = build_hygiene_stage(settings, metrics)
    services.prefix = build_prefix_stage(settings, metrics, replicas, store, residency, scraper,
                                         services.upstream, services.kv_events)
    services.hygiene.system_first = services.prefix.system_first  # Messages: merged inline system
    services.tracing = build_tracing_stage(settings)

    # --- extra control-plane routers (/hygiene/*, /ui): one line each ---
    services.extra_routers.append(build_hygiene_router(services))
    services.extra_routers.append(build_engines_router(scraper))
    return services


def build_pipeline(services: Services) -> RequestPipeline:
    """The request pipeline over `services`' parts, each handed in once (the stages left None are
    skipped). `serve`'s ASGI adapter and the Endpoint Picker each build one."""
    settings = services.settings
    forwarder = Forwarder(services.router, services.upstream, services.health, services.load, services.metrics,
                          api_key=settings.upstream.api_key, max_retries=settings.routing.max_retries,
                          migrate=settings.routing.migrate_midstream)
    return RequestPipeline(settings, services.metrics, services.health, services.replicas, services.residency,
                           forwarder, ResponseOwners(services.store, services.replicas),
                           hygiene=services.hygiene, prefix=services.prefix, tracing=services.tracing,
                           admission=services.admission, hooks=services.hooks)


class PrefixgateApp:
    """The ASGI entry point of the data port: path dispatch to the raw hot path or the FastAPI
    control plane, with the admin gate at the door (app/api/admin.py). Also the target of the
    SIGTERM drain (app/serving.py `Drainable`)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.openai = OpenAIProxy(services, build_pipeline(services))
        self.control = _control_plane(services)
        self.gate = AdminGate(services.settings)
        self.admin: AdminApp | None = AdminApp(self.control) if self.gate.separate else None
        self._open: dict[asyncio.Task[Any], _WatchedSend] = {}  # /v1 requests in flight
        self._cutting = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith("/v1/") and path != "/v1/models":
                await self._hot_path(scope, receive, send)
                return
            if is_admin_path(path) and (refusal := self.gate.refusal(scope_headers(scope))) is not None:
                await send_error(send, refusal)
                return
        await self.control(scope, receive, send)

    async def _hot_path(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The /v1 request, known to the drain: at the shutdown deadline `cut` cancels it and the
        gateway ends the response itself, so the client gets an error, never a bare cut."""
        task = asyncio.current_task()
        watched = _WatchedSend(send)
        if task is not None:
            self._open[task] = watched
        try:
            await self.openai(scope, receive, watched)
        except asyncio.CancelledError:
            if task is None or task.cancelling() != 1 or not self._cutting:
                raise
            task.uncancel()
            await watched.end_with(SHUTDOWN_ERROR)
        finally:
            if task is not None:
                self._open.pop(task, None)

    # ------------------------------------------------------------------ drain (app/serving.py)
    def begin_drain(self) -> None:
        self.services.draining = True
        self.services.metrics.draining.set(1)

    def in_flight(self) -> int:
        return len(self._open)

    async def cut(self) -> int:
        """End every /v1 request still open: each is cancelled and answered by the gateway with
        its route's error (a stream: the error event and [DONE] after the events it already had;
        not yet started: an error response). Returns how many were open."""
        tasks = list(self._open)
        if not tasks:
            return 0
        self.services.metrics.shutdown_cut.inc(len(tasks))
        self._cutting = True
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=CUT_WAIT_S)
        return len(tasks)


SHUTDOWN_ERROR = ProxyError(503, "the gateway is shutting down: shutdown.grace_s reached before the "
                            "response ended", type="server_error", code="gateway_shutdown")
CUT_WAIT_S = 5.0  # cancelled requests finish their after-response accounting within this


class _WatchedSend:
    """The ASGI send of one /v1 request, remembering how far the response got (started, ended),
    so that a cut can end it correctly. Body chunks sent through `raw` (the relay's per-chunk fast
    path) bypass it: they neither start nor end a response."""

    __slots__ = ("send", "raw", "started", "ended")

    def __init__(self, send: Any) -> None:
        self.send = self.raw = send
        self.started = self.ended = False

    async def __call__(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self.send(message)

    async def end_with(self, err: ProxyError) -> None:
        if self.ended:
            return
        with contextlib.suppress(Exception):  # the client may be gone too
            if self.started:
                await self.send({"type": "http.response.body", "body": sse_error_event(err), "more_body": False})
            else:
                await send_error(self.send, err)
        self.ended = True


class AdminApp:
    """The admin port's ASGI app (`admin.listen`): the control plane only (admin paths, probes,
    /v1/models); the hot path is not served here. The data port's server runs the lifespan."""

    def __init__(self, control: FastAPI) -> None:
        self.control = control

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and scope["path"] != "/v1/models":
            await send_error(send, ProxyError(404, "Not Found", type="NotFoundError", code="not_found"))
            return
        await self.control(scope, receive, send)


FLUSH_TIMEOUT_S = 10.0  # after-response tracking and spans still pending at exit get this long


def _control_plane(services: Services) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await services.upstream.start()
        await services.store.start()
        started: list[Background] = []
        try:
            for component in services.background:
                await component.start()
                started.append(component)
            yield
        finally:
            await _flush(services)
            for component in reversed(started):
                with contextlib.suppress(Exception):
                    await component.stop()
            for closer in (services.prefix, services.tracing):
                if closer is not None:
                    with contextlib.suppress(Exception):
                        closer.shutdown()
            if services.admission is not None:
                with contextlib.suppress(Exception):
                    await services.admission.close()
            await services.store.close()  # sends the queued Redis writes first
            await services.upstream.stop()

    app = FastAPI(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = services

    @app.exception_handler(ProxyError)
    async def proxy_error(_: Request, exc: ProxyError) -> Response:
        return Response(error_body(exc), status_code=exc.status, media_type="application/json",
                        headers=exc.headers)

    app.include_router(build_probe_router(services))
    app.include_router(build_metrics_router(services))
    for extra in services.extra_routers:
        app.include_router(extra)
    return app


async def _flush(services: Services) -> None:
    """Background work of finished requests (continuity tracking, residency writes, spans) ends
    before the store closes, so a restart loses none of it."""
    for pending in (services.prefix, services.tracing):
        if pending is not None:
            try:
                await asyncio.wait_for(pending.drain(), FLUSH_TIMEOUT_S)
            except Exception:  # noqa: BLE001 -- a stuck flush must not keep the pod from exiting
                log.warning("shutdown: %s did not flush within %.0fs", type(pending).__name__, FLUSH_TIMEOUT_S)


def create_app(settings: Settings, store_path: str | None = None,
               siblings: SiblingLoads | None = None) -> PrefixgateApp:
    return PrefixgateApp(build_services(settings, store_path, siblings))
