"""A faster encoder for byte-level BPE tokenizers: the same ids as `tokenizers`, ~5× less CPU.

A cold prompt's cost is its tokenisation (docs/performance.md): `tokenizers` spends ~27-40 ms of
CPU on 100 KB of English with the built-in tokenizer. tiktoken's BPE (Rust) gives the same ids in
~5 ms when the tokenizer is the GPT-2 family's byte-level BPE — the built-in tokenizer, Llama 3,
Qwen 2, GPT-OSS and most chat models of the seeds: a regex pre-split, byte-level pieces, merges.

The two agree when the tokenizer is a plain byte-level BPE (no normaliser, or NFC; a
`ByteLevel(use_regex)` or a `Split(regex, Isolated)` then `ByteLevel` pre-tokeniser; no dropout,
unknown token, prefixes, suffixes or byte fallback) whose merges produce ids in the merges'
order: tiktoken merges the pair whose result has the lowest id, `tokenizers` the pair that comes
first in `merges`, and for such a tokenizer these are one order. `build` checks that structure,
then encodes a probe set both ways (random pieces of the vocabulary, whitespace, digits,
punctuation, scripts, emoji) and uses the fast encoder only when every probe agrees. Anything
else — another model type, another pre-tokeniser, a mismatch, tiktoken not installed — keeps
`tokenizers`. Text with added tokens is never given to it: the caller splits those out first
(app/prefix/tokens.py, segments), and `build` refuses a tokenizer whose added tokens the caller
does not split at.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import unicodedata
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("prefixgate.tokens")

# GPT-2's pre-tokenisation regex: what `ByteLevel(use_regex=True)` splits with
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PROBES = 1500  # random probe texts checked at build, besides the fixed ones
_FIXED_PROBES = (
    "", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \t\n ", "Hello world", " leading", "trailing ",
    "it's we'll they're I'm you've he'd 'S 'LL", "numbers 12345 and 3.14159, 1e-9, 0x1F", "٣²½Ⅻ",
    "Ünïcödé — ✓ 中文 日本語 한국어 Ελληνικά русский עברית العربية हिन्दी", "e\u0301 ﬁ ß ẞ",
    "😀👍🏽🇺🇸🏳️‍🌈", "\u00a0\u2028\u2029\u3000\u200b\ufeff\x0b\x0c\x85\u1680\u2000\u205f",
    "code: def f(x):\n    return x  # ok\n", "{\"a\": [1, 2, {\"b\": null}]}", "<not special> <| x |>",
)
_PROBE_ALPHABET = (*"abcXYZ 019'\"sdmtlvre\n\t\r .,;:!?-_()[]{}<>|/\\#@$%^&*+=~`", "\u00a0", "\u3000",
                   "é", "e\u0301", "中", "文", "😀", "👍🏽", "٣", "²", "ß", "ﬁ", "\x0b", "\x85", "\u2028",
                   "'S", " 's", "  ", "\n\n", "\r\n")


class FastBPE:
    """tiktoken's encoder over the tokenizer's own vocabulary (ids are ranks)."""

    def __init__(self, encoding: Any, nfc: bool) -> None:
        self._encoding = encoding
        self._nfc = nfc

    def encode(self, text: str) -> array:
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        return array("I", self._encoding.encode_ordinary(text))

    def encode_many(self, texts: Iterable[str]) -> list[array]:
        return [self.encode(t) for t in texts]


def _byte_decoder() -> dict[str, int]:
    """The byte-level alphabet: the character that stands for each byte in vocabulary strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _pattern(pre: dict[str, Any] | None) -> str | None:
    """The pre-split regex when the pre-tokeniser is byte-level BPE's, else None."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        if pre.get("use_regex", True) and not pre.get("add_prefix_space", False):
            return GPT2_PATTERN
        return None
    if pre.get("type") != "Sequence":
        return None
    parts = pre.get("pretokenizers") or []
    if len(parts) != 2:
        return None
    split, level = parts
    regex = split.get("pattern", {}).get("Regex") if isinstance(split.get("pattern"), dict) else None
    if (split.get("type") != "Split" or not isinstance(regex, str) or split.get("behavior") != "Isolated"
            or split.get("invert", False)):
        return None
    if level.get("type") != "ByteLevel" or level.get("use_regex", True) or level.get("add_prefix_space", False):
        return None
    return regex


def _structure(spec: dict[str, Any]) -> tuple[dict[bytes, int], str, bool] | None:
    """(ranks, pattern, nfc) when `spec` (tokenizer.json) is a plain byte-level BPE, else None."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or model.get("unk_token") is not None:
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("byte_fallback"):
        return None
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pattern = _pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        return None
    decode = _byte_decoder()
    vocab: dict[str, int] = model.get("vocab") or {}
    try:
        ranks = {bytes(decode[ch] for ch in token): tid for token, tid in vocab.items()}
    except KeyError:
        return None  # a vocabulary string outside the byte-level alphabet
    if len(ranks) != len(vocab) or any(bytes([b]) not in ranks for b in range(256)):
        return None
    previous = -1
    for merge in model.get("merges") or []:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        tid = vocab.get(left + right)
        if tid is None or tid <= previous:
            return None  # a merge whose result is not next in id order: the two orders differ
        previous = tid
    return ranks, pattern, normalizer is not None


