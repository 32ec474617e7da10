"""The after-response path keeps O(prompt) work off the event loop (bench/loop_stalls.py measures it).

No timing assertions: each test checks the mechanism (a long residency write yields between
slices, bulk updates keep the same bookkeeping as the per-item loops they replaced, the cheap
sketch finds the same regions, the inline encode gives the engine's ids).
"""

from __future__ import annotations

import asyncio
import random

from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import build_sketch, find_content, message_key
from app.prefix.tokens import SegmentTokenizer
from app.prefix.tracker import TenantTracker
from app.state.memory import ADD_SLICE_BLOCKS, MemoryStore, _Residency


def rand_chain(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(64) for _ in range(n)]


async def test_long_residency_write_yields_and_keeps_single_pass_order() -> None:
    head = rand_chain(3 * ADD_SLICE_BLOCKS + 100, 1)
    other = rand_chain(500, 2)
    store = MemoryStore(capacity_blocks=10 * ADD_SLICE_BLOCKS)
    await store.residency_add("r", other)
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    await store.residency_add("r", head)
    stop.set()
    await task
    assert ticks - before >= 3  # the loop ran other tasks between the slices

    reference = _Residency(10 * ADD_SLICE_BLOCKS, 3600.0, lambda: 0.0)
    reference.add(other)
    reference.add(head)
    assert list(store._residency["r"].blocks) == list(reference.blocks)  # same LRU order
    assert list(store._residency["r"].blocks)[-1] == head[0]  # block 0 most recent
    assert (await store.residency_lookup(head, ["r"]))["r"] == len(head)


async def test_lookups_between_slices_see_a_prefix_closed_set() -> None:
    """A lookup running between two slices of a long add answers what a linear scan answers
    (the binary search relies on the resident set being prefix-closed at every moment)."""
    chain = rand_chain(4 * ADD_SLICE_BLOCKS + 33, 11)
    store = MemoryStore(capacity_blocks=8 * ADD_SLICE_BLOCKS)
    await store.residency_add("r", chain[:ADD_SLICE_BLOCKS // 2])  # warm head, cold rest
    seen: list[tuple[int, int]] = []
    done = False

    async def reader() -> None:
        while not done:
            present = store._residency["r"].blocks
            linear = next((i for i, h in enumerate(chain) if h not in present), len(chain))
            seen.append(((await store.residency_lookup(chain, ["r"]))["r"], linear))
            await asyncio.sleep(0)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    await store.residency_add("r", chain)
    done = True
    await task
    assert all(found == linear for found, linear in seen), seen
    assert len(seen) >= 6
    assert seen[-1] == (len(chain), len(chain))


async def test_long_residency_write_trims_like_a_single_pass() -> None:
    chain = rand_chain(2 * ADD_SLICE_BLOCKS + 7, 3)
    store = MemoryStore(capacity_blocks=ADD_SLICE_BLOCKS + 5)
    await store.residency_add("r", rand_chain(300, 4))
    await store.residency_add("r", chain)
    assert store.residency_size("r") == ADD_SLICE_BLOCKS + 5
    # eviction took tail blocks first: the resident set is the chain's head, prefix-closed
    assert store.residency_hashes("r") == set(chain[:ADD_SLICE_BLOCKS + 5])
    assert (await store.residency_lookup(chain, ["r"]))["r"] == ADD_SLICE_BLOCKS + 5


async def test_tracker_bulk_updates_keep_ownership_and_counts() -> None:
    tracker = TenantTracker(MemoryStore(), tenant_max_hashes=2500)
    shared = rand_chain(1000, 5)
    chains = [shared + rand_chain(400, 10 + i) for i in range(6)]
    for c in chains:
        await tracker.observe("t", c, None, 16)
        state = tracker._tenants["t"]
        assert tracker.hash_count == len(state.hashes)
        assert len(state.hashes) <= 2500
    state = tracker._tenants["t"]
    # the shared prefix survived the eviction of the requests that first contained it
    assert all(h in state.hashes for h in shared)
    assert state.hashes[shared[0]] == state.last_seq
    assert not any(h in state.hashes for h in chains[0][1000:])  # oldest request's own blocks dropped
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
