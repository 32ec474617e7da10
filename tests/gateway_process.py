"""`prefixgate serve` as a real subprocess (the signal handling and the drain only exist there):
start it from a config dict, wait for readiness, signal it, read its exit status and log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.serving import free_port

ROOT = Path(__file__).resolve().parent.parent


class GatewayProcess:
    def __init__(self, config: dict[str, Any], port: int | None = None, env: dict[str, str] | None = None,
                 args: list[str] | None = None) -> None:
        self.port = port or free_port()
        self.args = args or []  # extra `prefixgate serve` arguments (e.g. --workers 2)
        self.config = {**config, "listen": {"host": "127.0.0.1", "port": self.port}}
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="prefixgate-", suffix=".log", delete=False)  # noqa: SIM115
        self._config_path = Path(tempfile.mkstemp(prefix="prefixgate-", suffix=".yaml")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> GatewayProcess:
        """Start the process without waiting for it (see `started`: several start side by side)."""
        self._config_path.write_text(yaml.safe_dump(self.config))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--config", str(self._config_path), "--log-level", "info", *self.args],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env})
        return self

    def wait_ready(self, timeout: float = 60.0) -> GatewayProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        # one client for the whole wait: a new one per poll costs ~30 ms of CPU (its TLS context),
        # taken from the gateway that is starting beside it
        with httpx.Client(timeout=1) as client:
            while not self.ready(client):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gateway exited with {self.proc.returncode} during start:\n{self.log()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gateway on {self.port} not ready in {timeout}s:\n{self.log()}")
                time.sleep(0.1)
        return self

    def ready(self, client: httpx.Client | None = None) -> bool:
        try:
            get = client.get if client is not None else httpx.get
            return get(self.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._config_path.unlink(missing_ok=True)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def started(*gateways: GatewayProcess) -> Iterator[tuple[GatewayProcess, ...]]:
    """Start every gateway at once (their imports overlap), wait until each is ready, stop them all."""
    try:
        for g in gateways:
            g.spawn()
        for g in gateways:
            g.wait_ready()
        yield gateways
    finally:
        for g in gateways:
            g.stop()