def _probes(vocab_strings: list[str], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = list(_FIXED_PROBES)
    for i in range(PROBES):
        if i % 2 and vocab_strings:  # runs of the vocabulary's own pieces: every merge path they take
            out.append("".join(rng.choice(vocab_strings) for _ in range(rng.randint(1, 24))))
        else:
            out.append("".join(rng.choice(_PROBE_ALPHABET) for _ in range(rng.randint(1, 48))))
    return out


BUILT_ENTRIES = 8  # tokenizers whose verdict a process keeps (a FastBPE holds its vocabulary's ranks)
_built: OrderedDict[tuple[bytes, frozenset[str]], FastBPE | None] = OrderedDict()
_built_lock = threading.Lock()


def build(tokenizer: Any, split_at: Iterable[str]) -> FastBPE | None:
    """A FastBPE equal to `tokenizer` on text without added tokens, or None (see the docstring).
    `split_at`: the strings the caller splits out before encoding; every added token must be one.
    The verdict is kept per process for the same tokenizer and splits: the probes cost ~80 ms of
    CPU with the built-in tokenizer, on every load (a FastBPE is immutable: shared)."""
    spec = tokenizer.to_str()
    key = (hashlib.blake2b(spec.encode(), digest_size=16).digest(), frozenset(split_at))
    with _built_lock:
        if key in _built:
            _built.move_to_end(key)
            return _built[key]
    fast = _build(tokenizer, spec, key[1])
    with _built_lock:
        _built[key] = fast
        while len(_built) > BUILT_ENTRIES:
            _built.popitem(last=False)
    return fast


def _build(tokenizer: Any, spec: str, split_at: frozenset[str]) -> FastBPE | None:
    try:
        import tiktoken
    except ImportError:
        return None
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    if not added <= split_at:
        return None
    try:
        structure = _structure(json.loads(spec))
        if structure is None:
            return None
        ranks, pattern, nfc = structure
        fast = FastBPE(tiktoken.Encoding("prefixgate-bpe", pat_str=pattern, mergeable_ranks=ranks,
                                         special_tokens={}), nfc)
        strings = tokenizer.decode_batch([[tid] for tid in range(min(tokenizer.get_vocab_size(), 1 << 17))])
        probes = [p for p in _probes([s for s in strings if s not in added]) if not any(a in p for a in added)]
        expected = [e.ids for e in tokenizer.encode_batch(probes, add_special_tokens=False)]
        for text, ids in zip(probes, expected, strict=True):
            if list(fast.encode(text)) != ids:
                log.info("fast BPE encoder off: it differs from the tokenizer on %r", text[:80])
                return None
    except Exception:  # noqa: BLE001 - an odd tokenizer keeps the tokenizer's own encoder
        log.debug("fast BPE encoder off", exc_info=True)
        return None
    return fast
