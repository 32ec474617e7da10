"""SplitMemo (app/prefix/resplit.py): a prompt that continues a kept one is split as the kept
segments plus a split of its new part, and that always equals the full split."""

from __future__ import annotations

import random

from app.prefix.resplit import SplitMemo
from app.prefix.tokens import SegmentSplitter, SegmentTokenizer

# overlapping and nested specials: a longer special extending a shorter one, one ending where
# another starts, one-character ones
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|im_end|>x", "<|a|>", "|><|", "<", "<tool_call>", "</tool_call>"]
ALPHABET = ["a", "b", "x", " ", "\n", "<", "|", ">", "<|", "|>", "im_", "end", "start", "<tool", "call>"]


def _piece(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(SPECIALS)
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40)))


def _mutate(rng: random.Random, text: str) -> str:
    """Grow (the usual turn), or edit, trim the front, cut the end, swap two halves."""
    op = rng.random()
    if op < 0.6 or len(text) < 10:
        return text + "".join(_piece(rng) for _ in range(rng.randint(1, 12)))
    i = rng.randrange(len(text))
    if op < 0.7:
        return text[:i] + _piece(rng) + text[i + 1:]
    if op < 0.8:
        return text[i:]
    if op < 0.9:
        return text[:i]
    return text[i:] + text[:i]


def test_split_equals_the_full_split_on_random_growing_edited_and_trimmed_texts() -> None:
    splitter = SegmentSplitter(SPECIALS)
    memo = SplitMemo(splitter.split, splitter.specials, max_bytes=1 << 20, min_chars=1)
    rng = random.Random(7)
    for conversation in range(60):
        text = "".join(_piece(rng) for _ in range(rng.randint(0, 5)))
        for _turn in range(25):
            text = _mutate(rng, text)
            assert memo.split(text) == splitter.split(text), (conversation, text)
    assert memo.hits > 500  # the shortcut ran, not only the fallback


def test_a_continuation_of_another_prompt_or_a_cut_special_falls_back() -> None:
    splitter = SegmentSplitter(SPECIALS)
    memo = SplitMemo(splitter.split, splitter.specials, max_bytes=1 << 20, min_chars=1)
    head = "sys " * 100  # one head (the memo finds kept prompts by their first 256 characters)
    base = head + "<|im_end|>abc<|im_end|>" + "y" * 20
    assert memo.split(base) == splitter.split(base)
    # the text after the kept `<|im_end|>` turns it into the longer special `<|im_end|>x`
    grown = head + "<|im_end|>abc<|im_end|>x" + "y" * 20
    assert memo.split(grown) == splitter.split(grown)
    assert "<|im_end|>x" in memo.split(grown)
    assert memo.hits >= 1  # through the first `<|im_end|>`, the part both share
    edited = head + "<|im_end|>abd<|im_end|>" + "y" * 20
    assert memo.split(edited) == splitter.split(edited)


def test_kept_segments_stay_within_the_byte_cap() -> None:
    splitter = SegmentSplitter(SPECIALS)
    memo = SplitMemo(splitter.split, splitter.specials, max_bytes=20_000, min_chars=1)
    rng = random.Random(3)
    for k in range(200):
        text = f"head {k} " + "".join(_piece(rng) for _ in range(100))
        memo.split(text)
        assert 0 <= memo.bytes <= 20_000


def _bodies(rng: random.Random) -> list[dict]:
    """A chat with tools that grows, has an early turn edited, its tools reordered, its front
    trimmed, then grows again (the fallbacks between the continuations)."""
    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": "does " * 300,
                                               "parameters": {"type": "object", "properties": {}}}} for k in range(4)]
    messages: list[dict] = [{"role": "system", "content": "You are an agent.\n" + "rules " * 7000}]
    out: list[dict] = []

    def turn(k: int) -> None:
        messages.extend([
            {"role": "user", "content": f"step {k} " + " ".join(rng.choice(["a", "bc", "<|im_end|>"]) for _ in range(3000))},
            {"role": "assistant", "content": f"done {k}"}])
        out.append({"model": "m", "messages": list(messages), "tools": list(tools)})

    for k in range(3):
        turn(k)
    messages[1] = {**messages[1], "content": "edited " + messages[1]["content"]}
    turn(3)
    tools.reverse()
    turn(4)
    del messages[1:3]
    turn(5)
    turn(6)
    return out


def test_the_fingerprint_of_a_changing_chat_equals_a_fresh_gateways() -> None:
    """Through the tokenizer's real template and memos: each request's chain, from a tokenizer
    that kept the earlier requests' segments, equals the chain of one that never saw them."""
    from app.prefix.fingerprint import Fingerprinter, prompt_input

    warm = Fingerprinter(SegmentTokenizer.load(), inline_chars=1 << 30, inline_hash_tokens=1 << 30)
    shortcuts = 0
    for body in _bodies(random.Random(5)):
        inp = prompt_input("chat", body)
        before = warm.tokenizer.resplit.hits
        fp = warm.prepare(inp, 16)
        shortcuts += warm.tokenizer.resplit.hits - before
        cold = Fingerprinter(SegmentTokenizer.load(), inline_chars=1 << 30, inline_hash_tokens=1 << 30)
        ref = cold.prepare(inp, 16)
        assert fp.complete and ref.complete
        assert list(fp.block_hashes) == list(ref.block_hashes)
        assert warm.tokenizer.split(fp.text) == cold.tokenizer.splitter.split(fp.text)
        cold.close()
    assert shortcuts >= 3  # the continuations took the shortcut (not the edit, the reorder, the trim)
    warm.close()


