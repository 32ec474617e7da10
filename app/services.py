"""`Services`: everything the request path and the control plane share, built once per app.

A plain typed record so that the API modules, the proxy core and the hooks can name what they use
(`services.scraper`, `services.prefix`) without importing the server that wires them: this module
imports only the parts it holds, never `app.server` or `app.api.*`, so there is no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fastapi import APIRouter

    from app.admission.gate import Admission
    from app.config import Settings
    from app.engines.kv_events import KVEventSubscriber
    from app.engines.scrape import EngineScraper
    from app.pipeline.hygiene_stage import HygieneStage
    from app.pipeline.prefix_stage import PrefixStage
    from app.pipeline.tracing_stage import TracingStage
    from app.proxy.context import RequestHook
    from app.proxy.upstream import Upstream
    from app.routing.base import Router
    from app.routing.health import HealthChecker
    from app.routing.load import ReplicaLoad
    from app.routing.replicas import ReplicaSet
    from app.routing.residency import ReplicaIndex
    from app.state.base import Store
    from app.telemetry.metrics import Metrics


class Background(Protocol):
    """A part with its own tasks, started in order by the lifespan and stopped in reverse."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


@dataclass
class Services:
    """The shared parts of one gateway. Optional fields are the ones configuration can leave out:
    `kv_events` exists only with `routing.kv_events`; the stages are always built by `build_services`
    but a hand-made `Services` (tests) may omit them."""

    settings: Settings
    metrics: Metrics
    replicas: ReplicaSet
    store: Store
    residency: ReplicaIndex  # the residency index's one owner (app/routing/residency.py)
    router: Router
    upstream: Upstream
    health: HealthChecker
    scraper: EngineScraper
    load: ReplicaLoad  # the one owner of the replicas' load counters (app/routing/load.py)
    kv_events: KVEventSubscriber | None = None  # the prefix hook asks it when blocks arrived
    # the pipeline's stages (app/pipeline/request.py runs them in its order); None: step skipped.
    # They are read once, when app/server.py `build_pipeline` wires the pipeline.
    hygiene: HygieneStage | None = None
    prefix: PrefixStage | None = None
    tracing: TracingStage | None = None  # only with tracing.enabled
    admission: Admission | None = None  # per-tenant limits and the gateway queue (app/admission/)
    hooks: list[RequestHook] = field(default_factory=list)  # extra observers, after the stages
    background: list[Background] = field(default_factory=list)
    extra_routers: list[APIRouter] = field(default_factory=list)  # mounted on the control plane
    draining: bool = False  # set once on SIGTERM: /readyz answers 503 from then on
    # `serve --workers N`: the other workers' own-metrics sockets; /metrics merges them (app/workers.py)
    metric_peers: list[str] = field(default_factory=list)
