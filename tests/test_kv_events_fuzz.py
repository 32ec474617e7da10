"""Fuzzing what the gateway reads from an engine's KV-event stream: real ZMQ PUB and ROUTER
(replay) sockets on loopback, the gateway's real `KVEventSubscriber` and `ReplicaIndex` over a
`MemoryStore`, as tests/test_kv_events_subscriber.py wires them.

Each case plays an engine that publishes good batches in vLLM's shapes (map and legacy array
events, int or bytes hashes, salted roots, chains extended and branched, re-stores, removals of
known and unknown blocks, clears, CPU-tier and other-group events, event types it does not know)
and, between them, what a broken engine or a stranger on its port may send:
- batches on the engine's sequence whose payload is no msgpack, cut short, of the wrong shape
  (events that are no list, 5,000-deep nesting), or with one event that is no valid event (a hash
  that is a float, a string, a bool; token ids that are no list of 32-bit ids; a block size that
  is no positive int; a medium, LoRA name, salt or extra keys of the wrong type; enormous lists);
- batches lost on the wire (a sequence gap), which the replay endpoint answers honestly, from a
  later start, with a hole, with a bent entry, with garbage, with nothing, or with batches past
  the gap that no engine sent;
- messages that are not the engine's: frames in the wrong number, a sequence number that is not
  8 bytes, or one that jumps backwards or ahead (a restarted engine, another publisher).

The test keeps its own model of the engine's cache from the good events alone (a bent batch's
stores are never added, its removals always taken), and after every case, once a good batch sent
last is applied, checks: the subscriber task is alive and logged no traceback; every block the
index holds that the model knows of is resident in the model (never a false hit), none of the
blocks a bent message alone claimed is held, the set is prefix-closed, each known chain's lookup
is at most the model's; a bent message was counted `malformed`. `PREFIXGATE_KV_EVENTS_FUZZ`
(default 300) seeded cases; a failure names its case, which reproduces alone
(`PREFIXGATE_KV_EVENTS_FUZZ_ONLY=484,740`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from app.engines.kv_events import KVEventSubscriber
from app.prefix.blocks import proxy_chain, proxy_digest
from app.routing.residency import ReplicaIndex
from app.serving import free_port
from app.state.memory import MemoryStore
from app.telemetry.metrics import Metrics
from tests.bend import VALUES

CASES = int(os.environ.get("PREFIXGATE_KV_EVENTS_FUZZ", "300"))
ONLY = [int(c) for c in os.environ.get("PREFIXGATE_KV_EVENTS_FUZZ_ONLY", "").split(",") if c]  # rerun these
SEED = 20261206
B = 4
R = "r0"
END = (-1).to_bytes(8, "big", signed=True)
enc = msgspec.msgpack.encode


def _encodable(v: Any) -> bool:
    try:
        enc(v)
    except (OverflowError, TypeError, UnicodeEncodeError, msgspec.EncodeError):
        return False
    return True


ANY = [v for v in VALUES if _encodable(v)]
NOT_LIST = [v for v in ANY if not isinstance(v, list)] + [b"\x01\x02"]
NOT_HASH = [None, True, False, 1.5, -0.0, "12", "", [], [1], {}, {"a": 1}]
NOT_TOKEN = [1.5, "x", -1, 2**32, True, None, [], {}]
NOT_SIZE = [None, "4", 4.0, True, [4], {}]
NOT_TEXT = [5, True, [], ["x"], {}, 1.5]
NOT_INT = ["0", 0.0, 1.5, True, [], {}]


def stored(shape: str, hashes: list[Any], parent: Any, tokens: Any, size: Any = B, medium: Any = "GPU",
           group: Any = 0, extra_keys: Any = None, cache_salt: Any = None, lora_name: Any = None) -> Any:
    if shape == "array":
        return ["BlockStored", hashes, parent, tokens, size, None, medium, lora_name, extra_keys, group]
    ev: dict[str, Any] = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                          "token_ids": tokens, "block_size": size, "lora_id": None, "medium": medium,
                          "lora_name": lora_name}
    if group != 0:
        ev["group_idx"] = group
    if extra_keys is not None:
        ev["extra_keys"] = extra_keys
    if cache_salt is not None:
        ev["cache_salt"] = cache_salt
    return ev


def removed(shape: str, hashes: list[Any], medium: Any = "GPU", group: Any = 0) -> Any:
    if shape == "array":
        return ["BlockRemoved", hashes, medium, group]
    ev: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group != 0:
        ev["group_idx"] = group
    return ev


def cleared(shape: str) -> Any:
    return ["AllBlocksCleared"] if shape == "array" else {"type": "AllBlocksCleared"}


def payload(events: list[Any], seq: int) -> bytes:
    return enc([float(seq), events, 0])



@dataclass
class Model:
    """The engine's GPU cache as its good events say: proxy hash -> parent proxy. Prefix-closed:
    a removal takes the subtree, as the index does (the engine cannot hit past a removed block)."""

    resident: dict[int, int | None] = field(default_factory=dict)
    engine_hash: dict[int, Any] = field(default_factory=dict)  # proxy -> engine hash
    parent_of: dict[int, int | None] = field(default_factory=dict)  # every block a message named
    chains: list[list[int]] = field(default_factory=list)  # root..tail of every store, good or bent
    good: list[tuple[Any, list[int], int | None]] = field(default_factory=list)  # (event, proxies, parent)

    def chain_to(self, h: int) -> list[int]:
        out = [h]
        while (p := self.parent_of[out[-1]]) is not None:
            out.append(p)
        return out[::-1]

    def leading(self, chain: list[int]) -> int:
        n = 0
        while n < len(chain) and chain[n] in self.resident:
            n += 1
        return n

    def store(self, proxies: list[int], parent: int | None) -> None:
        above = parent
        for h in proxies:
            self.resident[h] = above
            above = h

    def remove(self, hashes: list[int]) -> None:
        gone = {h for h in hashes if h in self.resident}
        while True:
            more = {h for h, p in self.resident.items() if p in gone and h not in gone}
            if not more:
                break
            gone |= more
        for h in gone:
            del self.resident[h]


class Engine:
    """One case's engine: its sequence, its replay buffer, the model, and event makers."""

    def __init__(self, case: int, r: random.Random, replay_mode: str) -> None:
        self.case = case
        self.r = r
        self.seq = r.choice([-1, r.randrange(0, 2**40)])
        self.bytes_hashes = r.random() < 0.3  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
        self.shape = r.choice(["map", "map", "array", "mixed"])
        self.replay_mode = replay_mode
        self.model = Model()
        self.buffer: dict[int, bytes] = {}
        self.must_drop = 0  # messages sent that must be counted malformed
        self.log: list[str] = []

    def ev_shape(self) -> str:
        return self.r.choice(["map", "array"]) if self.shape == "mixed" else self.shape

    def new_hash(self) -> Any:
        return self.r.randbytes(32) if self.bytes_hashes else self.r.getrandbits(64)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # ----------------------------------------------------------- events and their meaning
    def store_event(self, parent: int | None, k: int, low: int = 0, known: bool = True) -> tuple[Any, list[int]]:
        """A new run of `k` blocks under `parent` (None: a root, sometimes salted) and its proxy
        hashes; `known`: the test tracks them (a good or a phantom store; a stranger's are not)."""
        r = self.r
        toks = [r.randrange(low, low + 256) for _ in range(k * B)]
        salt = r.choice([None, None, "tenant-a", "tenant-b"]) if parent is None else None
        hashes = [self.new_hash() for _ in range(k)]
        proxies = proxy_chain(toks, B, salt=salt) if parent is None else \
            proxy_chain(toks, B, parent=proxy_digest(parent))
        shape = self.ev_shape()
        extra = salt_field = None
        if salt is not None and (shape == "array" or r.random() < 0.5):
            extra = [[salt]] + [None] * (k - 1)
        elif salt is not None:
            salt_field = salt
        ev = stored(shape, hashes, None if parent is None else self.model.engine_hash[parent], toks,
                    extra_keys=extra, cache_salt=salt_field)
        if known:
            m = self.model
            above = parent
            for h, eh in zip(proxies, hashes, strict=True):
                m.parent_of.setdefault(h, above)
                m.engine_hash.setdefault(h, eh)
                above = h
            m.chains.append(m.chain_to(proxies[-1]))
        return ev, proxies

    def good_events(self) -> list[Any]:
        r, m = self.r, self.model
        out: list[Any] = []
        for _ in range(r.randint(1, 4)):
            how = r.random()
            if how < 0.3 or not m.resident:
                parent = None if how < 0.3 or not m.resident else r.choice(sorted(m.resident))
                ev, proxies = self.store_event(parent, r.randint(1, 3))
                out.append(ev)
                m.store(proxies, parent)
                m.good.append((ev, proxies, parent))
            elif how < 0.55:
                parent = r.choice(sorted(m.resident))
                ev, proxies = self.store_event(parent, r.randint(1, 3))
                out.append(ev)
                m.store(proxies, parent)
                m.good.append((ev, proxies, parent))
            elif how < 0.62:  # the same event again: report mode "full", or stored again after eviction
                ev, proxies, parent = r.choice(m.good)
                if parent is None or parent in m.resident:
                    out.append(ev)
                    m.store(proxies, parent)
            elif how < 0.82:
                gone = r.sample(sorted(m.resident), min(len(m.resident), r.randint(1, 3)))
                hashes = [m.engine_hash[h] for h in gone] + [self.new_hash() for _ in range(r.randint(0, 1))]
                out.append(removed(self.ev_shape(), hashes))
                m.remove(gone)
            elif how < 0.85:
                out.append(cleared(self.ev_shape()))
                m.resident.clear()
            elif how < 0.93:  # the CPU tier, another KV-cache group, no block size: nothing to index
                hashes = [m.engine_hash[h] for h in r.sample(sorted(m.resident), 1)]
                toks = [r.randrange(256) for _ in range(B)]
                out.append(r.choice([stored(self.ev_shape(), [self.new_hash()], None, [], medium="CPU"),
                                     stored(self.ev_shape(), [self.new_hash()], None, toks, group=1),
                                     stored(self.ev_shape(), [self.new_hash()], None, toks, size=r.choice([0, -4])),
                                     removed(self.ev_shape(), hashes, medium="CPU"),
                                     removed(self.ev_shape(), hashes, group=1)]))
            else:  # what this proxy does not know
                out.append(r.choice([{"type": "SomethingNew", "x": [1, {"y": None}]}, ["Other", 1], 42, None]))
        return out

    def phantom(self) -> Any:
        """A store no engine made (a root, or under a resident block): must never be held."""
        parent = self.r.choice(sorted(self.model.resident)) if self.model.resident and self.r.random() < 0.5 else None
        ev, _ = self.store_event(parent, self.r.randint(1, 3))
        return ev

    def stranger_events(self) -> list[Any]:
        """What another publisher might send: its own stores (other tokens), removals, clears."""
        r, m = self.r, self.model
        out: list[Any] = []
        for _ in range(r.randint(1, 3)):
            how = r.random()
            if how < 0.5:
                parent = r.choice(sorted(m.resident)) if m.resident and r.random() < 0.5 else None
                out.append(self.store_event(parent, r.randint(1, 2), low=1000, known=False)[0])
            elif how < 0.85 and m.resident:
                out.append(removed(self.ev_shape(), [m.engine_hash[h] for h in r.sample(sorted(m.resident), 1)]))
            else:
                out.append(cleared(self.ev_shape()))
        return out

    # ----------------------------------------------------------- bent
    def bent_event(self) -> Any:
        """A store (phantom) or a removal (of resident blocks: taken in the model) with one member
        that is no valid value for it: the batch carrying it must be dropped whole."""
        r, m = self.r, self.model
        if m.resident and r.random() < 0.4:
            gone = r.sample(sorted(m.resident), min(len(m.resident), r.randint(1, 2)))
            ev = removed(self.ev_shape(), [m.engine_hash[h] for h in gone])
            m.remove(gone)
            fields = {"block_hashes": 1, "medium": 2, "group_idx": 3}
        else:
            ev = self.phantom()
            fields = {"block_hashes": 1, "parent_block_hash": 2, "token_ids": 3, "block_size": 4,
                      "medium": 6, "lora_name": 7, "extra_keys": 8, "group_idx": 9}
            if isinstance(ev, dict):
                fields["cache_salt"] = 0  # a member of the map shape only
        if isinstance(ev, list) and r.random() < 0.15:
            return ev[:r.randint(1, 4 if ev[0] == "BlockStored" else 1)]  # required members missing
        name = r.choice(sorted(fields))
        key: Any = name if isinstance(ev, dict) else fields[name]
        current = ev[key] if isinstance(ev, list) else ev.get(key)
        ev[key] = self.bad_value(name, current)
        self.log.append(f"bent {name}")
        return ev

    def bad_value(self, name: str, current: Any) -> Any:
        r = self.r
        if name == "block_hashes":
            how = r.random()
            if how < 0.3:
                return r.choice(NOT_LIST + [None])
            if how < 0.95:
                out = list(current)
                h = out[r.randrange(len(out))]
                out[r.randrange(len(out))] = r.choice(NOT_HASH + ([str(h), float(h)] if isinstance(h, int) else [list(h)]))
                return out
            return [*current, *(r.getrandbits(64) for _ in range(50_000)), r.choice(NOT_HASH)]  # enormous
        if name == "parent_block_hash":
            return r.choice([v for v in NOT_HASH if v is not None]
                            + ([str(current), float(current)] if isinstance(current, int) else []))
        if name == "token_ids":
            how = r.random()
            if how < 0.4:
                return r.choice([bytes(current), {t: 0 for t in current}, "abcd" * len(current), 5, 1.5, True])
            out = list(current)
            out[r.randrange(len(out))] = r.choice(NOT_TOKEN)
            return out
        if name == "block_size":
            return r.choice(NOT_SIZE)
        if name == "group_idx":
            return r.choice(NOT_INT)
        if name == "extra_keys":
            return r.choice([5, "x", True, 1.5, {"a": [1]}])
        return r.choice(NOT_TEXT)  # medium, lora_name, cache_salt

    def bent_batch(self) -> tuple[bytes, bool]:
        """A payload on the engine's sequence that is no valid batch; True when it must be
        counted malformed (some junk may decode as an empty batch)."""
        r, m = self.r, self.model
        how = r.random()
        if how < 0.55:
            events = [self.bent_event()]
            for _ in range(r.randint(0, 3)):
                if m.resident and r.random() < 0.5:
                    gone = r.sample(sorted(m.resident), 1)
                    events.append(removed(self.ev_shape(), [m.engine_hash[h] for h in gone]))
                    m.remove(gone)  # the engine did remove it: the index must not keep it
                else:
                    events.append(self.phantom())
            r.shuffle(events)
            return enc([1.0, events, 0]), True
        if how < 0.7:  # cut short
            events = [self.phantom() for _ in range(r.randint(1, 3))]
            if m.resident:
                gone = r.sample(sorted(m.resident), 1)
                events.append(removed(self.ev_shape(), [m.engine_hash[h] for h in gone]))
                m.remove(gone)
            whole = enc([1.0, events, 0])
            self.log.append("cut")
            return whole[:r.randrange(len(whole))], True
        if how < 0.85:
            self.log.append("garbage")
            return r.randbytes(r.randint(1, 40)), False
        self.log.append("shape")
        return r.choice([enc(5), enc("x"), enc(None), enc({}), enc([1.0]), enc([1.0, 5, 0]), enc([1.0, "ev", 0]),
                         enc([1.0, {"a": 1}, 0]), enc(["x", [], 0]), enc([[], [[[]]], {}]),
                         b"\x91" * 5000 + b"\xc0", b"\x92\xcb" + b"\x00" * 8 + b"\x91" * 5000 + b"\xc0"]), False


