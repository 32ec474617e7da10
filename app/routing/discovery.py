"""DNS discovery: a Kubernetes headless Service name resolves to one A/AAAA record per ready pod.

Every `interval_s` the name is resolved (in the loop's resolver thread, never blocking the hot
path); new addresses become replicas named `<ip>:<port>`, addresses that disappeared are removed
from the ReplicaSet (in-flight requests to them finish on their own connections). A failed
resolution changes nothing: a DNS outage must not empty the fleet.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable

from app.config import Discovery
from app.routing.base import Replica
from app.routing.replicas import ReplicaSet
from app.tasks import cancel_and_wait

log = logging.getLogger("prefixgate.discovery")

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_addresses(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def replica_for(address: str, port: int, scheme: str) -> Replica:
    host = f"[{address}]" if ":" in address else address
    return Replica(name=f"{host}:{port}", url=f"{scheme}://{host}:{port}")


def diff_replicas(current: Iterable[str], wanted: Iterable[str]) -> tuple[list[str], list[str]]:
    """(names to add, names to remove): pure, so the reconciliation is testable without DNS."""
    cur, want = set(current), set(wanted)
    return sorted(want - cur), sorted(cur - want)


class DnsDiscovery:
    def __init__(self, config: Discovery, replicas: ReplicaSet, resolver: Resolver = resolve_addresses,
                 on_change: Callable[[list[Replica], list[str]], None] | None = None) -> None:
        self.config = config
        self.replicas = replicas
        self.resolver = resolver
        self.on_change = on_change  # (added replicas, removed names): e.g. clear their index
        self._managed: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> bool:
        """One resolution and reconciliation; False when DNS failed (nothing changed)."""
        try:
            addresses = await self.resolver(self.config.dns, self.config.port)
        except OSError as exc:
            log.warning("discovery: resolving %s failed: %s", self.config.dns, exc)
            return False
        wanted = {replica_for(a, self.config.port, self.config.scheme).name: a for a in addresses}
        if not wanted:
            log.warning("discovery: %s has no addresses; keeping %d replicas", self.config.dns,
                        len(self._managed))
            return False
        to_add, to_remove = diff_replicas(self._managed, wanted)
        added = [self.replicas.add(replica_for(wanted[n], self.config.port, self.config.scheme)) for n in to_add]
        for name in to_remove:
            self.replicas.remove(name)
        self._managed = set(wanted)
        if (added or to_remove) and self.on_change is not None:
            self.on_change(added, to_remove)
        if added or to_remove:
            log.info("discovery: +%d -%d replicas (%d total)", len(added), len(to_remove), len(self.replicas))
        return True

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="prefixgate-discovery")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.refresh()
            except Exception:  # discovery must outlive one bad pass
                log.exception("discovery pass failed")
