"""ZMQ KV-cache events, on the wire as vLLM 0.33 publishes them (engine-facts B.2).

Three frames per batch: topic, the 8-byte big-endian sequence number, and a msgpack payload
`[ts, events, dp_rank]` whose events are maps tagged with `"type"`. Hashes are the unsigned low 64
bits of the engine digest (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default). `BlockStored`
carries the blocks' token ids, so a subscriber can index them with its own hash (llm-d style).
SGLang flavor: one `BlockStored` per page, signed int64 hashes, and a `cache_salt` field.

The simulator always binds the endpoint (subscribers connect), whatever its host part.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

import msgspec
import zmq

from app.prefix.blocks import low64

_encoder = msgspec.msgpack.Encoder()


def _engine_hash(key: Hashable | None, flavor: str) -> int | None:
    if key is None:
        return None
    if isinstance(key, bytes):
        return low64(key)
    value = int(key)  # type: ignore[call-overload]
    if flavor == "sglang" and value >= 2**63:
        value -= 2**64  # SGLang publishes signed int64
    return value


def format_events(events: list[dict[str, Any]], flavor: str, block_size: int) -> list[dict[str, Any]]:
    """Engine-internal pool events -> the map-shaped wire events."""
    out: list[dict[str, Any]] = []
    for ev in events:
        kind = ev["type"]
        if kind == "BlockStored" and flavor == "sglang":
            parent = ev["parent"]
            for i, key in enumerate(ev["keys"]):
                out.append({"type": "BlockStored", "block_hashes": [_engine_hash(key, flavor)],
                            "parent_block_hash": _engine_hash(parent, flavor),
                            "token_ids": ev["token_ids"][i * block_size:(i + 1) * block_size],
                            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None,
                            "cache_salt": ev.get("salt")})
                parent = key
        elif kind == "BlockStored":
            stored: dict[str, Any] = {
                "type": "BlockStored", "block_hashes": [_engine_hash(k, flavor) for k in ev["keys"]],
                "parent_block_hash": _engine_hash(ev["parent"], flavor), "token_ids": ev["token_ids"],
                "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
            if ev.get("cache_salt") is not None:
                stored["extra_keys"] = [[ev["cache_salt"]]] + [None] * (len(ev["keys"]) - 1)
            out.append(stored)
        elif kind == "BlockRemoved":
            out.append({"type": "BlockRemoved", "block_hashes": [_engine_hash(k, flavor) for k in ev["keys"]],
                        "medium": "GPU", "group_idx": 0})
        elif kind == "AllBlocksCleared":
            out.append({"type": "AllBlocksCleared"})
    return out


class KVEventPublisher:
    """A ZMQ PUB socket publishing one batch per engine step."""

    def __init__(self, endpoint: str, flavor: str = "vllm", block_size: int = 16, topic: str = "",
                 dp_rank: int = 0) -> None:
        self.endpoint = endpoint
        self.flavor = flavor
        self.block_size = block_size
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self.seq = 0
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint.replace("tcp://*", "tcp://0.0.0.0"))
        if endpoint.endswith(":0"):
            self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def publish(self, events: list[dict[str, Any]]) -> None:
        wire = format_events(events, self.flavor, self.block_size)
        if not wire:
            return
        payload = _encoder.encode([time.time(), wire, self.dp_rank])
        try:
            self._sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # PUB drops at the high-water mark, as vLLM's publisher does
        self.seq += 1

    def close(self) -> None:
        if not self._sock.closed:
            self._sock.close(0)
            self._ctx.term()
