"""`prefixgate epp`: the gateway as an Endpoint Picker (docs/epp.md).

The same `Services` as `serve` (config file, env, routers, stages, store, scraper), with the
control plane (/metrics, /ui, probes) on `listen` as usual, plus one more background component:
`EppServer`, the ext_proc gRPC server (TLS) and the gRPC health server. Being the last component
it starts after the store and the health checker and stops first, so readiness only says SERVING
while the parts it relies on run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from app.epp.exchange import Exchange, ExchangeParts
from app.epp.protocol import EXT_PROC_SERVICE
from app.epp.tls import key_pair
from app.server import build_pipeline

if TYPE_CHECKING:
    from app.server import PrefixgateApp
    from app.services import Services

log = logging.getLogger("prefixgate.epp")
READY_SERVICES = ("readiness", EXT_PROC_SERVICE)
READY_POLL_S = 0.2


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    """`Process`: one bidirectional stream per HTTP request, answered by an `Exchange`."""

    def __init__(self, services: Services) -> None:
        self.parts = ExchangeParts.of(services, build_pipeline(services))
        self.active = 0  # streams not yet closed (tests settle on 0)

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ProcessingResponse]:
        exchange = Exchange(self.parts)
        self.active += 1
        try:
            async for message in request_iterator:
                for answer in await exchange.handle(message):
                    yield answer
                if exchange.closed:
                    return
        finally:
            try:
                exchange.close()
            except Exception:
                log.exception("closing an exchange failed")
            self.active -= 1


class EppServer:
    """The ext_proc and health gRPC servers, as a `Background` component of `Services`."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.processor = ExternalProcessor(services)
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.health_server: grpc.aio.Server | None = None
        self.grpc_port = services.settings.epp.grpc_port
        self.health_port = services.settings.epp.health_port
        self.certificate: bytes | None = None  # PEM of the ext_proc port's certificate (TLS)
        self._ready_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg = self.services.settings.epp
        await self.health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
        self.health_port = self.health_server.add_insecure_port(f"{cfg.host}:{cfg.health_port}")
        await self.health_server.start()
        self.server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(self.processor, self.server)
        address = f"{cfg.host}:{cfg.grpc_port}"
        if cfg.tls:
            key, cert = key_pair(cfg.cert_file, cfg.key_file)
            self.certificate = cert
            self.grpc_port = self.server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        else:
            self.grpc_port = self.server.add_insecure_port(address)
        await self.server.start()
        self._ready_task = asyncio.create_task(self._track_readiness())
        log.info("ext_proc on %s:%d (%s), gRPC health on %s:%d", cfg.host, self.grpc_port,
                 "TLS" if cfg.tls else "plaintext", cfg.host, self.health_port)

    def ready(self) -> bool:
        """Usable state: not draining, and at least one replica the health checker finds healthy."""
        services = self.services
        return not services.draining and any(r.healthy for r in services.replicas.all())

    async def _track_readiness(self) -> None:
        last: bool | None = None
        while True:
            now = self.ready()
            if now != last:
                status = health_pb2.HealthCheckResponse.SERVING if now else health_pb2.HealthCheckResponse.NOT_SERVING
                for name in READY_SERVICES:
                    await self.health.set(name, status)
                last = now
            await asyncio.sleep(READY_POLL_S)

    async def stop(self) -> None:
        if self._ready_task is not None:
            self._ready_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ready_task
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.server is not None:
            await self.server.stop(grace=self.services.settings.shutdown.accept_s)
        if self.health_server is not None:
            await self.health_server.stop(grace=0)


def create_epp_app(settings: Any) -> tuple[PrefixgateApp, EppServer]:
    """The serve app (control plane, lifespan) with the EPP servers as its last component."""
    from app.server import create_app

    app = create_app(settings)
    services = app.services
    if settings.epp.pool is not None:  # endpoints from an InferencePool (before health checks run)
        from app.epp.pool import PoolWatch
        from app.routing.components import forget_removed

        services.background.insert(0, PoolWatch(settings.epp, services.replicas, forget_removed(services.residency)))
    epp = EppServer(services)
    services.background.append(epp)
    return app, epp


# ---------------------------------------------------------------- CLI: prefixgate epp
def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.serve import add_arguments as serve_arguments

    serve_arguments(parser)
    parser.add_argument("--grpc-port", type=int, help="ext_proc gRPC port (default 9002)")
    parser.add_argument("--health-port", type=int, help="gRPC health port (default 9003)")
    parser.add_argument("--cert", help="TLS certificate (PEM) for the ext_proc port; default self-signed")
    parser.add_argument("--key", help="TLS key (PEM) for the ext_proc port")
    parser.add_argument("--plaintext", action="store_true", help="serve ext_proc without TLS")


def run(args: argparse.Namespace) -> int:
    from app.config import ConfigError
    from app.proxy.gctune import tune_for_serving
    from app.serve import settings_from_args
    from app.serving import serve_draining, uvicorn_config

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        base = settings_from_args(args)
        epp = {k: v for k, v in (("grpc_port", args.grpc_port), ("health_port", args.health_port),
                                 ("cert_file", args.cert), ("key_file", args.key)) if v is not None}
        if args.plaintext:
            epp["tls"] = False
        settings = base.model_copy(update={"epp": base.epp.model_copy(update=epp)})  # flags over file/env
        if not settings.backends and settings.discovery is None and settings.epp.pool is None:
            raise ConfigError("backends: none: pass --backend URL, set backends, discovery or epp.pool in the config")
        app, _ = create_epp_app(settings)
    except ValueError as exc:
        print(f"prefixgate: {exc}", file=sys.stderr)
        return 2
    tune_for_serving()
    config = uvicorn_config(app, settings.listen.host, settings.listen.port, log_level=args.log_level.lower())
    return serve_draining(app, config, accept_s=settings.shutdown.accept_s, grace_s=settings.shutdown.grace_s)
