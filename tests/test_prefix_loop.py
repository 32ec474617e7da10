"""The after-response path keeps O(prompt) work off the event loop (bench/loop_stalls.py measures it).

No timing assertions: each test checks the mechanism (the residency run tree holds what the
per-block LRU it replaced held and reads a few hashes per run of a known chain, bulk updates keep the same bookkeeping as the per-item loops they replaced, the cheap
sketch finds the same regions, the inline encode gives the engine's ids).
"""

from __future__ import annotations

import random
from collections import OrderedDict

from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import build_sketch, find_content, message_key
from app.prefix.tokens import SegmentTokenizer
from app.prefix.tracker import TenantTracker
from app.state.memory import MemoryStore


def rand_chain(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(64) for _ in range(n)]


class BlockLRU:
    """The per-block model the run tree replaced: an LRU of block hashes, each chain refreshed
    tail first (block 0 most recent), a hit refreshing only present blocks, trimmed from the
    least recent end, a removal taking the given blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, chain: list[int], only_present: bool = False) -> None:
        for h in reversed(chain):
            if only_present and h not in self.blocks:
                continue
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def leading(self, chain: list[int]) -> int:
        return next((i for i, h in enumerate(chain) if h not in self.blocks), len(chain))


class CountingChain(list):
    """A chain that counts the hashes read from it (a slice counts its length)."""

    reads = 0

    def __getitem__(self, key):  # type: ignore[override]
        out = super().__getitem__(key)
        CountingChain.reads += len(out) if isinstance(key, slice) else 1
        return out

    def __iter__(self):  # type: ignore[override]
        CountingChain.reads += len(self)
        return super().__iter__()


async def test_run_tree_holds_what_the_per_block_lru_held() -> None:
    """Random conversations growing, branching, hitting, evicted at a small capacity, with
    removals of a block and its descendants: the run tree holds exactly the blocks (and answers
    exactly the lookups) of the per-block LRU it replaced, in the engine's eviction order."""
    rng = random.Random(5)
    capacity = 300
    store = MemoryStore(capacity_blocks=capacity)
    model = BlockLRU(capacity)
    convs: list[list[int]] = [rand_chain(rng.randint(5, 60), 100 + i) for i in range(6)]
    for step in range(600):
        k = rng.randrange(len(convs))
        roll = rng.random()
        if roll < 0.55:  # the conversation's next turn: its chain plus new blocks
            keep = len(convs[k]) - (rng.randint(0, 2) if rng.random() < 0.3 else 0)  # a changed tail
            convs[k] = convs[k][:keep] + rand_chain(rng.randint(1, 40), 1000 + step)
            await store.residency_add("r", convs[k])
            model.add(convs[k])
        elif roll < 0.7:  # a new branch off a conversation's head
            cut = rng.randint(0, len(convs[k]))
            branch = convs[k][:cut] + rand_chain(rng.randint(1, 30), 5000 + step)
            await store.residency_add("r", branch)
            model.add(branch)
            convs.append(branch)
        elif roll < 0.85:  # a hit on a leading part
            part = convs[k][:rng.randint(0, len(convs[k]))] + rand_chain(3, 9000 + step)
            await store.residency_touch("r", part)
            model.add(part, only_present=True)
        elif roll < 0.93:  # a removal: a block and every block after it in any chain
            chain = convs[k]
            if chain:
                victim = rng.choice(chain)
                gone = {h for c in convs if victim in c for h in c[c.index(victim):]}
                await store.residency_remove("r", sorted(gone))
                for h in gone:
                    model.blocks.pop(h, None)
        else:  # a shared prefix of the pool, as a whole
            await store.residency_add("r", convs[0])
            model.add(convs[0])
        assert store.residency_hashes("r") == set(model.blocks), f"step {step}"
        assert store.residency_size("r") == len(model.blocks)
        for c in convs[-8:]:
            assert (await store.residency_lookup(c, ["r"]))["r"] == model.leading(c), f"step {step}"


async def test_known_blocks_cost_nothing_per_block() -> None:
    """Re-adding and hitting a long known chain reads a few hashes per run on its path, not one per
    block; a conversation growing turn by turn adds one run per turn (the runs the hit walks)."""
    store = MemoryStore(capacity_blocks=1_000_000)
    chain = rand_chain(20_000, 1)
    await store.residency_add("r", chain)
    for turn in range(40):  # each turn continues the last (and its output's last block differs)
        chain = chain[:-1] + rand_chain(200, 10 + turn)
        await store.residency_add("r", chain)
    res = store._residency["r"]
    assert res.runs <= 2 * 41 + 1
    counted = CountingChain(chain)
    CountingChain.reads = 0
    await store.residency_add("r", counted)
    await store.residency_touch("r", counted)
    assert (await store.residency_lookup(counted, ["r"]))["r"] == len(chain)
    assert CountingChain.reads < 3 * (41 * 2 + 64)  # never len(chain) (~28k)
    assert res.runs <= 2 * 41 + 1  # a known chain makes no run


