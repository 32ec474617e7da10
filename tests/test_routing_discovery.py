"""DNS discovery reconciliation with an injected resolver, one real loopback resolution, and the
proxy serving through a replica it discovered."""

from __future__ import annotations

import time

import httpx

from app.config import Discovery
from app.routing.base import Replica
from app.routing.discovery import DnsDiscovery, diff_replicas, replica_for, resolve_addresses
from app.routing.replicas import ReplicaSet


def test_diff_and_naming():
    assert diff_replicas(["a", "b"], ["b", "c"]) == (["c"], ["a"])
    assert replica_for("10.0.0.5", 8000, "http").url == "http://10.0.0.5:8000"
    assert replica_for("fd00::1", 8000, "http").name == "[fd00::1]:8000"


async def test_discovery_adds_removes_and_survives_dns_failure():
    answers: list[list[str] | OSError] = [["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.3"],
                                          OSError("SERVFAIL"), []]

    async def resolver(host: str, port: int) -> list[str]:
        assert host == "vllm-headless.ns.svc" and port == 8000
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    replicas = ReplicaSet([Replica("static", "http://static:8000")])
    changes = []
    disc = DnsDiscovery(Discovery(dns="vllm-headless.ns.svc"), replicas, resolver,
                        on_change=lambda added, removed: changes.append(([r.name for r in added], removed)))
    assert await disc.refresh()
    assert replicas.names() == ["static", "10.0.0.1:8000", "10.0.0.2:8000"]
    assert await disc.refresh()
    assert replicas.names() == ["static", "10.0.0.2:8000", "10.0.0.3:8000"]
    assert changes[-1] == (["10.0.0.3:8000"], ["10.0.0.1:8000"])
    assert not await disc.refresh()  # DNS failure: nothing removed
    assert not await disc.refresh()  # empty answer: nothing removed
    assert len(replicas) == 3


async def test_real_resolution_of_localhost():
    assert "127.0.0.1" in await resolve_addresses("localhost", 80)


def test_proxy_finds_its_replica_through_real_dns(sim_factory, proxy_factory) -> None:
    """End to end: no static backends, only `discovery: {dns: localhost}` — the name really goes
    through the system resolver, the replica it yields serves a request through the proxy."""
    sim = sim_factory(replicas=1, time_scale=0.0)
    port = int(sim.urls[0].rsplit(":", 1)[1])
    proxy = proxy_factory([], discovery={"dns": "localhost", "port": port, "interval_s": 0.2})
    deadline = time.monotonic() + 10
    while not any(r.url == f"http://127.0.0.1:{port}" for r in proxy.services.replicas.healthy()):
        assert time.monotonic() < deadline, [r.url for r in proxy.services.replicas.all()]
        time.sleep(0.05)
    resp = httpx.post(proxy.url + "/v1/chat/completions", timeout=30,
                      json={"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-prefixgate-backend"] == f"127.0.0.1:{port}"
