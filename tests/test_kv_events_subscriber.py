"""The ZMQ subscriber over loopback: a real PUB socket plays the engine."""

from __future__ import annotations

import asyncio
import time

import msgspec
import zmq
import zmq.asyncio

from app.engines.kv_events import KVEventSubscriber
from app.prefix.blocks import proxy_chain
from app.routing.residency import ReplicaIndex
from app.serving import free_port
from app.state.memory import MemoryStore
from app.telemetry.metrics import Metrics

B = 4


def stored(hashes, parent, tokens):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": B, "lora_id": None, "medium": "GPU", "lora_name": None}


def message(seq: int, events) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), msgspec.msgpack.encode([float(seq), events, 0])]


class Publisher:
    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.port = free_port()
        self.sock = ctx.socket(zmq.PUB)
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")

    async def send_until_received(self, sub: KVEventSubscriber, name: str, frames: list[bytes]) -> None:
        """PUB/SUB drops messages until the subscription propagates: resend a no-op first."""
        while sub.streams[name].batches == 0:
            await self.sock.send_multipart(message(0, []))
            await asyncio.sleep(0.05)
        await self.sock.send_multipart(frames)


async def test_subscriber_applies_events_handles_gaps_and_replays():
    ctx = zmq.asyncio.Context()
    pub = Publisher(ctx)
    replay_port = free_port()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    store = MemoryStore()
    metrics = Metrics()
    sub = KVEventSubscriber({"r0": f"tcp://127.0.0.1:{pub.port}"}, ReplicaIndex(store, True), metrics,
                            replay_endpoints={"r0": f"tcp://127.0.0.1:{replay_port}"}, topic="kv")
    await sub.start()
    try:
        tokens = list(range(16))
        chain = proxy_chain(tokens, B)
        await pub.send_until_received(sub, "r0", message(1, [stored([1, 2], None, tokens[:8])]))
        await sub.wait_for_batches("r0", 2)
        await pub.sock.send_multipart(message(2, [stored([3, 4], 2, tokens[8:])]))
        await sub.wait_for_batches("r0", 3)
        assert store.residency_hashes("r0") == set(chain)
        assert store.residency_lookup_sync(chain, ["r0"]) == {"r0": 4}

        # A gap (seq 3 lost) with a replay endpoint: the missed batch is fetched and applied.
        async def serve_replay():
            ident, empty, start = await router.recv_multipart()
            assert int.from_bytes(start, "big") == 3
            lost = message(3, [{"type": "BlockRemoved", "block_hashes": [4], "medium": "GPU"}])
            await router.send_multipart([ident, b"", *lost])
            await router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

        replay = asyncio.create_task(serve_replay())
        await pub.sock.send_multipart(message(4, [{"type": "BlockRemoved", "block_hashes": [3]}]))
        await sub.wait_for_batches("r0", 5)
        await replay
        assert store.residency_hashes("r0") == set(chain[:2])
        assert sub.streams["r0"].last_seq == 4

        # A gap the replay cannot fill (buffer starts later): index cleared, rebuilt from there.
        async def serve_short_replay():
            ident, _, _ = await router.recv_multipart()
            await router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

        replay = asyncio.create_task(serve_short_replay())
        other = [7, 7, 7, 7]
        await pub.sock.send_multipart(message(9, [stored([50], None, other)]))
        await sub.wait_for_batches("r0", 6)
        await replay
        assert store.residency_hashes("r0") == set(proxy_chain(other, B))
        assert metrics.registry.get_sample_value("prefixgate_kv_event_gaps_total", {"backend": "r0"}) == 2
        stored_count = metrics.registry.get_sample_value(
            "prefixgate_kv_events_total", {"backend": "r0", "kind": "stored"})
        assert stored_count == 5

        await pub.sock.send_multipart(message(10, [{"type": "AllBlocksCleared"}]))
        await sub.wait_for_batches("r0", 7)
        assert store.residency_size("r0") == 0
    finally:
        await sub.stop()
        router.close(0)
        pub.sock.close(0)
        ctx.term()


async def test_gap_without_replay_clears_the_replica_index():
    ctx = zmq.asyncio.Context()
    pub = Publisher(ctx)
    store = MemoryStore()
    sub = KVEventSubscriber({"r0": f"tcp://127.0.0.1:{pub.port}"}, ReplicaIndex(store, True))
    await sub.start()
    try:
        await pub.send_until_received(sub, "r0", message(1, [stored([1], None, [1, 2, 3, 4])]))
        await sub.wait_for_batches("r0", 2)
        assert store.residency_size("r0") == 1
        await pub.sock.send_multipart(message(5, [stored([9], 1, [5, 6, 7, 8])]))  # parent lost with the gap
        await sub.wait_for_batches("r0", 3)
        assert store.residency_size("r0") == 0  # cleared; the orphan could not be placed
        assert sub.streams["r0"].gaps == 1
    finally:
        await sub.stop()
        pub.sock.close(0)
        ctx.term()


