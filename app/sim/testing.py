"""`SimCluster`: N simulated replicas in-process, for tests, benchmarks and the demo.

    with SimCluster(replicas=2, time_scale=0) as sim:
        sim.urls                  # ["http://127.0.0.1:PORT", ...] (no /v1)
        sim.kv_event_endpoints    # ["tcp://127.0.0.1:PORT", ...] when kv_events=True
        sim.kv_replay_endpoints   # the matching replay (ROUTER) endpoints
        sim.engine(0)             # the replica's SimEngine, for white-box assertions

Options use the `prefixgate sim` flag names with underscores (see app.sim.options.SimOptions).
Each replica is a uvicorn server on a free loopback port, in its own thread and event loop.
"""

from __future__ import annotations

from typing import Any

from app.serving import ServerThread
from app.sim.engine import SimEngine
from app.sim.options import SimOptions
from app.sim.server import SimApp
from app.sim.tokens import load_tokenizer


class SimCluster:
    """N simulated replicas in-process (uvicorn in background threads via app.serving.ServerThread)."""

    def __init__(self, replicas: int = 1, host: str = "127.0.0.1", ports: list[int] | None = None,
                 **options: Any) -> None:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        self.options = SimOptions.from_kwargs(**options)
        self.host = host
        self._ports = ports
        self.replicas = replicas
        self.apps: list[SimApp] = []
        self.servers: list[ServerThread] = []
        self.urls: list[str] = []
        self.kv_event_endpoints: list[str] = []
        self.kv_replay_endpoints: list[str] = []  # vLLM-style ROUTER replay, per replica

    def start(self) -> SimCluster:
        tokenizer = load_tokenizer(self.options.tokenizer)
        try:
            for i in range(self.replicas):
                app = SimApp(self.options, tokenizer)
                self.apps.append(app)
                port = self._ports[i] if self._ports else None
                server = ServerThread(app, host=self.host, port=port).start()
                self.servers.append(server)
                self.urls.append(server.url)
                if app.kv_events_endpoint:
                    self.kv_event_endpoints.append(app.kv_events_endpoint)
                if app.kv_replay_endpoint:
                    self.kv_replay_endpoints.append(app.kv_replay_endpoint)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:  # every replica shuts down at once; then each is joined
            server.request_stop()
        for server in self.servers:
            server.stop()
        for app in self.apps:
            if app.publisher is not None:
                try:
                    app.publisher.close()
                except Exception:  # noqa: BLE001 - already closed by the lifespan
                    pass
        self.servers = []

    def engine(self, i: int) -> SimEngine:
        return self.apps[i].engine

    def app(self, i: int) -> SimApp:
        return self.apps[i]

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
