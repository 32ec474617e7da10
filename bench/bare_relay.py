"""A Python relay with no features: the floor of prefixgate's stack, for the peer table.

    .venv/bin/python bench/bare_relay.py --port 8000 --backend http://127.0.0.1:8001 --backend ...

The same server and client as `prefixgate serve` (uvicorn with uvloop + httptools and the
lingering close, `app.serving.uvicorn_config`; the gateway's own HTTP/1.1 client,
app/proxy/h1.py) and nothing else: a POST is read whole, sent to the next backend in turn, and
its response relayed chunk by chunk as it arrives (one await per upstream read). No parsing of
the body, no routing state, no metrics, no fingerprint. `bench/peer_table.py --targets ...,py_relay`
runs it beside the Rust routers, so what prefixgate's features cost is read against what a
Python relay costs on the same machine in the same rounds (issue 26).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from yarl import URL  # noqa: E402

from app.config import Limits  # noqa: E402
from app.proxy.h1 import H1Pool  # noqa: E402
from app.serving import uvicorn_config  # noqa: E402

HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}


class BareRelay:
    def __init__(self, backends: list[str]) -> None:
        self.backends = itertools.cycle([URL(b.rstrip("/")) for b in backends])
        self.pool: H1Pool | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.pool = H1Pool(Limits(), asyncio.get_running_loop())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":  # readiness (/health, /healthz)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        parts = []
        more = True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        assert self.pool is not None
        backend = next(self.backends)
        resp = await self.pool.request(backend.with_path(scope["path"]), "POST", b"".join(parts),
                                       {"content-type": "application/json"})
        try:
            headers = [(k.lower(), v) for k, v in resp.raw_headers if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            while chunk := await resp.readany():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.release()


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", action="append", required=True)
    a = ap.parse_args()
    uvicorn.Server(uvicorn_config(BareRelay(a.backend), a.host, a.port)).run()


if __name__ == "__main__":
    main()
