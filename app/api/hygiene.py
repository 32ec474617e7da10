"""Control-plane reports on prefix hygiene, and the explorer page that reads them.

JSON: `/hygiene/overview` (this pod, display settings, the reuse funnel), `/hygiene/tenants`
(every tenant: continuity, its per-request sparkline, breaks by cause, TTFT by prompt bucket, the
last break), `/hygiene/tenants/{tenant}` (one tenant's report with its last breaks). Page: `/ui`
with `/ui/app.js` and `/ui/app.css` (app/ui/, docs/ui.md), under a CSP that allows nothing but
this origin.

Tenant figures are read from the Store (records and counters written by the tenant tracker), so
any gateway pod answers for the whole fleet, break views included (app/prefix/breakview.py).
Prompt text appears only when `hygiene.show_text` is on; otherwise snippets are redacted to their
shape (letters x, digits 9, dynamic values <kind>). The reuse funnel is this pod's counters.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from app.prefix.breakview import POD
from app.prefix.tracker import tenant_report
from app.telemetry.funnel import STAGES as REUSE_STAGES
from app.ui.data import tenant_summary
from app.ui.page import ASSETS, SECURITY_HEADERS, asset

REUSE_METRIC = "prefixgate_prefix_reuse_tokens_total"


def _mode(services: Any) -> str | None:
    return services.prefix.mode if services.prefix is not None else None


async def _all_reports(services: Any) -> list[dict[str, Any]]:
    opts = services.settings.prefix
    tenants = await services.store.tenants()
    reports = [await tenant_report(services.store, t, opts.window, opts.last_breaks) for t in sorted(tenants)]
    return [r for r in reports if r["requests"]]


def safe_link(url: str | None) -> str | None:
    """`url` when it is an absolute http(s) URL, else None (no javascript: links in the page)."""
    if not url:
        return None
    parts = urlsplit(url)
    return url if parts.scheme in ("http", "https") and parts.netloc else None


def reuse_funnel(metrics: Any) -> dict[str, Any]:
    """This pod's reusable prompt tokens since it started, by stage (app/telemetry/funnel.py); a
    stage never counted is None (unknown), not 0."""
    funnel: dict[str, Any] = {"scope": "pod", "pod": POD}
    for stage in REUSE_STAGES:
        funnel[stage] = metrics.registry.get_sample_value(REUSE_METRIC, {"stage": stage})
    return funnel


def build_hygiene_router(services: Any) -> APIRouter:
    router = APIRouter()
    settings = services.settings

    @router.get("/hygiene/overview")
    async def overview() -> JSONResponse:
        return JSONResponse({
            "pod": POD, "fingerprint_mode": _mode(services), "show_text": settings.hygiene.show_text,
            "window": settings.prefix.window, "grafana_url": safe_link(settings.ui.grafana_url),
            "refresh_s": settings.ui.refresh_s, "reuse": reuse_funnel(services.metrics),
        })

    @router.get("/hygiene/tenants")
    async def tenants() -> JSONResponse:
        reports = await _all_reports(services)
        return JSONResponse({"fingerprint_mode": _mode(services), "show_text": settings.hygiene.show_text,
                             "tenants": [tenant_summary(r) for r in reports]})

    @router.get("/hygiene/tenants/{tenant}")
    async def tenant(tenant: str) -> JSONResponse:
        opts = settings.prefix
        report = await tenant_report(services.store, tenant, opts.window, opts.last_breaks)
        if not report["requests"]:
            return JSONResponse({"error": {"message": f"unknown tenant {tenant!r}", "type": "not_found",
                                           "param": "tenant", "code": None}}, status_code=404)
        report["fingerprint_mode"] = _mode(services)
        return JSONResponse(report)

    @router.get("/ui", response_class=HTMLResponse)
    async def ui() -> HTMLResponse:
        return HTMLResponse(asset("index.html"), headers=SECURITY_HEADERS)

    @router.get("/ui/{name}")
    async def ui_asset(name: str) -> Response:
        if name not in ASSETS:
            return JSONResponse({"error": {"message": f"no such file {name!r}", "type": "not_found",
                                           "param": None, "code": None}}, status_code=404)
        return Response(asset(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)

    return router
