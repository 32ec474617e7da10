"""Incremental tokenisation: the safe-cut rule is exact ("pieces concatenated == full encode") for
the built-in tokenizer and a Hugging Face BPE built here (Qwen-style split regex + byte level),
reuse of a memoised segment's prefix gives the ids of a full encode, and a 100 KB message whose
last line changed is fingerprinted on the hot path, exactly, from its predecessor's memo entries."""

from __future__ import annotations

import sysconfig
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from app.prefix.blocks import proxy_chain
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.tokens import (
    INCREMENTAL_MIN_CHARS,
    Cuts,
    SegmentTokenizer,
    TokenMemo,
    common_prefix_len,
    find_cuts,
    memo_entry_bytes,
    pieces_match,
)

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3's split regex: digits in runs of at most three
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:40]]
    return [*texts, "Ünïcödé — ✓ 中文 日本語 12345 3.14159\n\n\t  x"] * 2


def _hf_bpe(pre: pre_tokenizers.PreTokenizer) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def builtin() -> SegmentTokenizer:
    return SegmentTokenizer.load()


def _split_then_bytes(split: str, builtin: SegmentTokenizer) -> SegmentTokenizer:
    """A byte-level BPE whose pre-tokenizer splits on `split` first (Qwen's and Llama 3's shape)."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return SegmentTokenizer(_hf_bpe(pre), builtin.template, SPECIALS)


@pytest.fixture(scope="module")
def qwen_style(builtin: SegmentTokenizer) -> SegmentTokenizer:
    return _split_then_bytes(QWEN_SPLIT, builtin)


@pytest.fixture(scope="module")
def llama3_style(builtin: SegmentTokenizer) -> SegmentTokenizer:
    return _split_then_bytes(LLAMA3_SPLIT, builtin)


@pytest.fixture(scope="module", params=["builtin", "qwen_style", "llama3_style"])
def tok(request: pytest.FixtureRequest) -> SegmentTokenizer:
    return request.getfixturevalue(request.param)


_piece = st.sampled_from(
    list("ab Z\n\t .:'!?_-09") + ["Ü", "中文", "é", "\u00a0", "\u2028", "\r\n", "  ", "\n\n", "\n ", " \n",
                                 "   \n", "def ", "123", "4567", "'s", "'ll", "...", "<|im_end|>", "✓",
                                 "word", " word", " x", "Ab ", "é b", "1 a", ") if", "= foo", "' s", "a  b"])
_text = st.lists(_piece, max_size=60).map("".join)


def test_every_tokenizer_verifies_the_cut_rule(builtin: SegmentTokenizer, qwen_style: SegmentTokenizer,
                                               llama3_style: SegmentTokenizer) -> None:
    assert builtin.incremental and qwen_style.incremental and llama3_style.incremental


def test_cuts_inside_a_line_fall_before_a_space_and_a_word() -> None:
    # rule 3: a non-space character, then one space and an ASCII letter: the word's pre-token
    # starts with that space whatever came before (a single 100 KB line still has cuts)
    text = "alpha beta, gamma 12 delta\n  epsilon"
    assert find_cuts(text, 0, stride=1) == [5, 11, 20, 28]
    assert pieces_match(SegmentTokenizer.load(), text, find_cuts(text, 0, stride=1))


def test_an_added_token_with_whitespace_turns_incremental_off(builtin: SegmentTokenizer) -> None:
    # added tokens are matched before pre-tokenisation, so "a b" as one token would span a cut
    tok = Tokenizer.from_str(builtin.tokenizer.to_str())
    tok.add_tokens(["hello world"])
    assert not SegmentTokenizer(tok, builtin.template, SPECIALS).incremental
    plain = Tokenizer.from_str(builtin.tokenizer.to_str())
    plain.add_tokens(["<tool>"])
    assert SegmentTokenizer(plain, builtin.template, SPECIALS).incremental


def test_a_tokenizer_that_merges_across_cuts_is_not_incremental(builtin: SegmentTokenizer) -> None:
    # Metaspace prepends "▁" to every piece: "a\nb" cut after "\n" encodes "▁b", not "b"
    pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.train_from_iterator(_corpus(), trainer=trainers.BpeTrainer(vocab_size=600, show_progress=False))
    st_ = SegmentTokenizer(tok, None, [])
    assert not st_.incremental
    assert st_.pieces("x\ny\n" * 4000) == []
    assert st_.reuse("x\ny\n" * 4000) is None


@settings(max_examples=200, deadline=None)
@given(text=_text, data=st.data())
def test_pieces_at_safe_cuts_concatenate_to_the_full_encode(tok: SegmentTokenizer, text: str,
                                                           data: st.DataObject) -> None:
    every = find_cuts(text, 0, stride=1)
    assert pieces_match(tok, text, every)
    subset = sorted(data.draw(st.sets(st.sampled_from(every))) if every else [])
    assert pieces_match(tok, text, subset)


@settings(max_examples=100, deadline=None)
@given(a=_text, b=_text)
def test_common_prefix_len(a: str, b: str) -> None:
    n = common_prefix_len(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]
    big = a * 500
    assert common_prefix_len(big + "x" + b, big + "y") == len(big)


@settings(max_examples=100, deadline=None)
@given(a=_text, b=_text, a0=st.integers(0, 40), b0=st.integers(0, 40), shared=st.integers(0, 20_000))
def test_common_prefix_len_from_offsets(a: str, b: str, a0: int, b0: int, shared: int) -> None:
    """From offsets, across the doubling chunks' edges (8 KB, 16 KB): what diagnosis asks when it
    re-aligns two prompts (app/prefix/strings.py `common_prefix_len`)."""
    run = ("abcdefghij" * 2_000)[:shared]
    a, b = a[:a0].ljust(a0, "<") + run + a, b[:b0].ljust(b0, ">") + run + b
    n = common_prefix_len(a, b, a0, b0)
    assert a[a0:a0 + n] == b[b0:b0 + n] and n >= shared
    assert n == min(len(a) - a0, len(b) - b0) or a[a0 + n] != b[b0 + n]


_line = st.lists(_piece, min_size=1, max_size=12).map("".join)


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(_line, min_size=3, max_size=30), edit=st.floats(0.0, 1.0), tail=_text)
def test_reused_prefix_ids_equal_the_full_encode(tok: SegmentTokenizer, lines: list[str], edit: float,
                                                 tail: str) -> None:
    # a segment never holds an added token (the splitter cuts them out): encode_segment's input
    base, tail = "\n".join(lines).replace("<|im_end|>", ""), tail.replace("<|im_end|>", "")
    base = (base + "\nx\n") * (INCREMENTAL_MIN_CHARS // len(base) + 2)
    tok.memo = TokenMemo(64 * 1024 * 1024)
    assert tok.encode_segment(base) == tok.encode(base)
    cut = int(edit * len(base))
    new = base[:cut] + tail
    reuse = tok.reuse(new)
    if reuse is not None:
        assert reuse.chars < common_prefix_len(base, new) or reuse.chars == len(base)
    assert tok.encode_segment(new, reuse) == tok.encode(new)
    # and the new segment's own cuts are exact for the next one
    again = new + "\nmore\n"
    assert tok.encode_segment(again, tok.reuse(again)) == tok.encode(again)
    assert tok.encode_segments([again + "z", base + "q"]) == [tok.encode(again + "z"), tok.encode(base + "q")]


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_line, min_size=3, max_size=30), edit=st.floats(0.0, 1.0), tail=_text,
       wide=st.booleans())
def test_reuse_takes_the_last_cut_inside_the_shared_prefix(tok: SegmentTokenizer, lines: list[str], edit: float,
                                                          tail: str, wide: bool) -> None:
    # the definition, against the in-place compare of the last cut that fits and its fallback
    base = "\n".join(lines).replace("<|im_end|>", "") + ("é\n" if wide else "\nx\n")
    base = base * (INCREMENTAL_MIN_CHARS // len(base) + 2)
    tok.memo = TokenMemo(64 * 1024 * 1024)
    tok.encode_segment(base)
    cuts = tok.memo.cuts(base)  # None: no safe cut in this text for this tokenizer
    cut = int(edit * len(base))
    for new in (base[:cut] + tail.replace("<|im_end|>", ""), base + tail[:3], base[:-1], base[:1] + base[1:]):
        shared = common_prefix_len(base, new)
        fits = [c for c in cuts.chars if c + 2 <= shared] if cuts is not None else []
        reuse = tok.reuse(new)
        if new == base or len(new) < INCREMENTAL_MIN_CHARS or not fits:
            assert reuse is None
        else:
            assert reuse is not None and reuse.prev is base and reuse.chars == fits[-1]


def test_memo_counts_cuts_and_forgets_evicted_heads() -> None:
    memo = TokenMemo(max_bytes=14_000)  # room for one entry of ~11-13 KB
    seg = "line\n" * 2000
    cuts = Cuts(array("Q", [1024, 2048]), array("Q", [200, 400]))
    ids = array("I", range(10))
    memo.put(seg, ids, cuts)
    assert memo.bytes == memo_entry_bytes(seg, ids, cuts) > memo_entry_bytes(seg, ids)
    assert [c[0] for c in memo.candidates(seg + "x")] == [seg]
    memo.put("other\n" * 2000, ids, cuts)  # evicts the first
    assert memo.get(seg) is None
    assert memo.candidates(seg + "x") == []
    assert memo.bytes == memo_entry_bytes("other\n" * 2000, ids, cuts)


def _doc(chars: int) -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "".join(p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:120])[:chars]


def test_long_message_with_a_new_last_line_is_exact_on_the_hot_path(builtin: SegmentTokenizer) -> None:
    fpr = Fingerprinter(SegmentTokenizer.load())
    doc = _doc(100_000)

    def body(question: str) -> dict:
        return {"messages": [{"role": "system", "content": "You answer questions about code."},
                             {"role": "user", "content": f"{doc}\nQuestion: {question}"}]}

    first = fpr.complete_sync(fpr.prepare(prompt_input("chat", body("what does it do?")), 16))
    assert first.complete
    reuses = fpr.tokenizer.memo.reuses
    fp = fpr.prepare(prompt_input("chat", body("which function parses paths?")), 16)
    assert fp.complete  # routed on the whole exact chain, nothing left for the worker pool
    assert fpr.tokenizer.memo.reuses == reuses + 1  # only the tail after the last shared cut was encoded
    ids = builtin.encode(fp.text or "")
    assert fp.num_tokens == len(ids)
    assert list(fp.block_hashes) == proxy_chain(ids, 16)
    # a salted chain has no memoised blocks to reuse: its ids are reused, its blocks hashed anew
    salted = fpr.complete_sync(fpr.prepare(prompt_input("chat", body("q3")), 16, salt="t1"))
    assert list(salted.block_hashes) == proxy_chain(builtin.encode(salted.text or ""), 16, salt="t1")
    fpr.close()



def _words(chars: int, seed: int) -> str:
    # the benchmark's prompt shape (bench/peerbench/load_client.py): one line of words, no newline
    import random
    rng = random.Random(seed)
    words = "the of and to in is that for it as was with be by on not he this are".split()
    out, n = [], 0
    while n < chars:
        out.append(rng.choice(words))
        n += len(out[-1]) + 1
    return " ".join(out)[:chars]


def test_single_line_message_with_a_new_tail_is_exact_on_the_hot_path(builtin: SegmentTokenizer) -> None:
    fpr = Fingerprinter(SegmentTokenizer.load())
    line = _words(100_000, 7)
    assert "\n" not in line

    def body(n: int) -> dict:
        return {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": f"{line} [q{n}]"}]}

    first = fpr.complete_sync(fpr.prepare(prompt_input("chat", body(1)), 16))
    assert first.complete
    reuses = fpr.tokenizer.memo.reuses
    for n in (2, 3):
        fp = fpr.prepare(prompt_input("chat", body(n)), 16)
        assert fp.complete  # the head's ids reused up to a cut inside the line; only the tail encoded
        ids = builtin.encode(fp.text or "")
        assert fp.num_tokens == len(ids)
        assert list(fp.block_hashes) == proxy_chain(ids, 16)
    assert fpr.tokenizer.memo.reuses == reuses + 2
    fpr.close()


def test_a_cut_is_reused_only_when_the_characters_that_make_it_safe_are_shared() -> None:
    # every cut of `base` is rule 2 ("\n| a": decided by the " a" after it); the new text keeps
    # the space but not the letter, so "\n \n" is one pre-token there and the cut is not safe
    tok = SegmentTokenizer.load()
    tok.memo = TokenMemo(64 * 1024 * 1024)
    base = "y\n a" * 3000
    tok.encode_segment(base)
    cuts = tok.memo.cuts(base)
    assert cuts is not None
    c = cuts.chars[-1]
    new = base[:c + 1] + "\n tail"
    reuse = tok.reuse(new)
    assert tok.encode_segment(new, reuse) == tok.encode(new)
    assert reuse is not None and reuse.chars < c


def test_a_pool_of_documents_holds_one_memo_entry_per_document() -> None:
    """The same documents sent again and again, each with another question at its end: the memos
    keep one entry per document (the newer one supersedes the older, whose blocks it reuses), so
    memos sized for the pool (not for its recent requests) stay exact on the hot path even when
    one document is asked many times in a row, and every fingerprint still equals the plain
    encoding's chain."""
    import random

    from app.prefix.tokens import SegmentTokenizer

    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"]
    docs = [" ".join(rng.choice(words) for _ in range(4000)) for _ in range(4)]
    tok = SegmentTokenizer.load(None)
    fpr = Fingerprinter(tok)
    plain = Fingerprinter(SegmentTokenizer.load(None))
    order = [0, 1, 2, 3] + [0] * 7 + [1, 2, 3]
    routed_exact = []
    for i, d in enumerate(order):
        inp = prompt_input("chat", {"messages": [{"role": "user", "content": f"{docs[d]} [q{i}]"}]})
        fp = fpr.prepare(inp, 16)
        routed_exact.append(fp.complete)
        fpr.complete_sync(fp)
        assert fp.block_hashes == plain.complete_sync(plain.prepare(inp, 16)).block_hashes
        if i == 0:  # room for five documents' entries in each memo: the pool, not its last requests
            tok.memo.max_bytes = 5 * tok.memo.bytes + 1024
            fpr.chains.max_bytes = 5 * fpr.chains.bytes + 1024
        assert sum(len(s) > 4096 for s, _ in tok.memo._data.values()) <= 4
    assert routed_exact == [False] * 4 + [True] * (len(order) - 4)
    fpr.close()
    plain.close()
