"""Segment split, memo and the segment-concatenation invariant (property test)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.prefix.tokens import SegmentSplitter, SegmentTokenizer, TokenMemo, concat_matches

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tok() -> SegmentTokenizer:
    return SegmentTokenizer.load()


def test_split_keeps_specials_as_segments() -> None:
    sp = SegmentSplitter(SPECIALS)
    text = "<|im_start|>system\nhi<|im_end|>\n<|im_start|>user\nq<|im_end|>"
    segs = sp.split(text)
    assert "".join(segs) == text
    assert segs == ["<|im_start|>", "system\nhi", "<|im_end|>", "\n", "<|im_start|>", "user\nq", "<|im_end|>"]


def test_split_prefers_longest_special() -> None:
    sp = SegmentSplitter(["<|a|>", "<|a|>b"])
    assert sp.split("x<|a|>by") == ["x", "<|a|>b", "y"]
    assert SegmentSplitter([]).split("abc") == ["abc"]
    assert sp.split("") == []


def _split_reference(specials: list[str], text: str) -> list[str]:
    """A position-by-position splitter: at each position the longest special starting there."""
    out: list[str] = []
    i = cursor = 0
    while i < len(text):
        s = max((s for s in specials if text.startswith(s, i)), key=len, default=None)
        if s is None:
            i += 1
            continue
        if i > cursor:
            out.append(text[cursor:i])
        out.append(s)
        i = cursor = i + len(s)
    if cursor < len(text):
        out.append(text[cursor:])
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<", "|", "<|", "|>", "im_end", "a", " ", "\n", *SPECIALS, "</s>"]),
                max_size=300))
def test_split_equals_a_position_by_position_reference(parts: list[str]) -> None:
    """Also where the specials' first character is common (markup, code): there the scan for
    that character gives way to the prefix's own find after its misses (exercised: up to 300
    parts, many of them a lone "<")."""
    specials = [*SPECIALS, "</s>"]
    text = "".join(parts)
    assert SegmentSplitter(specials).split(text) == _split_reference(specials, text)


def test_split_finds_specials_after_many_lone_first_characters() -> None:
    """A special right after the miss that ends the first-character scan, and far after it."""
    sp = SegmentSplitter(SPECIALS)
    for lone in range(SegmentSplitter.FIRST_CHAR_MISSES - 2, SegmentSplitter.FIRST_CHAR_MISSES + 3):
        assert sp.split("<" * lone + "<|im_end|>x") == ["<" * lone, "<|im_end|>", "x"]
    text = "a < b " * 200 + "<|im_end|>" + "x" * 10 + "<|im_start|>"
    assert sp.split(text) == ["a < b " * 200, "<|im_end|>", "x" * 10, "<|im_start|>"]


def test_memo_is_bounded_lru() -> None:
    memo = TokenMemo(max_bytes=1000)
    for i in range(20):
        memo.put(f"seg{i}", array("I", [i] * 10))
    assert memo.bytes <= 1000
    assert memo.get("seg0") is None  # evicted
    assert memo.get("seg19") == array("I", [19] * 10)
    assert memo.evictions > 0


def test_default_tokenizer_is_segmentable(tok: SegmentTokenizer) -> None:
    assert tok.segmented
    assert tok.count_special() == 3


_piece = st.sampled_from(list("ab c\n\t .:Ü中<|>_") + ["<|im_start|>", "<|im_end|>", "  ", "\n\n", "def ", "123"])
_text = st.lists(_piece, max_size=30).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), _text), min_size=1,
                max_size=5), st.booleans())
def test_segment_concat_equals_full_encode_chatml(tok: SegmentTokenizer, msgs, agp) -> None:
    assert tok.template is not None
    text = tok.template.render([{"role": r, "content": c} for r, c in msgs], add_generation_prompt=agp)
    assert concat_matches(tok, text)
    joined = array("I")
    for ids in tok.encode_segments(tok.split(text)):
        joined.extend(ids)
    assert joined == tok.encode(text)


def test_non_segmentable_tokenizer_falls_back(tok: SegmentTokenizer) -> None:
    # A tokenizer whose special strips the whitespace around it breaks concatenation: simulate by
    # splitting at a string that is not a special token for the tokenizer (BPE merges across it).
    fake = SegmentTokenizer(tok.tokenizer, tok.template, ["in"])
    assert not fake.segmented
    assert fake.split("a in b") == ["a in b"]


_PIECES = st.one_of(st.sampled_from(SPECIALS), st.text(max_size=40),
                    st.text(alphabet=" \n\t", max_size=6), st.sampled_from(["don't", " 2026-12-03", "日本語", "  x"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_PIECES, max_size=10).map("".join), min_size=1, max_size=6))
def test_batch_encoding_gives_the_single_encodes_ids(tok: SegmentTokenizer, texts: list[str]) -> None:
    """The batch path (worker threads and the cold pool: the fast BPE encoder, or the tokenizer's
    batch encode without character offsets) gives exactly the ids of the tokenizer's own single
    encode, for what it is given: segments, which never hold an added token."""
    segments = [s for t in texts for s in tok.split(t) if s not in SPECIALS]
    assert tok.encode_many(segments) == [tok.encode(s) for s in segments]