# ---------------------------------------------------------------- the replay endpoint
async def serve_replay(router: zmq.asyncio.Socket, current: list[Engine]) -> None:
    """vLLM's ROUTER replay endpoint for the current case's engine, answering as its mode says."""
    n = 0
    while True:
        frames = await router.recv_multipart()
        eng = current[0]
        n += 1
        r = random.Random(f"{eng.case}-{n}")
        ident, start_frame = frames[0], frames[-1]
        start = int.from_bytes(start_frame, "big", signed=True)
        mode = eng.replay_mode
        if mode == "silent":
            continue
        entries = sorted((s, p) for s, p in eng.buffer.items() if s >= start)
        if mode == "late" and entries:
            entries = entries[r.randint(1, len(entries)):]
        elif mode == "holed" and len(entries) > 1:
            del entries[r.randrange(1, len(entries))]
        elif mode == "stale":
            entries = sorted((s, p) for s, p in eng.buffer.items() if s >= start - 2)
        elif mode == "future" and entries:
            last = max(eng.buffer)
            for k in range(1, r.randint(2, 4)):
                entries.append((last + k, enc([0.0, [], 0])))  # batches no engine sent
        elif mode == "end":
            entries = []
        out: list[list[bytes]] = []
        for s, p in entries:
            topic = [b"kv"] if r.random() < 0.5 else []
            out.append([ident, b"", *topic, s.to_bytes(8, "big", signed=True), p])
        if mode == "bent" and out:
            i = r.randrange(len(out))
            out[i] = r.choice([[ident, b"", out[i][-2], r.randbytes(9)], [ident, b"", out[i][-2][1:], out[i][-1]],
                               [ident, b"", out[i][-1]], [ident, b"", out[i][-2], out[i][-1][:5]]])
        if mode == "garbage":
            out = [[ident, *(r.randbytes(r.randint(0, 12)) for _ in range(r.randint(1, 4)))]
                   for _ in range(r.randint(1, 5))]
        out.append([ident, b"", b"", END, b""])
        for msg in out:
            await router.send_multipart(msg)


