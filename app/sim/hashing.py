"""Block keys as the engines compute them: the simulator's own implementation.

An oracle must not share the code it checks. The gateway predicts the engine's cache with its own
chain (app/prefix/blocks.py); the simulator keys its pool with these functions, written from the
engines' definitions (docs/engine-hashing.md, /work/shared/engine-facts.md A.3 and B.3), so a
prediction that equals the simulator's answer is evidence, not an identity. `duplicates` may flag
the likeness to app/prefix/blocks.py: that duplication is deliberate (docs/testing-oracles.md).

vLLM V1 (0.33): block i's key is HASH((key_{i-1}, tuple(block tokens), extra)) over full blocks
only, key_{-1} = NONE_HASH = HASH(PYTHONHASHSEED or "vllm-none-hash"), HASH = sha256 of the
pickled tuple (`sha256`, the default) or of its canonical CBOR (`sha256_cbor`); extra is None, or
(("cache_salt", salt),) on block 0 only. KV events publish the digest's unsigned low 64 bits.

SGLang (0.5.23): a radix tree whose child keys carry the request's namespace (`extra_key`,
`cache_salt`); its KV events publish per page the signed int64 of the first 16 hex digits of a
SHA-256 page chain (each page hashes the previous page's digest, then its token ids as 4-byte
little-endian). The namespace seeds that chain here (a SHA-256 of the tagged pair), so two
namespaces never share a page; the gateway never reads these values (it keys residency by the
events' token ids), so only their shape and the no-sharing property matter.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any, Literal

import cbor2

VllmHashAlgo = Literal["sha256", "sha256_cbor"]
VLLM_DEFAULT_SEED = "vllm-none-hash"  # 0.33 with PYTHONHASHSEED unset (sha256 variants)


def _vllm_hash(algo: str, obj: Any) -> bytes:
    if algo == "sha256":
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    elif algo == "sha256_cbor":
        payload = cbor2.dumps(obj, canonical=True)
    else:
        raise ValueError(f"prefix_caching_hash_algo {algo!r} is not simulated")
    return hashlib.sha256(payload).digest()


def vllm_none_hash(algo: str = "sha256", python_hash_seed: str | None = None) -> bytes:
    """The parent of block 0 (`init_none_hash`)."""
    return _vllm_hash(algo, VLLM_DEFAULT_SEED if python_hash_seed is None else python_hash_seed)


def vllm_block_keys(tokens: Sequence[int], block_size: int, *, first: int = 0, parent: bytes | None = None,
                    algo: str = "sha256", python_hash_seed: str | None = None,
                    cache_salt: str | None = None) -> list[bytes]:
    """Keys of the full blocks `first`, `first + 1`, ... of `tokens`; `parent` is block
    `first - 1`'s key (None: block 0 follows NONE_HASH)."""
    prev = parent if parent is not None else vllm_none_hash(algo, python_hash_seed)
    keys: list[bytes] = []
    for i in range(first, len(tokens) // block_size):
        extra = (("cache_salt", cache_salt),) if i == 0 and cache_salt is not None else None
        prev = _vllm_hash(algo, (prev, tuple(tokens[i * block_size:(i + 1) * block_size]), extra))
        keys.append(prev)
    return keys


def vllm_event_hash(key: bytes) -> int:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (default): the unsigned low 64 bits of the digest."""
    return int.from_bytes(key[-8:], "big")


def sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The chain seed of a radix namespace; None for the default namespace."""
    if extra_key is None and cache_salt is None:
        return None
    tagged = cbor2.dumps(["sglang-namespace", extra_key, cache_salt])
    return hashlib.sha256(tagged).digest()


def sglang_page_keys(tokens: Sequence[int], page_size: int, *, first: int = 0, parent: bytes | None = None,
                     namespace: bytes | None = None) -> list[bytes]:
    """SHA-256 page chain over the full pages `first`, ...; `parent` is page `first - 1`'s digest
    (None at page 0: the namespace seed, or nothing)."""
    prev = parent if parent is not None else namespace
    keys: list[bytes] = []
    for i in range(first, len(tokens) // page_size):
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        for t in tokens[i * page_size:(i + 1) * page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prev = h.digest()
        keys.append(prev)
    return keys


def sglang_event_hash(key: bytes) -> int:
    """`hash_str_to_int64`: the first 16 hex digits of the digest as a signed int64."""
    value = int.from_bytes(key[:8], "big")
    return value - 2**64 if value >= 2**63 else value
