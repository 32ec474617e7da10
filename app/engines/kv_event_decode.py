"""KV-cache events: decoding the wire payload and turning events into residency-index updates.

Wire (docs/routing.md, "KV events"): the payload is msgpack `[ts, events, dp_rank]`. Each event is either a
map with a `"type"` tag (vLLM >= #42892, SGLang) or the legacy tagged array
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name, extra_keys, group_idx, ...]`, `["BlockRemoved", block_hashes, medium, ...]`,
`["AllBlocksCleared"]`. Both are decoded; unknown event types are ignored (forward compatible).

Keys (docs/routing.md; llm-d's dual-key design): the index is keyed by prefixgate's own
`proxy_chain` over the event's `token_ids`, never by engine digests, so no engine seed, hash
algorithm or version has to match. `EventIndexer` keeps, per replica, `engine hash -> proxy hash`
so that a `BlockStored` can continue its chain from `parent_block_hash` and a `BlockRemoved` can
find what to drop. The first block of a chain carries the cache salt (vLLM: bare in extra_keys[0];
SGLang/simulator: a `cache_salt` field), which roots the proxy chain exactly as the fingerprint
roots it for a salted request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from app.prefix.blocks import proxy_chain, proxy_digest

EngineHash = int | bytes
GPU_MEDIA = (None, "GPU", "gpu")  # CPU / STORAGE tiers do not serve GPU prefix hits


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int = 0
    cache_salt: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: list[KVEvent]
    dp_rank: int | None = None


def _h(value: Any) -> EngineHash:
    return bytes(value) if isinstance(value, bytes | bytearray | memoryview) else int(value)


def _at(items: Sequence[Any], i: int, default: Any = None) -> Any:
    return items[i] if len(items) > i else default


def decode_event(raw: Any) -> KVEvent | None:
    """One event in either shape; None for types this proxy does not use."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind == "BlockStored":
            return BlockStored(
                block_hashes=[_h(x) for x in raw.get("block_hashes") or []],
                parent_block_hash=None if raw.get("parent_block_hash") is None else _h(raw["parent_block_hash"]),
                token_ids=list(raw.get("token_ids") or []), block_size=int(raw.get("block_size") or 0),
                medium=raw.get("medium"), lora_name=raw.get("lora_name"), extra_keys=raw.get("extra_keys"),
                group_idx=int(raw.get("group_idx") or 0), cache_salt=raw.get("cache_salt"))
        if kind == "BlockRemoved":
            return BlockRemoved([_h(x) for x in raw.get("block_hashes") or []], raw.get("medium"),
                                int(raw.get("group_idx") or 0))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
        return None
    if isinstance(raw, list | tuple) and raw:
        kind = raw[0]
        if kind == "BlockStored":
            parent = _at(raw, 2)
            return BlockStored(
                block_hashes=[_h(x) for x in _at(raw, 1) or []],
                parent_block_hash=None if parent is None else _h(parent),
                token_ids=list(_at(raw, 3) or []), block_size=int(_at(raw, 4) or 0),
                medium=_at(raw, 6), lora_name=_at(raw, 7), extra_keys=_at(raw, 8),
                group_idx=int(_at(raw, 9) or 0))
        if kind == "BlockRemoved":
            return BlockRemoved([_h(x) for x in _at(raw, 1) or []], _at(raw, 2), int(_at(raw, 3) or 0))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    """The msgpack `[ts, events, dp_rank]` payload (a map-shaped batch is accepted too)."""
    raw = msgspec.msgpack.decode(payload)
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts", 0.0), raw.get("events") or [], raw.get("data_parallel_rank")
    else:
        ts, events, rank = _at(raw, 0, 0.0), _at(raw, 1) or [], _at(raw, 2)
    decoded = [e for e in (decode_event(x) for x in events) if e is not None]
    return EventBatch(float(ts or 0.0), decoded, rank)


def salt_of(event: BlockStored) -> str | None:
    """The cache salt rooting a chain that starts at this event (parent None)."""
    if event.cache_salt:
        return event.cache_salt
    first = _at(event.extra_keys or [], 0)
    if not first:
        return None
    strings = [k for k in (first if isinstance(first, list | tuple) else [first]) if isinstance(k, str)]
    if event.lora_name and strings and strings[0] == event.lora_name:
        strings = strings[1:]
    return strings[-1] if strings else None


@dataclass
class IndexUpdate:
    """What a batch means for the residency index, as ordered operations (order matters: a block
    stored and evicted in the same batch must end up absent): ("add", new blocks in chain order,
    the proxy hash of their parent or None for a root), ("remove", hashes, None),
    ("clear", [], None)."""

    ops: list[tuple[str, list[int], int | None]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def push(self, kind: str, hashes: list[int], parent: int | None = None) -> None:
        if kind == "clear":
            self.ops = [("clear", [], None)]
        elif self.ops and self.ops[-1][0] == kind == "remove":
            self.ops[-1][1].extend(hashes)
        elif hashes:
            self.ops.append((kind, hashes, parent))

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n


class EventIndexer:
    """One replica's engine-hash -> proxy-hash map; pure (no I/O), so it is unit-testable.

    `block_size` is the proxy's block size; events with another size are still indexed with
    their own size (the fingerprint must then use the engine's size to match, which the scraper
    reports)."""

    def __init__(self, max_entries: int = 4_000_000) -> None:
        self.map: dict[EngineHash, int] = {}
        self.max_entries = max_entries

    def reset(self) -> None:
        self.map.clear()

    def apply(self, events: Sequence[KVEvent], update: IndexUpdate | None = None) -> IndexUpdate:
        update = update or IndexUpdate()
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self.map.clear()
                update.push("clear", [])
                update.count("cleared")
            elif isinstance(event, BlockRemoved):
                if event.medium not in GPU_MEDIA or event.group_idx != 0:
                    update.count("ignored")
                    continue
                gone = [p for p in (self.map.pop(h, None) for h in event.block_hashes) if p is not None]
                update.push("remove", gone)
                update.count("removed", len(event.block_hashes))
            else:
                self._stored(event, update)
        return update

    def _stored(self, event: BlockStored, update: IndexUpdate) -> None:
        n = len(event.block_hashes)
        size = event.block_size
        if (event.medium not in GPU_MEDIA or event.group_idx != 0 or n == 0 or size <= 0
                or len(event.token_ids) < n * size):
            update.count("ignored")
            return
        parent: int | None = None
        if event.parent_block_hash is None:
            hashes = proxy_chain(event.token_ids[:n * size], size, salt=salt_of(event))
        else:
            parent = self.map.get(event.parent_block_hash)
            if parent is None:
                update.count("orphan", n)
                return
            hashes = proxy_chain(event.token_ids[:n * size], size, parent=proxy_digest(parent))
        if len(self.map) + n > self.max_entries:  # bounded: a map gone stale is rebuilt from scratch,
            self.map.clear()  # and so is the index: its removals could no longer be mapped
            update.push("clear", [])
            if parent is not None:
                update.count("orphan", n)
                return
        for engine_hash, proxy in zip(event.block_hashes, hashes, strict=True):
            self.map[engine_hash] = proxy
        update.push("add", hashes, parent)
        update.count("stored", n)
