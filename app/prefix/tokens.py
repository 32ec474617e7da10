"""Tokenisation for fingerprints: segments, a bounded memo, and a worker pool for misses.

A rendered chat prompt is split at special-token boundaries (`<|im_start|>`, `<|im_end|>`, ...)
into segments. Hugging Face `tokenizers` extracts added tokens before normalising and
pre-tokenising, so for ChatML-style templates the ids of the whole prompt are the concatenation of
the ids of its segments. That lets the proxy memoise segment -> ids (a system prompt is encoded
once, not once per request) and encode only a new turn. The invariant does not hold for every
tokenizer (added tokens with lstrip/rstrip, SentencePiece "prepend to the first piece"): it is
verified at load on probe texts, and where it fails `segmented` is False and callers encode the
whole prompt instead.

Memory is bounded: the memo is an LRU over the bytes its entries hold (docs/memory.md).
"""

from __future__ import annotations

import sys
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR
from app.prefix.template import ChatTemplate, load_chat_template

DEFAULT_MEMO_BYTES = 128 * 1024 * 1024
DEFAULT_WORKERS = 2
APPROX_CHARS = 4  # approx mode: one pseudo-token per 4 characters

Ids = array  # array('I') of token ids


class SegmentSplitter:
    """Splits text at special-token occurrences (leftmost, longest at a position), keeping each
    special token as its own segment. Scans with `str.find` per distinct 2-char prefix of the
    specials, so a 1 MB prompt with a handful of specials costs well under a millisecond."""

    def __init__(self, specials: Sequence[str]) -> None:
        self.specials = sorted({s for s in specials if s}, key=lambda s: (-len(s), s))
        by_prefix: dict[str, list[str]] = {}
        for s in self.specials:
            by_prefix.setdefault(s[:2], []).append(s)
        self._by_prefix = by_prefix

    def split(self, text: str) -> list[str]:
        if not self._by_prefix or not text:
            return [text] if text else []
        hits: list[tuple[int, str]] = []
        for prefix, candidates in self._by_prefix.items():
            pos = text.find(prefix)
            while pos >= 0:
                for s in candidates:
                    if text.startswith(s, pos):
                        hits.append((pos, s))
                        break
                pos = text.find(prefix, pos + 1)
        if not hits:
            return [text]
        hits.sort(key=lambda h: (h[0], -len(h[1])))
        out: list[str] = []
        cursor = 0
        for pos, s in hits:
            if pos < cursor:
                continue  # overlapped by an earlier (longer) match
            if pos > cursor:
                out.append(text[cursor:pos])
            out.append(s)
            cursor = pos + len(s)
        if cursor < len(text):
            out.append(text[cursor:])
        return out


# What one memo entry holds besides its text and ids (CPython 3.11, sys.getsizeof): the array
# header (80 B) and the OrderedDict's slot and link (~100 B).
MEMO_ENTRY_OVERHEAD_BYTES = 180


def memo_entry_bytes(segment: str, ids: Ids) -> int:
    """Bytes a memo entry really holds: the key string as stored (1, 2 or 4 bytes a character plus
    its header) and the ids (4 bytes each), plus the container overhead."""
    return sys.getsizeof(segment) + ids.itemsize * len(ids) + MEMO_ENTRY_OVERHEAD_BYTES


