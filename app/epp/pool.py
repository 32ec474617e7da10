"""Endpoints from an InferencePool: its selector's ready pods, kept current by a watch.

A small client of the Kubernetes REST API (no client library): read the pool
(`/apis/inference.networking.k8s.io/v1/namespaces/NS/inferencepools/NAME`) for
`spec.selector.matchLabels` and `spec.targetPorts[].number`, list the pods matching the selector,
then watch them from the list's `resourceVersion` (one JSON event per line: ADDED, MODIFIED,
DELETED, BOOKMARK, ERROR). A pod is an endpoint while it has a pod IP, its `Ready` condition is
True and it is not being deleted; each target port makes one replica `ip:port` (the names the
protocol uses, docs/epp.md). A broken or expired watch (410 Gone) is answered with a fresh list;
API errors leave the replicas as they are, so an API outage never empties the pool.

In-cluster by default: the API server from KUBERNETES_SERVICE_HOST/PORT, the service account's
token and CA (the chart's Role grants get/list/watch on pods and inferencepools). `epp.kube_api`
points elsewhere (tests: a loopback API).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from app.config import Epp
from app.routing.base import Replica
from app.routing.discovery import diff_replicas, replica_for
from app.routing.replicas import ReplicaSet
from app.tasks import cancel_and_wait

log = logging.getLogger("prefixgate.epp.pool")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RETRY_S = 2.0


def pod_endpoints(pod: dict[str, Any], ports: list[int]) -> list[str]:
    """The `ip:port` names a pod contributes (none unless it is ready and not being deleted)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or meta.get("deletionTimestamp"):
        return []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return [replica_for(ip, port, "http").name for port in ports] if ready else []


class PoolWatch:
    """A `Background` component: the pool's ready pods as the ReplicaSet's members."""

    def __init__(self, config: Epp, replicas: ReplicaSet,
                 on_change: Callable[[list[Replica], list[str]], None] | None = None) -> None:
        assert config.pool is not None
        self.name = config.pool
        self.namespace = config.pool_namespace or _own_namespace()
        self.api = (config.kube_api or _in_cluster_api()).rstrip("/")
        self.replicas = replicas
        self.on_change = on_change
        self.ports: list[int] = []
        self.selector = ""
        self.pods: dict[str, list[str]] = {}  # pod name -> its endpoints
        self._managed: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()

    async def start(self) -> None:
        headers = {}
        token = SA_DIR / "token"
        if self.api.startswith("https://") and token.exists():
            headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        ssl_ctx: ssl.SSLContext | bool = True
        if (SA_DIR / "ca.crt").exists() and self.api.startswith("https://"):
            ssl_ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
        self._session = aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=ssl_ctx))
        version = ""
        with contextlib.suppress(Exception):  # the first sync is best effort: the loop retries
            version = await asyncio.wait_for(self._list(), 10)
        self._task = asyncio.create_task(self._run(version), name="prefixgate-pool-watch")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.get(self.api + path) as resp:
            resp.raise_for_status()
            return orjson.loads(await resp.read())

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    async def _list(self) -> str:
        """Read the pool and list its pods; returns the list's resourceVersion."""
        pool = await self._get(f"/apis/inference.networking.k8s.io/v1/namespaces/{self.namespace}"
                               f"/inferencepools/{self.name}")
        spec = pool.get("spec") or {}
        labels = (spec.get("selector") or {}).get("matchLabels") or {}
        self.selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        self.ports = [int(p["number"]) for p in spec.get("targetPorts") or []]
        listing = await self._get(f"{self._pods_path()}?labelSelector={self.selector}")
        self.pods = {p["metadata"]["name"]: pod_endpoints(p, self.ports) for p in listing.get("items") or []}
        self._reconcile()
        self.synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    async def _run(self, version: str) -> None:
        while True:
            try:
                if not version:
                    version = await self._list()
                version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API is away: keep the replicas, retry
                log.warning("pool %s/%s: %s: %s; retrying", self.namespace, self.name, type(exc).__name__, exc)
                version = ""
                await asyncio.sleep(RETRY_S)

    async def _watch(self, version: str) -> str:
        """Follow pod events until the watch ends; '' asks for a fresh list (expired, error)."""
        assert self._session is not None
        url = f"{self.api}{self._pods_path()}?labelSelector={self.selector}&watch=1&resourceVersion={version}"
        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
            if resp.status == 410:
                return ""
            resp.raise_for_status()
            async for line in resp.content:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind, pod = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return ""
                version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                name = (pod.get("metadata") or {}).get("name", "")
                if kind == "DELETED":
                    self.pods.pop(name, None)
                else:
                    self.pods[name] = pod_endpoints(pod, self.ports)
                self._reconcile()
        return version

    def _reconcile(self) -> None:
        wanted = {e for endpoints in self.pods.values() for e in endpoints}
        to_add, to_remove = diff_replicas(self._managed, wanted)
        added = []
        for name in to_add:
            host, port = name.rsplit(":", 1)
            added.append(self.replicas.add(Replica(name=name, url=f"http://{host}:{port}")))
        for name in to_remove:
            self.replicas.remove(name)
        self._managed = wanted
        if (added or to_remove) and self.on_change is not None:
            self.on_change(added, to_remove)
        if added or to_remove:
            log.info("pool %s/%s: +%d -%d endpoints (%d total)", self.namespace, self.name, len(added),
                     len(to_remove), len(self.replicas))


def _own_namespace() -> str:
    path = SA_DIR / "namespace"
    return path.read_text().strip() if path.exists() else "default"


def _in_cluster_api() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ValueError("epp.pool: not in a cluster (no KUBERNETES_SERVICE_HOST); set epp.kube_api")
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"
