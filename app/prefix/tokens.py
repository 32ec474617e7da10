"""Tokenisation for fingerprints: segments, a bounded memo, and a worker pool for misses.

A rendered chat prompt is split at special-token boundaries (`<|im_start|>`, `<|im_end|>`, ...)
into segments. Hugging Face `tokenizers` extracts added tokens before normalising and
pre-tokenising, so for ChatML-style templates the ids of the whole prompt are the concatenation of
the ids of its segments. That lets the proxy memoise segment -> ids (a system prompt is encoded
once, not once per request) and encode only a new turn. The invariant does not hold for every
tokenizer (added tokens with lstrip/rstrip, SentencePiece "prepend to the first piece"): it is
verified at load on probe texts, and where it fails `segmented` is False and callers encode the
whole prompt instead.

Within a segment, tokenisation is incremental (docs/engine-hashing.md, "Incremental
tokenisation"): a long segment is encoded as pieces cut at *safe cuts*, positions no pre-token of
the tokenizer can span (`CUT_RE`: after a lone newline between two non-space characters, before
the last space of an indentation run, or inside a line before " word"), so its ids are the
concatenation of the pieces'. The memo keeps, per long segment, the char offset
and token index of each cut (`Cuts`); a new segment that shares a head with a memoised one (a
100 KB document whose last line changed) reuses the ids up to the last shared cut and encodes only
the tail. Whether the cut rule holds for a tokenizer is verified at load (`incremental`), like
segmentation.

Memory is bounded: the memo is an LRU over the bytes its entries hold (docs/memory.md).
"""

from __future__ import annotations

import re
import sys
import threading
import zlib
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR
from app.prefix.fast_bpe import FastBPE
from app.prefix.fast_bpe import build as build_fast_bpe
from app.prefix.pool import ColdPool, encode_texts
from app.prefix.resplit import Kept, SplitMemo
from app.prefix.segment_key import Key, held, remember, segment_key
from app.prefix.str_bytes import same_prefix
from app.prefix.strings import common_prefix_len
from app.prefix.template import ChatTemplate, load_chat_template

DEFAULT_MEMO_BYTES = 128 * 1024 * 1024
DEFAULT_SPLIT_MEMO_BYTES = 8 * 1024 * 1024  # resplit.py; the server's is a share of memory.budget_mb
DEFAULT_WORKERS = 2
APPROX_CHARS = 4  # approx mode: one pseudo-token per 4 characters

Ids = array  # array('I') of token ids

# Incremental tokenisation (see the module docstring). A safe cut is the end of a match of CUT_RE,
# one of three rules: (1) after a "\n" with a non-space character on each side (Python's \s is a
# superset of the Unicode White_Space the tokenizers' regexes use, so \S is non-space for them
# too); (2) before the last space of a whitespace run that an ASCII letter follows (code
# indentation), where the run's pre-token ends and " word" begins; (3) inside a line, before a
# single space and an ASCII letter after a non-space character (prose: "alpha| beta"), where no
# pre-token can take the space from the left and " beta" starts one. Why these are pre-token
# boundaries whatever follows or precedes: docs/engine-hashing.md.
CUT_RE = re.compile(r"\S\n(?=\S)|(?:\S|[ \t\n])(?= [A-Za-z])")
# chars between two recorded cuts (at least): on reuse, what lies between the last shared cut and
# the first changed character is encoded again (~0.1 ms per 256 chars of prose with the built-in
# tokenizer); a cut costs 16 bytes of memo (4 a token of ids: ~1/16 of them)
CUT_STRIDE = 256
INCREMENTAL_MIN_CHARS = 4096  # shorter segments are encoded whole and not indexed
HEAD_CHARS = 256  # a long segment is indexed by its first HEAD_CHARS chars
HEAD_CANDIDATES = 4  # most recent long segments kept per head


@dataclass(slots=True)
class Cuts:
    """Safe cuts of a memoised segment: `chars[j]` is a char offset, `toks[j]` the number of the
    segment's tokens before it (ascending, first cut > 0)."""

    chars: array  # array('Q')
    toks: array  # array('Q')

    def nbytes(self) -> int:
        return 16 * len(self.chars) + 160


