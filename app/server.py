"""`prefixgate serve`: the proxy app and the wiring of its parts.

`create_app(settings)` returns one ASGI app that dispatches on the path *before* any framework:
`/v1/*` (except `/v1/models`) goes to the raw ASGI hot path (app/api/openai.py), everything else
to FastAPI (control plane, /hygiene, /ui). The lifespan starts and stops the shared parts held in
`Services`: the upstream session, the state store, background components (health checker, engine
scraper) and hooks.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.api.admin import build_admin_router
from app.api.engines import build_engines_router
from app.api.errors import error_body
from app.api.hygiene import build_hygiene_router
from app.api.openai import OpenAIProxy
from app.config import ConfigError, Settings, load_settings
from app.engines.kv_events import KVEventSubscriber
from app.engines.scrape import EngineScraper
from app.hygiene.hook import build_hygiene_hook
from app.prefix.hook import build_prefix_hook
from app.proxy.context import ProxyError
from app.proxy.upstream import Upstream
from app.routing.components import build_routing_components
from app.routing.factory import build_router
from app.routing.health import HealthChecker
from app.routing.replicas import ReplicaSet
from app.services import Background, Services
from app.state.factory import build_store
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import build_tracing_hook

log = logging.getLogger("prefixgate.server")


def build_services(settings: Settings) -> Services:
    metrics = Metrics(settings.metrics.tenant_label_cap)
    replicas = ReplicaSet.from_backends(settings.backends)
    store = build_store(settings, metrics)
    router = build_router(settings, replicas, store, metrics)
    health = HealthChecker(replicas, metrics, settings.routing.health_interval_s)
    scraper = EngineScraper(replicas, metrics, settings)
    services = Services(settings=settings, metrics=metrics, replicas=replicas, store=store, router=router,
                        upstream=Upstream(settings.limits), health=health, scraper=scraper)

    # --- background components (started in order, stopped in reverse): one line each ---
    services.background.append(health)
    services.background.append(scraper)
    for component in build_routing_components(settings, replicas, store, metrics):
        services.background.append(component)
        if isinstance(component, KVEventSubscriber):
            services.kv_events = component

    # --- hooks, in hot-path order (hygiene, then prefix/fingerprint, then tracing): one line each ---
    services.hygiene = build_hygiene_hook(settings, services)
    services.prefix = build_prefix_hook(settings, services)
    services.tracing = build_tracing_hook(settings)
    services.hooks = [h for h in (services.hygiene, services.prefix, services.tracing) if h is not None]

    # --- extra control-plane routers (/hygiene/*, /ui): one line each ---
    services.extra_routers.append(build_hygiene_router(services))
    services.extra_routers.append(build_engines_router(scraper))
    return services


class PrefixgateApp:
    """The ASGI entry point: path dispatch to the raw hot path or the FastAPI control plane."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.openai = OpenAIProxy(services)
        self.control = _control_plane(services)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith("/v1/") and path != "/v1/models":
                await self.openai(scope, receive, send)
                return
        await self.control(scope, receive, send)


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
            for component in reversed(started):
                with contextlib.suppress(Exception):
                    await component.stop()
            for closer in (services.prefix, services.tracing):
                if closer is not None:
                    with contextlib.suppress(Exception):
                        closer.shutdown()
            await services.store.close()
            await services.upstream.stop()

    app = FastAPI(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = services

    @app.exception_handler(ProxyError)
    async def proxy_error(_: Request, exc: ProxyError) -> Response:
        return Response(error_body(exc), status_code=exc.status, media_type="application/json",
                        headers=exc.headers)

    app.include_router(build_admin_router(services))
    for extra in services.extra_routers:
        app.include_router(extra)
    return app


def create_app(settings: Settings) -> PrefixgateApp:
    return PrefixgateApp(build_services(settings))


# ---------------------------------------------------------------- CLI: prefixgate serve
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (keys: see README ## Configuration)")
    parser.add_argument("--backend", action="append", metavar="URL",
                        help="replica base URL (repeatable); replaces the file's backends")
    parser.add_argument("--host", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (default 8080)")
    parser.add_argument("--policy", choices=["round_robin", "least_load", "session", "prefix_affinity"])
    parser.add_argument("--state", help="memory | redis://host:6379/0")
    parser.add_argument("--tokenizer", help="Hugging Face tokenizer directory (default: built-in)")
    parser.add_argument("--log-level", default="info")


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {"state": args.state, "tokenizer": args.tokenizer}
    if args.backend:
        overrides["backends"] = [{"url": url} for url in args.backend]
    listen = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if listen:
        overrides["listen"] = listen
    if args.policy:
        overrides["routing"] = {"policy": args.policy}
    return load_settings(args.config, **overrides)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from app.proxy.gctune import tune_for_serving
    from app.serving import uvicorn_config

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(args)
        if not settings.backends and settings.discovery is None:
            raise ConfigError("backends: none: pass --backend URL, set backends or discovery in the config file")
        app = create_app(settings)
    except ValueError as exc:  # ConfigError, or a hook refusing its settings: one line naming the key
        print(f"prefixgate: {exc}", file=sys.stderr)
        return 2
    log.info("prefixgate on http://%s:%d -> %s", settings.listen.host, settings.listen.port,
             ", ".join(r.url for r in app.services.replicas.all()))
    tune_for_serving()  # app/proxy/gctune.py: no full collections over start-up objects
    uvicorn.Server(uvicorn_config(app, settings.listen.host, settings.listen.port,
                                  log_level=args.log_level.lower())).run()
    return 0
