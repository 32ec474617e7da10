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
never wrong about a block being resident. A replay answer is taken only when it is exactly the
missed batches: one missing, bent or past the gap, or silence, is the same as no replay endpoint.

A seq at or below the last one means the publisher started over (an engine restart counts from 0)
or another one sends on the port: the replica is cleared and rebuilt from that batch on. A message
that is no batch (frames in another number, a seq that is not 8 bytes, a payload that does not
decode, an event no engine sends: `MalformedBatch`) is counted `malformed` and dropped before it
touches any state; if it was the engine's, the next batch finds the gap.
"""

from __future__ import annotations

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from app.engines.kv_event_decode import EventBatch, EventIndexer, IndexUpdate, MalformedBatch, decode_batch
from app.routing.residency import ReplicaIndex
from app.tasks import cancel_and_wait
from app.telemetry.metrics import Metrics

log = logging.getLogger("prefixgate.kv_events")

REPLAY_TIMEOUT_S = 2.0
MAX_STORED_AT = 1_000_000  # per replica: arrival times of stored blocks kept for resident_before()
END_SEQ = -1  # replay end marker (signed 8-byte seq)
SEQ_BYTES = 8
MAX_REPLAY = 100_000  # batches; vLLM keeps buffer_steps = 10,000 (KVEventsConfig)


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
            except Exception:  # one message must not end the subscription
                log.exception("kv event from %s could not be applied", name)
                self._count(name, "malformed")
                try:  # it may have been applied in part: on doubt, start over
                    await self._forget(self.streams[name])
                except Exception:
                    log.exception("kv events from %s: the index could not be cleared", name)

    async def handle(self, name: str, frames: list[bytes]) -> None:
        """Apply one `(topic, seq, payload)` message (public for tests and replay). A message
        that is no batch is dropped before it touches any state: if it was the engine's, the next
        batch finds the gap."""
        if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
            self._malformed(name, f"{len(frames)} frames" if len(frames) != 3 else f"a {len(frames[1])}-byte seq")
            return
        try:
            batch = decode_batch(frames[2])
        except MalformedBatch as exc:
            self._malformed(name, str(exc))
            return
        stream = self.streams[name]
        seq = parse_seq(frames[1])
        if stream.last_seq is not None and seq <= stream.last_seq:
            # The publisher started over (an engine restart counts from 0 again), or another one
            # sends on its port: what the index holds can no longer be trusted.
            self._gap(stream, f"seq went back (after {stream.last_seq}, got {seq})")
            await self._forget(stream)
        elif stream.last_seq is not None and seq != stream.last_seq + 1:
            await self._on_gap(stream, expected=stream.last_seq + 1, got=seq)
        await self._apply(stream, seq, batch)

    async def _apply(self, stream: ReplicaStream, seq: int, batch: EventBatch) -> None:
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

    def _gap(self, stream: ReplicaStream, what: str) -> None:
        stream.gaps += 1
        if self.metrics is not None:
            self.metrics.kv_event_gaps.labels(stream.name).inc()
        log.warning("kv events from %s: %s", stream.name, what)

    async def _on_gap(self, stream: ReplicaStream, expected: int, got: int) -> None:
        """Batches `expected..got-1` were missed: replay exactly those, or start over."""
        self._gap(stream, f"seq gap (expected {expected}, got {got})")
        replayed = await self._replay(stream.name, expected, got)
        if replayed is None:
            await self._forget(stream)
            return
        for seq, batch in replayed:
            await self._apply(stream, seq, batch)

    async def _forget(self, stream: ReplicaStream) -> None:
        """Clear the replica's index and hash map; they are rebuilt from the events that follow."""
        stream.indexer.reset()
        stream.last_seq = None
        self._stored_at.get(stream.name, {}).clear()
        await self.index.learn_cleared(stream.name)

    async def _replay(self, name: str, start: int, end: int) -> list[tuple[int, EventBatch]] | None:
        """The batches `start..end-1` from the replica's replay endpoint, or None without one, or
        when its answer is not exactly those (a batch missing or no batch, garbage, silence).
        Batches past `end` are not taken: they come over the live socket (if any engine sent
        them), and `last_seq` must never run ahead of it."""
        endpoint = self.replay_endpoints.get(name)
        if endpoint is None or self._ctx is None or not 0 < end - start <= MAX_REPLAY:
            return None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, EventBatch]] = []
        why = "the replay ended early"
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big", signed=True)])
            while start + len(out) < end:  # each answer adds the next batch, or ends the replay
                frames = await asyncio.wait_for(sock.recv_multipart(), self.replay_timeout_s)
                while frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) < 2 or not frames[-1] or parse_seq(frames[-2]) == END_SEQ:
                    break
                if len(frames[-2]) != SEQ_BYTES or parse_seq(frames[-2]) != start + len(out):
                    why = f"the replay answered seq {parse_seq(frames[-2])} for {start + len(out)}"
                    break
                out.append((start + len(out), decode_batch(frames[-1])))
        except (TimeoutError, zmq.ZMQError, MalformedBatch) as exc:
            why = f"the replay failed: {exc!r}"
        finally:
            sock.close(linger=0)
        if start + len(out) < end:
            log.warning("kv events from %s: %s", name, why)
            return None
        return out

    def _malformed(self, name: str, why: str) -> None:
        log.warning("kv events from %s: a message that is no batch dropped (%s)", name, why)
        self._count(name, "malformed")

    def _count(self, name: str, kind: str, n: int = 1) -> None:
        if self.metrics is not None and n:
            self.metrics.kv_events.labels(name, kind).inc(n)

