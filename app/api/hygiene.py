"""Control-plane reports on prefix hygiene: `/hygiene/tenants`, `/hygiene/tenants/{tenant}`, `/ui`.

Everything is read from the Store (records and counters written by the tenant tracker), so any
gateway pod answers for the whole fleet. Prompt text appears only when `hygiene.show_text` is on;
otherwise snippets are redacted to their shape (letters x, digits 9, dynamic values <kind>).
"""

from __future__ import annotations

import html
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse

from app.prefix.tracker import tenant_report


def _mode(services: Any) -> str | None:
    hook = getattr(services, "components", {}).get("prefix")
    return getattr(hook, "mode", None)


async def _all_reports(services: Any) -> list[dict[str, Any]]:
    opts = services.settings.prefix
    tenants = await services.store.tenants()
    reports = [await tenant_report(services.store, t, opts.window, opts.last_breaks) for t in sorted(tenants)]
    return [r for r in reports if r["requests"]]


def build_hygiene_router(services: Any) -> APIRouter:
    router = APIRouter()

    @router.get("/hygiene/tenants")
    async def tenants() -> JSONResponse:
        reports = await _all_reports(services)
        summary = [{k: r[k] for k in ("tenant", "requests", "continuity", "breaks", "new_sessions", "breaks_by_cause")}
                   for r in reports]
        return JSONResponse({"fingerprint_mode": _mode(services),
                             "show_text": services.settings.hygiene.show_text, "tenants": summary})

    @router.get("/hygiene/tenants/{tenant}")
    async def tenant(tenant: str) -> JSONResponse:
        opts = services.settings.prefix
        report = await tenant_report(services.store, tenant, opts.window, opts.last_breaks)
        if not report["requests"]:
            return JSONResponse({"error": {"message": f"unknown tenant {tenant!r}", "type": "not_found",
                                           "param": "tenant", "code": None}}, status_code=404)
        report["fingerprint_mode"] = _mode(services)
        return JSONResponse(report)

    @router.get("/ui", response_class=HTMLResponse)
    async def ui() -> HTMLResponse:
        return HTMLResponse(render_page(await _all_reports(services), _mode(services)))

    return router


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def render_page(reports: list[dict[str, Any]], mode: str | None) -> str:
    """A small self-contained HTML page: one row per tenant, then each tenant's last breaks."""
    esc = html.escape
    rows = []
    details = []
    for r in reports:
        causes = ", ".join(f"{esc(k)}: {v}" for k, v in sorted(r["breaks_by_cause"].items())) or "–"
        rows.append(f"<tr><td>{esc(r['tenant'])}</td><td>{r['requests']}</td><td>{_pct(r['continuity'])}</td>"
                    f"<td>{r['breaks']}</td><td>{causes}</td></tr>")
        for b in r["last_breaks"]:
            details.append(
                f"<tr><td>{esc(r['tenant'])}</td><td>{esc(str(b.get('cause')))}</td><td>{b.get('block_index')}</td>"
                f"<td>{b.get('token_offset')}</td><td><code>{esc(str(b.get('snippet', '')))}</code></td>"
                f"<td>{esc(str(b.get('fix') or ''))}</td></tr>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>prefixgate hygiene</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}code{white-space:pre-wrap}</style>"
        f"</head><body><h1>Prefix hygiene</h1><p>fingerprint mode: <b>{esc(str(mode))}</b></p>"
        "<h2>Tenants</h2><table><tr><th>tenant</th><th>requests</th><th>continuity (window)</th>"
        f"<th>breaks</th><th>by cause</th></tr>{''.join(rows)}</table>"
        "<h2>Last breaks</h2><table><tr><th>tenant</th><th>cause</th><th>block</th><th>token offset</th>"
        f"<th>snippet</th><th>fix</th></tr>{''.join(details)}</table></body></html>")
