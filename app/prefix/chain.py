"""The block-hash chain as the proxy walks it: immutable chain states and a byte-bounded memo.

A `ChainNode` is the state of a chain after some leading segments of a prompt: the block hashes
the last step added, the tokens after the last full block (`tail`, fewer than B) and the digest to
continue from. It holds no reference to the node it grew from: whoever walks a chain (the memo
walk in app/prefix/fingerprint.py) collects the hashes on the way, so an ancestor evicted from the
memo is freed, not kept alive by its descendants (docs/memory.md). What is hashed, and why it
mirrors the engines' own chains, is in docs/engine-hashing.md.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from app.prefix.blocks import proxy_chain_packed, proxy_digest
from app.prefix.segment_key import Key, held, same_segment, segment_key

POLITE_BLOCKS = 512  # blocks hashed between two GIL releases in a worker thread (~0.6 ms)
POLITE_PAUSE_S = 0.0001
ROOTS_CAP = 4096  # (salt, block size) roots kept; one per tenant salt in isolation mode

# Bytes one memo entry really holds besides its segment text and hashes, measured with
# sys.getsizeof on CPython 3.11: the node (slots object, 104 B + 16 B GC header), its key tuple
# (56 + 16 B) and key int (28 B), the tail array (80 B + 4 a token), the hashes array's header
# (80 B), the OrderedDict's slot and link (~100 B), the (segment, node) tuple (56 + 16 B) and a
# long segment's bytes key (57 B; counted for every entry, an upper bound).
NODE_OVERHEAD_BYTES = 610
HASH_BYTES = 8  # a block hash in the node's packed array('Q')


@dataclass(eq=False, slots=True, weakref_slot=True)
class ChainNode:
    """The chain after some leading segments (see the module docstring)."""

    key: int  # unique per node: the memo's children are keyed by their parent's key
    hashes: array  # array('Q'): the hashes this step added, 8 bytes each (no int objects, no GC work)
    tail: array
    digest: bytes | None  # None: still at the root (salted) digest
    salt: str | None
    block_size: int
    num_tokens: int
    num_blocks: int


_keys = itertools.count(1)


def root_node(salt: str | None, block_size: int) -> ChainNode:
    return ChainNode(next(_keys), array("Q"), array("I"), None, salt, block_size, 0, 0)


def extend_node(node: ChainNode, ids: Sequence[int], polite: bool = False) -> ChainNode:
    """The chain after appending `ids` to `node` (pure; hashes only the new full blocks).

    `polite` (worker threads): hash in slices of POLITE_BLOCKS with a short sleep between them.
    The hash loop is Python code, so a worker thread running it keeps the GIL for a whole switch
    interval (5 ms) whenever the event loop asks for it. A sleep(0) is not enough: on a machine
    with idle cores the worker takes the GIL back before the woken loop thread runs (measured:
    loop stalls of 15-60 ms blamed on this loop with two workers hashing). A pause of
    POLITE_PAUSE_S lets a waiting thread in; it costs ~15% of the hashing time, off the loop."""
    tokens = node.tail + array("I", ids) if node.tail else array("I", ids)
    b = node.block_size
    if not polite or len(tokens) <= POLITE_BLOCKS * b:
        hashes = proxy_chain_packed(tokens, b, salt=node.salt, parent=node.digest)
    else:
        hashes = array("Q")
        digest = node.digest
        for start in range(0, len(tokens) // b, POLITE_BLOCKS):
            part = proxy_chain_packed(tokens[start * b:(start + POLITE_BLOCKS) * b], b, salt=node.salt,
                                      parent=digest)
            hashes.extend(part)
            digest = proxy_digest(part[-1])
            time.sleep(POLITE_PAUSE_S)  # releases the GIL long enough for a waiting event loop
    used = len(hashes) * b
    digest = proxy_digest(hashes[-1]) if hashes else node.digest
    return ChainNode(next(_keys), hashes, tokens[used:], digest, node.salt, b,
                     node.num_tokens + len(ids), node.num_blocks + len(hashes))


def extend_reusing(parent: ChainNode, known: ChainNode, ids: Sequence[int], shared: int,
                   polite: bool = False) -> ChainNode:
    """`extend_node(parent, ids)` when `known` is the chain after parent + other ids whose first
    `shared` equal ids[:shared]: the full blocks inside that shared part are known's (same parent,
    same tokens, same hashes), so only the blocks after them are hashed."""
    b = parent.block_size
    m = min(len(known.hashes), (len(parent.tail) + shared) // b)
    if m == 0:
        return extend_node(parent, ids, polite)
    head = known.hashes[:m]
    consumed = m * b - len(parent.tail)  # ids inside the head blocks
    mid = ChainNode(0, head, array("I"), proxy_digest(head[-1]), parent.salt, b,
                    parent.num_tokens + consumed, parent.num_blocks + m)
    rest = extend_node(mid, ids[consumed:], polite)
    return ChainNode(next(_keys), head + rest.hashes, rest.tail, rest.digest, parent.salt, b,
                     parent.num_tokens + len(ids), rest.num_blocks)


def node_bytes(segment: str, node: ChainNode) -> int:
    """What one memo entry holds, in bytes (the segment text may also sit in the token memo: then
    it is counted in both, so the sum is an upper bound)."""
    return (sys.getsizeof(segment) + HASH_BYTES * len(node.hashes) + node.tail.itemsize * len(node.tail)
            + NODE_OVERHEAD_BYTES)


class ChainMemo:
    """LRU (parent node key, segment) -> ChainNode, bounded in bytes; roots per (salt, B).

    A child whose parent was evicted is unreachable (a re-added parent gets a new key) and ages
    out of the LRU like any other entry; it is counted until then."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0
        # (parent node key, segment_key) -> (segment, node): the segment confirms a hit (same_segment)
        self._data: OrderedDict[tuple[int, Key], tuple[str, ChainNode]] = OrderedDict()
        self._roots: OrderedDict[tuple[str | None, int], ChainNode] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def root(self, salt: str | None, block_size: int) -> ChainNode:
        key = (salt, block_size)
        with self._lock:
            node = self._roots.get(key)
            if node is None:
                node = self._roots[key] = root_node(salt, block_size)
                while len(self._roots) > ROOTS_CAP:
                    self._roots.popitem(last=False)
            else:
                self._roots.move_to_end(key)
            return node

    def get(self, parent: ChainNode, segment: str) -> ChainNode | None:
        key = (parent.key, segment_key(segment))
        with self._lock:
            node = held(self._data.get(key), segment)
            if node is not None:
                self._data.move_to_end(key)
            return node

    def discard(self, parent: ChainNode, segment: str) -> None:
        key = (parent.key, segment_key(segment))
        with self._lock:
            node = held(self._data.get(key), segment)
            if node is not None:
                del self._data[key]
                self.bytes -= node_bytes(segment, node)

    def put(self, parent: ChainNode, segment: str, node: ChainNode) -> None:
        cost = node_bytes(segment, node)
        if cost > self.max_bytes:
            return
        key = (parent.key, segment_key(segment))
        with self._lock:
            entry = self._data.get(key)
            if entry is not None:
                if same_segment(entry[0], segment):
                    return
                del self._data[key]  # another segment under the same key: replaced
                self.bytes -= node_bytes(*entry)
            self._data[key] = (segment, node)
            self.bytes += cost
            while self.bytes > self.max_bytes and self._data:
                _, old = self._data.popitem(last=False)
                self.bytes -= node_bytes(*old)
                self.evictions += 1
