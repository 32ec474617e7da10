"""`GET /hygiene/engines`: per backend the engine gauges, the window figures and a one-line verdict
("prefix cache on, 83% hit" / "prefix cache OFF: 0 queries over 1,200 prompt tokens/s").

Reads the scraper's in-memory view only, so it answers instantly even while an engine hangs.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.engines.scrape import EngineScraper


def build_engines_router(scraper: EngineScraper) -> APIRouter:
    router = APIRouter(tags=["hygiene"])

    @router.get("/hygiene/engines")
    async def engines() -> dict[str, Any]:
        backends = scraper.status()
        off = sorted(name for name, view in backends.items() if view["caching_enabled"] is False)
        stale = sorted(name for name, view in backends.items() if view["stale"])
        return {"backends": backends, "prefix_cache_off": off, "stale": stale}

    return router
