"""Running ASGI apps: free ports, uvicorn servers in background threads, and the SIGTERM drain.

`ServerThread` is used by the demo, the simulator's test cluster, the benchmarks and the tests, so
each of them starts real HTTP servers the same way. `serve_draining` runs `prefixgate serve`: the
data port (and the admin port, if any) on the main thread's loop, with the shutdown policy of
docs/operations.md ("Drain").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import uvicorn

from app.lingering import LingeringAutoProtocol

log = logging.getLogger("prefixgate.serving")
CUT_BACKSTOP_S = 10.0  # after the deadline's cut, uvicorn cancels whatever still has not ended


_PORT_RNG = random.Random()
_HANDED: deque[int] = deque(maxlen=1024)  # ports this process handed out lately


def free_port(host: str = "127.0.0.1") -> int:
    """A free port for a child process to bind (see consecutive_free_ports)."""
    return consecutive_free_ports(1, host)


def consecutive_free_ports(n: int, host: str = "127.0.0.1") -> int:
    """The first of `n` consecutive free ports (for `prefixgate sim --replicas n`), drawn below the
    kernel's ephemeral range (32768+ on Linux), where outgoing connections never take one between
    this check and the child's bind."""
    for _ in range(200):
        base = _PORT_RNG.randrange(20000, 32768 - n)
        if any(base + i in _HANDED for i in range(n)):
            continue  # handed out recently: its child may not have bound it yet
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, base + i))
            _HANDED.extend(range(base, base + n))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a child process: close its stdin (a child that waits on it sees EOF), SIGTERM, and SIGKILL
    after `timeout` seconds, so a hung child never outlives the benchmark or test that started it."""
    if proc.stdin and not proc.stdin.closed:
        proc.stdin.close()
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def uvicorn_config(app: Any, host: str, port: int, **kwargs: Any) -> uvicorn.Config:
    """The production settings: uvloop + httptools when installed, lingering close
    (app/lingering.py), no access log."""
    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("lifespan", "on")
    kwargs.setdefault("http", LingeringAutoProtocol)
    return uvicorn.Config(app, host=host, port=port, loop="auto",
                          access_log=False, timeout_keep_alive=75, **kwargs)


class _PromptServer(uvicorn.Server):
    """uvicorn's server whose main loop ends as soon as `wake()` is called from another thread,
    rather than at its next 0.1 s tick: the test suite stops a few thousand of these, one or more a
    test, and each stop waited for that tick."""

    _exit_now: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._exit_now = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):  # what uvicorn's loop does each tick (date header, limits)
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_now.wait(), 0.1)

    def wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread-safe: end the main loop now (after `should_exit` is set)."""
        event = self._exit_now
        if event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: it has exited anyway
                loop.call_soon_threadsafe(event.set)


