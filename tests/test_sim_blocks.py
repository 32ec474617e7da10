"""vLLM 0.33 block-hash recipes (the test vectors recorded with vLLM's own hashing.py,
docs/engine-hashing.md): the gateway's implementation (app/prefix/blocks.py) and the simulator's
own (app/sim/hashing.py) must each reproduce them; they are written apart so that agreeing means
something (docs/testing-oracles.md)."""

from __future__ import annotations

from array import array

import pytest

from app.prefix.blocks import low64, none_hash, proxy_chain, proxy_digest, vllm_chain, vllm_chain_from
from app.sim.hashing import (
    sglang_event_hash,
    sglang_namespace_seed,
    sglang_page_keys,
    vllm_block_keys,
    vllm_event_hash,
    vllm_none_hash,
)

TOKENS = list(range(32))

VECTORS = [
    # algo, seed, NONE_HASH hex, H_0 hex, H_0 u64, H_1 u64
    ("sha256", None, "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
     "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798", 3262291359910021016, 7142137847444424233),
    ("sha256", "0", "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
     "6358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec84ae048faaaa6", 7982712666671721126, 12675106281628537544),
    ("sha256_cbor", None, "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
     "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749", 2233398808101521225, 17911472383915781900),
    ("sha256_cbor", "0", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
     "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c", 12687895063098490012, 1814341696565857452),
]


@pytest.mark.parametrize("algo,seed,none_hex,h0_hex,h0_u64,h1_u64", VECTORS)
def test_vllm_vectors(algo, seed, none_hex, h0_hex, h0_u64, h1_u64):
    assert none_hash(algo, seed).hex() == none_hex
    chain = vllm_chain(TOKENS, 16, algo=algo, python_hash_seed=seed)
    assert chain[0].hex() == h0_hex
    assert [low64(d) for d in chain] == [h0_u64, h1_u64]
    assert vllm_chain_from(TOKENS, 16, algo=algo, python_hash_seed=seed) == chain


def test_salted_vector():
    chain = vllm_chain(TOKENS, 16, algo="sha256_cbor", python_hash_seed="0", cache_salt="tenant-a")
    assert chain[0].hex() == "3be36890effbb5e0d90d6506b68f1365539bcf2a82688a430612688636e0959d"
    assert vllm_chain_from(TOKENS, 16, algo="sha256_cbor", python_hash_seed="0", cache_salt="tenant-a") == chain


def test_incremental_chain_equals_full_chain():
    tokens = list(range(1000, 1000 + 16 * 9 + 5))
    full = vllm_chain(tokens, 16, cache_salt="s")
    assert len(full) == 9  # only full blocks
    for start in range(1, 9):
        assert vllm_chain_from(tokens, 16, parent=full[start - 1], start_block=start, cache_salt="s") == full[start:]
    proxy = proxy_chain(tokens, 16, salt="s")
    assert proxy_chain(tokens, 16, salt="s", parent=proxy_digest(proxy[3]), start_block=4) == proxy[4:]


@pytest.mark.parametrize("algo,seed,none_hex,h0_hex,h0_u64,h1_u64", VECTORS)
def test_sim_hashing_reproduces_the_vllm_vectors(algo, seed, none_hex, h0_hex, h0_u64, h1_u64):
    assert vllm_none_hash(algo, seed).hex() == none_hex
    keys = vllm_block_keys(TOKENS, 16, algo=algo, python_hash_seed=seed)
    assert keys[0].hex() == h0_hex
    assert [vllm_event_hash(k) for k in keys] == [h0_u64, h1_u64]


def test_sim_hashing_salted_vector_and_incremental_keys():
    keys = vllm_block_keys(TOKENS, 16, algo="sha256_cbor", python_hash_seed="0", cache_salt="tenant-a")
    assert keys[0].hex() == "3be36890effbb5e0d90d6506b68f1365539bcf2a82688a430612688636e0959d"
    tokens = list(range(1000, 1000 + 16 * 9 + 5))
    full = vllm_block_keys(tokens, 16, cache_salt="s")
    assert len(full) == 9  # only full blocks
    for first in range(1, 9):
        assert vllm_block_keys(tokens, 16, first=first, parent=full[first - 1], cache_salt="s") == full[first:]


def test_sim_sglang_pages_chain_and_namespaces_share_nothing():
    tokens = list(range(40))
    plain = sglang_page_keys(tokens, 1)
    assert len(plain) == 40 and sglang_page_keys(tokens, 1, first=10, parent=plain[9]) == plain[10:]
    spaces = [sglang_namespace_seed(e, s) for e, s in ((None, None), ("k", None), (None, "k"), ("k", "k"))]
    keyed = [set(sglang_page_keys(tokens, 1, namespace=n)) for n in spaces]
    assert all(not (a & b) for i, a in enumerate(keyed) for b in keyed[i + 1:])
    assert all(-(2**63) <= sglang_event_hash(k) < 2**63 for k in plain)


def test_proxy_chain_vectors():
    """The gateway's own 64-bit chain is a stored format (Redis residency, KV-event indexes, other
    pods): these values were recorded from its first implementation and must never change."""
    assert proxy_chain(TOKENS, 16) == [7239153517877980863, 16364453105938386585]
    assert proxy_chain(TOKENS, 16, salt="tenant-a") == [15212082539226047956, 615786302009226236]
    ids = array("I", TOKENS * 3)  # the gateway's packed ids, a tuple, a list: one chain
    assert proxy_chain(ids, 16) == proxy_chain(tuple(TOKENS * 3), 16) == proxy_chain(TOKENS * 3, 16)
