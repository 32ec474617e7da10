"""`serve --workers N`: one worker's /metrics answer is every worker's series, merged.

Each worker serves its own registry on a private UNIX socket (app/workers.py); the worker a
scrape reaches gathers its peers' expositions here and merges them (app/telemetry/merge.py).
"""

from __future__ import annotations

import asyncio

import aiohttp

from app.telemetry.merge import merge_expositions

PEER_TIMEOUT_S = 5.0


async def gather_metrics(own: bytes, peers: list[str]) -> bytes:
    """This worker's exposition merged with every peer's (a peer that does not answer within
    PEER_TIMEOUT_S is left out: its series are then missing, never zeroed)."""
    async def fetch(path: str) -> str | None:
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
                async with session.get("http://worker/metrics",
                                       timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as resp:
                    return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    texts = await asyncio.gather(*(fetch(p) for p in peers))
    return merge_expositions([own.decode(), *(t for t in texts if t is not None)])
