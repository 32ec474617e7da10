"""The fuzz suite's servers, in their own process: simulated replicas and two real proxies.

`python -m tests.fuzz_server` starts three simulated replicas (each wrapped so it records the
request id of every 5xx it answers) and two proxies in front of them (`create_app`, real uvicorn
on loopback), prints one JSON line `{"proxies": [port, ...], "sims": [port, ...], "report": port}`
and serves until stdin closes. Its own process, so the proxies' work runs on another core than
the test's request generation, and so the proxy process's open sockets can be counted from
/proc/<pid>/fd.

`GET /report` on the report port answers what only the inside can see: the simulators' recorded
5xx request ids and, per proxy, its active request count, its upstream pool and its health
checker's pool (acquired, idle connections each) and its engine scraper's open connections. The simulators' running and waiting requests come from their own `GET /sim/state`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from app.serving import ServerThread
from app.sim.options import SimOptions
from app.sim.server import SimApp
from app.sim.tokens import load_tokenizer

MODEL = "sim"
SALT_ENV = "PREFIXGATE_FUZZ_SALT_SECRET"
# proxy 0: the defaults; proxy 1: every optional stage on, the session router, a small body limit
PROXY_CONFIGS: list[dict[str, Any]] = [
    {},
    {"routing": {"policy": "session"}, "limits": {"max_body_bytes": 262_144},
     "hygiene": {"rewrites": {"canonical_json": True}},
     "tenants": {"default": {"policy": "rewrite"},
                 "overrides": {"warned": {"policy": "warn"}, "rejected": {"policy": "reject"}},
                 "cache_salt": {"enabled": True, "secret_env": SALT_ENV}}},
]


class RecordingSim:
    """ASGI wrapper of one simulated replica: remembers the request id of every 5xx it answers
    (and of every request it failed on with an exception, which uvicorn turns into a 500)."""

    def __init__(self, app: SimApp, five_xx: set[str]) -> None:
        self.app = app
        self.five_xx = five_xx

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 500:
                self.five_xx.add(rid)
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        except BaseException:
            self.five_xx.add(rid)
            raise


def _pool(connector: Any) -> tuple[int, int]:
    """(acquired, idle) connections of an aiohttp connector; (-1, -1) when it cannot be read
    (aiohttp keeps them in private fields), so a leak check fails rather than passing on zeros."""
    if connector is None or not hasattr(connector, "_acquired") or not hasattr(connector, "_conns"):
        return -1, -1
    for _ in range(10):  # read from another thread: retry if the pool changed meanwhile
        try:
            idle = sum(len(v) for v in list(connector._conns.values()))
            return len(connector._acquired), idle
        except RuntimeError:
            continue
    return -1, -1


def _upstream_pool(upstream: Any) -> tuple[int, int]:
    """(acquired, idle) over the proxy's upstream clients (aiohttp and app/proxy/h1.py)."""
    for _ in range(10):  # read from another thread: retry if a pool changed meanwhile
        try:
            return upstream.pool_stats()
        except RuntimeError:
            continue
    return -1, -1


def _httpx_connections(client: Any) -> int:
    """Connections an httpx client's pool holds open (the engine scraper's); -1 when unreadable."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    if pool is None:
        return 0 if client is None else -1
    return sum(1 for c in list(pool.connections) if not c.is_closed())


class Report:
    def __init__(self, five_xx: set[str], proxies: list[Any]) -> None:
        self.five_xx, self.proxies = five_xx, proxies

    def snapshot(self) -> dict[str, Any]:
        return {
            "five_xx": sorted(self.five_xx),
            "proxies": [{"active": p.openai.active, "pool": _upstream_pool(p.services.upstream),
                         "health": _pool(p.services.health._session.connector if p.services.health._session else None),
                         "scraper": _httpx_connections(p.services.scraper._client)} for p in self.proxies],
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body = json.dumps(self.snapshot()).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def main() -> int:
    from app.config import Settings, deep_merge
    from app.server import create_app

    os.environ.setdefault(SALT_ENV, "fuzz-secret-" + "k" * 32)
    options = SimOptions.from_kwargs(time_scale=0.0, model=MODEL, max_model_len=8192, output_tokens=16)
    tokenizer = load_tokenizer(options.tokenizer)
    five_xx: set[str] = set()
    sims = [SimApp(options, tokenizer) for _ in range(3)]
    servers = [ServerThread(RecordingSim(a, five_xx), log_level="critical").start() for a in sims]
    urls = [s.url for s in servers]
    proxies = []
    for i, config in enumerate(PROXY_CONFIGS):
        backends = urls[:2] if i == 0 else urls[1:]
        settings = Settings(**deep_merge({"backends": [{"url": u} for u in backends]}, config))
        app = create_app(settings)
        proxies.append(app)
        servers.append(ServerThread(app, log_level="critical").start())
    report = ServerThread(Report(five_xx, proxies), log_level="critical").start()
    ports = {"proxies": [s.port for s in servers[3:]], "sims": [s.port for s in servers[:3]], "report": report.port}
    print(json.dumps(ports), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    for server in [report, *reversed(servers)]:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
