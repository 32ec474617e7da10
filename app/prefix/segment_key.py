"""The key the token and chain memos file a segment under.

A dict keyed by a str hashes it with SipHash, once per str object: ~0.2 ms a MB. A prompt that is
one long message (a document and a question) is a new str object on every request, so both memos
paid that for every request that carried it. A long segment is keyed instead by its length and an
XXH3-128 of its UTF-8 (~0.02 ms a MB, hashed in place when ASCII: app/prefix/str_bytes.py). The
key is not trusted alone: each memo keeps the segment with its entry and compares it on a hit, so
two segments that share a key (XXH3 is not collision-resistant against a client crafting one) make
a miss, never a wrong entry.
"""

from __future__ import annotations

import threading
from typing import TypeVar

from app.prefix.str_bytes import xxh3_128_utf8

LONG_SEGMENT_CHARS = 4096  # shorter segments are their own key (hashing them costs ~1 µs)
RECENT_KEYS = 8  # long segments whose keys are kept, by identity: one walk asks for a key ~7 times

Key = str | bytes
V = TypeVar("V")

_recent: list[tuple[str, bytes]] = []
_lock = threading.Lock()


def segment_key(segment: str) -> Key:
    """`segment` itself when short, else its length and XXH3-128 (see the module docstring).

    The keys of the last RECENT_KEYS long segments are kept with the segments themselves and found
    by identity: a walk asks for the key of the same object in the chain memo, the token memo and
    again after encoding. The segments kept are those of the last requests and the memos' reuse
    candidates, which the memos hold anyway unless over budget."""
    if len(segment) <= LONG_SEGMENT_CHARS:
        return segment
    with _lock:
        for seen, key in _recent:
            if seen is segment:
                return key
    key = b"%d:" % len(segment) + xxh3_128_utf8(segment)
    remember(segment, key)
    return key


def remember(segment: str, key: Key) -> None:
    """Keep `key` as the key of this `segment` object: a memo returning a segment it holds (a
    candidate to reuse) knows its key, which the walk then asks for again."""
    if isinstance(key, bytes):
        with _lock:
            _recent.insert(0, (segment, key))
            del _recent[RECENT_KEYS:]


def held(entry: tuple[str, V] | None, segment: str) -> V | None:
    """The value of a memo's (segment, value) entry, found under `segment`'s key, when it is
    `segment`'s own; None when absent or another segment's."""
    return entry[1] if entry is not None and same_segment(entry[0], segment) else None


def same_segment(kept: str, segment: str) -> bool:
    """Whether the segment a memo kept under a key is `segment` (a memcmp; none for a short one:
    its key is itself)."""
    return kept is segment or len(segment) <= LONG_SEGMENT_CHARS or kept == segment
