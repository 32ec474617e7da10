"""`prefixgate lint FILE --html REPORT`: the explorer's tenant row and break view, offline.

The lint run's tracker wrote its records into a MemoryStore exactly as the gateway writes them
into the shared Store, so the report is built by the same `tenant_report` + `tenant_summary` the
`/hygiene/tenants` endpoints use, and shown by the same page (app/ui/page.py `standalone_html`).
Lint reads the user's own file, so its break view shows prompt text (as its console output does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.prefix.tracker import tenant_report
from app.state.memory import MemoryStore
from app.ui.data import tenant_summary
from app.ui.page import standalone_html

LINT_TENANT = "lint"
LINT_KEYS = ("index", "tokens", "continuity", "cause", "fix", "static", "error")


async def lint_payload(source: str, results: list[dict[str, Any]], store: MemoryStore,
                       mode: str | None) -> dict[str, Any]:
    n = max(1, len(results))
    report = await tenant_report(store, LINT_TENANT, window=n, last_breaks=n)
    observed = [r["index"] for r in results if not r.get("error")]  # the tracker's seq 1, 2, ...
    for record in report["last_breaks"]:
        record.pop("pod", None)  # the machine that ran lint is no gateway pod
        record["request"] = observed[record["seq"] - 1]
    return {
        "overview": {"source": "lint", "file": Path(source).name, "fingerprint_mode": mode,
                     "show_text": True, "window": n, "refresh_s": 0},
        "engines": None,
        "tenants": {"tenants": [tenant_summary(report)] if report["requests"] else []},
        "details": {LINT_TENANT: report},
        "lint": [{k: r.get(k) for k in LINT_KEYS} for r in results],
    }


async def write_lint_report(path: str, source: str, results: list[dict[str, Any]], store: MemoryStore,
                            mode: str | None) -> None:
    payload = await lint_payload(source, results, store, mode)
    Path(path).write_text(standalone_html(payload), encoding="utf-8")
