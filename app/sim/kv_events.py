"""ZMQ KV-cache events, on the wire as vLLM 0.33 publishes them (engine-facts B.2).

Three frames per batch: topic, the 8-byte big-endian sequence number, and a msgpack payload
`[ts, events, dp_rank]` whose events are maps tagged with `"type"`. Hashes are the unsigned low 64
bits of the engine digest (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default). `BlockStored`
carries the blocks' token ids, so a subscriber can index them with its own hash (llm-d style).
SGLang flavor: one `BlockStored` per page, signed int64 hashes, and the request's `cache_salt` (SGLang
does not publish the `extra_key` that also namespaces its radix tree).

The simulator always binds the endpoint (subscribers connect), whatever its host part.
Replay as vLLM's ROUTER `replay_endpoint`: a client sends `[b"", start_seq(8 bytes)]` from a
DEALER and gets `[b"", seq, payload]` for every buffered batch with seq >= start, then
`[b"", -1 (signed 8 bytes), b""]`. The last `REPLAY_BUFFER` batches are kept.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

import msgspec
import zmq

from app.sim.hashing import sglang_event_hash, vllm_event_hash

_encoder = msgspec.msgpack.Encoder()
REPLAY_BUFFER = 10_000  # vLLM KVEventsConfig.buffer_steps
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _engine_hash(key: Hashable | None, flavor: str) -> int | None:
    if key is None:
        return None
    assert isinstance(key, bytes)
    return sglang_event_hash(key) if flavor == "sglang" else vllm_event_hash(key)


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


def _bind(sock: zmq.Socket, endpoint: str) -> str:
    sock.bind(endpoint.replace("tcp://*", "tcp://0.0.0.0"))
    return sock.getsockopt_string(zmq.LAST_ENDPOINT) if endpoint.endswith(":0") else endpoint


class KVEventPublisher:
    """A ZMQ PUB socket publishing one batch per engine step, plus a replay ROUTER served by a
    small thread (ZMQ sockets stay in the thread that uses them; the buffer is shared)."""

    def __init__(self, endpoint: str, flavor: str = "vllm", block_size: int = 16, topic: str = "",
                 dp_rank: int = 0, replay_endpoint: str | None = "tcp://127.0.0.1:0") -> None:
        self.flavor = flavor
        self.block_size = block_size
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self.seq = 0
        self.drop_next = 0  # fault injection: batches to skip on the wire (seq still advances)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = _bind(self._sock, endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BUFFER)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.replay_endpoint: str | None = None
        self._thread: threading.Thread | None = None
        if replay_endpoint:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = _bind(router, replay_endpoint)
            self._thread = threading.Thread(target=self._serve_replay, args=(router,), daemon=True,
                                            name="sim-kv-replay")
            self._thread.start()

    def publish(self, events: list[dict[str, Any]]) -> None:
        wire = format_events(events, self.flavor, self.block_size)
        if not wire:
            return
        payload = _encoder.encode([time.time(), wire, self.dp_rank])
        seq = self.seq.to_bytes(8, "big")
        with self._lock:
            self._buffer.append((self.seq, payload))
        self.seq += 1
        if self.drop_next > 0:
            self.drop_next -= 1
            return
        try:
            self._sock.send_multipart([self.topic, seq, payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # PUB drops at the high-water mark, as vLLM's publisher does

    def _serve_replay(self, router: zmq.Socket) -> None:
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3:
                    continue
                client, _, start_bytes = frames
                start = int.from_bytes(start_bytes, "big")
                with self._lock:
                    batches = [(s, p) for s, p in self._buffer if s >= start]
                for s, payload in batches:
                    router.send_multipart([client, b"", s.to_bytes(8, "big"), payload])
                router.send_multipart([client, b"", END_SEQ, b""])
        finally:
            router.close(0)

    def close(self) -> None:
        if self._sock.closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()
