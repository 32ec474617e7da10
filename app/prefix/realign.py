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
TAIL_CHARS = 12  # a line's last characters: what the line filter compares
PROBES_BEFORE_FILTERS = 4  # failed probes before the previous prompt's line tails or pieces are gathered


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
    they are skipped (one failed scan instead of one per word start; the result is the same).

    A document with lines defeats that probe: a line is shorter than the reach of a probe, and the
    next anchor is the next line, so each line cost a scan (80 per request, ~38 ms for 1 MB). So,
    after PROBES_BEFORE_FILTERS failed probes, one of two filters is gathered from `prev` once, at
    C speed, and an anchor it rules out is skipped without a scan (the result is the same):
    - line tails, for an anchor whose line ends within `material`: the re-aligned run holds that
      line end, newline included, so `prev` holds a line ending the same way (`line_tails`);
    - sampled pieces, for a longer line from a line start: the anchor-long pieces of `prev` every
      `material - ANCHOR_CHARS + 1` characters. A run of `material` characters in `prev` holds one
      of them whole, so one of the pieces at the anchor's first that-many offsets is among them
      (`sampled_pieces`)."""
    p0 = d if pd is None else pd
    p1 = len(prev) if prev_end is None else min(len(prev), prev_end)
    reach = material - ANCHOR_CHARS  # how far ahead one probe rules anchors out
    ruled_out = -1  # anchors at or before this cannot re-align
    failed = 0  # probes that failed
    tails: set[str] | None = None  # line tails of prev where a run may lie, once probes keep failing
    pieces: set[str] | None = None  # the same for longer lines: pieces of prev sampled every `stride`
    stride = material - ANCHOR_CHARS + 1
    # an anchor closer than `material` to the end cannot re-align (`realign_at` wants that many
    # chars in common): on a short prompt most word starts are there
    for c in _anchors(cur, d + 1, len(cur) - material):
        if c <= ruled_out:
            continue
        anchor = cur[c:c + ANCHOR_CHARS]
        if len(anchor) < min(ANCHOR_CHARS, material) or not anchor.strip():
            continue
        if failed >= PROBES_BEFORE_FILTERS:
            end = cur.find("\n", c, c + material)
            if end - c >= TAIL_CHARS:
                if tails is None:
                    tails = line_tails(prev, p0, p1 + material)
                if cur[end - TAIL_CHARS:end] not in tails:
                    continue
            elif stride > 0 and cur[c - 1] == "\n":  # (word starts: the probe rules them out ten at a time)
                if pieces is None:
                    pieces = sampled_pieces(prev, p0, p1, stride)
                if pieces.isdisjoint([cur[i:i + ANCHOR_CHARS] for i in range(c, c + stride)]):
                    continue
        if reach > 0:
            probe = cur[c + reach:c + reach + ANCHOR_CHARS]
            # (a run whose anchor starts before p1 may hold the probe past p1, up to p1 + reach)
            if len(probe) == ANCHOR_CHARS and prev.find(probe, p0, p1 + reach) < 0:
                ruled_out = c + reach
                failed += 1
                continue
        found = realign_at(prev, cur, c, p0, material, p1)
        if found is not None:
            return found
    return None


def line_tails(text: str, start: int, end: int) -> set[str]:
    """The last TAIL_CHARS characters of every line of `text[start:end]` (shorter lines whole):
    every run of ≥ `material` characters found by a search from `start` to `end - material`
    holds its line ends, with their tails, inside that span."""
    return {line[-TAIL_CHARS:] for line in text[start:end].split("\n")}


def sampled_pieces(text: str, start: int, end: int, stride: int) -> set[str]:
    """The ANCHOR_CHARS-long pieces of `text` at `start`, `start + stride`, ...: a run of
    `stride + ANCHOR_CHARS - 1` characters or more that starts at or after `start`, and before
    `end - ANCHOR_CHARS` (where an anchor may start), holds one of them whole."""
    last = min(end - ANCHOR_CHARS + stride, len(text) - ANCHOR_CHARS + 1)
    return {text[m:m + ANCHOR_CHARS] for m in range(start, last, stride)}


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
