"""A real redis-server for tests: free loopback port, no persistence, stopped by PID.

`RedisServer` can be paused (SIGSTOP: accepts TCP but never answers, the "slow Redis" case),
resumed, killed and restarted on the same port (the "Redis went away" case). Fixtures:
- `redis_server` (session): one shared server; tests isolate themselves with `redis_namespace`.
- `redis_proc` (function): a private server a fault test may kill, pause and restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

from app.serving import free_port

REDIS_BIN = os.environ.get("PREFIXGATE_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    def __init__(self, port: int | None = None, maxmemory: str | None = None) -> None:
        self.port = port or free_port()
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="pg-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        if not os.path.exists(REDIS_BIN):
            pytest.fail(f"redis-server not found ({REDIS_BIN}); run `make tools`")
        args = [REDIS_BIN, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", self._dir, "--loglevel", "warning"]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode} on port {self.port}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"redis-server on port {self.port} did not answer in {timeout}s")
            time.sleep(0.02)
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the data is gone, as when a Redis pod dies."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process still dies, but be explicit
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_namespace() -> str:
    """A namespace of its own per test, so tests sharing `redis_server` never see each other."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_proc() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
