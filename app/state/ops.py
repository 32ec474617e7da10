"""Store writes as values. The Redis store applies a list of them in one MULTI/EXEC pipeline, and
the resilient wrapper queues them (bounded by `weight`) while a flusher batches them to Redis.

Values are captured when the write happens (the score base, the timestamp, the packed chain), so a
write that reaches Redis late, after a batch delay or an outage replay, still orders as it
happened: ZADD GT keeps a newer score that landed first.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.state.keys import MEMBER_BYTES


@dataclass(frozen=True, slots=True)
class ResidencyAdd:
    replica: str
    blob: bytes  # packed chain (keys.pack_hashes), head first
    base_us: int  # score of the head block (keys.next_base)
    only_present: bool = False  # a touch: refresh members already there, insert none


@dataclass(frozen=True, slots=True)
class ResidencyRemove:
    replica: str
    blob: bytes


@dataclass(frozen=True, slots=True)
class ResidencyClear:
    replica: str


@dataclass(frozen=True, slots=True)
class CapacityTrim:
    replica: str


@dataclass(frozen=True, slots=True)
class BindingSet:
    key: str
    replica: str


@dataclass(frozen=True, slots=True)
class HistoryAppend:
    tenant: str
    record: bytes  # JSON
    at: float  # wall-clock seconds (tenant LRU order)


@dataclass(frozen=True, slots=True)
class CounterIncr:
    tenant: str
    field: str
    amount: float
    at: float


@dataclass(frozen=True, slots=True)
class RecentAdd:
    replica: str  # one request placed there (app/routing/recent.py)


WriteOp = (ResidencyAdd | ResidencyRemove | ResidencyClear | CapacityTrim | BindingSet | HistoryAppend | CounterIncr
           | RecentAdd)


def weight(op: WriteOp) -> int:
    """Queue cost of an op: 1 plus its blocks, so a bound on total weight bounds memory."""
    if isinstance(op, ResidencyAdd | ResidencyRemove):
        return 1 + len(op.blob) // MEMBER_BYTES
    if isinstance(op, HistoryAppend):
        return 1 + len(op.record) // 64
    return 1