class ServerThread:
    """A uvicorn server on its own event loop in a daemon thread. `start()` returns when the
    server accepts connections; `stop()` shuts it down gracefully."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, **kwargs: Any) -> None:
        self.host = host
        self._app, self._kwargs, self._chosen = app, kwargs, port is None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._prepare(port or free_port(host))

    def _prepare(self, port: int) -> None:
        self.port = port
        self.server = _PromptServer(uvicorn_config(self._app, self.host, port, **self._kwargs))
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"uvicorn:{port}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        # the production loop (uvloop when installed, as `prefixgate serve` gets), not asyncio's
        factory = self.server.config.get_loop_factory()
        self.loop = factory() if factory is not None else asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        except SystemExit:
            # uvicorn exits on a failed start-up (the port taken): the thread ends quietly, and
            # `start()`, which sees it end before the server started, draws another port or raises
            return

    def start(self, timeout: float = 20.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        tries = 3  # a port this thread chose may be taken between the check and the bind (another process
        while not self.server.started:  # drew it too): it draws another, as a port given to it never does
            if not self._thread.is_alive():
                if self._chosen and tries > 0:
                    tries -= 1
                    self._prepare(free_port(self.host))
                    self._thread.start()
                    continue
                raise RuntimeError(f"server on port {self.port} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout}s")
            time.sleep(0.01)
        return self

    def request_stop(self) -> None:
        """Begin the graceful shutdown without waiting for it (several servers then stop side by side)."""
        self.server.should_exit = True
        if self.loop is not None:
            self.server.wake(self.loop)

    def stop(self, timeout: float = 10.0) -> None:
        self.request_stop()
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Drainable(Protocol):
    """What the drain needs from the app it serves (app/server.py `PrefixgateApp`)."""

    def begin_drain(self) -> None:
        """Readiness answers 503 from now on."""
        ...

    def in_flight(self) -> int:
        """Requests not yet finished."""
        ...

    async def cut(self) -> int:
        """End what is still open, each with its route's error; returns how many were open."""
        ...


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM/SIGINT to `serve_draining` (uvicorn's own handler
    closes the listener at once, which is exactly the lost-requests behaviour a drain avoids)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve_draining(target: Drainable, primary: uvicorn.Config, *others: uvicorn.Config,
                   accept_s: float, grace_s: float,
                   sockets: list[list[socket.socket] | None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT, then drain; the exit status (0 after a clean drain).

    On the first signal: `target.begin_drain()` (/readyz 503 at once); the listener keeps accepting
    for `accept_s` (endpoint propagation: peers still routing here are served, not refused); then
    it closes and in-flight requests run to their end until `grace_s` after the signal, when
    `target.cut()` ends the rest with their route's error event; the app's lifespan shutdown then
    flushes background work. A second signal ends at once (status 1). `others` (the admin port)
    keep serving until the primary has finished, so /metrics answers throughout the drain.
    `sockets`: per config (primary first), listeners already bound (a worker of `serve --workers`,
    app/workers.py); None: the config binds its own."""
    with asyncio.Runner(loop_factory=primary.get_loop_factory()) as runner:
        return runner.run(_Drain(target, primary, others, accept_s, grace_s, sockets).run())


class _Drain:
    def __init__(self, target: Drainable, primary: uvicorn.Config, others: tuple[uvicorn.Config, ...],
                 accept_s: float, grace_s: float, sockets: list[list[socket.socket] | None] | None = None) -> None:
        self.target = target
        self.sockets = sockets or [None] * (1 + len(others))
        # uvicorn's own graceful timeout is only the backstop behind our deadline and cut
        primary.timeout_graceful_shutdown = int(grace_s + CUT_BACKSTOP_S) + 1
        self.primary = _QuietServer(primary)
        self.others = [_QuietServer(c) for c in others]
        self.accept_s = accept_s
        self.grace_s = grace_s
        self.stop = asyncio.Event()
        self.forced = asyncio.Event()

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stop.is_set():
            log.warning("second %s: exiting now", sig.name)
            self.forced.set()
            for server in (self.primary, *self.others):
                server.force_exit = server.should_exit = True
        else:
            log.info("%s: draining (accepting %.0fs more, in-flight requests get up to %.0fs)",
                     sig.name, self.accept_s, self.grace_s)
            self.stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        primary = asyncio.create_task(self.primary.serve(self.sockets[0]))
        others = [asyncio.create_task(s.serve(socks)) for s, socks in zip(self.others, self.sockets[1:], strict=True)]
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait([primary, *others, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not self.stop.is_set():  # a server ended on its own (start-up failed: port in use, lifespan error)
            for server in (self.primary, *self.others):
                server.should_exit = True
            await asyncio.gather(primary, *others, return_exceptions=True)
            stopped.cancel()
            return 1
        signalled = loop.time()
        self.target.begin_drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.forced.wait(), self.accept_s)
        self.primary.should_exit = True  # listener closes; uvicorn waits for in-flight requests
        deadline = asyncio.create_task(self._cut_at(signalled + self.grace_s))
        await asyncio.gather(primary, return_exceptions=True)
        deadline.cancel()
        for server in self.others:
            server.should_exit = True
        await asyncio.gather(*others, return_exceptions=True)
        return 1 if self.forced.is_set() else 0

    async def _cut_at(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - asyncio.get_running_loop().time()))
        if self.target.in_flight():
            n = await self.target.cut()
            log.warning("shutdown.grace_s (%.0fs) reached: ended %d open request(s) with an error event",
                        self.grace_s, n)
