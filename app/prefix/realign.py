"""Where two prompts agree again after they part: static content pushed back by something
variable (app/prefix/diagnose.py reads such a re-alignment as a break). The searches run at C
speed (`str.find`), bounded by windows after the divergence."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.prefix.strings import common_prefix_len

ANCHOR_CHARS = 24
MAX_ANCHORS = 160
NEAR_WINDOW = 512  # chars after the divergence where anchors are tried at every word start
LINE_WINDOW = 65_536  # beyond that, only at line starts


@dataclass
class Realignment:
    prev_offset: int
    cur_offset: int
    common: int  # chars equal from there on


_WORD_END = re.compile(r"[ \n\t\"'>:,.;]")  # an anchor follows one of these (a word start)


def _anchors(cur: str, start: int, last: int) -> list[int]:
    """`start`, the word starts in the NEAR_WINDOW characters after it, then line starts up to
    LINE_WINDOW, none past `last`: at most MAX_ANCHORS, half of them word starts (found by a regex
    scan, not a Python step per character)."""
    out: list[int] = []
    end = min(len(cur), start + NEAR_WINDOW, last + 1)
    if start < end:
        out.append(start)
        for m in _WORD_END.finditer(cur, start, end - 1):
            if len(out) >= MAX_ANCHORS // 2:
                break
            out.append(m.start() + 1)
    pos = cur.find("\n", end)
    while 0 <= pos < min(start + LINE_WINDOW, last) and len(out) < MAX_ANCHORS:
        out.append(pos + 1)
        pos = cur.find("\n", pos + 1)
    return out


def find_realignment(prev: str, cur: str, d: int, material: int, pd: int | None = None,
                     prev_end: int | None = None) -> Realignment | None:
    """The first place after `d` (in `cur`; `pd` in `prev`, default `d`) where `cur` continues with
    ≥ `material` chars also in `prev` after `pd` (and before `prev_end`, default its end): static
    content shifted by what differs there.

    A `find` that fails scans all of `prev` (1 MB: ~0.7 ms), and when nothing re-aligns (another
    document) every anchor fails. So before trying an anchor `c` it looks for the anchor-long
    piece at `c + material - ANCHOR_CHARS`: every re-alignment starting at or before it, and at or
    after `c`, contains that piece, so when `prev` does not, no anchor up to there can succeed and
    they are skipped (one failed scan instead of one per word start; the result is the same)."""
    p0 = d if pd is None else pd
    p1 = len(prev) if prev_end is None else min(len(prev), prev_end)
    reach = material - ANCHOR_CHARS  # how far ahead one probe rules anchors out
    ruled_out = -1  # anchors at or before this cannot re-align
    # an anchor closer than `material` to the end cannot re-align (`realign_at` wants that many
    # chars in common): on a short prompt most word starts are there
    for c in _anchors(cur, d + 1, len(cur) - material):
        if c <= ruled_out:
            continue
        anchor = cur[c:c + ANCHOR_CHARS]
        if len(anchor) < min(ANCHOR_CHARS, material) or not anchor.strip():
            continue
        if reach > 0:
            probe = cur[c + reach:c + reach + ANCHOR_CHARS]
            if len(probe) == ANCHOR_CHARS and prev.find(probe, p0, p1) < 0:
                ruled_out = c + reach
                continue
        found = realign_at(prev, cur, c, p0, material, p1)
        if found is not None:
            return found
    return None


def realign_at(prev: str, cur: str, c: int, p0: int, material: int, p1: int | None = None) -> Realignment | None:
    """`cur` from `c` re-aligned with `prev` after `p0` (the anchor before `p1`): the first of (at
    most three) places where `prev` holds the anchor starting at `c` and the two then agree for
    ≥ `material` chars."""
    anchor = cur[c:c + ANCHOR_CHARS]
    p1 = len(prev) if p1 is None else p1
    p = prev.find(anchor, p0, p1)
    tries = 0
    while p >= 0 and tries < 3:
        common = common_prefix_len(prev, cur, p, c)
        if common >= material:
            return Realignment(p, c, common)
        p = prev.find(anchor, p + 1, p1)
        tries += 1
    return None
