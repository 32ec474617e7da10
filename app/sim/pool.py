"""The KV block pool, shaped like vLLM V1's `BlockPool`.

Invariants (as in vLLM):
- Block 0 is the reserved null block; `num_blocks - 1` blocks are usable, and
  `usage = 1 - free / (num_blocks - 1)` (cached but unreferenced blocks count as free).
- A block is referenced by every running request that uses it (`ref_cnt`); at 0 it sits in the
  free queue, still cached (hash kept) until it is handed out again.
- The free queue is LRU: allocation takes from the head; a finished request's blocks are
  appended tail-first, so its last blocks are evicted before its first ones.
- Only full blocks are cached, keyed by their chained hash. A hash already cached is not cached
  twice (the newer block stays anonymous).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

EventSink = Callable[[dict[str, Any]], None]


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    key: Hashable | None = None  # engine hash when cached
    origin: Origin | None = None  # what it holds, when cached (white-box state, never a cache key)


@dataclass(frozen=True, eq=False)
class Origin:
    """Where a cached block's tokens come from: block `index` of the request whose token list
    (prompt + output, only ever appended to) is `token_ids`, in that request's namespace. The
    simulator's state reports residency this way, as tokens, so a test can key it with the
    gateway's own chain without the simulator computing the gateway's hashes."""

    token_ids: list[int]
    index: int
    cache_salt: str | None
    extra_key: str | None


@dataclass
class BlockPool:
    """The free queue starts as every usable block in id order. A block never handed out stays
    ahead of every released one (those join the tail), so the never-used ids are kept as a range,
    `[fresh, num_blocks)`, at the head of the queue, and a `Block` is made when first handed out:
    the same ids in the same order, without building millions of objects up front (an SGLang
    simulator's token-granular pool of 100,000 16-token blocks is 1.6 million pages)."""

    num_blocks: int
    on_event: EventSink | None = None
    block_size: int = 16  # tokens per block (only the white-box state reads it)
    cached: dict[Hashable, Block] = field(init=False, default_factory=dict)
    free: OrderedDict[int, Block] = field(init=False, default_factory=OrderedDict)  # released, LRU
    fresh: int = field(init=False, default=1)  # the first id never handed out (0 is the null block)

    # ------------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        return len(self.free) + self.num_blocks - self.fresh

    def usage(self) -> float:
        usable = self.num_blocks - 1
        return 1.0 - self.num_free / usable if usable else 0.0

    def leading_hits(self, keys: Sequence[Hashable], max_blocks: int) -> list[Block]:
        """Cached blocks for the longest resident prefix of `keys`, at most `max_blocks`."""
        hits: list[Block] = []
        for key in keys[:max_blocks]:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def resident_chains(self) -> list[dict[str, Any]]:
        """The resident blocks grouped by the request that cached them: its namespace, the token
        ids through its last resident block, and the indexes of its resident blocks."""
        groups: dict[int, tuple[Origin, list[int]]] = {}
        for block in self.cached.values():
            origin = block.origin
            if origin is None:
                continue
            entry = groups.setdefault(id(origin.token_ids), (origin, []))
            entry[1].append(origin.index)
        out: list[dict[str, Any]] = []
        for origin, indexes in groups.values():
            indexes.sort()
            out.append({"cache_salt": origin.cache_salt, "extra_key": origin.extra_key, "blocks": indexes,
                        "token_ids": origin.token_ids[:(indexes[-1] + 1) * self.block_size]})
        return out

    # ------------------------------------------------------------------ mutations
    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on cache hits (removing unreferenced ones from the free queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[Block] | None:
        """`n` fresh blocks from the LRU head (evicting their cached hashes), or None if short."""
        if n > self.num_free:
            return None
        out: list[Block] = []
        removed: list[Hashable] = []
        for _ in range(n):
            if self.fresh < self.num_blocks:
                out.append(Block(self.fresh, ref_cnt=1))
                self.fresh += 1
                continue
            _, block = self.free.popitem(last=False)
            if block.key is not None:
                if self.cached.get(block.key) is block:
                    del self.cached[block.key]
                    removed.append(block.key)
                block.key = None
                block.origin = None
            block.ref_cnt = 1
            out.append(block)
        if removed and self.on_event:
            self.on_event({"type": "BlockRemoved", "keys": removed})
        return out

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference per block; blocks reaching 0 join the free queue tail-first."""
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free[block.block_id] = block

    def cache(self, block: Block, key: Hashable, origin: Origin | None = None) -> bool:
        """Register a now-full block under its hash; False when that hash is already cached."""
        if key in self.cached:
            return False
        block.key = key
        block.origin = origin
        self.cached[key] = block
        return True

    def reset(self) -> bool:
        """Forget every cached hash (vLLM `reset_prefix_cache`); refused while blocks are in use."""
        if self.num_free != self.num_blocks - 1:
            return False
        for block in self.cached.values():
            block.key = None
            block.origin = None
        self.cached.clear()
        if self.on_event:
            self.on_event({"type": "AllBlocksCleared"})
        return True
