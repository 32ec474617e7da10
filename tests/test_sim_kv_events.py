"""ZMQ KV events from a replica: 3 frames, map-shaped msgpack batches, hashes = vLLM low 64 bits."""

from __future__ import annotations

import time

import httpx
import msgspec
import pytest
import zmq

from app.prefix.blocks import low64, vllm_chain
from app.sim.testing import SimCluster


def collect(sub: zmq.Socket, until, timeout: float = 5.0) -> list:
    batches = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            batches.append((topic, int.from_bytes(seq, "big"), msgspec.msgpack.decode(payload)))
            if until(batches):
                break
    return batches


@pytest.fixture
def sim_and_sub():
    with SimCluster(time_scale=0, kv_events=True, kv_blocks=12, kv_events_topic="kv@sim") as sim:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(sim.kv_event_endpoints[0])
        time.sleep(0.3)  # PUB/SUB slow joiner
        try:
            yield sim, sub
        finally:
            sub.close(0)
            ctx.term()


def events_of(batches) -> list[dict]:
    return [ev for _, _, (_, evs, _) in batches for ev in evs]


def test_block_stored_carries_token_ids_and_vllm_hashes(sim_and_sub):
    sim, sub = sim_and_sub
    url = sim.urls[0]
    prompt = list(range(100, 150))  # 3 full blocks
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1, "cache_salt": "t1"})
    assert r.status_code == 200
    batches = collect(sub, lambda b: any(e["type"] == "BlockStored" for e in events_of(b)))
    topic, seq, (ts, events, rank) = batches[0]
    assert topic == b"kv@sim" and seq == 0 and rank == 0 and ts > 0
    stored = [e for e in events_of(batches) if e["type"] == "BlockStored"][0]
    expected = [low64(d) for d in vllm_chain(prompt, 16, cache_salt="t1")]
    assert stored["block_hashes"] == expected
    assert stored["parent_block_hash"] is None
    assert stored["token_ids"] == prompt[:48]
    assert stored["block_size"] == 16 and stored["medium"] == "GPU"
    assert stored["extra_keys"] == [["t1"], None, None]


def test_eviction_emits_block_removed_and_reset_all_cleared(sim_and_sub):
    sim, sub = sim_and_sub
    url = sim.urls[0]
    stored_hashes: set[int] = set()
    for i in range(4):  # 4 x 4 blocks through an 11-block pool
        prompt = [1000 * (i + 1) + j for j in range(64)]
        assert httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}).status_code == 200
    batches = collect(sub, lambda b: any(e["type"] == "BlockRemoved" for e in events_of(b)))
    evs = events_of(batches)
    for e in evs:
        if e["type"] == "BlockStored":
            stored_hashes.update(e["block_hashes"])
    removed = [h for e in evs if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert removed and set(removed) <= stored_hashes
    seqs = [s for _, s, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert httpx.post(url + "/reset_prefix_cache").json() == {"success": True}
    batches = collect(sub, lambda b: any(e["type"] == "AllBlocksCleared" for e in events_of(b)))
    assert {"type": "AllBlocksCleared"} in events_of(batches)
    assert httpx.get(url + "/sim/state").json()["num_resident_blocks"] == 0


def test_gap_fault_then_replay_returns_the_missed_batches(sim_and_sub):
    sim, sub = sim_and_sub
    url = sim.urls[0]
    assert httpx.post(url + "/sim/faults", json={"mode": "kv_gap", "count": 1}).status_code == 200
    httpx.post(url + "/v1/completions", json={"prompt": list(range(500, 540)), "max_tokens": 1})
    httpx.post(url + "/v1/completions", json={"prompt": list(range(600, 640)), "max_tokens": 1})
    got = collect(sub, lambda b: len(b) >= 1, timeout=3)
    assert got and got[0][1] >= 1  # batch 0 was never sent: a gap
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(sim.kv_replay_endpoints[0])
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = []
        while dealer.poll(3000):
            frames = dealer.recv_multipart()
            assert frames[0] == b""
            if frames[1] == (-1).to_bytes(8, "big", signed=True):
                assert frames[2] == b""
                break
            replayed.append((int.from_bytes(frames[1], "big"), msgspec.msgpack.decode(frames[2])))
    finally:
        dealer.close(0)
        ctx.term()
    assert [s for s, _ in replayed] == list(range(len(replayed))) and len(replayed) >= 2
    first_events = replayed[0][1][1]
    assert first_events[0]["type"] == "BlockStored" and first_events[0]["token_ids"] == list(range(500, 532))
    sources = httpx.get(url + "/kv_event_sources").json()["sources"]
    assert sources[0]["replay_endpoint"] == sim.kv_replay_endpoints[0]