async def test_eviction_takes_the_least_recent_chain_tail_first() -> None:
    head = rand_chain(1000, 3)
    store = MemoryStore(capacity_blocks=1500)
    await store.residency_add("r", head + rand_chain(300, 4))  # turn 1
    await store.residency_add("r", head + rand_chain(400, 5))  # turn 2 (shares the head): 1700 held
    # turn 1's tail is the least recent: its last 200 blocks went, its first 100 stay
    assert store.residency_size("r") == 1500
    assert (await store.residency_lookup(head + rand_chain(300, 4), ["r"]))["r"] == 1100
    assert (await store.residency_lookup(head + rand_chain(400, 5), ["r"]))["r"] == 1400


async def test_tracker_keeps_the_shared_head_and_counts_its_blocks() -> None:
    tracker = TenantTracker(MemoryStore(), tenant_max_hashes=2500)
    shared = rand_chain(1000, 5)
    chains = [shared + rand_chain(400, 10 + i) for i in range(6)]
    for c in chains:
        await tracker.observe("t", c, None, 16)
        tree = tracker._tenants["t"].tree
        assert tracker.hash_count == tree.size == len(tree.held())
        assert tree.size <= 2500
    state = tracker._tenants["t"]
    held = state.tree.held()
    # the shared prefix survived the eviction of the requests that first contained it
    assert all(h in held for h in shared)
    assert state.tree.match(shared)[1].stamp == state.last_seq  # the newest request through it
    assert not any(h in held for h in chains[0][1000:])  # the least recent request's own blocks went
    obs = await tracker.observe("t", shared + rand_chain(3, 99), None, 16)
    assert obs.matched_blocks == 1000


def test_find_content_skips_false_probe_matches() -> None:
    body = "x" * 70 + "the real tail"
    decoy = "x" * 70 + "a different tail"
    text = f"<s>{decoy}</s><s>{body}</s>"
    assert find_content(text, body, 0) == text.index(body)
    assert find_content(text, body, text.index(body) + 1) == -1
    assert find_content(text, "short", 0) == -1


def test_message_keys_identify_content() -> None:
    a = "policy " * 50_000
    assert message_key("system", a, None) == message_key("system", "".join(["policy "] * 50_000), None)
    assert message_key("system", a, None) != message_key("system", a[:-1] + "!", None)
    assert message_key("user", a, None) != message_key("system", a, None)
    assert message_key("assistant", "", [{"id": "1"}]) != message_key("assistant", "", [{"id": "2"}])


def test_sketch_regions_of_a_long_prompt() -> None:
    fpr = Fingerprinter(SegmentTokenizer.load(None))
    system = "".join(f"{i}. refund policy clause\n" for i in range(20_000))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "refund policy clause"}]
    inp = prompt_input("chat", {"model": "m", "messages": msgs})
    assert inp is not None
    text = fpr.render(inp)
    sketch = build_sketch(inp, text)
    assert [r.role for r in sketch.regions] == ["system", "user", "assistant", "user"]
    for region, msg in zip(sketch.regions, msgs, strict=True):
        assert text[region.start:region.end] == msg["content"]
    assert sketch.tail_start == sketch.regions[-1].start
    fpr.close()


def test_a_sketchs_message_keys_are_each_messages_key() -> None:
    """Keyed when first read, from where each content sits in the text: the same keys as keying
    every message as sent (content parts, empty content, tool calls, content the template did not
    render verbatim)."""
    from app.prefix.sketch import content_text

    fpr = Fingerprinter(SegmentTokenizer.load(None))
    calls = [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a.py\"}"}}]
    msgs = [{"role": "system", "content": "rules " * 300},
            {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": "def f(): pass\n" * 40},
            {"role": "assistant", "content": "  padded reply  ", "tool_calls": calls},
            {"role": "user", "content": ""},
            {"role": "user", "content": "rules " * 300}]
    inp = prompt_input("chat", {"model": "m", "messages": msgs})
    assert inp is not None
    sketch = build_sketch(inp, fpr.render(inp))
    want = [message_key(m["role"], content_text(m.get("content")), m.get("tool_calls")) for m in msgs]
    assert sketch.message_keys == want
    assert sketch.message_keys is sketch.message_keys  # computed once
    fpr.close()


def test_encode_small_equals_encode_text() -> None:
    fpr = Fingerprinter(SegmentTokenizer.load(None))
    for text in ("Hello there, how can I help?", "Ünïcödé ✓ 中文\n\n  spaced  ", "a<|im_end|>\nb<|im_start|>c", ""):
        assert list(fpr.encode_small(text)) == list(fpr.encode_text(text))
    fpr.close()


def test_polite_hashing_gives_the_same_chain() -> None:
    from app.prefix.chain import POLITE_BLOCKS, extend_node, root_node

    rng = random.Random(7)
    ids = [rng.randrange(50_000) for _ in range(16 * (3 * POLITE_BLOCKS + 5) + 9)]
    for salt in (None, "tenant-salt"):
        plain = extend_node(root_node(salt, 16), ids)
        polite = extend_node(root_node(salt, 16), ids, polite=True)
        assert polite.hashes == plain.hashes and polite.tail == plain.tail and polite.digest == plain.digest
        # continuing from a node with a partial tail block, as the memo walk does
        head = extend_node(root_node(salt, 16), ids[:37])
        assert [*head.hashes, *extend_node(head, ids[37:], polite=True).hashes] == list(plain.hashes)
