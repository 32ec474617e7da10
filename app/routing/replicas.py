"""The replica registry: the Replica objects every part of the proxy shares.

The proxy core updates in-flight counters, the health checker flips `healthy`, the engine scraper
fills the engine_* fields and the real block size, DNS discovery adds and removes replicas.
Iteration order is stable (insertion order), which round-robin and tests rely on. Under
`serve --workers N` each replica added gets its view of the other workers' live load
(app/routing/siblings.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from app.config import Backend
from app.routing.base import Replica
from app.routing.siblings import SiblingLoads


class ReplicaSet:
    def __init__(self, replicas: Iterable[Replica] = (), siblings: SiblingLoads | None = None) -> None:
        self._by_name: dict[str, Replica] = {}
        self.siblings = siblings
        for replica in replicas:
            self.add(replica)

    @classmethod
    def from_backends(cls, backends: Iterable[Backend], siblings: SiblingLoads | None = None) -> ReplicaSet:
        return cls(
            (Replica(name=b.display_name(), url=b.url.rstrip("/").removesuffix("/v1"), engine=b.engine,
                     block_size=b.block_size, kv_blocks=b.kv_blocks)
             for b in backends),
            siblings,
        )

    def add(self, replica: Replica) -> Replica:
        existing = self._by_name.get(replica.name)
        if existing is not None:
            return existing
        if self.siblings is not None:
            replica.siblings = self.siblings.view(replica.name)
        self._by_name[replica.name] = replica
        return replica

    def remove(self, name: str) -> Replica | None:
        return self._by_name.pop(name, None)

    def get(self, name: str) -> Replica | None:
        return self._by_name.get(name)

    def all(self) -> list[Replica]:
        return list(self._by_name.values())

    def healthy(self) -> list[Replica]:
        return [r for r in self._by_name.values() if r.healthy]

    def names(self) -> list[str]:
        return list(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)