async def test_resident_before_counts_only_blocks_stored_before_a_time():
    """In KV-event mode a request's prediction must not count the blocks it made the engine store
    itself (their events can arrive before the proxy's lookup)."""
    store = MemoryStore()
    sub = KVEventSubscriber({"r0": "tcp://127.0.0.1:1"}, ReplicaIndex(store, True), Metrics())  # handle() only, no socket
    tokens = list(range(16))
    chain = proxy_chain(tokens, B)
    await sub.handle("r0", message(0, [stored([1, 2], None, tokens[:8])]))
    sent = time.perf_counter()
    await asyncio.sleep(0.01)
    await sub.handle("r0", message(1, [stored([3, 4], 2, tokens[8:])]))
    assert (await store.residency_lookup(chain, ["r0"]))["r0"] == 4  # all four are resident now
    assert sub.resident_before("r0", chain, sent) == 2  # but only two were when "sent"
    assert sub.resident_before("r0", chain, time.perf_counter()) == 4
    await sub.handle("r0", message(2, [{"type": "AllBlocksCleared"}]))
    await sub.handle("r0", message(3, [stored([1, 2], None, tokens[:8])]))
    assert sub.resident_before("r0", chain, sent) == 0  # re-stored after `sent`: not counted


VALUES = [None, True, -1, 0, 2**64 - 1, -(2**63), 1.5, float("nan"), "", "x", b"\x00\xff", [], [1, "a"], {}, {"a": 1}]


def _bent_event(r, tokens):
    """A BlockStored / BlockRemoved / AllBlocksCleared event with one to three members replaced by
    any msgpack value, or no event at all."""
    if r.random() < 0.1:
        return r.choice(VALUES)
    ev = r.choice([stored([r.randrange(1000), r.randrange(1000)], r.choice([None, 1, 2]), tokens[:8]),
                   {"type": "BlockRemoved", "block_hashes": [r.randrange(1000)], "medium": "GPU"},
                   {"type": "AllBlocksCleared"}])
    for _ in range(r.randint(1, 3)):
        ev[r.choice(sorted(ev))] = r.choice(VALUES)
    return ev


async def test_bent_events_are_counted_and_the_subscription_goes_on():
    """An engine (or another publisher on its port) sending events whose members are any value,
    payloads that are no msgpack, frames of another count: each such message is counted
    `malformed` (or applied as far as it reads), the subscription goes on, and the next good
    batch is indexed as usual. 300 seeded messages through a real PUB socket."""
    import random

    ctx = zmq.asyncio.Context()
    pub = Publisher(ctx)
    store = MemoryStore()
    metrics = Metrics()
    sub = KVEventSubscriber({"r0": f"tcp://127.0.0.1:{pub.port}"}, ReplicaIndex(store, True), metrics, topic="kv")
    await sub.start()
    try:
        r = random.Random(7)
        tokens = list(range(16))
        await pub.send_until_received(sub, "r0", message(1, []))
        seq = 1
        for _ in range(300):
            seq += 1
            how = r.random()
            if how < 0.1:
                await pub.sock.send_multipart([b"kv", seq.to_bytes(8, "big"), bytes(r.randrange(256) for _ in range(9))])
            elif how < 0.15:
                await pub.sock.send_multipart([b"kv", seq.to_bytes(8, "big")])
            else:
                await pub.sock.send_multipart(message(seq, [_bent_event(r, tokens) for _ in range(r.randint(1, 3))]))
        seq += 1
        other = [9, 9, 9, 9, 8, 8, 8, 8]
        await pub.sock.send_multipart(message(seq, [{"type": "AllBlocksCleared"}, stored([501, 502], None, other)]))
        deadline = time.monotonic() + 10
        while sub.streams["r0"].last_seq != seq:
            assert time.monotonic() < deadline, f"the subscription stopped at {sub.streams['r0'].last_seq}"
            await asyncio.sleep(0.02)
        assert store.residency_hashes("r0") == set(proxy_chain(other, B))
        malformed = metrics.registry.get_sample_value("prefixgate_kv_events_total",
                                                      {"backend": "r0", "kind": "malformed"})
        assert malformed and malformed > 0
    finally:
        await sub.stop()
        pub.sock.close(0)
        ctx.term()


