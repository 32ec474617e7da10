"""Chained block hashes over prompt token ids, as vLLM V1's prefix cache computes them.

Two families live here:
- `proxy_chain`: prefixgate's own fast 64-bit chain (blake2b-8 over the parent digest and the
  block's token ids). Used for indexing (tenant history, residency index). It needs no engine
  seed, so it is stable across engine versions and PYTHONHASHSEED (the llm-d "dual key" approach).
- `vllm_chain`: vLLM 0.33's exact recipe (`sha256` over pickle, or `sha256_cbor` over canonical
  CBOR) with its NONE_HASH seed rules, for matching engine digests when the deployment pins them.

Invariant shared by both: only full blocks are hashed; block i's hash covers tokens[0:(i+1)B]
through the chain, so two prompts share block i iff tokens[0:(i+1)B] are equal (and the salt).
The engines' rules these mirror (block size, parent chaining, extra keys, cache_salt, SGLang's
radix matching) are in docs/engine-hashing.md.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from array import array
from collections.abc import Sequence
from typing import Any, Literal

import cbor2

HashAlgo = Literal["sha256", "sha256_cbor"]
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM 0.33, PYTHONHASHSEED unset, sha256 variants

_ROOT = b"prefixgate-v1"
_LITTLE_ENDIAN = sys.byteorder == "little"


def _proxy_root(salt: str | None) -> bytes:
    return hashlib.blake2b(_ROOT + (salt or "").encode(), digest_size=8).digest()


def proxy_chain(
    tokens: Sequence[int],
    block_size: int,
    salt: str | None = None,
    parent: bytes | None = None,
    start_block: int = 0,
) -> list[int]:
    """64-bit chained hashes of the full blocks of `tokens`, starting at block `start_block`.

    `parent` is the digest of block `start_block - 1` (as returned by `proxy_digest`), which lets a
    caller extend a known chain with a new turn without rehashing the prefix.
    """
    return proxy_chain_packed(tokens, block_size, salt, parent, start_block).tolist()


def proxy_chain_packed(
    tokens: Sequence[int],
    block_size: int,
    salt: str | None = None,
    parent: bytes | None = None,
    start_block: int = 0,
) -> array:
    """`proxy_chain` as an array('Q'). Each block is hashed from a view of the ids' bytes (no
    per-block copy, no int object); the digests are collected as bytes and read back in one step
    (big-endian, as `int.from_bytes(digest, "big")`): ~12 ms a MB of prompt against ~19."""
    digest = parent if parent is not None else _proxy_root(salt)
    ids = tokens if isinstance(tokens, array) and tokens.itemsize == 4 and tokens.typecode == "I" \
        else array("I", tokens)
    raw = memoryview(ids).cast("B")
    step = 4 * block_size
    blake2b = hashlib.blake2b
    digests = bytearray()
    for offset in range(start_block * step, len(ids) // block_size * step, step):
        h = blake2b(digest, digest_size=8)
        h.update(raw[offset:offset + step])
        digest = h.digest()
        digests += digest
    out = array("Q")
    out.frombytes(digests)
    if _LITTLE_ENDIAN:
        out.byteswap()
    return out


def proxy_digest(block_hash: int) -> bytes:
    """The parent digest to continue a `proxy_chain` after `block_hash`."""
    return block_hash.to_bytes(8, "big")


# ---------------------------------------------------------------- vLLM-compatible digests

def _hash_fn(algo: HashAlgo):
    if algo == "sha256":
        return lambda obj: hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if algo == "sha256_cbor":
        return lambda obj: hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    raise ValueError(f"unsupported hash algorithm {algo!r}")


def none_hash(algo: HashAlgo = "sha256", python_hash_seed: str | None = None) -> bytes:
    """vLLM 0.33's NONE_HASH: HASH(PYTHONHASHSEED) when set, else HASH("vllm-none-hash")."""
    seed = python_hash_seed if python_hash_seed is not None else DEFAULT_NONE_HASH_SEED
    return _hash_fn(algo)(seed)


def vllm_chain(
    tokens: Sequence[int],
    block_size: int,
    algo: HashAlgo = "sha256",
    python_hash_seed: str | None = None,
    cache_salt: str | None = None,
    extra_keys: Sequence[Any | None] | None = None,
) -> list[bytes]:
    """vLLM V1 block hashes: H_i = HASH((H_{i-1}, tuple(block_tokens), extra_keys_i)).

    `cache_salt` becomes the tagged extra key ("cache_salt", salt) on block 0 only (0.33 layout);
    `extra_keys`, when given, supplies per-block extras (None for none) and is combined with it.
    """
    h = _hash_fn(algo)
    parent = none_hash(algo, python_hash_seed)
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        keys: list[Any] = []
        if extra_keys is not None and i < len(extra_keys) and extra_keys[i] is not None:
            keys.extend(extra_keys[i])
        if cache_salt is not None and i == 0:
            keys.append(("cache_salt", cache_salt))
        extra = tuple(keys) if keys else None
        parent = h((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), extra))
        out.append(parent)
    return out


def low64(digest: bytes) -> int:
    """What vLLM KV events publish by default: the unsigned low 64 bits of the digest."""
    return int.from_bytes(digest, "big") & (2**64 - 1)


def cacheable_blocks(num_tokens: int, block_size: int) -> int:
    """Most leading blocks vLLM can serve from cache for an N-token prompt: the last token is
    always recomputed (max_cache_hit_length = N - 1), and hits are whole blocks."""
    if num_tokens <= 0:
        return 0
    return (num_tokens - 1) // block_size


def predicted_hit_tokens(resident_leading_blocks: int, num_tokens: int, block_size: int) -> int:
    """vLLM's hit count: B * min(leading resident blocks, floor((N-1)/B))."""
    return block_size * min(resident_leading_blocks, cacheable_blocks(num_tokens, block_size))


def vllm_chain_from(
    tokens: Sequence[int],
    block_size: int,
    parent: bytes | None = None,
    start_block: int = 0,
    algo: HashAlgo = "sha256",
    python_hash_seed: str | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """`vllm_chain` continued from block `start_block` (whose predecessor's digest is `parent`;
    None = NONE_HASH), so an engine can hash the blocks that decode fills one at a time without
    rehashing the prompt. Same values as `vllm_chain(tokens, ...)[start_block:]`."""
    h = _hash_fn(algo)
    digest = parent if parent is not None else none_hash(algo, python_hash_seed)
    out: list[bytes] = []
    for i in range(start_block, len(tokens) // block_size):
        extra = (("cache_salt", cache_salt),) if cache_salt is not None and i == 0 else None
        digest = h((digest, tuple(tokens[i * block_size:(i + 1) * block_size]), extra))
        out.append(digest)
    return out
