"""The control plane on FastAPI: probes, the model list, Prometheus metrics, and the admin gate.

These are cheap and rare, so FastAPI's convenience costs nothing here; the `/v1/*` hot path
is raw ASGI (app/api/openai.py). Two kinds of control-plane path:

- open: the probes `/healthz`, `/health`, `/readyz` (always unauthenticated, a kubelet must reach
  them) and `/v1/models` (a data-plane route: it needs a valid API key when keys are configured);
- admin: every other control-plane path (`/metrics`, `/hygiene/*`, `/ui`, whatever router is added
  later). `AdminGate` decides at the ASGI door, before FastAPI routes, so a router added by another
  module inherits the gate without knowing about it (docs/operations.md, "Admin surface").
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.errors import error_body, to_proxy_error
from app.api.tenant import bearer_token, resolve_tenant
from app.errors import ProxyError
from app.routing.base import NoReplicaAvailable
from app.telemetry.peers import gather_metrics

if TYPE_CHECKING:
    from app.config import Settings
    from app.services import Services

PROBE_PATHS = frozenset({"/healthz", "/health", "/readyz"})
OPEN_PATHS = PROBE_PATHS | {"/v1/models"}


def is_admin_path(path: str) -> bool:
    """A control-plane path that belongs to the operator surface (see the module docstring)."""
    return path not in OPEN_PATHS


class AdminGate:
    """Who may use the admin surface through the data port.

    With `admin.listen` set the admin surface lives on its own port and the data port answers 404
    for it. Sharing the data port, it needs `Authorization: Bearer <token>` (token from the env var
    `admin.token_env`) whenever `tenants.api_keys` is configured or a token is set: a client that may
    send requests must not read every tenant's continuity report. With keys but no token, nobody
    gets in through the data port (a 401 saying which variable to set)."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.separate = settings.admin.listen is not None
        self.token_env = settings.admin.token_env
        self.token = env.get(self.token_env) or None
        self.required = self.token is not None or bool(settings.tenants.api_keys)

    def refusal(self, headers: Mapping[str, str]) -> ProxyError | None:
        """None when the request may proceed, else the error to answer with."""
        if self.separate:
            return ProxyError(404, "Not Found", type="NotFoundError", code="not_found")
        if not self.required:
            return None
        given = bearer_token(headers)
        if self.token is not None and given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return None
        return ProxyError(401, f"the admin surface needs Authorization: Bearer ${self.token_env}",
                          type="authentication_error", code="invalid_admin_token")


def scope_headers(scope: Mapping[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def build_probe_router(services: Services) -> APIRouter:
    """The open paths: probes and /v1/models."""
    router = APIRouter()

    @router.get("/healthz")
    @router.get("/health")
    async def healthz() -> dict[str, str]:
        """The process is alive (it answers). `/health` is the name vLLM, SGLang and their routers
        serve, so probes and benchmark harnesses written for them work unchanged."""
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready when at least one replica is healthy and the gateway is not draining (after
        SIGTERM it answers 503 at once, so the Service stops sending it new work)."""
        healthy = [r.name for r in services.replicas.healthy()]
        ready = bool(healthy) and not services.draining
        return JSONResponse({"ready": ready, "draining": services.draining, "healthy_backends": healthy,
                             "backends": len(services.replicas)}, status_code=200 if ready else 503)

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        """The union of the models served by healthy replicas (refreshed now if unknown). Needs a
        valid API key when keys are configured, like every /v1 route."""
        resolve_tenant(request.headers, None, services.settings.tenants)  # raises ProxyError(401)
        health = services.health
        if not health.model_union() and services.replicas.healthy():
            await health.check_all()
        if not services.replicas.healthy():
            err = to_proxy_error(NoReplicaAvailable("no healthy replica"))
            return Response(error_body(err), status_code=err.status, media_type="application/json")
        return JSONResponse({"object": "list", "data": health.model_union()})

    return router


def build_metrics_router(services: Services) -> APIRouter:
    """`/metrics` (an admin path: gated by `AdminGate`)."""
    router = APIRouter()

    @router.get("/metrics")
    async def metrics() -> Response:
        body, content_type = services.metrics.render()
        if services.metric_peers:  # one gateway of N workers: every worker's series (app/workers.py)
            body = await gather_metrics(body, services.metric_peers)
        return Response(body, media_type=content_type)

    return router
