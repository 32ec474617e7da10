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

An entry also carries what its caller attached to it (`split_walk`, `attach`): the fingerprinter
keeps there the chain state its memo walk reached at the end of the entry's segments, so the next
turn's walk starts there instead of stepping through every kept segment again
(app/prefix/fingerprint.py). Whatever is attached goes with its entry.

Memory: one entry per conversation (a continuation replaces the entry it came from), LRU within a
byte cap carved from `memory.budget_mb` (docs/memory.md). An entry is counted as if it owned its
strings (sys.getsizeof each; most are shared with the token memo's keys), plus the bytes its
attachments declare.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from typing import Any

MIN_CHARS = 32 * 1024  # shorter prompts split in microseconds: not kept
HEAD_CHARS = 256  # entries are found by the prompt's first characters
PER_HEAD = 16  # conversations over one head (system prompt + tools) kept at once
PROBE_CHARS = 32  # a long segment's tail, compared before the whole segment
ENTRY_OVERHEAD_BYTES = 300  # the entry, its tuple's header, the LRU and head-index slots


class Kept:
    """One kept prompt: its segments through `cut` (the end of a special token), the `guard`
    characters after it, and what callers attached (key -> (value, bytes))."""

    __slots__ = ("head", "segments", "cut", "guard", "nbytes", "attached", "live")

    def __init__(self, head: str, segments: tuple[str, ...], cut: int, guard: str, nbytes: int) -> None:
        self.head = head
        self.segments = segments
        self.cut = cut
        self.guard = guard
        self.nbytes = nbytes
        self.attached: dict[Hashable, tuple[Any, int]] = {}
        self.live = True  # False once dropped: nothing more is attached to it

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
        self._entries: OrderedDict[int, Kept] = OrderedDict()  # LRU, oldest first
        self._by_head: dict[str, list[int]] = {}  # head -> entry ids, newest first
        self._next = 0
        self._lock = threading.Lock()

    def split(self, text: str) -> list[str]:
        return self.split_walk(text)[0]

    def split_walk(self, text: str) -> tuple[list[str], Kept | None, Kept | None]:
        """`split(text)`, with the kept prompt it continued (its segments are the first
        `len(continued.segments)` returned, the same objects) and the entry kept for `text` (its
        segments are the first `len(kept.segments)`), each None when there is none."""
        if len(text) < self.min_chars or not self.specials or self.max_bytes <= 0:
            return self.full(text), None, None
        head = text[:HEAD_CHARS]
        with self._lock:
            candidates = [(k, self._entries[k]) for k in self._by_head.get(head, ())]
        best: tuple[int, Kept] | None = None
        for key, entry in candidates:
            if (best is None or entry.cut > best[1].cut) and entry.continued_by(text):
                best = (key, entry)
        if best is None:
            segments = self.full(text)
        else:
            self.hits += 1
            segments = [*best[1].segments, *self.full(text[best[1].cut:])]
        kept = self._remember(head, text, segments, best[0] if best is not None else None)
        return segments, best[1] if best is not None else None, kept

    def attached(self, entry: Kept, key: Hashable) -> Any | None:
        """What was attached to `entry` under `key` (None: nothing)."""
        item = entry.attached.get(key)
        return item[0] if item is not None else None

    def attach(self, entry: Kept, key: Hashable, value: Any, nbytes: int) -> None:
        """Attach `value` (`nbytes` bytes, counted against the cap) to a kept entry; nothing when
        the entry was dropped meanwhile or the value alone would not fit."""
        with self._lock:
            if not entry.live or entry.nbytes + nbytes > self.max_bytes:
                return
            old = entry.attached.get(key)
            grown = nbytes - (old[1] if old is not None else 0)
            entry.attached[key] = (value, nbytes)
            entry.nbytes += grown
            self.bytes += grown
            while self.bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))

    def _remember(self, head: str, text: str, segments: list[str], replaces: int | None) -> Kept | None:
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
            return None
        if replaces is not None:
            with self._lock:
                same = self._entries.get(replaces)
                if same is not None and same.cut == end:  # the same prompt again (a retry): it stays kept,
                    self._entries.move_to_end(replaces)  # with what is attached to it
                    ids = self._by_head[head]
                    ids.remove(replaces)
                    ids.insert(0, replaces)
                    return same
        kept = tuple(segments[:i])
        guard = text[end:end + self.lookahead]
        nbytes = (sum(map(sys.getsizeof, kept)) + 8 * len(kept) + sys.getsizeof(head) + sys.getsizeof(guard)
                  + ENTRY_OVERHEAD_BYTES)
        if nbytes > self.max_bytes:
            return None
        entry = Kept(head, kept, end, guard, nbytes)
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
        return entry if entry.live else None

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        entry.live = False  # a caller holding it may still read what is attached (immutable values)
        self.bytes -= entry.nbytes
        ids = self._by_head.get(entry.head)
        if ids is not None:
            ids.remove(key)
            if not ids:
                del self._by_head[entry.head]
