"""One memory budget (app/prefix/budget.py): every cap a share of it, each part counting the bytes
it really holds, budget and usage exported as gauges (docs/memory.md)."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from array import array
from collections.abc import Callable
from typing import Any

import pytest
from openai import OpenAI

from app.config import Settings
from app.prefix.budget import MB, MemoryCaps
from app.prefix.chain import ChainMemo, extend_node, root_node
from app.prefix.fingerprint import WALK_BLOCK_BYTES, WALK_RECORD_BYTES, WalkRecord
from app.prefix.resplit import SplitMemo
from app.prefix.sketch import RequestSketch
from app.prefix.tokens import SegmentSplitter, TokenMemo
from app.prefix.tracker import TenantTracker

# ASCII, Latin-1, CJK and emoji text: CPython stores 1, 1, 2 and 4 bytes a character
ALPHABETS = ("policy clause ", "cliché façade ", "缓存命中前缀 ", "🙂🚀 ")


def _text(rng: random.Random, n: int) -> str:
    return (rng.choice(ALPHABETS) * (n // 8 + 1))[:n] + str(rng.random())


class _NullStore:
    """The tracker's Store calls, keeping nothing (the Store's own memory is not the tracker's)."""

    async def history_recent(self, *_: Any) -> list[dict]:
        return []

    async def history_append(self, *_: Any) -> None:
        return None

    async def counter_incr(self, *_: Any) -> None:
        return None


def _held(build: Callable[[], Any]) -> tuple[Any, int]:
    """The object `build` returns and the bytes it allocated that are still held."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        obj = build()
        gc.collect()
        return obj, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_every_cap_is_a_share_of_the_one_budget() -> None:
    for mb in (8, 256, 4096):
        caps = MemoryCaps.from_budget(mb)
        parts = (caps.token_memo_bytes + caps.split_memo_bytes + caps.chain_memo_bytes + caps.tracker_hash_bytes
                 + caps.tracker_text_bytes)
        assert caps.budget_bytes == mb * MB and parts <= caps.budget_bytes
        assert caps.tracker_tenant_hash_bytes < caps.tracker_hash_bytes
    assert abs(MemoryCaps.from_budget(512).token_memo_bytes - 2 * MemoryCaps.from_budget(256).token_memo_bytes) <= 1
    assert Settings().memory.budget_mb * MB + 160 * MB <= 512 * MB  # the Helm chart's request


def test_token_memo_counts_the_bytes_it_holds() -> None:
    """Byte counts, not characters: a CJK or emoji segment holds 2-4 bytes a character."""
    rng = random.Random(3)

    def build() -> TokenMemo:
        memo = TokenMemo(1 << 40)
        for i in range(3000):
            seg = _text(rng, rng.randrange(4, 400))
            memo.put(f"{i}{seg}", array("I", range(rng.randrange(1, 100))))
        return memo

    memo, held = _held(build)
    assert 0.8 <= memo.bytes / held <= 1.25, (memo.bytes, held)


def test_chain_memo_counts_the_bytes_it_holds() -> None:
    rng = random.Random(4)

    def build() -> ChainMemo:
        memo = ChainMemo(1 << 40)
        node = memo.root(None, 16)
        for i in range(2000):
            child = extend_node(node, [rng.randrange(50_000) for _ in range(rng.randrange(1, 300))])
            memo.put(node, f"{i}{_text(rng, rng.randrange(4, 300))}", child)
            node = child if i % 10 else memo.root(None, 16)
        return memo

    memo, held = _held(build)
    assert 0.8 <= memo.bytes / held <= 1.25, (memo.bytes, held)


def test_split_memo_counts_the_bytes_it_holds_walk_records_included() -> None:
    """Kept segments and the walk records attached to them (as Fingerprinter._record attaches
    them: a packed copy of the walk's block hashes), against what is allocated."""
    rng = random.Random(6)
    splitter = SegmentSplitter(["<|im_start|>", "<|im_end|>"])
    node = root_node(None, 16)  # the chain memo's (counted there), shared by every record here

    def build() -> SplitMemo:
        memo = SplitMemo(splitter.split, splitter.specials, max_bytes=1 << 40, min_chars=1)
        for conversation in range(40):
            text = f"<|im_start|>system {conversation} " + _text(rng, 2000) + "<|im_end|>"
            for _turn in range(6):
                text += "<|im_start|>user " + _text(rng, rng.randrange(100, 3000)) + "<|im_end|>\n"
                _segments, _continued, keep = memo.split_walk(text)
                if keep is not None:
                    hashes = array("Q", (rng.getrandbits(64) for _ in range(len(text) // 40)))
                    memo.attach(keep, (None, 16), WalkRecord(node, hashes[:]),
                                WALK_BLOCK_BYTES * len(hashes) + WALK_RECORD_BYTES)
        return memo

    memo, held = _held(build)
    assert memo.hits >= 150  # the continuations were kept as one entry per conversation
    assert 0.8 <= memo.bytes / held <= 1.25, (memo.bytes, held)


def test_tracker_counts_and_caps_the_bytes_it_holds() -> None:
    """Requests sharing a long head hold a tuple slot per block each (not only one index entry per
    distinct hash): counted, and the byte cap holds the total."""
    rng = random.Random(5)
    head = [rng.getrandbits(64) for _ in range(200)]

    def feed(tracker: TenantTracker, n: int) -> TenantTracker:
        async def go() -> None:
            for i in range(n):
                chain = head + [rng.getrandbits(64) for _ in range(4)]
                await tracker.observe(f"t{i % 40}", chain, RequestSketch(text=_text(rng, 2000)), 16)
        asyncio.run(go())
        return tracker

    tracker, held = _held(lambda: feed(TenantTracker(_NullStore(), max_hashes=10**9, tenant_max_hashes=10**9,
                                                     max_hash_bytes=1 << 40), 1500))
    assert 0.8 <= (tracker.hash_bytes + tracker.text_bytes) / held <= 1.25, (tracker.hash_bytes, held)
    capped = feed(TenantTracker(_NullStore(), max_hashes=10**9, tenant_max_hashes=10**9,
                                max_hash_bytes=400_000, texts_bytes=100_000), 1500)
    assert 300_000 < capped.hash_bytes <= 400_000 and capped.text_bytes <= 100_000


@pytest.mark.parametrize("budget_mb", [64])
def test_budget_and_usage_are_exported(proxy_factory: Callable[..., Any], sim: Any, budget_mb: int) -> None:
    proxy = proxy_factory(sim, memory={"budget_mb": budget_mb})
    client = OpenAI(base_url=proxy.base_url, api_key="x")
    for i in range(4):
        client.chat.completions.create(model="sim", max_tokens=4, messages=[
            {"role": "system", "content": "Be brief. " * 200}, {"role": "user", "content": f"question {i}"}])
    stage = proxy.services.prefix
    asyncio.run_coroutine_threadsafe(stage.drain(), proxy.server.loop).result(10)
    assert proxy.sample("prefixgate_memory_budget_bytes") == budget_mb * MB
    held = stage.memory_bytes()
    assert set(held) == {"token_memo", "split_memo", "chain_memo", "tracker_hashes", "tracker_texts", "recent"}
    for part, value in held.items():
        assert proxy.sample("prefixgate_memory_used_bytes", part=part) == value
    assert held["token_memo"] > 0 and held["chain_memo"] > 0 and held["tracker_hashes"] > 0
    assert stage.fingerprinter.tokenizer.memo.max_bytes == MemoryCaps.from_budget(budget_mb).token_memo_bytes
