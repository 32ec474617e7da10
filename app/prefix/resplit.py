"""Splitting a prompt that continues a recent one: only what follows the shared part is scanned.

A growing conversation re-sends everything it sent before. The splitter (special-token cuts,
leftmost and longest at a position: `SegmentSplitter` in app/prefix/tokens.py) scans the whole
prompt and slices it into new strings on every request, and the memo walk then hashes each new
string again to look it up: O(prompt bytes) per request, ~2 ms at 900 KB. `SplitMemo` keeps the
segments of recent long prompts. A prompt that starts with one of them, through the end `cut` of a
special token and `lookahead` (the longest special's length - 1) characters past it, is split as
those segments (the same string objects, whose hashes Python has cached) plus a split of
`text[cut:]`. Anything else (an edit, a trim, a reordered tool list, another conversation) is
split in full.

Why that equals the full split: the splitter's greedy takes the hits left to right, the longest at
a position first, and skips a hit that starts inside the previous one. Whether there is a hit at a
position p < cut depends on text[p:p + longest], inside the verified prefix (p + longest <=
cut + lookahead): the hits before `cut` are those of the earlier prompt, so the greedy selects the
same ones and its cursor after them is `cut` (the end of a selected special). From there it sees
only hits at positions >= cut, exactly what a split of `text[cut:]` sees.
tests/test_resplit.py compares it with the full split on random growing, edited and trimmed texts.

Memory: one entry per conversation (a continuation replaces the entry it came from), LRU within a
byte cap carved from the token memo's share of `memory.budget_mb` (docs/memory.md). An entry is
counted as if it owned its strings (sys.getsizeof each); most are shared with the token memo's keys.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

MIN_CHARS = 32 * 1024  # shorter prompts split in microseconds: not kept
HEAD_CHARS = 256  # entries are found by the prompt's first characters
PER_HEAD = 16  # conversations over one head (system prompt + tools) kept at once
PROBE_CHARS = 32  # a long segment's tail, compared before the whole segment
ENTRY_OVERHEAD_BYTES = 300  # the entry, its tuple's header, the LRU and head-index slots


@dataclass(frozen=True)
class _Entry:
    head: str
    segments: tuple[str, ...]  # the prompt's segments through `cut`
    cut: int  # where they end: the end of a special token
    guard: str  # the `lookahead` characters after `cut`
    nbytes: int

    def continued_by(self, text: str) -> bool:
        """`text` holds this entry's segments, then its guard, from the start. A long segment's
        last characters are compared first: the same document with another question at its end
        fails there, not after a memcmp of the whole document."""
        if len(text) < self.cut + len(self.guard) or not text.startswith(self.guard, self.cut):
            return False
        pos = 0
        for seg in self.segments:
            n = len(seg)
            if n > PROBE_CHARS and not text.startswith(seg[-PROBE_CHARS:], pos + n - PROBE_CHARS):
                return False
            if not text.startswith(seg, pos):
                return False
            pos += n
        return True


class SplitMemo:
    """`split(text)` equal to `full(text)`, reusing the segments of a recent prompt it continues.
    Thread-safe (the walk runs on the loop, `prompt_ids` in worker threads)."""

    def __init__(self, full: Callable[[str], list[str]], specials: Collection[str], max_bytes: int,
                 min_chars: int = MIN_CHARS) -> None:
        self.full = full
        self.specials = frozenset(specials)
        self.lookahead = max((len(s) for s in self.specials), default=1) - 1
        self.max_bytes = max_bytes
        self.min_chars = min_chars
        self.bytes = 0
        self.hits = 0  # splits that reused a kept prompt's segments
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU, oldest first
        self._by_head: dict[str, list[int]] = {}  # head -> entry ids, newest first
        self._next = 0
        self._lock = threading.Lock()

    def split(self, text: str) -> list[str]:
        if len(text) < self.min_chars or not self.specials or self.max_bytes <= 0:
            return self.full(text)
        head = text[:HEAD_CHARS]
        with self._lock:
            candidates = [(k, self._entries[k]) for k in self._by_head.get(head, ())]
        best: tuple[int, _Entry] | None = None
        for key, entry in candidates:
            if (best is None or entry.cut > best[1].cut) and entry.continued_by(text):
                best = (key, entry)
        if best is None:
            segments = self.full(text)
        else:
            self.hits += 1
            segments = [*best[1].segments, *self.full(text[best[1].cut:])]
        self._remember(head, text, segments, best[0] if best is not None else None)
        return segments

    def _remember(self, head: str, text: str, segments: list[str], replaces: int | None) -> None:
        """Keep `segments` through their last special that has `lookahead` characters after it."""
        end = len(text)
        i = len(segments)
        while i > 0:
            seg = segments[i - 1]
            if seg in self.specials and end + self.lookahead <= len(text):
                break
            end -= len(seg)
            i -= 1
        if i == 0:
            return
        kept = tuple(segments[:i])
        guard = text[end:end + self.lookahead]
        nbytes = (sum(map(sys.getsizeof, kept)) + 8 * len(kept) + sys.getsizeof(head) + sys.getsizeof(guard)
                  + ENTRY_OVERHEAD_BYTES)
        if nbytes > self.max_bytes:
            return
        entry = _Entry(head, kept, end, guard, nbytes)
        with self._lock:
            if replaces is not None:
                self._drop(replaces)  # the conversation's previous prompt: this one holds it
            key = self._next
            self._next += 1
            self._entries[key] = entry
            ids = self._by_head.setdefault(head, [])
            ids.insert(0, key)
            self.bytes += nbytes
            while len(ids) > PER_HEAD:
                self._drop(ids[-1])
            while self.bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry.nbytes
        ids = self._by_head.get(entry.head)
        if ids is not None:
            ids.remove(key)
            if not ids:
                del self._by_head[entry.head]