@dataclass(slots=True)
class Reuse:
    """A memoised segment `prev` whose first `toks` ids are the ids of the new segment's first
    `chars` chars (a safe cut both share)."""

    prev: str
    ids: Ids  # prev's ids
    chars: int
    toks: int
    cuts_kept: int  # how many of prev's cuts lie at or before the cut (inherited by the new segment)


def find_cuts(text: str, start: int = 0, stride: int = CUT_STRIDE) -> list[int]:
    """Safe cuts of `text` after `start`, at least `stride` chars apart (C-speed regex scan)."""
    out: list[int] = []
    pos = start + stride
    search = CUT_RE.search
    last = start
    while pos < len(text):
        # a match ending at `pos` starts 2 chars before it; none ending at or before the last cut
        # can start after it, and none ending just past it exists (each rule's last char differs
        # from the other's first), so searching from `last` always advances
        m = search(text, max(last, pos - 2))
        if m is None:
            break
        last = m.end()
        out.append(last)
        pos = last + stride
    return out


class SegmentSplitter:
    """Splits text at special-token occurrences (leftmost, longest at a position), keeping each
    special token as its own segment. Scans per distinct 2-char prefix of the specials for its
    first character (`str.find` of one character is a memchr: ~0.01 ms a MB, where a 2-character
    needle takes ~0.7 ms), checking the prefix at each; text where that character is common (code,
    markup) goes on with the 2-character find after `FIRST_CHAR_MISSES` misses."""

    FIRST_CHAR_MISSES = 64

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
            for pos in self._occurrences(text, prefix):
                for s in candidates:
                    if text.startswith(s, pos):
                        hits.append((pos, s))
                        break
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

    def _occurrences(self, text: str, prefix: str) -> Iterator[int]:
        """Every position where `prefix` starts, in order."""
        first, misses = prefix[0], 0
        pos = text.find(first)
        while pos >= 0 and misses <= self.FIRST_CHAR_MISSES:
            if text.startswith(prefix, pos):
                yield pos
            else:
                misses += 1
            pos = text.find(first, pos + 1)
        if pos >= 0:  # the first character is common here: the prefix's own find from this one on
            pos = text.find(prefix, pos)
        while pos >= 0:
            yield pos
            pos = text.find(prefix, pos + 1)


# What one memo entry holds besides its text and ids (CPython 3.11, sys.getsizeof): the array
# header (80 B), the OrderedDict's slot and link (~100 B), the (segment, ids) tuple (56 + 16 B)
# and a long segment's bytes key (57 B; counted for every entry, an upper bound).
MEMO_ENTRY_OVERHEAD_BYTES = 310


# a head-index slot: list slot, its (segment, key) tuple (56 + 16 B), dict slot share (the head
# string is counted)
HEAD_ENTRY_BYTES = 192


def memo_entry_bytes(segment: str, ids: Ids, cuts: Cuts | None = None) -> int:
    """Bytes a memo entry really holds: the key string as stored (1, 2 or 4 bytes a character plus
    its header) and the ids (4 bytes each), plus the container overhead; a long segment's cuts and
    its head-index slot (head string + slot) too."""
    extra = 0
    if cuts is not None:
        extra = cuts.nbytes() + sys.getsizeof(segment[:HEAD_CHARS]) + HEAD_ENTRY_BYTES
    return sys.getsizeof(segment) + ids.itemsize * len(ids) + MEMO_ENTRY_OVERHEAD_BYTES + extra


