"""Running ASGI apps on loopback: free ports and uvicorn servers in background threads.

Used by the demo, the simulator's test cluster, the benchmarks and the tests, so each of them
starts real HTTP servers the same way.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    """The production settings: uvloop + httptools when installed, no access log."""
    kwargs.setdefault("log_level", "warning")
    return uvicorn.Config(app, host=host, port=port, loop="auto", http="auto",
                          access_log=False, lifespan="on", timeout_keep_alive=75, **kwargs)


class ServerThread:
    """A uvicorn server on its own event loop in a daemon thread. `start()` returns when the
    server accepts connections; `stop()` shuts it down gracefully."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, **kwargs: Any) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(uvicorn_config(app, host, self.port, **kwargs))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"uvicorn:{self.port}")
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        # the production loop (uvloop when installed, as `prefixgate serve` gets), not asyncio's
        factory = self.server.config.get_loop_factory()
        self.loop = factory() if factory is not None else asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def start(self, timeout: float = 20.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
