"""What a person needs to *see* a break, as plain data the Store can carry to every gateway pod.

The tracker keeps rendered prompts only in the memory of the pod that served the request; the
explorer page (`/ui`, docs/ui.md) may be answered by any pod. So at diagnosis time the pod that
holds both prompts writes, into the break's record, everything the page shows:

- where: block index and token offset (already in the record), the character offset, the line of
  the rendered prompt, and which message (index, role, line within its content) holds it;
- the structure of both prompts around that message: roles and lengths, never content;
- one window per side (previous / current) around the first divergent character, with marks:
  the dynamic value(s) at the divergence with their kind, or the differing run.

With `show_text` off (the default) a window is redacted to its shape (letters x, digits 9, each
dynamic value `<kind>`, app/prefix/diagnose.py `redact`) and the marks point into that redacted
string; with it on, the window is the prompt text and says which pod rendered it.
Pure functions; cost O(window + messages) plus one C-level newline count up to the divergence.
"""

from __future__ import annotations

import socket
from typing import Any

from app.prefix.diagnose import Diagnosis, redact
from app.prefix.dynamic import Span, get_detector
from app.prefix.sketch import Region, RequestSketch

POD = socket.gethostname()  # a Kubernetes pod's hostname is its name
BEFORE_CHARS = 160  # window before the divergence (cut back to a line start when one is near)
AFTER_CHARS = 240
STRUCTURE_AROUND = 12  # messages kept on each side of the divergent one (bounded record size)
DIFF = "diff"  # mark kind of a differing run that is no dynamic value
RUN_CHARS = 120
LINE_CLIP = 160  # chars each side of the divergence scanned for the previous side's value (~1 ms)


def break_view(prev: RequestSketch | None, cur: RequestSketch, diag: Diagnosis, show_text: bool,
               extra_patterns: tuple[str, ...] = ()) -> dict[str, Any]:
    """The record fields behind the page's break view (see the module docstring)."""
    d = diag.char_offset
    region, where = locate(cur, d)
    message = None
    if region is not None:
        line = cur.text.count("\n", region.start, d) + 1 if where == "content" else None
        message = {"index": region.index, "role": region.role, "where": where, "line": line}
    anchor = region.index if region is not None else 0
    cur_marks = [(s.start, s.end, s.kind) for s in diag.spans]
    if not cur_marks:
        cur_marks = [(d, _run_end(cur.text, d), DIFF)]
    view: dict[str, Any] = {
        "pod": POD,
        "line": cur.text.count("\n", 0, d) + 1,
        "message": message,
        "structure": {"cur": structure(cur, anchor), "prev": structure(prev, anchor) if prev else None},
        "view": {"text_shown": show_text,
                 "cur": window(cur.text, d, cur_marks, diag.spans, show_text),
                 "prev": None},
    }
    if prev is not None:
        prev_spans = _covering(get_detector(extra_patterns).find(*_line_of(prev.text, d)), d) if diag.spans else []
        prev_marks = [(s.start, s.end, s.kind) for s in prev_spans] or \
            [(d, _run_end(prev.text, d), DIFF)]
        view["view"]["prev"] = window(prev.text, d, prev_marks, prev_spans, show_text)
    return view


def locate(sketch: RequestSketch, offset: int) -> tuple[Region | None, str]:
    """The message whose content holds `offset` ("content"), else the next message after the
    template text that holds it ("template"; None past the last message)."""
    for region in sketch.regions:
        if region.start <= offset < region.end:
            return region, "content"
        if region.start > offset:
            return region, "template"
    return None, "template"


def structure(sketch: RequestSketch, anchor: int) -> dict[str, Any]:
    """Roles and content lengths of the messages around message `anchor`, and the totals."""
    kept = [r for r in sketch.regions if abs(r.index - anchor) <= STRUCTURE_AROUND]
    return {"chars": len(sketch.text), "messages": len(sketch.regions),
            "regions": [[r.index, r.role, r.end - r.start] for r in kept]}


def window(text: str, d: int, marks: list[tuple[int, int, str]], spans: list[Span] | Any,
           show_text: bool) -> dict[str, Any]:
    """`text` around `d` with `marks` as [start, end, kind] into the returned string. Redacted
    unless `show_text`: dynamic `spans` become `<kind>`, the rest keeps only its shape."""
    lo = max(0, d - BEFORE_CHARS)
    nl = text.find("\n", lo, d)
    if 0 <= nl < d - 24:
        lo = nl + 1  # start on a line when one starts in the window
    hi = min(len(text), d + AFTER_CHARS)
    replaced = [] if show_text else sorted((s for s in spans if lo <= s.start and s.end <= hi),
                                           key=lambda s: s.start)
    # (source start, source end, output start, output end) of each piece, in order; plain pieces
    # keep their length (redaction maps one character to one), a replaced span becomes `<kind>`
    pieces: list[str] = []
    segments: list[tuple[int, int, int, int]] = []
    cursor, out = lo, 0
    for span in replaced:
        if span.start < cursor:
            continue
        for src_end, piece in ((span.start, redact(text[cursor:span.start])), (span.end, f"<{span.kind}>")):
            pieces.append(piece)
            segments.append((cursor, src_end, out, out + len(piece)))
            cursor, out = src_end, out + len(piece)
    tail = text[cursor:hi]
    pieces.append(tail if show_text else redact(tail))
    segments.append((cursor, hi, out, out + len(tail)))

    def to_out(pos: int, closing: bool) -> int:
        for s0, s1, o0, o1 in segments:
            if pos < s1 or (pos == s1 and s1 == hi):
                if s1 - s0 == o1 - o0:
                    return o0 + max(0, pos - s0)
                return o1 if closing and pos > s0 else o0  # inside a replaced span: its whole token
        return out + len(tail)

    out_marks = []
    for start, end, kind in marks:
        a = to_out(max(lo, min(start, hi)), closing=False)
        b = to_out(max(lo, min(end, hi)), closing=True)
        out_marks.append([a, max(a, b), kind])
    return {"start": lo, "end": hi, "text": "".join(pieces), "marks": out_marks,
            "cut_before": lo > 0, "cut_after": hi < len(text)}


def _run_end(text: str, d: int) -> int:
    """End of the marked differing run from `d`: the end of its line, at most RUN_CHARS on.
    (Where the prompts re-align is no better: an alignment artefact can make it 1 char on one
    side and 90 on the other.)"""
    line_end = text.find("\n", d, d + RUN_CHARS)
    line_end = min(len(text), d + RUN_CHARS) if line_end < 0 else line_end
    return max(line_end, min(len(text), d + 1))


def _line_of(text: str, offset: int) -> tuple[str, int, int]:
    """`offset`'s line, clipped to LINE_CLIP chars each side: this runs on the event loop, and a
    1 MB single-line prompt must not be regex-scanned whole."""
    start = max(text.rfind("\n", 0, offset) + 1, offset - LINE_CLIP)
    end = text.find("\n", offset, offset + LINE_CLIP)
    return text, start, min(len(text), offset + LINE_CLIP) if end < 0 else end


def _covering(spans: list[Span], offset: int) -> list[Span]:
    return [s for s in spans if s.start <= offset <= s.end]