class TokenMemo:
    """LRU segment -> ids, bounded in the bytes its entries hold (memo_entry_bytes). Thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._data: OrderedDict[str, Ids] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _cost(segment: str, ids: Ids) -> int:
        return memo_entry_bytes(segment, ids)

    def get(self, segment: str) -> Ids | None:
        with self._lock:
            ids = self._data.get(segment)
            if ids is None:
                self.misses += 1
                return None
            self._data.move_to_end(segment)
            self.hits += 1
            return ids

    def put(self, segment: str, ids: Ids) -> None:
        cost = self._cost(segment, ids)
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(segment, None)
            if old is not None:
                self.bytes -= self._cost(segment, old)
            self._data[segment] = ids
            self.bytes += cost
            while self.bytes > self.max_bytes and self._data:
                key, value = self._data.popitem(last=False)
                self.bytes -= self._cost(key, value)
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._data)


class SegmentTokenizer:
    """A `tokenizers.Tokenizer` plus its chat template, splitter, memo and worker pool."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None, specials: Sequence[str],
                 memo_bytes: int = DEFAULT_MEMO_BYTES, workers: int = DEFAULT_WORKERS,
                 source: str = "default") -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.source = source
        self.splitter = SegmentSplitter(specials)
        self.memo = TokenMemo(memo_bytes)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="prefixgate-tok")
        self._special_ids: dict[str, int] = {}
        for s in self.splitter.specials:
            tid = tokenizer.token_to_id(s)
            if tid is not None:
                self._special_ids[s] = tid
        self.segmented = verify_segmentation(self)

    @classmethod
    def load(cls, path: str | Path | None = None, memo_bytes: int = DEFAULT_MEMO_BYTES,
             workers: int = DEFAULT_WORKERS) -> SegmentTokenizer:
        """Load `tokenizer.json` (+ chat template) from a HF tokenizer directory; None = built-in."""
        directory = Path(path) if path is not None else DEFAULT_TOKENIZER_DIR
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        try:
            template: ChatTemplate | None = load_chat_template(path)
        except ValueError:
            template = None  # completions still work; chat falls back to the caller
        specials = list(template.special_tokens) if template is not None else []
        for added in tokenizer.get_added_tokens_decoder().values():
            if added.special:
                specials.append(added.content)
        return cls(tokenizer, template, specials, memo_bytes, workers,
                   source=str(directory) if path is not None else "default")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ encoding
    def split(self, text: str) -> list[str]:
        """Segments of `text` (a single segment when segmentation is not exact)."""
        if not self.segmented:
            return [text] if text else []
        return self.splitter.split(text)

    def encode(self, text: str) -> Ids:
        """The tokenizer's own single encode (add_special_tokens=False, as engines do for chat)."""
        return array("I", self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_many(self, texts: list[str]) -> list[Ids]:
        """Several texts at once, without holding the GIL (see encode_segments)."""
        return [array("I", e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def lookup(self, segment: str) -> Ids | None:
        """Known ids of a segment without encoding (specials are always known)."""
        tid = self._special_ids.get(segment)
        if tid is not None:
            return array("I", (tid,))
        return self.memo.get(segment)

    def encode_segment(self, segment: str) -> Ids:
        """Ids of one segment: memo, else encode now (caller decides whether that is affordable)."""
        ids = self.lookup(segment)
        if ids is None:
            ids = self.encode(segment)
            self.memo.put(segment, ids)
        return ids

    def encode_segments(self, segments: Sequence[str]) -> list[Ids]:
        """Ids for every segment; misses are encoded in one batch, without holding the GIL."""
        out: list[Ids | None] = [self.lookup(s) for s in segments]
        missing = [i for i, ids in enumerate(out) if ids is None]
        if missing:
            texts = [segments[i] for i in missing]
            # encode_batch releases the GIL (plain encode holds it for the whole call, which would
            # stall the event loop's relay for ~0.5 s per MB); it also parallelises several misses
            encoded = self.encode_many(texts)
            for i, ids in zip(missing, encoded, strict=True):
                self.memo.put(segments[i], ids)
                out[i] = ids
        return [ids for ids in out if ids is not None]

    def encode_text(self, text: str) -> Ids:
        """Ids of free text (generated output) without touching the memo: such text is unique."""
        segments = self.split(text)
        misses = [s for s in segments if s not in self._special_ids]
        encoded = iter(self.encode_many(misses) if misses else [])
        out = array("I")
        for segment in segments:
            tid = self._special_ids.get(segment)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(next(encoded))
        return out

    def count_special(self) -> int:
        return len(self._special_ids)


class ApproxTokenizer(SegmentTokenizer):
    """Character-block pseudo-tokens (one per 4 chars, crc32): the last-resort mode when no
    tokenizer matches the engine. Consistent with itself only; predictions are approximate."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.segmented = True  # consistent with itself by construction

    def encode(self, text: str) -> array:
        return array("I", (zlib.crc32(text[i:i + APPROX_CHARS].encode()) for i in
                           range(0, len(text), APPROX_CHARS)))

    def encode_many(self, texts: list[str]) -> list[array]:
        return [self.encode(t) for t in texts]


# ---------------------------------------------------------------------- verification

_PROBE_TEXTS = (
    "Hello world", " leading space", "trailing space ", "\n\nnewlines\n", "tabs\tand  spaces",
    "Ünïcödé — ✓ 中文 日本語", "code: def f(x):\n    return x  # ok\n", "", " ", "\n",
    "numbers 12345 and 3.14159", "<not special> <| also not |>",
)


def _probe_prompts(st: SegmentTokenizer) -> list[str]:
    prompts: list[str] = []
    specials = st.splitter.specials[:6]
    for i, text in enumerate(_PROBE_TEXTS):
        for s in specials:
            prompts.append(f"{text}{s}{_PROBE_TEXTS[(i + 1) % len(_PROBE_TEXTS)]}{s}{text}")
    if st.template is not None:
        try:
            prompts.append(st.template.render([
                {"role": "system", "content": "You are helpful.\n\n"},
                {"role": "user", "content": " Hi there\n"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Ünïcödé\tstuff  "},
            ], add_generation_prompt=True))
        except ValueError:
            pass
    return prompts


def concat_matches(st: SegmentTokenizer, text: str) -> bool:
    """True when encoding the segments of `text` one by one equals encoding it whole."""
    joined = array("I")
    for segment in st.splitter.split(text):
        tid = st._special_ids.get(segment)
        joined.extend(array("I", (tid,)) if tid is not None else st.encode(segment))
    return joined == st.encode(text)


def verify_segmentation(st: SegmentTokenizer) -> bool:
    """Segment memoisation is exact for this tokenizer (checked on probe prompts)."""
    if not st.splitter.specials:
        return True
    return all(concat_matches(st, p) for p in _probe_prompts(st))