class TokenMemo:
    """LRU segment -> ids, bounded in the bytes its entries hold (memo_entry_bytes). Thread-safe.

    Entries are filed under `segment_key` and keep their segment, which confirms a hit. Long
    segments stored with their `Cuts` are also indexed by head (their first HEAD_CHARS chars), so
    `candidates` finds the memoised segments a new one may share a long prefix with."""

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.reuses = 0  # misses served from a memoised prefix (only the tail encoded)
        self._data: OrderedDict[Key, tuple[str, Ids]] = OrderedDict()
        self._cuts: dict[Key, Cuts] = {}
        self._heads: dict[str, list[tuple[str, Key]]] = {}  # head -> (segment, key), oldest first
        self._lock = threading.Lock()

    def _find(self, segment: str) -> tuple[Key, Ids | None]:
        key = segment_key(segment)
        return key, held(self._data.get(key), segment)

    def _drop(self, key: Key) -> None:
        """Forget the entry under `key` (held): its bytes and its head-index slot."""
        segment, ids = self._data.pop(key)
        cuts = self._cuts.pop(key, None)
        self.bytes -= memo_entry_bytes(segment, ids, cuts)
        if cuts is None:
            return
        head = segment[:HEAD_CHARS]
        group = self._heads.get(head)
        if group is not None:
            group[:] = [(s, k) for s, k in group if k != key]
            if not group:
                del self._heads[head]

    def cuts(self, segment: str) -> Cuts | None:
        with self._lock:
            key, ids = self._find(segment)
            return self._cuts.get(key) if ids is not None else None

    def candidates(self, segment: str) -> list[tuple[str, Ids, Cuts]]:
        """Memoised long segments with the same head as `segment`, most recent first."""
        with self._lock:
            group = self._heads.get(segment[:HEAD_CHARS])
            if not group:
                return []
            found = [(s, k) for s, k in reversed(group) if k in self._data and self._data[k][0] is s]
            for s, k in reversed(found):  # the walk asks for a reused segment's key again
                remember(s, k)
            return [(s, self._data[k][1], self._cuts[k]) for s, k in found]

    def get(self, segment: str) -> Ids | None:
        with self._lock:
            key, ids = self._find(segment)
            if ids is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return ids

    def put(self, segment: str, ids: Ids, cuts: Cuts | None = None) -> None:
        cost = memo_entry_bytes(segment, ids, cuts)
        if cost > self.max_bytes:
            return
        key = segment_key(segment)
        with self._lock:
            if key in self._data:  # this segment again, or another under its key: replaced
                self._drop(key)
            self._data[key] = (segment, ids)
            if cuts is not None:
                self._cuts[key] = cuts
                group = self._heads.setdefault(segment[:HEAD_CHARS], [])
                group.append((segment, key))
                if len(group) > HEAD_CANDIDATES:
                    del group[0]  # still memoised, just no longer a reuse candidate
            self.bytes += cost
            while self.bytes > self.max_bytes and self._data:
                self._drop(next(iter(self._data)))
                self.evictions += 1

    def discard(self, segment: str) -> None:
        """Drop `segment` (superseded: a newer segment holds all but its last stride)."""
        with self._lock:
            key, ids = self._find(segment)
            if ids is not None:
                self._drop(key)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, segment: object) -> bool:
        if not isinstance(segment, str):
            return False
        with self._lock:
            return self._find(segment)[1] is not None


