"""The EPP's endpoints from an InferencePool (app/epp/pool.py): the pool read, its pods listed and
watched over the Kubernetes REST API. No cluster runs here, so the API is a small loopback server
speaking the same paths and watch stream (one JSON event per line); the replicas are real
simulators on two loopback addresses (two "pod IPs", one target port)."""

from __future__ import annotations

import asyncio
import queue
import time
from typing import Any

import orjson

from app.epp.pool import pod_endpoints
from app.serving import ServerThread, free_port
from app.sim.testing import SimCluster
from tests.epp_testing import EppHandle, chat, conversation, make_epp

NS, POOL = "llm", "vllm-pool"


def pod(name: str, ip: str, ready: bool = True, version: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "labels": {"app": "vllm"}, "resourceVersion": str(version)},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class KubeApi:
    """The three calls the watch makes: get the pool, list pods (by label), watch pods."""

    def __init__(self, port: int, pods: list[dict[str, Any]]) -> None:
        self.pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
                     "metadata": {"name": POOL, "namespace": NS},
                     "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": port}],
                              "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
        self.pods = pods
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.selectors: list[str] = []
        self.closed = False  # ends the watch stream, so the server's shutdown need not wait it out

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, query = scope["path"], scope["query_string"].decode()
        if path == f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools/{POOL}":
            await self._json(send, self.pool)
        elif path == f"/api/v1/namespaces/{NS}/pods" and "watch=1" not in query:
            self.selectors.append(query)
            await self._json(send, {"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": self.pods})
        elif path == f"/api/v1/namespaces/{NS}/pods":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            while not self.closed:
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    await asyncio.sleep(0.02)
                    continue
                await send({"type": "http.response.body", "body": orjson.dumps(event) + b"\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await self._json(send, {"kind": "Status", "code": 404}, 404)

    @staticmethod
    async def _json(send: Any, body: Any, status: int = 200) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(body)})


def test_pod_endpoints_need_an_ip_readiness_and_no_deletion() -> None:
    assert pod_endpoints(pod("a", "10.0.0.1"), [8000, 8001]) == ["10.0.0.1:8000", "10.0.0.1:8001"]
    assert pod_endpoints(pod("a", "10.0.0.1", ready=False), [8000]) == []
    gone = pod("a", "10.0.0.1")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_endpoints(gone, [8000]) == []
    assert pod_endpoints({"metadata": {"name": "p"}, "status": {}}, [8000]) == []


def test_the_pool_watch_follows_pods_and_the_epp_routes_to_them() -> None:
    port = free_port("127.0.0.1")
    with SimCluster(1, host="127.0.0.1", ports=[port], time_scale=0.0), \
            SimCluster(1, host="127.0.0.2", ports=[port], time_scale=0.0):  # two "pod IPs", one target port
        api = KubeApi(port, [pod("vllm-a", "127.0.0.1")])
        with ServerThread(api) as kube:
            epp = make_epp([], epp={"pool": POOL, "pool_namespace": NS, "kube_api": kube.url},
                           routing={"health_interval_s": 0.2})
            try:
                follow_pods(epp, api, f"127.0.0.1:{port}", f"127.0.0.2:{port}")
            finally:
                epp.server.stop()
                api.closed = True


def follow_pods(epp: EppHandle, api: KubeApi, ea: str, eb: str) -> None:
    replicas = epp.app.services.replicas

    def wait_names(names: list[str]) -> None:
        deadline = time.monotonic() + 10
        while sorted(replicas.names()) != sorted(names):
            assert time.monotonic() < deadline, replicas.names()
            time.sleep(0.02)

    wait_names([ea])
    assert api.selectors == ["labelSelector=app=vllm"]  # listed once, then watched
    api.events.put({"type": "ADDED", "object": pod("vllm-b", "127.0.0.2", version=2)})
    wait_names([ea, eb])
    deadline = time.monotonic() + 10
    while replicas.get(eb).models is None:  # routable once the health checker has seen its /v1/models
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = epp.run(lambda plane: plane.request("/v1/chat/completions", chat(conversation(1, 1)[0]), subset=[eb]))
    assert r.status == 200, r.body
    assert r.served == eb and r.headers["x-prefixgate-backend"] == eb
    api.events.put({"type": "MODIFIED", "object": pod("vllm-a", "127.0.0.1", ready=False, version=3)})
    api.events.put({"type": "DELETED", "object": pod("vllm-b", "127.0.0.2", version=4)})
    wait_names([])
    r = epp.run(lambda plane: plane.request("/v1/chat/completions", chat(conversation(1, 1)[0])))
    assert r.status == 503
