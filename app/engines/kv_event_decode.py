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

from array import array
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


class MalformedBatch(ValueError):
    """A payload that is no `[ts, events, dp_rank]` batch, or one with an event of a known type
    that is not what the engine sends (a hash that is no int or bytes, token ids that are no list
    of 32-bit ids, ...). The whole batch is dropped: applying the rest could leave a removal out."""


def _hash(value: Any) -> EngineHash:
    if isinstance(value, bytes) or type(value) is int:  # not bool, float or a string of digits
        return value
    raise MalformedBatch(f"block hash {value!r:.40}")


def _hashes(value: Any) -> list[EngineHash]:
    if not isinstance(value, list):
        raise MalformedBatch(f"block_hashes {value!r:.40}")
    return [_hash(x) for x in value]


def _parent(value: Any) -> EngineHash | None:
    return None if value is None else _hash(value)


def _token_ids(value: Any) -> list[int]:
    if value is None:  # an offload tier's event carries none
        return []
    if not isinstance(value, list):
        raise MalformedBatch(f"token_ids {value!r:.40}")
    try:  # each an int (not a bool, which array() takes as 0/1) and a 32-bit id, at C speed
        if not set(map(type, value)) <= {int}:
            raise TypeError(f"a {set(map(type, value)) - {int}} among them")
        array("I", value)
    except (TypeError, OverflowError) as exc:
        raise MalformedBatch(f"token_ids: {exc}") from None
    return value


def _int(value: Any, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if type(value) is not int:
        raise MalformedBatch(f"{value!r:.40} is no int")
    return value


def _text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MalformedBatch(f"{value!r:.40} is no string")
    return value


def _extra_keys(value: Any) -> list[Any] | None:
    if value is not None and not isinstance(value, list):
        raise MalformedBatch(f"extra_keys {value!r:.40}")
    return value


def _at(items: Sequence[Any], i: int, default: Any = None) -> Any:
    return items[i] if len(items) > i else default


def decode_event(raw: Any) -> KVEvent | None:
    """One event in either shape; None for types this proxy does not use. Raises MalformedBatch
    for a known type whose members are not what an engine sends."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind == "BlockStored":
            if "block_hashes" not in raw:
                raise MalformedBatch("BlockStored without block_hashes")
            return BlockStored(
                block_hashes=_hashes(raw["block_hashes"]), parent_block_hash=_parent(raw.get("parent_block_hash")),
                token_ids=_token_ids(raw.get("token_ids")), block_size=_int(raw.get("block_size")),
                medium=_text(raw.get("medium")), lora_name=_text(raw.get("lora_name")),
                extra_keys=_extra_keys(raw.get("extra_keys")), group_idx=_int(raw.get("group_idx"), 0),
                cache_salt=_text(raw.get("cache_salt")))
        if kind == "BlockRemoved":
            if "block_hashes" not in raw:
                raise MalformedBatch("BlockRemoved without block_hashes")
            return BlockRemoved(_hashes(raw["block_hashes"]), _text(raw.get("medium")),
                                _int(raw.get("group_idx"), 0))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
        return None
    if isinstance(raw, list) and raw:
        kind = raw[0]
        if kind == "BlockStored":
            if len(raw) < 5:
                raise MalformedBatch("BlockStored without its block size")
            return BlockStored(
                block_hashes=_hashes(raw[1]), parent_block_hash=_parent(raw[2]), token_ids=_token_ids(raw[3]),
                block_size=_int(raw[4]), medium=_text(_at(raw, 6)), lora_name=_text(_at(raw, 7)),
                extra_keys=_extra_keys(_at(raw, 8)), group_idx=_int(_at(raw, 9), 0))
        if kind == "BlockRemoved":
            if len(raw) < 2:
                raise MalformedBatch("BlockRemoved without block_hashes")
            return BlockRemoved(_hashes(raw[1]), _text(_at(raw, 2)), _int(_at(raw, 3), 0))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    """The msgpack `[ts, events, dp_rank]` payload (a map-shaped batch is accepted too); raises
    MalformedBatch for anything else."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise MalformedBatch(f"no msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts", 0.0), raw.get("events", []), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], _at(raw, 2)
    else:
        raise MalformedBatch(f"no [ts, events, dp_rank] batch: {raw!r:.40}")
    if not isinstance(events, list):
        raise MalformedBatch(f"events {events!r:.40}")
    if ts is not None and (type(ts) is not float and type(ts) is not int):
        raise MalformedBatch(f"timestamp {ts!r:.40}")
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
