"""The control plane on FastAPI: liveness, readiness, Prometheus metrics, the model list.

These are cheap and rare, so FastAPI's convenience costs nothing here; the `/v1/*` hot path
is raw ASGI (app/api/openai.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app.api.errors import error_body, to_proxy_error
from app.routing.base import NoReplicaAvailable

if TYPE_CHECKING:
    from app.services import Services


def build_admin_router(services: Services) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz")
    @router.get("/health")
    async def healthz() -> dict[str, str]:
        """The process is alive (it answers). `/health` is the name vLLM, SGLang and their routers
        serve, so probes and benchmark harnesses written for them work unchanged."""
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready when at least one replica is healthy."""
        healthy = [r.name for r in services.replicas.healthy()]
        status = 200 if healthy else 503
        return JSONResponse({"ready": bool(healthy), "healthy_backends": healthy,
                             "backends": len(services.replicas)}, status_code=status)

    @router.get("/metrics")
    async def metrics() -> Response:
        body, content_type = services.metrics.render()
        return Response(body, media_type=content_type)

    @router.get("/v1/models")
    async def models() -> Response:
        """The union of the models served by healthy replicas (refreshed now if unknown)."""
        health = services.health
        if not health.model_union() and services.replicas.healthy():
            await health.check_all()
        if not services.replicas.healthy():
            err = to_proxy_error(NoReplicaAvailable("no healthy replica"))
            return Response(error_body(err), status_code=err.status, media_type="application/json")
        return JSONResponse({"object": "list", "data": health.model_union()})

    return router
