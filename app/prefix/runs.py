"""Chains of block hashes as a tree of runs: the structure the residency index (per replica,
app/state/memory.py) and the continuity tracker (per tenant, app/prefix/tracker.py) keep.

A run holds blocks that were always used together: a stretch of a chain between two cuts (where
chains branch, where a hit ended, where an eviction cut), as a node of SGLang's radix cache holds
a run of tokens. Its block hashes sit in a packed array (8 bytes a block), its children are keyed
by their first hash, and runs form one LRU list. The held set is prefix-closed by construction: a
block is held only inside a run, after its run's ancestors. An add or a hit refreshes the runs on
the chain's path, deepest first, so a parent is always more recent than its children and the
least recent run is a leaf; eviction takes that leaf's blocks tail first, as vLLM's free queue
does (a finished request's blocks are freed in reverse order), and may cut a run short. A match
follows the runs from the root by first hash and compares one hash per run (chained hashes: an
equal last block means an equal run), bisecting only the run where the chain leaves the tree.
So a request costs O(runs on its path + log n + new blocks), never a Python step per known block.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

# Bytes the residency index holds beyond 8 a block (sys.getsizeof, CPython 3.11): a run (slots
# object, its children dict, the array header, its slot in the parent's dict); an entry of the
# hash -> run map that removals by hash (KV events) build (dict slot + 64-bit int).
RUN_BYTES = 320
WHERE_ENTRY_BYTES = 100


class Run:
    """Blocks resident on one replica that were always used together: a run of a chain between two
    cuts (a branch point, an eviction, a hit that ended inside it), as a node of SGLang's radix
    cache holds a run of tokens. `depth` blocks precede it on its path; `parent` is the run it
    continues (None: a root). Runs are also an intrusive doubly linked LRU list (`older`/`newer`)."""

    __slots__ = ("hashes", "depth", "parent", "children", "expiry", "stamp", "older", "newer")

    def __init__(self, hashes: Any, depth: int, parent: Run | None, expiry: float) -> None:
        self.hashes = hashes  # array('Q'): 8 bytes a block
        self.depth = depth
        self.parent = parent
        self.children: dict[int, Run] = {}  # by first block hash; every child hangs at this run's end
        self.expiry = expiry
        self.stamp = 0  # the caller's mark of the newest add through this run (a request's seq)
        self.older: Run = self
        self.newer: Run = self


def packed(hashes: Any) -> Any:
    """Block hashes as an array of unsigned 64-bit ints (a list when one does not fit)."""
    try:
        return array("Q", hashes)
    except (OverflowError, TypeError):
        return list(hashes)


def joined(first: Sequence[int], second: Sequence[int]) -> Any:
    """`first` then `second` as one chain: packed when both fit (a copy at C speed when they are
    already packed), else a list."""
    try:
        return array("Q", first) + array("Q", second)
    except (OverflowError, TypeError):
        return [*first, *second]


class RunTree:
    """One replica's resident blocks: a tree of runs (see the module docstring).

    Invariants: a run's parent is more recent in the LRU list than the run (an add or a touch
    refreshes the whole path, deepest run first), so the least recent run is a leaf and evicting
    from its tail keeps the set prefix-closed; `size` is the number of blocks held. `where`
    (block hash -> run) exists only once a removal by hash asked for it (KV events)."""

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self.roots: dict[int, Run] = {}
        self.size = 0
        self.runs = 0
        self.where: dict[int, Run] | None = None
        self._lru = Run((), 0, None, 0.0)  # sentinel: .newer is the least recent run, .older the most

    # ------------------------------------------------------------- the LRU list
    @staticmethod
    def _unlink(run: Run) -> None:
        run.older.newer = run.newer
        run.newer.older = run.older

    @staticmethod
    def _link_after(run: Run, older: Run) -> None:
        """Place `run` right after `older` (just more recent than it)."""
        newer = older.newer
        run.older, run.newer = older, newer
        older.newer = run
        newer.older = run

    def _refresh(self, run: Run | None, expiry: float, stamp: int | None = None) -> None:
        """A chain through `run` was just used: its path becomes the most recent, deepest run
        first, as the engine frees a finished request's blocks tail first (O(runs on the path))."""
        while run is not None:
            run.expiry = expiry
            if stamp is not None:
                run.stamp = stamp
            self._unlink(run)
            self._link_after(run, self._lru.older)
            run = run.parent

    def iter_runs(self) -> Iterator[Run]:
        """Least recent first."""
        run = self._lru.newer
        while run is not self._lru:
            yield run
            run = run.newer

    # ------------------------------------------------------------- reading
    def match(self, hashes: Sequence[int]) -> tuple[int, Run | None]:
        """(m, run): hashes[:m] is held and `run` holds its last block (None when m == 0)."""
        m, run, _ = self._walk(hashes)
        return m, run

    def _walk(self, hashes: Sequence[int]) -> tuple[int, Run | None, int]:
        """(m, run, at): hashes[:m] is held, its last block is block `at - 1` of `run`. Follows
        the runs from the root by their first hash, comparing one hash per run (chained hashes:
        equal last blocks mean equal runs) and bisecting only the run where the chain leaves the
        tree: O(runs on the path + log n), never a step per block."""
        now = self._clock()
        n = len(hashes)
        pos, last, at = 0, None, 0
        level = self.roots
        while pos < n:
            run = level.get(hashes[pos])
            if run is None:
                break
            if run.expiry < now:  # expired runs are the least recent, their subtrees too
                self._expire(now)
                break
            arr = run.hashes
            size = len(arr)
            if pos + size <= n and hashes[pos + size - 1] == arr[-1]:
                pos, last, at = pos + size, run, size
                level = run.children
                continue
            lo, hi = 1, min(size, n - pos)  # arr[:lo] matches; find the largest such lo
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if hashes[pos + mid - 1] == arr[mid - 1]:
                    lo = mid
                else:
                    hi = mid - 1
            return pos + lo, run, lo
        return pos, last, at

    def leading(self, hashes: Sequence[int]) -> int:
        """Length of the leading resident run of `hashes`."""
        return self._walk(hashes)[0]

    # ------------------------------------------------------------- writing
    def add(self, hashes: Sequence[int], stamp: int | None = None) -> int:
        """Insert or refresh a whole chain: O(runs on its path + log n + new blocks), the new
        blocks copied once into a packed array; `stamp` marks the runs on its path. Returns the
        blocks evicted.

        Only the chain's first `capacity` blocks are taken: the chain's path becomes the most
        recent, so a longer chain would evict everything else and then its own tail down to
        them. That is the same end, without packing (and counting as evicted) blocks that never
        fit; a replica whose capacity the engine did not report (the 4,096-block default) would
        otherwise re-add a 1 MB prompt's ~14,000 blocks on every request."""
        if len(hashes) > self.capacity:
            hashes = hashes[:self.capacity]
        if hashes:
            expiry = self._clock() + self.ttl_s
            m, run, at = self._walk(hashes)
            end = self._split(run, at) if run is not None else None
            if m < len(hashes):
                end = self._grow(end, hashes[m:], expiry)
            self._refresh(end, expiry, stamp)
        return self.trim()

    def touch(self, hashes: Sequence[int]) -> None:
        """Refresh the leading resident run of `hashes` (a hit); insert nothing."""
        m, run, at = self._walk(hashes)
        if run is not None:
            self._refresh(self._split(run, at), self._clock() + self.ttl_s)

    def _grow(self, end: Run | None, new: Sequence[int], expiry: float) -> Run:
        """Hang `new` after `end`: appended to it when it is a leaf, else as a new run."""
        if end is not None and not end.children:
            try:
                end.hashes.extend(new)
            except (OverflowError, TypeError):
                end.hashes = [*end.hashes, *new]
            run = end
        else:
            depth = end.depth + len(end.hashes) if end is not None else 0
            run = Run(packed(new), depth, end, expiry)
            (end.children if end is not None else self.roots)[new[0]] = run
            self._link_after(run, self._lru.older)
            self.runs += 1
        if self.where is not None:
            self.where.update(zip(new, repeat(run)))
        self.size += len(new)
        return run

    def _split(self, run: Run, at: int) -> Run:
        """Cut `run` after its first `at` blocks and return it (now ending there); the rest
        becomes a new run below it, just older in the LRU list (it was not used this time)."""
        if at >= len(run.hashes):
            return run
        tail = Run(run.hashes[at:], run.depth + at, run, run.expiry)
        tail.stamp = run.stamp
        tail.children = run.children
        for child in tail.children.values():
            child.parent = tail
        del run.hashes[at:]
        run.children = {tail.hashes[0]: tail}
        self._link_after(tail, run.older)
        self.runs += 1
        if self.where is not None:
            self.where.update(zip(tail.hashes, repeat(tail)))
        return run

    def trim(self) -> int:
        """Evict past the capacity (and drop expired runs): from the least recent run, a leaf,
        tail first."""
        self._expire(self._clock())
        return self.evict(self.size - self.capacity)

    def evict(self, blocks: int) -> int:
        """Evict `blocks` least recent blocks (fewer when fewer are held); returns how many."""
        evicted = 0
        goal = self.size - max(0, blocks)
        while self.size > goal:
            run = self._lru.newer
            if run is self._lru:
                break
            if run.children:  # cannot happen (parents are more recent); keep the set closed anyway
                self._drop(run, 0)
                continue
            k = min(self.size - goal, len(run.hashes))
            evicted += k
            self._drop(run, len(run.hashes) - k)
        return evicted

    def _expire(self, now: float) -> None:
        """Expired runs are the least recent ones (a refresh sets both the expiry and the order)."""
        while True:
            run = self._lru.newer
            if run is self._lru or run.expiry >= now:
                return
            self._drop(run, 0)

    def _drop(self, run: Run, at: int) -> None:
        """Remove `run`'s blocks from `at` on and every run below it."""
        stack = list(run.children.values())
        run.children = {}
        while stack:
            child = stack.pop()
            stack.extend(child.children.values())
            self._forget(child.hashes)
            self._unlink(child)
            self.runs -= 1
        if at > 0:
            self._forget(run.hashes[at:])
            del run.hashes[at:]
            return
        siblings = run.parent.children if run.parent is not None else self.roots
        if run.hashes and siblings.get(run.hashes[0]) is run:
            del siblings[run.hashes[0]]
        self._forget(run.hashes)
        self._unlink(run)
        self.runs -= 1

    def _forget(self, hashes: Sequence[int]) -> None:
        self.size -= len(hashes)
        if self.where is not None:
            deque(map(self.where.pop, hashes, repeat(None)), maxlen=0)  # C speed

    def remove(self, hashes: Iterable[int]) -> None:
        """Remove `hashes`, each with every block after it (a block goes with its descendants, as
        the residency owner removes them: the set stays prefix-closed)."""
        if self.where is None:  # first removal by hash (KV events): index every held block once
            self.where = {}
            for run in self.iter_runs():
                self.where.update(zip(run.hashes, repeat(run)))
        where = self.where
        for h in hashes:
            run = where.get(h)
            if run is None:
                continue
            arr = run.hashes
            self._drop(run, len(arr) - 1 if arr[-1] == h else arr.index(h))  # tail first: O(1)

    def clear(self) -> None:
        self.roots.clear()
        self.size = 0
        self.runs = 0
        if self.where is not None:
            self.where.clear()
        self._lru.older = self._lru.newer = self._lru

    def held(self) -> set[int]:
        out: set[int] = set()
        for run in self.iter_runs():
            out.update(run.hashes)
        return out

    def nbytes(self) -> int:
        """Bytes held, as counted in docs/memory.md: 8 a block, RUN_BYTES a run, and the
        hash -> run map when a removal by hash built it."""
        where = 0 if self.where is None else WHERE_ENTRY_BYTES * len(self.where)
        return 8 * self.size + RUN_BYTES * self.runs + where
