"""A salted request against real vLLM: its KV events match the proxy's own chain for that salt.

The salted vector in tests/test_sim_blocks.py is computed with the same recipe as app/prefix/blocks.py,
so it cannot tell whether that recipe is vLLM's. Here real vLLM 0.32 decides: the gateway salts a
tenant's request (tenants.cache_salt), and the BlockStored events vLLM publishes for it must
- start a new chain (no parent) whose first block carries that salt in its extra keys;
- carry engine block hashes equal to `vllm_chain(token_ids, B, cache_salt=salt)` (sha256, the
  engine's default, low 64 bits as published), i.e. the salted recipe is vLLM's;
- give, through `proxy_chain(token_ids, B, salt)`, exactly the chain the proxy's fingerprint computes
  for that request, so the residency index (fed by those events) holds the salted prompt block for
  block, and the same prompt unsalted or under another tenant's salt holds nothing;
- and a second tenant's identical prompt shares no block with the first (vLLM's cached_tokens 0).
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import pytest
import zmq

from app.engines.kv_event_decode import BlockStored, decode_batch, salt_of
from app.prefix.blocks import low64, proxy_chain, vllm_chain
from app.prefix.fingerprint import prompt_input
from tests.e2e.test_e2e_kv_events import _kv_proxy, _resident_blocks, _settle
from tests.e2e.workload import words

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SECRET_ENV = "PREFIXGATE_E2E_SALT_SECRET"
B = 32


class RawEvents:
    """A second SUB socket on the replica's KV-event stream, for the events as vLLM sent them."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)

    def drain(self) -> list[BlockStored]:
        out: list[BlockStored] = []
        while self.sock.poll(200):
            frames = self.sock.recv_multipart()
            if len(frames) == 3:
                out += [e for e in decode_batch(frames[2]).events if isinstance(e, BlockStored)]
        return out

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def _chain_from(events: list[BlockStored], salt: str) -> tuple[list[int], list[int]]:
    """(engine hashes, token ids) of the chain that starts with a root event salted `salt`."""
    roots = [i for i, e in enumerate(events) if e.parent_block_hash is None and salt_of(e) == salt]
    assert len(roots) == 1, f"expected one new chain salted {salt!r}, got {len(roots)}"
    hashes: list[int] = []
    tokens: list[int] = []
    for e in events[roots[0]:]:
        if hashes and e.parent_block_hash != hashes[-1]:
            continue  # another chain's event (a probe)
        assert e.block_size == B
        hashes += [int(h) for h in e.block_hashes]
        tokens += e.token_ids
    return hashes, tokens


def _send(proxy: Any, body: dict[str, Any], tenant: str) -> dict[str, Any]:
    resp = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"x-tenant-id": tenant}, timeout=120)
    resp.raise_for_status()
    return resp.json()


def test_salted_request_events_match_the_proxy_chain(e2e_proxy: Any, vllm_b32: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv(SECRET_ENV, "e2e-secret-" + "s" * 32)
    name = vllm_b32.name
    raw = RawEvents(vllm_b32.kv_endpoint)
    try:
        proxy, sub = _kv_proxy(e2e_proxy, vllm_b32, tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})
        raw.drain()  # what the connection probes caused
        body = {"model": "tiny", "max_tokens": 1, "temperature": 0.0,
                "messages": [{"role": "system", "content": words("salted-system", 120)},
                             {"role": "user", "content": words("salted-user", 60)}]}
        before = sub.streams[name].batches
        first = _send(proxy, body, "tenant-a")
        _settle(sub, name, before)
        time.sleep(0.3)
        events = raw.drain()
        proxy.settle()
        ctx = next(c for c in proxy.recorder.contexts.values() if c.tenant == "tenant-a")
        salt = ctx.salt
        assert salt and salt.startswith("pg1-"), "the gateway did not salt the request"

        hashes, tokens = _chain_from(events, salt)
        hook = proxy.services.prefix
        fp = hook.fingerprinter.complete_sync(hook.fingerprinter.prepare(prompt_input("chat", body), B, salt))
        prompt_blocks = first["usage"]["prompt_tokens"] // B
        assert prompt_blocks >= 4 and len(fp.block_hashes) == prompt_blocks
        # the proxy's own salted chain is the chain over the engine's token ids with that salt
        assert proxy_chain(tokens, B, salt=salt)[:prompt_blocks] == list(fp.block_hashes)
        # the salted recipe is vLLM's: the engine's published hashes, block for block
        seed = os.environ.get("PYTHONHASHSEED")
        expected = [low64(d) for d in vllm_chain(tokens, B, algo="sha256", python_hash_seed=seed, cache_salt=salt)]
        assert hashes == expected
        unsalted = [low64(d) for d in vllm_chain(tokens, B, algo="sha256", python_hash_seed=seed)]
        assert not set(hashes) & set(unsalted)

        assert _resident_blocks(proxy, body, name, salt) == (prompt_blocks, prompt_blocks)
        assert _resident_blocks(proxy, body, name, None)[0] == 0

        # another tenant, the same prompt: another salt, nothing shared in the engine or the index
        before = sub.streams[name].batches
        second = _send(proxy, body, "tenant-b")
        _settle(sub, name, before)
        time.sleep(0.3)
        other = next(c for c in proxy.recorder.contexts.values() if c.tenant == "tenant-b").salt
        assert other and other != salt
        other_hashes, other_tokens = _chain_from(raw.drain(), other)
        assert other_tokens[:len(tokens)] == tokens[:len(other_tokens)] and not set(other_hashes) & set(hashes)
        assert (second["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
        print(f"\nsalted KV events, b32: {len(hashes)} engine blocks = vllm_chain(salt); "
              f"{prompt_blocks} prompt blocks = proxy chain; tenant-b shares 0 blocks")
    finally:
        raw.close()