def _growing_chat(turns: int) -> list[dict]:
    """A long chat (each body > the split memo's 32 KB floor) growing by a turn per request."""
    messages: list[dict] = [{"role": "system", "content": "You are an agent.\n" + "rules " * 7000}]
    bodies = []
    for k in range(turns):
        messages += [{"role": "user", "content": f"step {k} " + "word " * 400},
                     {"role": "assistant", "content": f"done {k}"}]
        bodies.append({"model": "m", "messages": list(messages)})
    return bodies


class _CountingGets:
    """Wraps a ChainMemo's `get`: how many memo steps a walk took."""

    def __init__(self, memo) -> None:  # noqa: ANN001
        self.calls = 0
        self._get = memo.get
        memo.get = self

    def __call__(self, parent, segment):  # noqa: ANN001, ANN204
        self.calls += 1
        return self._get(parent, segment)


def test_a_continuing_turn_starts_its_walk_where_the_last_turn_passed_the_shared_part() -> None:
    """The memo walk of turn k + 1 steps only through its new segments (the walk record attached to
    the split memo's entry), and its chain equals a fresh gateway's."""
    from app.prefix.fingerprint import Fingerprinter, prompt_input

    warm = Fingerprinter(SegmentTokenizer.load(), inline_chars=1 << 30, inline_hash_tokens=1 << 30)
    gets = _CountingGets(warm.chains)
    bodies = _growing_chat(12)
    for k, body in enumerate(bodies):
        inp = prompt_input("chat", body)
        gets.calls = 0
        fp = warm.prepare(inp, 16)
        cold = Fingerprinter(SegmentTokenizer.load(), inline_chars=1 << 30, inline_hash_tokens=1 << 30)
        ref = cold.prepare(inp, 16)
        cold.close()
        assert fp.complete and list(fp.block_hashes) == list(ref.block_hashes)
        assert fp.num_tokens == ref.num_tokens and fp.node is not None and ref.node is not None
        assert fp.node.digest == ref.node.digest and list(fp.node.tail) == list(ref.node.tail)
        segments = len(warm.tokenizer.split(fp.text or ""))
        if k >= 2:  # turn 1 kept the entry, turn 2 recorded the walk on the entry it kept
            assert segments >= 30 and gets.calls <= 8, (k, segments, gets.calls)
    warm.close()


def test_a_walk_record_serves_only_its_own_salt_and_block_size() -> None:
    """Another tenant's salt or another block size continuing the same text walks its own chain."""
    from app.prefix.fingerprint import Fingerprinter, prompt_input

    warm = Fingerprinter(SegmentTokenizer.load(), inline_chars=1 << 30, inline_hash_tokens=1 << 30)
    bodies = _growing_chat(6)
    plan = [(None, 16), (None, 16), ("tenant-b", 16), (None, 64), ("tenant-b", 16), (None, 16)]
    for body, (salt, block) in zip(bodies, plan, strict=True):
        inp = prompt_input("chat", body)
        fp = warm.prepare(inp, block, salt)
        cold = Fingerprinter(SegmentTokenizer.load(), inline_chars=1 << 30, inline_hash_tokens=1 << 30)
        ref = cold.prepare(inp, block, salt)
        cold.close()
        assert fp.complete and list(fp.block_hashes) == list(ref.block_hashes), (salt, block)
    warm.close()


def test_walk_records_count_against_the_split_memos_cap() -> None:
    from app.prefix.fingerprint import WALK_BLOCK_BYTES, Fingerprinter, prompt_input

    tokenizer = SegmentTokenizer.load()
    warm = Fingerprinter(tokenizer, inline_chars=1 << 30, inline_hash_tokens=1 << 30)
    for body in _growing_chat(3):
        fp = warm.prepare(prompt_input("chat", body), 16)
    memo = tokenizer.resplit
    (entry,) = memo._entries.values()
    record = memo.attached(entry, (None, 16))
    assert record is not None and len(record.hashes) > 0
    assert entry.nbytes >= WALK_BLOCK_BYTES * len(record.hashes)
    assert memo.bytes == entry.nbytes <= memo.max_bytes
    assert list(record.hashes) == list(fp.block_hashes)[:len(record.hashes)]
    warm.close()
    small = SegmentTokenizer.load(split_memo_bytes=memo.bytes - 1)  # room for the segments, not the record
    tight = Fingerprinter(small, inline_chars=1 << 30, inline_hash_tokens=1 << 30)
    for body in _growing_chat(3):
        tight.prepare(prompt_input("chat", body), 16)
        assert small.resplit.bytes <= small.resplit.max_bytes
    tight.close()
