"""The memos' keys for long segments: no SipHash over the whole text, and a shared key is a miss."""

from __future__ import annotations

from array import array

import pytest

import app.prefix.chain as chain_mod
import app.prefix.segment_key as key_mod
import app.prefix.tokens as tokens_mod
from app.prefix.chain import ChainMemo, extend_node, node_bytes, root_node
from app.prefix.segment_key import LONG_SEGMENT_CHARS, segment_key
from app.prefix.tokens import Cuts, TokenMemo, memo_entry_bytes

DOC = "a document line\n" * 400  # 6,400 characters: a long segment


class _Unhashable(str):
    """A segment whose str hash fails: a memo that files it under the str itself raises."""

    def __hash__(self) -> int:
        raise AssertionError("a long segment was hashed as a str")


def test_a_long_segment_is_filed_and_found_without_hashing_its_text() -> None:
    seg, again = _Unhashable(DOC + "question"), _Unhashable(DOC + "question")
    ids = array("I", range(50))
    memo = TokenMemo()
    memo.put(seg, ids, Cuts(array("Q", [4096]), array("Q", [30])))
    assert memo.get(again) == ids and again in memo
    assert [c[0] for c in memo.candidates(DOC + "another question")] == [seg]
    memo.discard(again)
    assert memo.get(seg) is None and memo.bytes == 0
    chains = ChainMemo(1 << 20)
    root = root_node(None, 16)
    node = extend_node(root, ids)
    chains.put(root, seg, node)
    assert chains.get(root, again) is node
    chains.discard(root, again)
    assert chains.get(root, seg) is None and chains.bytes == 0


def test_a_short_segment_is_its_own_key() -> None:
    short = "x" * LONG_SEGMENT_CHARS
    assert segment_key(short) is short
    assert isinstance(segment_key(short + "x"), bytes)


def test_two_segments_under_one_key_are_a_miss_never_the_other_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def one_key(segment: str) -> str | bytes:
        return segment if len(segment) <= LONG_SEGMENT_CHARS else b"the same key"

    monkeypatch.setattr(tokens_mod, "segment_key", one_key)
    monkeypatch.setattr(chain_mod, "segment_key", one_key)
    a, b = DOC + "a", DOC + "b"
    ids_a, ids_b = array("I", [1] * 40), array("I", [2] * 40)
    memo = TokenMemo()
    memo.put(a, ids_a)
    assert memo.get(b) is None and b not in memo
    memo.discard(b)  # not held: the other segment stays
    assert memo.get(a) == ids_a
    memo.put(b, ids_b)  # replaces the other under their key
    assert memo.get(a) is None and memo.get(b) == ids_b
    assert memo.bytes == memo_entry_bytes(b, ids_b)

    chains = ChainMemo(1 << 20)
    root = root_node(None, 16)
    node_a, node_b = extend_node(root, ids_a), extend_node(root, ids_b)
    chains.put(root, a, node_a)
    assert chains.get(root, b) is None
    chains.discard(root, b)
    assert chains.get(root, a) is node_a
    chains.put(root, b, node_b)
    assert chains.get(root, a) is None and chains.get(root, b) is node_b
    assert chains.bytes == node_bytes(b, node_b)


def test_a_long_segments_key_is_computed_once_per_object(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = key_mod.xxh3_128_utf8

    def counted(text: str) -> bytes:
        calls.append(len(text))
        return real(text)

    monkeypatch.setattr(key_mod, "xxh3_128_utf8", counted)
    seg = DOC + "once"
    assert segment_key(seg) == segment_key(seg)
    assert len(calls) == 1
    assert segment_key("".join([DOC, "once"])) == segment_key(seg)  # an equal text, another object
    assert len(calls) == 2