class SegmentTokenizer:
    """A `tokenizers.Tokenizer` plus its chat template, splitter, memo and worker pool."""

    TOKENIZER_IDS = True  # its ids are the tokenizer's own, so the fast BPE encoder may give them

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None, specials: Sequence[str],
                 memo_bytes: int = DEFAULT_MEMO_BYTES, workers: int = DEFAULT_WORKERS,
                 source: str = "default", split_memo_bytes: int = DEFAULT_SPLIT_MEMO_BYTES) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.source = source
        self.tokenizer_json: Path | None = None  # where `load` read it (a cold-prompt pool reloads it)
        self.cold: ColdPool | None = None  # cold tokenisations in a process pool (app/prefix/pool.py)
        self.splitter = SegmentSplitter(specials)
        self.memo = TokenMemo(memo_bytes)
        self.resplit = SplitMemo(self.splitter.split, self.splitter.specials, split_memo_bytes)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="prefixgate-tok")
        self._special_ids: dict[str, int] = {}
        for s in self.splitter.specials:
            tid = tokenizer.token_to_id(s)
            if tid is not None:
                self._special_ids[s] = tid
        self._special_chars = max(map(len, self._special_ids), default=0)
        self.fast: FastBPE | None = None  # set below, once the tokenizer's own encodes verified the rest
        self.segmented = verify_segmentation(self)
        self.incremental = self.segmented and not _added_tokens_span_cuts(tokenizer, self.splitter) \
            and verify_cuts(self)
        if self.segmented and self.TOKENIZER_IDS:
            self.fast = build_fast_bpe(tokenizer, self.splitter.specials)  # segments hold no added token

    @classmethod
    def load(cls, path: str | Path | None = None, memo_bytes: int = DEFAULT_MEMO_BYTES,
             workers: int = DEFAULT_WORKERS, split_memo_bytes: int = DEFAULT_SPLIT_MEMO_BYTES) -> SegmentTokenizer:
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
        out = cls(tokenizer, template, specials, memo_bytes, workers,
                  source=str(directory) if path is not None else "default", split_memo_bytes=split_memo_bytes)
        out.tokenizer_json = directory / "tokenizer.json"
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.cold is not None:
            self.cold.close()

    def special_id(self, segment: str) -> int | None:
        """The id of a special token segment. A longer segment is not looked up: a dict hashes a
        str whole (SipHash, ~0.2 ms a MB), and the memos key long segments without that."""
        return self._special_ids.get(segment) if len(segment) <= self._special_chars else None

    def known(self, segment: str) -> bool:
        """Whether the ids of `segment` are at hand without encoding (no LRU touch, no count)."""
        return self.special_id(segment) is not None or segment in self.memo

    def new_chars(self, segments: Sequence[str]) -> int:
        """Characters `encode_segments` would tokenise: unknown segments past their reusable head."""
        total = 0
        for seg in segments:
            if not self.known(seg):
                reuse = self.reuse(seg)
                total += len(seg) - (reuse.chars if reuse is not None else 0)
        return total

    # ------------------------------------------------------------------ encoding
    def split(self, text: str) -> list[str]:
        """Segments of `text` (a single segment when segmentation is not exact)."""
        if not self.segmented:
            return [text] if text else []
        return self.resplit.split(text)  # == self.splitter.split(text) (app/prefix/resplit.py)

    def split_walk(self, text: str) -> tuple[list[str], Kept | None, Kept | None]:
        """`split(text)` with the split memo's entries it continued and kept (SplitMemo.split_walk)."""
        if not self.segmented:
            return ([text] if text else []), None, None
        return self.resplit.split_walk(text)

    def encode(self, text: str) -> Ids:
        """The tokenizer's own single encode (add_special_tokens=False, as engines do for chat)."""
        return array("I", self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_plain(self, text: str) -> Ids:
        """Ids of text without added tokens (a segment or a piece of one): the same as `encode`,
        through the fast BPE encoder when the tokenizer has one (app/prefix/fast_bpe.py)."""
        return self.fast.encode(text) if self.fast is not None else self.encode(text)

    def encode_many(self, texts: list[str]) -> list[Ids]:
        """Several texts without added tokens at once: the fast encoder (which releases the GIL
        while it encodes), else `encode_batch`, without holding the GIL (see encode_segments)."""
        return encode_texts(self.tokenizer, self.fast, texts)

    def lookup(self, segment: str) -> Ids | None:
        """Known ids of a segment without encoding (specials are always known)."""
        tid = self.special_id(segment)
        if tid is not None:
            return array("I", (tid,))
        return self.memo.get(segment)

    # ------------------------------------------------------------------ incremental encoding
    def pieces(self, text: str, start: int = 0) -> list[int]:
        """Safe cuts of `text[start:]` (offsets in `text`) when it is long enough to index, else []."""
        if not self.incremental or len(text) - start < INCREMENTAL_MIN_CHARS // 2:
            return []
        return find_cuts(text, start)

    def reuse(self, segment: str) -> Reuse | None:
        """The memoised long segment sharing the longest cut-aligned prefix with `segment`."""
        if not self.incremental or len(segment) < INCREMENTAL_MIN_CHARS:
            return None
        best: Reuse | None = None
        for prev, ids, cuts in self.memo.candidates(segment):
            # a cut c is safe in both when the characters that decide it are shared: the match
            # before c and the look-ahead after it (" a" for rules 2 and 3), so c + 2 <= shared.
            # The usual candidate is the same document with another ending: its last cut that
            # fits is tried first, by one compare in place; else the shared prefix is measured.
            # A candidate equal to the segment is skipped (its cuts would make a tail to encode
            # of a segment the memo holds whole)
            j = bisect_right(cuts.chars, min(len(prev), len(segment)) - 2)
            at = cuts.chars[j - 1] + 2 if j else 0  # what the last cut that fits needs shared
            if j and same_prefix(prev, segment, at):
                if len(prev) == len(segment) and prev[at:] == segment[at:]:
                    continue
            else:
                shared = common_prefix_len(prev, segment)
                if shared == len(prev) == len(segment):
                    continue
                j = bisect_right(cuts.chars, shared - 2)
            if j and (best is None or cuts.chars[j - 1] > best.chars):
                best = Reuse(prev, ids, cuts.chars[j - 1], cuts.toks[j - 1], j)
                if len(segment) - best.chars <= 2 * CUT_STRIDE:
                    break  # the most recent candidate already leaves only a short tail
        return best

    @staticmethod
    def supersedes(reuse: Reuse) -> bool:
        """The segment encoded from `reuse` holds all of `reuse.prev` but its last stretch (the
        same document with another question at its end): keeping both would hold the document
        twice, and a pool of documents would thrash the memos (one entry a request, not a
        document). A request for `prev` again reuses the newer one the same way."""
        return len(reuse.prev) - reuse.chars <= 2 * CUT_STRIDE

    def _assemble(self, text: str, start: int, cuts: list[int], encoded: Sequence[Ids],
                  reuse: Reuse | None) -> tuple[Ids, Cuts | None]:
        """ids and Cuts of `text` from the encoded pieces of text[start:] (cut at `cuts`) and the
        reused prefix ids of text[:start]."""
        ids = array("I")
        if reuse is not None:  # one copy at C speed; unlike a slice, it leaves room for a short tail,
            # which a slice's first `extend` reallocated (in the server, often a second copy)
            ids.frombytes(memoryview(reuse.ids).cast("B")[:reuse.toks * ids.itemsize])
        chars, toks = array("Q"), array("Q")
        prev_cuts = self.memo.cuts(reuse.prev) if reuse is not None else None
        if reuse is not None and prev_cuts is not None:
            chars, toks = prev_cuts.chars[:reuse.cuts_kept], prev_cuts.toks[:reuse.cuts_kept]
        for i, piece in enumerate(encoded):
            if i:
                chars.append(cuts[i - 1])
                toks.append(len(ids))
            ids.extend(piece)
        long = len(text) >= INCREMENTAL_MIN_CHARS and self.incremental
        return ids, (Cuts(chars, toks) if long and chars else None)

    def _split_at(self, text: str, start: int, cuts: list[int]) -> list[str]:
        bounds = [start, *cuts, len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    def encode_segment(self, segment: str, reuse: Reuse | None = None) -> Ids:
        """Ids of one segment: memo, else encode now (caller decides whether that is affordable),
        only past `reuse.chars` when a memoised prefix is given. Plain encodes in this thread:
        the batch pool may be busy with a worker's long prompt (see `encode_small`)."""
        ids = self.lookup(segment)
        if ids is not None:
            return ids
        start = reuse.chars if reuse is not None else 0
        cuts = self.pieces(segment, start)
        encoded = [self.encode_plain(piece) for piece in self._split_at(segment, start, cuts)]
        ids, memo_cuts = self._assemble(segment, start, cuts, encoded, reuse)
        if reuse is not None:
            self.memo.reuses += 1
        self.memo.put(segment, ids, memo_cuts)
        return ids

    def encode_segments(self, segments: Sequence[str]) -> list[Ids]:
        """Ids for every segment; misses are encoded in one batch (each past the prefix it shares
        with a memoised segment, in pieces cut at safe cuts), without holding the GIL."""
        out: list[Ids | None] = [self.lookup(s) for s in segments]
        jobs: list[tuple[int, int, list[int], Reuse | None, int]] = []  # i, start, cuts, reuse, first piece
        texts: list[str] = []
        for i, ids in enumerate(out):
            if ids is not None:
                continue
            seg = segments[i]
            reuse = self.reuse(seg)
            start = reuse.chars if reuse is not None else 0
            cuts = self.pieces(seg, start)
            jobs.append((i, start, cuts, reuse, len(texts)))
            texts.extend(self._split_at(seg, start, cuts))
        if jobs:
            # in the cold-prompt process pool when there is one (app/prefix/pool.py); else
            # encode_batch, which releases the GIL (plain encode holds it for the whole call, which
            # would stall the event loop's relay for ~0.5 s per MB) and parallelises the pieces
            encoded = self._encode_cold(texts)
            for i, start, cuts, reuse, first in jobs:
                ids, memo_cuts = self._assemble(segments[i], start, cuts,
                                                encoded[first:first + len(cuts) + 1], reuse)
                if reuse is not None:
                    self.memo.reuses += 1
                self.memo.put(segments[i], ids, memo_cuts)
                out[i] = ids
        return [ids for ids in out if ids is not None]

    def _encode_cold(self, texts: list[str]) -> list[Ids]:
        """`encode_many`, in the cold-prompt pool when there is one and the work is big enough; in
        this thread when the pool fails (a child died: the pool restarts on its next use)."""
        if self.cold is not None and sum(map(len, texts)) >= self.cold.min_chars:
            try:
                return self.cold.encode(texts)
            except Exception:  # noqa: BLE001 - the same ids, just here
                pass
        return self.encode_many(texts)

    def encode_text(self, text: str) -> Ids:
        """Ids of free text (generated output) without touching the memo: such text is unique."""
        segments = self.split(text)
        specials = [self.special_id(s) for s in segments]
        misses = [s for s, tid in zip(segments, specials, strict=True) if tid is None]
        encoded = iter(self.encode_many(misses) if misses else [])
        out = array("I")
        for tid in specials:
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

    TOKENIZER_IDS = False  # pseudo-tokens of its own: no fast encoder

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.segmented = True  # consistent with itself by construction
        self.incremental = False  # 4-char blocks do not line up with newline cuts

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
        tid = st.special_id(segment)
        joined.extend(array("I", (tid,)) if tid is not None else st.encode(segment))
    return joined == st.encode(text)


def verify_segmentation(st: SegmentTokenizer) -> bool:
    """Segment memoisation is exact for this tokenizer (checked on probe prompts)."""
    if not st.splitter.specials:
        return True
    return all(concat_matches(st, p) for p in _probe_prompts(st))


_CUT_PROBE = (
    "def f(x):\n    return x\nprint(1)\n\nclass A:\n pass\n's\n's'\n123\n456\nÜber\n中文\n"
    "a.\nb!\n?x\n\n\ny\n \nz\n\tq\n--\n++\n  indented\nend\n"
    "prose one, two. three 4 five it's x' y é b) if = foo 中 文 a  b\tc end"
)


def pieces_match(st: SegmentTokenizer, text: str, cuts: Sequence[int]) -> bool:
    """True when encoding text cut at `cuts` piece by piece equals encoding it whole."""
    bounds = [0, *cuts, len(text)]
    joined = array("I")
    for a, b in zip(bounds, bounds[1:], strict=False):
        joined.extend(st.encode(text[a:b]))
    return joined == st.encode(text)


def _added_tokens_span_cuts(tokenizer: Tokenizer, splitter: SegmentSplitter) -> bool:
    """Whether an added token the splitter does not split out contains whitespace. Added tokens
    are matched in the raw text before pre-tokenisation, and every safe cut has whitespace on one
    side, so only such a token can cover a cut (a probe text would not find it)."""
    specials = set(splitter.specials)
    return any(t.content not in specials and any(ch.isspace() for ch in t.content)
               for t in tokenizer.get_added_tokens_decoder().values())


def verify_cuts(st: SegmentTokenizer) -> bool:
    """The safe-cut rule is exact for this tokenizer (every cut of the probe text, at once)."""
    return pieces_match(st, _CUT_PROBE, find_cuts(_CUT_PROBE, 0, stride=1))