REPLAY_MODES = ["honest", "honest", "honest", "late", "holed", "bent", "garbage", "silent", "end", "stale", "future"]


class Wire:
    """The shared loopback sockets: the engine's PUB and its replay ROUTER."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.pub.bind(self.pub_endpoint)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.router.bind(self.replay_endpoint)

    def close(self) -> None:
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


async def send_engine(wire: Wire, eng: Engine, body: bytes, lose: bool = False) -> int:
    seq = eng.next_seq()
    eng.buffer[seq] = body
    if not lose:
        await wire.pub.send_multipart([b"kv", seq.to_bytes(8, "big", signed=True), body])
    return seq


async def send_stranger(wire: Wire, eng: Engine) -> None:
    r = eng.r
    how = r.random()
    if how < 0.35:  # frames in the wrong number; a phantom store inside must not be applied
        body = enc([1.0, [eng.phantom()], 0])
        seq = (eng.seq + 1).to_bytes(8, "big")
        frames = r.choice([[b"kv"], [b"kv", seq], [b"kv", seq, body, b"x"], [b"kv", b"", seq, body]])
        eng.must_drop += 1
        eng.log.append(f"frames {len(frames)}")
    elif how < 0.6:  # a sequence number that is not 8 bytes
        body = enc([1.0, [eng.phantom()], 0])
        width = r.choice([0, 1, 4, 7, 9, 16])
        frames = [b"kv", (eng.seq + 1).to_bytes(16, "big")[16 - width:], body]
        eng.must_drop += 1
        eng.log.append(f"seq of {width} bytes")
    else:  # an 8-byte sequence number that is not the engine's next
        last = eng.seq
        seq = r.choice([last, last + 1, last - r.randint(1, 5), r.randint(0, max(0, last)), last + r.randint(2, 5),
                        2**62, -1, -(2**40)])
        body = enc([1.0, eng.stranger_events(), 0]) if r.random() < 0.7 else r.randbytes(r.randint(1, 20))
        frames = [b"kv", seq.to_bytes(8, "big", signed=True), body]
        eng.log.append(f"stranger seq {seq - last:+d}")
    await wire.pub.send_multipart(frames)


def check(eng: Engine, sub: KVEventSubscriber, index: ReplicaIndex, store: MemoryStore, metrics: Metrics,
          sentinel: list[int], tracebacks: list[logging.LogRecord]) -> list[str]:
    m = eng.model
    bad: list[str] = []
    if sub._tasks[0].done():
        bad.append(f"the subscriber task ended: {sub._tasks[0]!r}")
    if tracebacks:
        bad.append(f"a traceback was logged: {tracebacks[0].getMessage()} {tracebacks[0].exc_info[1]!r}")
    held = store.residency_hashes(R)
    false = {h for h in held if h in m.parent_of and h not in m.resident}
    if false:
        bad.append(f"{len(false)} blocks held that the engine does not hold")
    tree = index.trees.get(R)
    for h in held:
        p = m.parent_of[h] if h in m.parent_of else (tree.parent.get(h) if tree else None)
        if p is not None and p not in held:
            bad.append("the replica's set is not prefix-closed")
            break
    for chain in m.chains:
        got = store.residency_lookup_sync(chain, [R])[R]
        if got > m.leading(chain):
            bad.append(f"a lookup found {got} blocks where the engine holds {m.leading(chain)}")
            break
    if store.residency_lookup_sync(sentinel, [R])[R] != len(sentinel):
        bad.append("the good batch sent last was not applied")
    malformed = metrics.registry.get_sample_value("prefixgate_kv_events_total", {"backend": R, "kind": "malformed"})
    if eng.must_drop and not malformed:
        bad.append(f"{eng.must_drop} bent messages sent, none counted malformed")
    return bad


async def run_case(case: int, wire: Wire, current: list[Engine], handler: Tracebacks) -> list[str]:
    r = random.Random(f"{SEED}-{case}")
    eng = Engine(case, r, r.choice(REPLAY_MODES))
    current[0] = eng
    store, metrics = MemoryStore(), Metrics()
    index = ReplicaIndex(store, True)
    sub = KVEventSubscriber({R: wire.pub_endpoint}, index, metrics, replay_endpoints={R: wire.replay_endpoint},
                            replay_timeout_s=0.1)
    handler.records.clear()
    await sub.start()
    try:
        stream = sub.streams[R]
        while stream.batches == 0:  # PUB drops until the subscription arrives
            await send_engine(wire, eng, payload([], eng.seq + 1))
            await asyncio.sleep(0.005)
        while stream.last_seq != eng.seq:
            await asyncio.sleep(0.002)
        for _ in range(r.randint(3, 14)):
            how = r.random()
            if how < 0.5:
                await send_engine(wire, eng, payload(eng.good_events(), eng.seq + 1), lose=r.random() < 0.1)
            elif how < 0.75:
                body, must = eng.bent_batch()
                lose = r.random() < 0.1
                eng.must_drop += must and not lose
                await send_engine(wire, eng, body, lose=lose)
            else:
                await send_stranger(wire, eng)
        ev, sentinel = eng.store_event(None, 2)
        eng.model.store(sentinel, None)
        seq = await send_engine(wire, eng, payload([ev], eng.seq + 1))
        deadline = asyncio.get_running_loop().time() + 3.0
        while stream.last_seq != seq:
            if asyncio.get_running_loop().time() > deadline or sub._tasks[0].done():
                return [f"the good batch sent last (seq {seq}) never applied: the stream is at {stream.last_seq}"]
            await asyncio.sleep(0.002)
        return check(eng, sub, index, store, metrics, sentinel, handler.records)
    finally:
        await sub.stop()


@pytest.mark.timeout(max(120, CASES))
async def test_bent_kv_event_streams_never_make_the_index_wrong() -> None:
    wire = Wire()
    current: list[Engine] = []
    current.append(Engine(-1, random.Random(0), "honest"))
    replay = asyncio.create_task(serve_replay(wire.router, current))
    handler = Tracebacks()
    logger = logging.getLogger("prefixgate.kv_events")
    logger.addHandler(handler)
    failures: list[str] = []
    try:
        for case in ONLY or range(CASES):
            bad = await run_case(case, wire, current, handler)
            failures += [f"case {case} ({current[0].replay_mode} replay; {', '.join(current[0].log)}): {b}"
                         for b in bad]
    finally:
        logger.removeHandler(handler)
        replay.cancel()
        await asyncio.gather(replay, return_exceptions=True)
        wire.close()
    cases = len({f.split(" (")[0] for f in failures})
    assert not failures, f"{cases} of {CASES} cases failed:\n" + "\n".join(failures[:30])
