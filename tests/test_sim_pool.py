"""The simulator's block pool: LRU eviction order, reference counts, usage, reset."""

from __future__ import annotations

from app.sim.pool import BlockPool


def test_usage_excludes_null_block_and_counts_cached_free_blocks_as_free():
    pool = BlockPool(5)  # block 0 is the null block: 4 usable
    assert pool.num_free == 4 and pool.usage() == 0.0
    blocks = pool.allocate(2)
    assert blocks is not None and pool.usage() == 0.5
    for i, b in enumerate(blocks):
        pool.cache(b, f"h{i}")
    pool.release(blocks)
    assert pool.usage() == 0.0  # cached but unreferenced = free (vLLM BlockPool.get_usage)
    assert len(pool.cached) == 2


def test_lru_eviction_order_tail_blocks_first_then_older_requests():
    events = []
    pool = BlockPool(7, on_event=events.append)  # 6 usable
    a = pool.allocate(3)
    b = pool.allocate(3)
    assert a is not None and b is not None
    for i, blk in enumerate(a):
        pool.cache(blk, f"a{i}")
    for i, blk in enumerate(b):
        pool.cache(blk, f"b{i}")
    pool.release(a)  # freed first: a2, a1, a0 (tail first)
    pool.release(b)
    fresh = pool.allocate(2)
    assert fresh is not None
    assert set(pool.cached) == {"a0", "b0", "b1", "b2"}  # a2 then a1 evicted
    assert events[-1] == {"type": "BlockRemoved", "keys": ["a2", "a1"]}
    pool.allocate(2)
    assert set(pool.cached) == {"b0", "b1"}


def test_touch_protects_hits_from_eviction_and_shared_refcounts():
    pool = BlockPool(4)  # 3 usable
    a = pool.allocate(2)
    assert a is not None
    pool.cache(a[0], "x")
    pool.cache(a[1], "y")
    pool.release(a)
    hits = pool.leading_hits(["x", "y", "z"], max_blocks=3)
    assert [b.block_id for b in hits] == [b.block_id for b in a]
    assert pool.leading_hits(["x", "y"], max_blocks=1) == hits[:1]
    assert pool.leading_hits(["q", "y"], max_blocks=2) == []  # a miss stops the prefix
    pool.touch(hits)
    pool.touch(hits[:1])
    assert hits[0].ref_cnt == 2 and pool.num_free == 1
    assert pool.allocate(2) is None  # referenced blocks are not evictable
    pool.release(hits)
    assert pool.num_free == 2 and hits[0].ref_cnt == 1
    assert pool.cache(pool.allocate(1)[0], "x") is False  # a hash is cached once


def test_reset_refused_while_in_use_then_clears():
    events = []
    pool = BlockPool(4, on_event=events.append)
    a = pool.allocate(1)
    pool.cache(a[0], "x")
    assert pool.reset() is False
    pool.release(a)
    assert pool.reset() is True
    assert pool.cached == {} and events[-1] == {"type": "AllBlocksCleared"}
    assert pool.resident_chains() == []