# ---------------------------------------------------------------- found by tests/test_kv_events_fuzz.py
async def test_a_seq_that_is_not_8_bytes_is_dropped():
    store, metrics = MemoryStore(), Metrics()
    sub = KVEventSubscriber({"r0": "tcp://127.0.0.1:1"}, ReplicaIndex(store, True), metrics)
    frames = message(1, [stored([1], None, [1, 2, 3, 4])])
    await sub.handle("r0", [frames[0], frames[1][1:], frames[2]])  # 7 bytes: applied as seq 1 before
    assert store.residency_size("r0") == 0
    assert metrics.registry.get_sample_value("prefixgate_kv_events_total", {"backend": "r0", "kind": "malformed"}) == 1


async def test_a_seq_that_goes_back_or_far_ahead_does_not_stop_the_stream():
    """An engine that restarted counts from 0 again; a stranger on the port may send any seq.
    Before, a seq at or below the last one was dropped as 'already applied', so after a restart
    (or one message far ahead) every batch was dropped and the index kept what the engine lost."""
    store = MemoryStore()
    sub = KVEventSubscriber({"r0": "tcp://127.0.0.1:1"}, ReplicaIndex(store, True))
    a, b, c = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    await sub.handle("r0", message(40, [stored([1], None, a)]))
    await sub.handle("r0", message(0, [stored([2], None, b)]))  # the engine restarted
    assert store.residency_hashes("r0") == set(proxy_chain(b, B))
    await sub.handle("r0", message(2**62, []))  # another publisher, far ahead
    await sub.handle("r0", message(1, [stored([3], None, c)]))
    assert store.residency_hashes("r0") == set(proxy_chain(c, B))


async def test_a_batch_with_an_event_no_engine_sends_is_dropped_whole():
    """Before, a removal whose medium was no string was skipped as another tier's and the rest of
    its batch applied: the index kept the block the engine removed, for good."""
    store = MemoryStore()
    sub = KVEventSubscriber({"r0": "tcp://127.0.0.1:1"}, ReplicaIndex(store, True))
    a, b = [1, 1, 1, 1], [2, 2, 2, 2]
    await sub.handle("r0", message(1, [stored([1], None, a)]))
    await sub.handle("r0", message(2, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 5},
                                       stored([2.0], None, b)]))
    assert store.residency_hashes("r0") == set(proxy_chain(a, B))  # dropped: the float hash not stored
    await sub.handle("r0", message(3, []))  # the next batch finds the gap: no replay, start over
    assert store.residency_size("r0") == 0


async def _replaying(answers):
    """A subscriber with a replay ROUTER that answers each request with `answers(start)`."""
    ctx = zmq.asyncio.Context()
    port = free_port()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    store = MemoryStore()
    sub = KVEventSubscriber({"r0": f"tcp://127.0.0.1:{free_port()}"}, ReplicaIndex(store, True), Metrics(),
                            replay_endpoints={"r0": f"tcp://127.0.0.1:{port}"}, replay_timeout_s=1.0)
    await sub.start()

    async def serve():
        while True:
            ident, _, start = await router.recv_multipart()
            for seq, body in answers(int.from_bytes(start, "big")):
                await router.send_multipart([ident, b"", seq.to_bytes(8, "big"), body])
            await router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    task = asyncio.create_task(serve())

    async def close():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub.stop()
        router.close(0)
        ctx.term()
    return sub, store, close


async def test_a_bad_batch_in_the_replay_buffer_does_not_wedge_the_stream():
    """Before, a replayed batch that did not decode raised out of the gap handling: the batch that
    found the gap was lost, and so was every later one (each found the gap again)."""
    a, b, c = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    sub, store, close = await _replaying(lambda start: [(2, b"\xc1 no msgpack")])
    try:
        await sub.handle("r0", message(1, [stored([1], None, a)]))
        await sub.handle("r0", message(3, [stored([2], None, b)]))  # seq 2 lost; its replay is garbage
        await sub.handle("r0", message(4, [stored([3], 2, c)]))
        assert store.residency_hashes("r0") == set(proxy_chain(b + c, B))  # a cleared (2 may have removed it)
        assert sub.streams["r0"].last_seq == 4
    finally:
        await close()


async def test_a_replay_past_the_gap_does_not_run_ahead_of_the_engine():
    """Before, batches the replay answered past the gap were applied and the next live batches
    dropped as already applied (a replay endpoint that answers seqs no engine sent lost a removal)."""
    a, b = [1, 1, 1, 1], [2, 2, 2, 2]
    sub, store, close = await _replaying(lambda start: [(s, msgspec.msgpack.encode([0.0, [], 0]))
                                                        for s in range(start, start + 5)])
    try:
        await sub.handle("r0", message(1, [stored([1], None, a)]))
        await sub.handle("r0", message(3, [stored([2], None, b)]))  # seq 2 lost, replayed (with 3..6)
        await sub.handle("r0", message(4, [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}]))
        assert store.residency_hashes("r0") == set(proxy_chain(b, B))
    finally:
        await close()
