"""Precise residency: subscribe to the replicas' ZMQ KV-cache events and keep the index equal to
what each engine really holds (routing.kv_events: true).

Transport (docs/routing.md, "KV events"): a SUB socket per replica connected to the engine's PUB endpoint;
each message is 3 frames `(topic, seq as 8-byte big-endian, msgpack payload)`, seq +1 per batch.
Decoding and the engine-hash -> proxy-hash bookkeeping are pure (app/engines/kv_event_decode.py);
this module is only the I/O: sockets and sequence tracking. What the events mean for the index
(whole chains, removed subtrees) is the residency owner's job (app/routing/residency.py).

A sequence gap means the index missed stores or removals. When the replica has a replay
endpoint (vLLM's ROUTER `replay_endpoint`), the missed batches are fetched and applied in order;
otherwise (or when the replay buffer no longer reaches back) the replica's index and hash map are
cleared and rebuilt from the events that follow: predictions undercount for a while, they are
never wrong about a block being resident.
"""

from __future__ import annotations

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from app.engines.kv_event_decode import EventIndexer, IndexUpdate, decode_batch
from app.routing.residency import ReplicaIndex
from app.tasks import cancel_and_wait
from app.telemetry.metrics import Metrics

log = logging.getLogger("prefixgate.kv_events")

REPLAY_TIMEOUT_S = 2.0
MAX_STORED_AT = 1_000_000  # per replica: arrival times of stored blocks kept for resident_before()
END_SEQ = -1  # replay end marker (signed 8-byte seq)


def parse_seq(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


class ReplicaStream:
    """Sequence state and hash map of one replica's event stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.indexer = EventIndexer()
        self.last_seq: int | None = None
        self.batches = 0
        self.gaps = 0


class KVEventSubscriber:
    def __init__(self, endpoints: dict[str, str], index: ReplicaIndex, metrics: Metrics | None = None,
                 replay_endpoints: dict[str, str] | None = None, topic: str = "",
                 replay_timeout_s: float = REPLAY_TIMEOUT_S) -> None:
        self.endpoints = dict(endpoints)
        self.replay_endpoints = dict(replay_endpoints or {})
        self.index = index
        self.metrics = metrics
        self.topic = topic.encode()
        self.replay_timeout_s = replay_timeout_s
        self.streams: dict[str, ReplicaStream] = {name: ReplicaStream(name) for name in self.endpoints}
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sockets: list[zmq.asyncio.Socket] = []
        self._applied = asyncio.Condition()
        # replica -> block hash -> perf_counter() when its BlockStored arrived (oldest first)
        self._stored_at: dict[str, dict[int, float]] = {name: {} for name in self.endpoints}

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        for name, endpoint in self.endpoints.items():
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            self._sockets.append(sock)
            self._tasks.append(asyncio.create_task(self._run(name, sock), name=f"kv-events:{name}"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def wait_for_batches(self, name: str, count: int, timeout: float = 10.0) -> None:
        """Until `count` batches of `name` were applied (tests and readiness)."""
        async with self._applied:
            await asyncio.wait_for(self._applied.wait_for(lambda: self.streams[name].batches >= count), timeout)

    def resident_before(self, name: str, chain: list[int], t: float) -> int:
        """How many leading blocks of `chain` were reported stored no later than `t`
        (perf_counter). With events as the index's only writer, a lookup made while a request is
        in flight also sees the blocks that request itself made the engine store; its prediction
        must only count blocks resident when it was sent. Blocks whose arrival is not known
        (stored before this subscriber started, or aged out) count as resident."""
        stored_at = self._stored_at.get(name, {})
        for i, h in enumerate(chain):
            if stored_at.get(h, t) > t:
                return i
        return len(chain)

    # ------------------------------------------------------------ the loop
    async def _run(self, name: str, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await sock.recv_multipart()
                await self.handle(name, frames)
            except asyncio.CancelledError:
                raise
            except Exception:  # one malformed message must not end the subscription
                log.exception("kv event from %s could not be applied", name)
                self._count(name, "malformed")

    async def handle(self, name: str, frames: list[bytes]) -> None:
        """Apply one `(topic, seq, payload)` message (public for tests and replay)."""
        if len(frames) != 3:
            self._count(name, "malformed")
            return
        stream = self.streams[name]
        seq = parse_seq(frames[1])
        if stream.last_seq is not None and seq <= stream.last_seq:
            return  # already applied (replay overlap)
        if stream.last_seq is not None and seq != stream.last_seq + 1:
            await self._on_gap(stream, expected=stream.last_seq + 1, got=seq)
            if stream.last_seq is not None and seq <= stream.last_seq:
                return
        await self._apply(stream, seq, frames[2])

    async def _apply(self, stream: ReplicaStream, seq: int, payload: bytes) -> None:
        batch = decode_batch(payload)
        update = stream.indexer.apply(batch.events)
        await self._write(stream.name, update)
        stream.last_seq = seq
        stream.batches += 1
        async with self._applied:
            self._applied.notify_all()

    async def _write(self, name: str, update: IndexUpdate) -> None:
        stored_at = self._stored_at.setdefault(name, {})
        for kind, hashes, parent in update.ops:
            if kind == "clear":
                stored_at.clear()
                await self.index.learn_cleared(name)
            elif kind == "remove":
                for h in hashes:
                    stored_at.pop(h, None)
                await self.index.learn_removed(name, hashes)
            else:
                now = time.perf_counter()
                for h in hashes:
                    stored_at.setdefault(h, now)  # a re-report keeps the first arrival
                while len(stored_at) > MAX_STORED_AT:
                    del stored_at[next(iter(stored_at))]
                if not await self.index.learn_stored(name, hashes, parent):
                    update.count("orphan", len(hashes))
        for kind, n in update.counts.items():
            self._count(name, kind, n)

    async def _on_gap(self, stream: ReplicaStream, expected: int, got: int) -> None:
        stream.gaps += 1
        if self.metrics is not None:
            self.metrics.kv_event_gaps.labels(stream.name).inc()
        log.warning("kv events from %s: seq gap (expected %d, got %d)", stream.name, expected, got)
        replayed = await self._replay(stream.name, expected)
        if replayed and parse_seq(replayed[0][0]) == expected:
            for seq_frame, payload in replayed:
                seq = parse_seq(seq_frame)
                if seq > (stream.last_seq if stream.last_seq is not None else -1):
                    await self._apply(stream, seq, payload)
            return
        stream.indexer.reset()
        stream.last_seq = None
        await self.index.learn_cleared(stream.name)

    async def _replay(self, name: str, start: int) -> list[tuple[bytes, bytes]]:
        """Buffered (seq, payload) pairs from `start` on, or [] without a replay endpoint."""
        endpoint = self.replay_endpoints.get(name)
        if endpoint is None or self._ctx is None:
            return []
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[bytes, bytes]] = []
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), self.replay_timeout_s)
                while frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) < 2 or parse_seq(frames[-2]) == END_SEQ or not frames[-1]:
                    break
                out.append((frames[-2], frames[-1]))
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("kv event replay from %s failed: %s", name, exc)
        finally:
            sock.close(linger=0)
        return out

    def _count(self, name: str, kind: str, n: int = 1) -> None:
        if self.metrics is not None and n:
            self.metrics.kv_events.labels(name, kind).inc(n)

