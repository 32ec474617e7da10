"""Redis key layout and value encodings for the shared state (pure functions, no I/O).

Every key lives under `<namespace>:v1:` so a layout change bumps the version instead of reading
stale shapes, and several gateways can share one Redis under different namespaces. Every key
carries a TTL (PEXPIRE on each write) or a size bound (residency trimmed to capacity, history
trimmed to its length, the tenant registry trimmed to `max_tenants`).

Residency keys share one Redis Cluster hash tag (`{res}`) so the lookup script, which reads every
replica's set in one call, stays legal on a cluster.

Residency members are block hashes packed as 8 big-endian bytes (a third of the decimal text),
and a chain travels to the lookup script as one concatenated blob of those members. Scores are
integer microseconds of last use; within one chain block i scores `base - i`, so the head of a
chain is always more recent than its tail (see `chain_scores`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

VERSION = "v1"
DEFAULT_NAMESPACE = "prefixgate"
MEMBER_BYTES = 8
_MASK64 = (1 << 64) - 1


class KeySpace:
    """Names of every key prefixgate writes, for one namespace."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.prefix = f"{namespace}:{VERSION}:"

    def residency(self, replica: str) -> str:
        return f"{self.prefix}{{res}}:{replica}"

    def binding(self, key: str) -> str:
        return f"{self.prefix}bind:{key}"

    def history(self, tenant: str) -> str:
        return f"{self.prefix}hist:{tenant}"

    def counters(self, tenant: str) -> str:
        return f"{self.prefix}cnt:{tenant}"

    def tenants(self) -> str:
        return f"{self.prefix}tenants"

    def recent(self) -> str:
        """The decayed placement counts (a hash: replica -> weight, "" -> the current unit)."""
        return f"{self.prefix}recent"

    def pattern(self) -> str:
        """Glob matching every key of this namespace (for tests and cleanup tools)."""
        return f"{self.prefix}*"


def fold64(block_hash: int) -> int:
    """A hash as an unsigned 64-bit value. proxy_chain hashes already are; wider engine digests
    (KV events) are folded, which only raises the collision odds to those of a 64-bit hash."""
    if 0 <= block_hash <= _MASK64:
        return block_hash
    h = block_hash & _MASK64
    rest = abs(block_hash) >> 64
    while rest:
        h ^= rest & _MASK64
        rest >>= 64
    return h


def pack_hashes(block_hashes: Sequence[int]) -> bytes:
    """The chain as one blob of 8-byte big-endian members, in chain order. At C speed: a copy into
    (or of) an unsigned 64-bit array, byte-swapped in place (struct.pack of a 14k-block chain took
    a Python int per block)."""
    try:
        packed = array("Q", block_hashes)
    except OverflowError:  # a hash outside 0..2**64-1: fold them (rare, engine digests)
        packed = array("Q", [fold64(h) for h in block_hashes])
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_members(blob: bytes) -> list[bytes]:
    """The 8-byte members of a packed blob, in chain order."""
    return [blob[i:i + MEMBER_BYTES] for i in range(0, len(blob), MEMBER_BYTES)]


def chain_scores(base_us: int, n: int) -> list[int]:
    """Scores for a chain of n blocks added at `base_us`: strictly decreasing along the chain.

    Together with ZADD GT (scores never decrease) this keeps every replica's set prefix-closed:
    a block is only ever added together with its whole prefix, each ancestor one step higher, so
    an ancestor always outscores its descendants. Eviction (lowest score first) and TTL expiry
    (score below a cutoff) therefore remove tails before heads, and the lookup can binary-search
    the leading resident run, exactly as MemoryStore does.
    """
    return [base_us - i for i in range(n)]


def next_base(now_us: int, last_base_us: int, n: int) -> int:
    """The base score for the next chain from this process: wall-clock microseconds, nudged so
    the whole new chain outranks the previous one (its lowest score above the previous base).
    Drift from the clock only builds up beyond a million added blocks per second."""
    return max(now_us, last_base_us + n)
