"""The residency index's one owner: which leading blocks of a chain each replica holds.

Three things teach it, and they are its only writers (docs/routing.md, "Residency"):
- `learn_routed`: a request was sent to a replica. Without KV events the routed chain is taken as
  resident there (the engine prefills and caches it); with KV events the engine's own events say
  what is stored, and only the resident head the lookup found is *touched* (marked just used, as
  vLLM does on a hit, which emits no event), never inserted.
- `learn_completed`: the full chain of a finished request (prompt plus the output blocks the
  engine keeps). Without KV events it is added; with KV events the events cover it.
- `learn_stored` / `learn_removed` / `learn_cleared`: the engine's KV events.

The invariant it alone keeps: every replica's resident set is prefix-closed, that is no block is
present without its parent. The Store's lookup binary-searches on that (app/state/memory.py, the
Redis script), so a hole would make it report blocks the engine cannot hit. It holds because:
1. every add is a whole chain from its root, tail first (the Store makes the head the most
   recent), so LRU trimming and TTL expiry take tails before heads. A BlockStored event carries
   only its new blocks and their parent, so the owner keeps each replica's parent links from the
   events (`ChainTree`) and adds the whole chain root..new tail; a block whose ancestry it does
   not know is not added (an undercount, never a false hit);
2. a touch refreshes only present blocks, tail first;
3. a removal takes the block's whole known subtree with it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from app.state.base import Store

DEFAULT_MAX_LINKS = 4_000_000  # per replica, as the event indexer's engine-hash map


class ChainTree:
    """One replica's block tree from KV events: proxy hash -> parent (None for a root) and the
    reverse links. `ReplicaIndex` bounds it at `max_links` blocks (past it, it starts over)."""

    def __init__(self, max_links: int = DEFAULT_MAX_LINKS) -> None:
        self.max_links = max_links
        self.parent: dict[int, int | None] = {}
        self.children: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.parent)

    def clear(self) -> None:
        self.parent.clear()
        self.children.clear()

    def chain_to(self, block: int | None) -> list[int] | None:
        """The chain root..block, or None when `block` is not in the tree ([] for None)."""
        out: list[int] = []
        node = block
        steps = len(self.parent) + 1  # a hash collision must not loop forever
        while node is not None and steps > 0:
            if node not in self.parent:
                return None
            out.append(node)
            node = self.parent[node]
            steps -= 1
        out.reverse()
        return out

    def link(self, blocks: list[int], parent: int | None) -> list[int] | None:
        """Record `blocks` (a run in chain order) under `parent`; the whole chain root..last, or
        None when the parent's ancestry is unknown."""
        head = self.chain_to(parent)
        if head is None:
            return None
        above = parent
        for h in blocks:
            if h not in self.parent:
                self.parent[h] = above
                if above is not None:
                    self.children.setdefault(above, []).append(h)
            above = h
        return head + blocks

    def cut(self, blocks: list[int]) -> list[int]:
        """Remove `blocks` and every descendant; returns all removed (plus unknown ones asked)."""
        gone: list[int] = []
        stack = list(blocks)
        while stack:
            h = stack.pop()
            gone.append(h)
            if h in self.parent:
                above = self.parent.pop(h)
                siblings = self.children.get(above) if above is not None else None
                if siblings is not None:
                    siblings.remove(h)
                    if not siblings:
                        del self.children[above]  # type: ignore[arg-type]
            stack.extend(self.children.pop(h, ()))
        return gone


class ReplicaIndex:
    """The residency index (one per gateway), over the shared Store.

    `events_own_presence` is True in KV-event mode (routing.kv_events): then only the engines'
    events insert or remove blocks, and requests only touch what is already there."""

    def __init__(self, store: Store, events_own_presence: bool = False,
                 max_links: int = DEFAULT_MAX_LINKS) -> None:
        self.store = store
        self.events_own_presence = events_own_presence
        self.max_links = max_links
        self.trees: dict[str, ChainTree] = {}
        self._capacity: dict[str, int] = {}

    # ------------------------------------------------------------ reading
    async def lookup(self, chain: list[int], replicas: list[str]) -> dict[str, int]:
        """Leading blocks of `chain` resident per replica (one Store round trip)."""
        return await self.store.residency_lookup(chain, replicas)

    def set_capacity(self, replica: str, blocks: int) -> None:
        """Bound a replica's set at its KV capacity (once known, and again when it changes)."""
        if blocks > 0 and self._capacity.get(replica) != blocks:
            self.store.set_capacity(replica, blocks)
            self._capacity[replica] = blocks

    # ------------------------------------------------------------ the three ways it learns
    async def learn_routed(self, replica: str, chain: Sequence[int], matched: int) -> None:
        """A request with `chain` went to `replica`, where its first `matched` blocks were found."""
        if not self.events_own_presence:
            await self.store.residency_add(replica, chain)
        elif matched > 0:
            await self.store.residency_touch(replica, chain[:matched])

    async def learn_completed(self, replica: str, chain: Sequence[int], anonymous_tail: bool = False) -> None:
        """The whole chain a finished request left on `replica` (predictive mode only), and, with
        `anonymous_tail`, the partial block after it. vLLM frees a finished request's blocks tail
        first into its free queue, the partial one uncached: it takes a slot there, just older
        than the request's own blocks, until an allocation pops it in LRU order. The index holds
        it the same way, as a block of its own under a random hash that no chain has (a lookup
        never reaches it): it counts against the replica's capacity and leaves in LRU order."""
        if self.events_own_presence:
            return
        if anonymous_tail:
            await self.store.residency_add(replica, [random.getrandbits(64)])
        if chain:
            await self.store.residency_add(replica, chain)

    async def learn_stored(self, replica: str, blocks: list[int], parent: int | None) -> bool:
        """BlockStored: `blocks` now follow `parent` (None: they start a chain). False when the
        parent's ancestry is unknown (the blocks are then left out)."""
        tree = self._tree(replica)
        if len(tree) + len(blocks) > tree.max_links:  # bounded: start over, as after a lost stream
            await self.learn_cleared(replica)
            return False
        full = tree.link(blocks, parent)
        if full is None:
            return False
        await self.store.residency_add(replica, full)
        return True

    async def learn_removed(self, replica: str, blocks: list[int]) -> None:
        """BlockRemoved: the blocks and, to keep the set prefix-closed, their descendants."""
        gone = self._tree(replica).cut(blocks)
        if gone:
            await self.store.residency_remove(replica, gone)

    async def learn_cleared(self, replica: str) -> None:
        """AllBlocksCleared, a lost event stream, or a replica that left the fleet."""
        self.trees.pop(replica, None)
        await self.store.residency_clear(replica)

    def _tree(self, replica: str) -> ChainTree:
        tree = self.trees.get(replica)
        if tree is None:
            tree = self.trees[replica] = ChainTree(self.max_links)
        return tree
