"""The explorer page's assets, its Content-Security-Policy, and the self-contained report file.

The page is three static files read once from this package. Served at `/ui`, app.js fetches the
`/hygiene/*` JSON from its own origin; in a `prefixgate lint --html` report the same CSS and JS
are inlined and the data travels in a `<script type="application/json">` block, which the JS
reads instead of fetching. Either way the DOM is built with `textContent` only (no `innerHTML`),
so prompt text, tenant names and values can never become markup.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import cache
from importlib import resources
from typing import Any

# Served pages: nothing but this origin; the report file: nothing but its own inlined script/style.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
DATA_ID = "pg-data"


@cache
def asset(name: str) -> str:
    """One of index.html, app.js, app.css (read once)."""
    return resources.files("app.ui").joinpath(name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def json_for_script(payload: Any) -> str:
    """JSON that cannot end its `<script>` element early (every `<`, `>`, `&` escaped)."""
    raw = json.dumps(payload, ensure_ascii=False, default=str)
    return raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def standalone_html(payload: dict[str, Any]) -> str:
    """index.html with app.css and app.js inlined and `payload` embedded: opens from a file,
    fetches nothing, and its CSP admits only the two inlined blocks (by hash)."""
    css, js = asset("app.css"), asset("app.js")
    csp = (f"default-src 'none'; script-src {_sha256(js)}; style-src {_sha256(css)}; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    page = asset("index.html")
    head = (f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f"<style>{css}</style>")
    page = page.replace('<link rel="stylesheet" href="/ui/app.css">', head)
    data = f'<script type="application/json" id="{DATA_ID}">{json_for_script(payload)}</script>\n'
    return page.replace('<script src="/ui/app.js"></script>', f"{data}<script>{js}</script>")
