"""A running prefixgate proxy in front of simulated vLLM replicas, with some traffic, for the
deploy tests that check dashboards and alert rules against what the proxy really exports."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from app.config import Settings
from app.server import create_app
from app.serving import ServerThread
from app.sim.testing import SimCluster

SYSTEM = "You are a careful assistant for the prefixgate deploy tests. " * 40


@dataclass
class RunningProxy:
    url: str
    sim_urls: list[str]

    def scrape(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text


def send_traffic(url: str, requests: int = 6) -> None:
    """Streamed chat completions from two tenants sharing a long system prompt."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(requests):
            body = {"model": "sim", "stream": True, "max_tokens": 8,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": f"question {i}"}]}
            r = client.post("/v1/chat/completions", json=body,
                            headers={"x-tenant-id": f"tenant-{i % 2}"})
            r.raise_for_status()


@contextmanager
def running_proxy(requests: int = 6) -> Iterator[RunningProxy]:
    with SimCluster(replicas=2, time_scale=0) as sim:
        settings = Settings(backends=[{"url": u, "name": f"sim-{i}"} for i, u in enumerate(sim.urls)],
                            scrape={"interval_s": 0.2})
        with ServerThread(create_app(settings)) as server:
            deadline = time.monotonic() + 15
            while httpx.get(f"{server.url}/readyz", timeout=5).status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError("proxy never became ready")
                time.sleep(0.05)
            send_traffic(server.url, requests)
            yield RunningProxy(server.url, sim.urls)
