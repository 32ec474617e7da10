"""The fast BPE encoder (app/prefix/fast_bpe.py): the tokenizer's own ids or not used at all."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_prefix_incremental import LLAMA3_SPLIT, QWEN_SPLIT, SPECIALS, _hf_bpe
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

from app.prefix.fast_bpe import FastBPE, build
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.tokens import SegmentTokenizer


def _split_then_bytes(split: str) -> Tokenizer:
    return _hf_bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


@pytest.fixture(scope="module")
def builtin() -> SegmentTokenizer:
    return SegmentTokenizer.load()


@pytest.fixture(scope="module")
def shapes(builtin: SegmentTokenizer) -> dict[str, Tokenizer]:
    """The byte-level BPE shapes of the seeds' models: GPT-2's (the built-in tokenizer), Qwen 2's
    (NFC, then its split regex) and Llama 3's (its split regex)."""
    qwen = _split_then_bytes(QWEN_SPLIT)
    qwen.normalizer = normalizers.NFC()
    return {"builtin": builtin.tokenizer, "qwen_style": qwen, "llama3_style": _split_then_bytes(LLAMA3_SPLIT)}


def test_every_byte_level_bpe_shape_gets_a_fast_encoder(builtin: SegmentTokenizer,
                                                       shapes: dict[str, Tokenizer]) -> None:
    assert builtin.fast is not None  # through SegmentTokenizer.load, as the gateway builds it
    for name, tokenizer in shapes.items():
        assert isinstance(build(tokenizer, SPECIALS), FastBPE), name


_piece = st.one_of(
    st.text(max_size=30),
    st.sampled_from([" ", "  ", "\n", "\n\n", "\r\n", "\t", "\u00a0", "\u2028", "\u3000", "'s", "'LL", " 's",
                     "123", "4567890", "3.14", "Ü", "é", "e\u0301", "Å", "中文", "😀", "👍🏽", "ﬁ", "²", "word",
                     " word", "def f(x):", "<not special>", "<|", "|>"]))
_segment = st.lists(_piece, max_size=40).map("".join).filter(lambda t: not any(s in t for s in SPECIALS))


@settings(max_examples=300, deadline=None)
@given(text=_segment)
def test_the_fast_encoder_gives_the_tokenizer_s_ids(shapes: dict[str, Tokenizer], text: str) -> None:
    for name, tokenizer in shapes.items():
        fast = build(tokenizer, SPECIALS) if name not in _BUILT else _BUILT[name]
        _BUILT[name] = fast
        assert fast is not None
        assert list(fast.encode(text)) == tokenizer.encode(text, add_special_tokens=False).ids, name


_BUILT: dict[str, FastBPE | None] = {}


def test_a_cold_prompt_is_fingerprinted_through_it_with_the_tokenizer_s_ids(builtin: SegmentTokenizer) -> None:
    """Through the fingerprinter, as a request's prompt: the chain from the fast encoder is the
    chain of the tokenizer's own ids."""
    body = {"messages": [{"role": "system", "content": "You are terse. " * 50},
                         {"role": "user", "content": "Ünïcödé — ✓ 中文 12345 it's\n\n  x " * 3000}]}
    fast = Fingerprinter(SegmentTokenizer.load())
    got = fast.prepare(prompt_input("chat", body), 16)
    assert not got.complete  # cold and long: finished off the hot path
    reference = SegmentTokenizer.load()
    reference.fast = None
    plain = Fingerprinter(reference)
    want = plain.complete_sync(plain.prepare(prompt_input("chat", body), 16))
    assert fast.tokenizer.fast is not None
    assert fast.complete_sync(got).block_hashes == want.block_hashes


def _respec(tokenizer: Tokenizer, change) -> Tokenizer:  # noqa: ANN001
    spec = json.loads(tokenizer.to_str())
    change(spec)
    return Tokenizer.from_str(json.dumps(spec))


def test_other_tokenizers_keep_their_own_encoder(builtin: SegmentTokenizer) -> None:
    tok = builtin.tokenizer

    def swap_first_merges(spec: dict) -> None:  # merge order no longer the ids' order
        merges = spec["model"]["merges"]
        merges[0], merges[1] = merges[1], merges[0]

    def lowercase(spec: dict) -> None:
        spec["normalizer"] = {"type": "Lowercase"}

    def prefix_space(spec: dict) -> None:
        spec["pre_tokenizer"]["add_prefix_space"] = True

    for change in (swap_first_merges, lowercase, prefix_space):
        assert build(_respec(tok, change), SPECIALS) is None, change.__name__
    added = Tokenizer.from_str(tok.to_str())
    added.add_tokens(["<tool>"])  # an added token the caller does not split at
    assert build(added, SPECIALS) is None
    assert build(added, [*SPECIALS, "<tool>"]) is not None
    metaspace = SegmentTokenizer(Tokenizer.from_str(tok.to_str()), None, [])
    metaspace.tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    assert build(metaspace.tokenizer, []) is None


def test_loading_the_same_tokenizer_again_reuses_its_verified_encoder(builtin: SegmentTokenizer) -> None:
    """The probes run once per process for a tokenizer and the strings split out before it: a second
    load (another app in the process, `prefixgate lint` run twice in one) gets the same FastBPE; a
    tokenizer changed in its spec, or other splits, are verified anew."""
    again = SegmentTokenizer.load()
    assert again.fast is not None and again.fast is builtin.fast
    changed = _respec(builtin.tokenizer, lambda spec: spec["model"]["vocab"].update({"zzz-probe": 1 << 20}))
    assert build(changed, SPECIALS) is not builtin.fast
    added = Tokenizer.from_str(builtin.tokenizer.to_str())
    added.add_tokens(["<tool>"])
    assert build(added, SPECIALS) is None and build(added, [*SPECIALS, "<tool>"]) is not None
