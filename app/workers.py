"""`prefixgate serve --workers N`: N worker processes behind one port, one gateway (docs/performance.md).

The master process validates the configuration, binds one SO_REUSEPORT listener per worker on the
data port (and the admin port) so the kernel spreads connections over the workers, and forks them.
Each worker is a complete `prefixgate serve` with its own event loop and its SIGTERM drain
(app/serving.py). Each worker's live load per replica (in flight, queued prefill) is in a table
of shared memory the master maps before the fork (app/routing/siblings.py), so a worker prices
its siblings' requests as its own, live, not from a stale engine scrape. What every worker must
see alike beyond that goes through the Store: Redis when `state` is a
Redis URL (the workers are then pods of one deployment), otherwise the master's embedded shared
store (app/state/shared.py) over a UNIX socket: the residency index, session bindings, tenant
history and the /hygiene counters. Prometheus series are per worker and merged at scrape time:
each worker serves its own registry on a private UNIX socket, and whichever worker a scrape
reaches answers with all of them merged (app/telemetry/peers.py, app/telemetry/merge.py).

Signals: SIGTERM/SIGINT to the master is forwarded to every worker (each drains as a single
process does, docs/operations.md); a second signal is forwarded too (the workers end at once).
The master keeps the shared store up until the last worker has exited, so their shutdown flush
(continuity records, residency writes) lands. A worker that dies on its own makes the master stop
the others and exit 1: the orchestrator restarts the pod whole rather than a gateway running on
fewer cores than it claims. Workers get SIGTERM if the master dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.prefix.pool import set_serve_workers

if TYPE_CHECKING:
    from app.config import Settings
    from app.routing.siblings import SiblingLoads

log = logging.getLogger("prefixgate.workers")
PR_SET_PDEATHSIG = 1


def worker_count(value: str) -> int:
    """`--workers`: a positive integer, or `auto` (the cores this process may run on)."""
    if value == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers must be a number or 'auto', not {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("--workers must be at least 1")
    return n


@dataclass
class WorkerContext:
    """What a forked worker is told by the master."""

    index: int
    store_path: str | None  # the embedded shared store's socket; None with Redis state
    siblings: SiblingLoads  # every worker's live load per replica (shared memory)
    metrics_path: str  # this worker's own-metrics socket
    peer_metrics: list[str]  # the other workers' own-metrics sockets


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class OwnMetricsApp:
    """The ASGI app on a worker's private socket: its own registry only, never merged (the
    worker answering a scrape merges; a peer answering with merged series would double-count)."""

    def __init__(self, render: Any) -> None:
        self.render = render

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body, content_type = self.render()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type.encode())]})
        await send({"type": "http.response.body", "body": body})


def serve_workers(settings: Settings, n: int, log_level: str) -> int:
    """The master: bind, fork `n` workers, serve the shared store, forward signals. `settings`
    are validated by the caller (app/serve.py); each worker builds its app from them."""
    from app.routing.siblings import SiblingLoads
    from app.state.factory import build_memory_store, is_redis_url
    from app.state.shared import StoreServer

    rundir = tempfile.mkdtemp(prefix="prefixgate-workers-")
    try:
        data = [reuseport_socket(settings.listen.host, settings.listen.port) for _ in range(n)]
        admin_listen = settings.admin.listen
        admin = [reuseport_socket(admin_listen.host, admin_listen.port) for _ in range(n)] if admin_listen else []
    except OSError as exc:
        print(f"prefixgate: cannot listen on {settings.listen.host}:{settings.listen.port}: {exc}", file=sys.stderr)
        return 2
    store_sock: socket.socket | None = None
    store_path = None
    if not is_redis_url(settings.state):
        store_path = os.path.join(rundir, "store.sock")
        store_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        store_sock.bind(store_path)
        store_sock.listen(256)
    metric_paths = [os.path.join(rundir, f"metrics-{i}.sock") for i in range(n)]
    siblings = SiblingLoads(n)  # mapped before the fork: every worker shares its pages
    children: dict[int, int] = {}
    set_serve_workers(n)  # each worker sizes its cold-prompt pool to the spare cores (inherited)
    for i in range(n):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                for j, sock in enumerate(data + admin):
                    if j % n != i:
                        sock.close()
                if store_sock is not None:
                    store_sock.close()
                with contextlib.suppress(Exception):
                    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
                siblings.bind(i)
                ctx = WorkerContext(i, store_path, siblings, metric_paths[i],
                                    [p for j, p in enumerate(metric_paths) if j != i])
                code = _run_worker(settings, log_level, ctx, data[i], admin[i] if admin else None)
            except BaseException:  # noqa: BLE001 -- a worker never returns into the master's code
                logging.getLogger("prefixgate.workers").exception("worker %d failed", i)
            finally:
                os._exit(code)
        children[pid] = i
    for sock in data + admin:
        sock.close()
    log.info("prefixgate: %d workers on http://%s:%d (state: %s)", n, settings.listen.host, settings.listen.port,
             "shared store " + store_path if store_path else "redis")
    server = StoreServer(build_memory_store(settings), store_sock) if store_sock is not None else None
    try:
        return asyncio.run(_master(children, server))
    finally:
        for path in (store_path, *metric_paths):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(rundir)


async def _master(children: dict[int, int], server: Any) -> int:
    loop = asyncio.get_running_loop()
    if server is not None:
        await server.start()
    signalled = 0

    def forward(sig: signal.Signals) -> None:
        nonlocal signalled
        signalled += 1
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if signalled == 1 else signal.SIGINT)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, forward, sig)
    status = 0
    try:
        while children:
            pid, code = await loop.run_in_executor(None, _wait_any)
            if pid not in children:
                continue
            index = children.pop(pid)
            code = os.waitstatus_to_exitcode(code)
            status = max(status, code if code > 0 else (1 if code < 0 else 0))
            if not signalled:
                log.error("worker %d (pid %d) exited on its own (status %d): stopping the others", index, pid, code)
                status = max(status, 1)
                forward(signal.SIGTERM)
    finally:
        if server is not None:
            await server.close()
    return status


def _wait_any() -> tuple[int, int]:
    while True:
        try:
            return os.wait()
        except InterruptedError:
            continue


def _run_worker(settings: Settings, log_level: str, ctx: WorkerContext, data: socket.socket,
                admin: socket.socket | None) -> int:
    from app.proxy.gctune import tune_for_serving
    from app.server import create_app
    from app.serving import serve_draining, uvicorn_config

    for sig in (signal.SIGTERM, signal.SIGINT):  # the master's asyncio handlers are not ours
        signal.signal(sig, signal.SIG_DFL)
    app = create_app(settings, store_path=ctx.store_path, siblings=ctx.siblings)
    app.services.metric_peers = ctx.peer_metrics
    tune_for_serving()
    level = log_level.lower()
    configs = [uvicorn_config(app, settings.listen.host, settings.listen.port, log_level=level)]
    sockets: list[list[socket.socket] | None] = [[data]]
    if app.admin is not None and admin is not None:
        configs.append(uvicorn_config(app.admin, settings.admin.listen.host, settings.admin.listen.port,
                                      log_level=level, lifespan="off"))
        sockets.append([admin])
    own = uvicorn_config(OwnMetricsApp(app.services.metrics.render), "", 0, log_level=level, lifespan="off",
                         uds=ctx.metrics_path)
    configs.append(own)
    sockets.append(None)
    return serve_draining(app, *configs, accept_s=settings.shutdown.accept_s, grace_s=settings.shutdown.grace_s,
                          sockets=sockets)
