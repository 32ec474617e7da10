"""A request's shape as keys, so that another gateway pod can diagnose against it (no text).

With several pods (or workers) one tenant's requests land on different pods, and the request a new
one must be compared with (its conversation's latest, or the tenant's latest) is often one this
pod never saw. Each tracker record therefore carries a `RequestDigest`: short keys of the lines of
the prompt's head (system prompt, tools, template text before the first turn), of each turn, and
of each tool, never text. `diagnose_digest` answers the same questions as the text diagnosis
(app/prefix/diagnose.py) at line precision: the changed line is found by its key, and the value
in it is read from the *current* prompt, which this pod has. Details: docs/diagnosis.md.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from app.prefix.conversation import TenantPast, continues, span_key
from app.prefix.diagnose import Diagnosis, Finding
from app.prefix.dynamic import (
    LINE_SCAN_CHARS,
    DynamicDetector,
    Span,
    counter_end,
    date_days,
    elapsed_value,
    get_detector,
    rolled_from,
)
from app.prefix.history_shape import (
    COMPACTED_MIN_MESSAGES,
    SUMMARY_IN_SYSTEM_CHARS,
    SUMMARY_MEMORY_CHARS,
    SUMMARY_REPLY_CHARS,
    HistoryKeys,
    first_exchange,
    history_compacted,
    opens_with_summary,
    restates_history,
    summary_alone,
    summary_memory,
    tail_start,
    trimmed,
)
from app.prefix.sketch import RequestSketch
from app.prefix.str_bytes import xxh3_128_utf8
from app.prefix.tool_text import (
    declares_name,
    schema_tools,
    schemas_reordered,
    templated_blocks,
    tool_entries,
    tools_span,
)
from app.prefix.transcript import SUMMARY_MIN_CHARS, grew_by_lines, summary_replaced
from app.prefix.value_change import (
    KEYED_KINDS,
    before_space,
    dynamic_kind,
    latest_entry,
    note_start,
    query_url,
    sentence_end,
    status_whole,
    token_span,
    value_token,
)
from app.prefix.value_kind import (
    keyed_value,
    match_score,
    named_tally,
    reads_as_status,
    value_kind,
    value_start,
    whole_value_start,
)

HEAD_LINES = 256  # head lines keyed per request (beyond: not compared)
MAX_TURNS = 64  # turn keys per request (the first ones: where trims and edits show)
LAST_TURNS = 16  # and the last ones past those (what a compaction keeps is at the end)
FIRST_TURN_MAX_CHARS = 64 * 1024  # a first user message longer than this is not keyed line by line
TAIL_LINES = 64  # lines of the last user turn keyed (a question placed before pasted documents)
LINE_KEY_BYTES = 6
LONG_UNIT = 4096  # a unit longer than this is keyed by its length and an XXH3-128 of the whole
MAX_SCHEMAS = 64  # JSON tool schemas in the head whose keys the digest keeps
DATE_REACH = 64  # chars each side of a year that a date holding it may span
DATE_WINDOWS = 64  # years looked at per head or first message (a head is read once; ~0.2 ms each)
SHORT_LINE = 120  # only a unit this short is read as `key: value` when no pattern matches
SHAPED_LINE = 160  # a unit's digits masked are kept up to this length (a tally with its heading; 120 before round 57)
MAX_DATES = 32  # units whose date (without a "today" cue) a record keeps, as day numbers
_YEARISH = re.compile(r"(?<!\d)(?:19|20)\d\d(?!\d)|\d\.\d{1,2}\.\d\d(?!\d)")  # cheap: may a date be here?


def _key(text: str) -> str:
    """A unit's key. A long one (a document pasted on one line) is keyed from its length and an
    XXH3-128 of all of it: ~0.03 ms a MB against ~0.25 ms for a CRC-32 and ~0.8 ms for blake2b
    over the whole, on every request that carries it. Two long units that differ inside share a
    key only when their 128-bit XXH3 collide (not adversarial: a client can only hide its own
    change from another pod's diagnosis)."""
    return _range_key(text, 0, len(text))


def _range_key(text: str, a: int, b: int) -> str:
    """`_key(text[a:b])`, slicing only a short unit (a long one is hashed in place)."""
    if b - a > LONG_UNIT:
        raw = b"%d\x00%s" % (b - a, xxh3_128_utf8(text, a, b))
    else:
        raw = text[a:b].encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=LINE_KEY_BYTES).hexdigest()


def head_end(sk: RequestSketch) -> int:
    return min(sk.first_history_start(), tail_start(sk), len(sk.text))


def head_lines(sk: RequestSketch) -> list[tuple[int, int]]:
    """(start, end) of the first HEAD_LINES lines of the head; a message's content ends a line
    (its last line is keyed without the template text that follows it)."""
    out: list[tuple[int, int]] = []
    end = head_end(sk)
    cuts = sorted(r.end for r in sk.regions if r.end < end)
    pos = 0
    text = sk.text
    while pos < end and len(out) < HEAD_LINES:
        nl = text.find("\n", pos, end)
        stop = end if nl < 0 else nl
        cut = next((c for c in cuts if pos < c < stop), None)
        if cut is not None:
            _sentences(text, pos, cut, out)
            pos = cut
            continue
        _sentences(text, pos, stop, out)
        pos = stop + 1
    return out[:HEAD_LINES]


SENTENCE_END = re.compile(r"(?<=[^\d\s][.!?])\s+(?=\S)")  # not after "9." (a German date)
# the same ends found from their punctuation (a scan at ~2 ms a MB; SENTENCE_END's look-behind is
# tried at every position, ~20 ms a MB): the match's space starts one after it
_PUNCT_SPACE = re.compile(r"[.!?]\s+(?=\S)")


def _sentence_ends(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each of SENTENCE_END's matches in `text[start:end]`, in order."""
    first = SENTENCE_END.match(text, start, end)  # space at `start` after a full stop before it
    pos = start
    if first is not None:
        yield first.span()
        pos = first.end()
    for m in _PUNCT_SPACE.finditer(text, pos, end):
        before = m.start() - 1
        if before >= 0 and not (text[before].isdigit() or text[before].isspace()):
            yield m.start() + 1, m.end()


def _sentences(text: str, start: int, end: int, out: list[tuple[int, int]]) -> None:
    """A long prose line is keyed sentence by sentence: the changed unit is then a sentence, short
    enough to be read as `key: value`."""
    if end - start <= SHORT_LINE:
        out.append((start, end))
        return
    pos = start
    for a, b in _sentence_ends(text, start, end):  # lazy: a 1 MB paragraph stops at HEAD_LINES
        out.append((pos, a))
        pos = b
        if len(out) >= HEAD_LINES:
            return
    out.append((pos, end))


def _sep(text: str, end: int) -> str:
    ch = text[end:end + 1]
    return "n" if ch == "\n" else "s" if ch.isspace() and ch else "e"


def last_turn_lines(sk: RequestSketch) -> list[tuple[int, int]]:
    """(start, end) of the first TAIL_LINES lines of the last user turn (documents pasted there)."""
    return _region_lines(sk, next((r for r in reversed(sk.regions) if r.role == "user"), None))


def first_turn_lines(sk: RequestSketch) -> list[tuple[int, int]]:
    """(start, end) of the first TAIL_LINES lines of the first user message (an agent's context
    block: a per-request value there is a dynamic value, not an edited turn)."""
    return _region_lines(sk, next((r for r in sk.regions if r.role == "user"), None))


def _region_lines(sk: RequestSketch, region: Any) -> list[tuple[int, int]]:
    if region is None:
        return []
    out: list[tuple[int, int]] = []
    pos = region.start
    while pos < region.end and len(out) < TAIL_LINES:
        nl = sk.text.find("\n", pos, region.end)
        stop = region.end if nl < 0 else nl
        out.append((pos, stop))
        pos = stop + 1
    return out


@dataclass(frozen=True)
class _Head:
    """The digest's part that only the head (system prompt, tools) decides: its units' keys, what
    ends each, the dates they hold without a cue."""

    lines: tuple[str, ...]
    seps: str
    dates: tuple[str, ...]
    schemas: tuple[tuple[str, str], ...]  # JSON tool schemas written into the head: (canonical, as written) keys
    shapes: tuple[str, ...]  # `<unit>:<key>` of each unit holding a digit, its digits masked (`_shape`)


def _shape(line: str) -> str | None:
    """The key of a line with its digit runs masked, when it holds a digit: two lines with equal
    shapes differ in their numbers only (a status line's readings, `status_readings`)."""
    return _key(_DIGITS.sub("#", line)) if _DIGITS.search(line) else None


_DIGITS = re.compile(r"\d+")


def _shape_of(digest: RequestDigest, index: int) -> str | None:
    """The masked key `_head_part` kept for a head unit, or None (no digit, or an older pod's record)."""
    prefix = f"{index}:"
    return next((e[len(prefix):] for e in digest.shapes if e.startswith(prefix)), None)


HEAD_MEMO_ENTRIES = 256  # heads read once per process: ~10 KB each (256 unit keys), ~2.5 MB at most
_head_memo: OrderedDict[bytes, _Head] = OrderedDict()
_head_lock = threading.Lock()


def _head_part(sk: RequestSketch) -> _Head:
    """The head's part of the digest, read once per distinct head: every turn of a conversation
    repeats its system prompt and tools, and reading them (line keys, the date detector on each
    unit) was ~1.7 ms a request in bench/agents_growth.py. Keyed by a hash of the head's text, the
    character after it (what ends the last unit) and the message ends inside it: the inputs of
    `head_lines`, `_sep` and `_unit_dates`. A head not seen before is read unit by unit
    (`_unit_part`): a head whose one line holds a per-request value reads that line only."""
    text = sk.text
    end = head_end(sk)
    cuts = sorted(r.end for r in sk.regions if r.end < end)
    key = hashlib.blake2b(text[:end + 1].encode("utf-8", "surrogatepass"), digest_size=16,
                          person=b"pg-head").digest() + repr(cuts).encode()
    with _head_lock:
        hit = _head_memo.get(key)
        if hit is not None:
            _head_memo.move_to_end(key)
            return hit
    units = head_lines(sk)
    parts = [_unit_part(text, a, b) for a, b in units]
    head = _Head(tuple(p.key for p in parts), "".join(p.sep for p in parts), tuple(_unit_dates(text, units, "h", parts)),
                 tuple((_key(c), _key(w)) for c, w, _, _ in schema_tools(text, 0, end)[:MAX_SCHEMAS]),
                 tuple(f"{i}:{p.shape}" for i, p in enumerate(parts) if p.shape is not None))
    with _head_lock:
        _head_memo[key] = head
        while len(_head_memo) > HEAD_MEMO_ENTRIES:
            _head_memo.popitem(last=False)
    return head


@dataclass(frozen=True)
class _UnitPart:
    """What one head unit gives the digest: its key, what ends it, its digits-masked key (short
    units holding a digit), and its first date without a cue as day numbers (`_unit_date`)."""

    key: str
    sep: str
    shape: str | None
    date: _UnitDate


UNIT_MEMO_ENTRIES = 4096  # head units read once per process (~0.6 KB each, ~2.5 MB at most)
UNIT_MEMO_CHARS = 512  # a longer unit is read every time (a document's line: rarely repeated in pieces)
UNIT_CONTEXT = 8  # chars before a unit that the patterns' look-behinds and `\b` may read (2 at most)
_unit_memo: OrderedDict[tuple[int, str], _UnitPart] = OrderedDict()


def _unit_part(text: str, a: int, b: int) -> _UnitPart:
    """A head unit's part, read once per distinct unit: keyed by the unit's text with the
    UNIT_CONTEXT chars before it and the char after it, all that its key, its end and its date
    read. A head that changes in one line (a timestamp on top) costs that line, not the head."""
    c0 = max(0, a - UNIT_CONTEXT)
    memo_key = (a - c0, text[c0:b + 1]) if b - a <= UNIT_MEMO_CHARS else None
    if memo_key is not None:
        with _head_lock:
            hit = _unit_memo.get(memo_key)
            if hit is not None:
                _unit_memo.move_to_end(memo_key)
                return hit
    unit = text[a:b]
    part = _UnitPart(_key(unit), _sep(text, b), _shape(unit) if b - a <= SHAPED_LINE else None,
                     _unit_date(text, a, b, DATE_WINDOWS))
    if memo_key is not None and not part.date.cut:
        with _head_lock:
            _unit_memo[memo_key] = part
            while len(_unit_memo) > UNIT_MEMO_ENTRIES:
                _unit_memo.popitem(last=False)
    return part


@dataclass
class RequestDigest:
    lines: list[str] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # every non-system message, in order
    tools: list[list[str]] = field(default_factory=list)  # [canonical key, as-sent key] per tool
    last: list[str] = field(default_factory=list)  # lines of the last user turn
    first: list[str] = field(default_factory=list)  # lines of the first user message
    seps: str = ""  # what ends each head unit: n(ewline), s(pace), e(nd of a message or the head)
    users: str = ""  # per turn: "u" a user message, "-" another role (an agent's pinned first exchange)
    # the whole history: its messages and characters, and its last LAST_TURNS keys and roles (the
    # first MAX_TURNS are in `turns`) -- what a compaction is told by
    history: list[int] = field(default_factory=lambda: [0, 0])
    last_turns: list[str] = field(default_factory=list)
    last_users: str = ""
    # "h<unit>:<day>,<day>" / "f<line>:..." for head units and first-user-message lines holding a
    # date without a "today" cue: another pod tells a date that rolled over by a day from an edit
    dates: list[str] = field(default_factory=list)
    # [canonical key, as-written key] of each JSON tool schema written into the head's text, in
    # order: another pod tells them reordered on one line (Mistral's `[AVAILABLE_TOOLS]`) or over
    # more lines than the head's units reach
    schemas: list[list[str]] = field(default_factory=list)
    # "<unit>:<key>" of each short head unit holding a digit, its digits masked: another pod tells a
    # line that changed in its numbers only (a status line) from one rewritten
    shapes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, sk: RequestSketch) -> RequestDigest:
        text = sk.text
        head = _head_part(sk)
        history = sk.history_regions()
        tail = history[MAX_TURNS:][-LAST_TURNS:]
        users = [r for r in history if r.role == "user"]
        first_user, last_user = (users[0], users[-1]) if users else (None, None)
        last = [_range_key(text, a, b) for a, b in last_turn_lines(sk)]
        first_lines = [] if first_user is None or first_user is last_user \
            or first_user.end - first_user.start > FIRST_TURN_MAX_CHARS else first_turn_lines(sk)
        return cls(
            dates=[*head.dates, *_unit_dates(text, first_lines, "f")][:MAX_DATES],
            schemas=[list(pair) for pair in head.schemas],
            shapes=list(head.shapes),
            lines=list(head.lines),  # the digest's own list: the memo's entry stays as it was
            seps=head.seps,
            turns=[span_key(r.role, text, r.start, r.end) for r in history[:MAX_TURNS]],
            users="".join("u" if r.role == "user" else "-" for r in history[:MAX_TURNS]),
            history=[len(history), sum(r.end - r.start for r in history)],
            last_turns=[span_key(r.role, text, r.start, r.end) for r in tail],
            last_users="".join("u" if r.role == "user" else "-" for r in tail),
            tools=[[_key(c), _key(r)] for c, r in zip(sk.tools_canon, sk.tools_raw, strict=True)],
            last=last,
            # a single-turn request's first user message is its last one: keyed once (1 MB: ~1 ms);
            # a long one (a pasted document, not a context block) is not keyed on every turn
            first=last if first_user is last_user else [_range_key(text, a, b) for a, b in first_lines],
        )

    def to_record(self) -> dict[str, Any]:
        return {"lines": self.lines, "turns": self.turns, "tools": self.tools, "last": self.last, "seps": self.seps,
                "users": self.users, "history": self.history, "last_turns": self.last_turns,
                "last_users": self.last_users, "first": self.first, "dates": self.dates, "schemas": self.schemas,
                "shapes": self.shapes}

    @classmethod
    def from_record(cls, rec: dict[str, Any] | None) -> RequestDigest | None:
        if not isinstance(rec, dict):
            return None
        try:
            return cls(lines=[str(x) for x in rec.get("lines") or []], turns=[str(x) for x in rec.get("turns") or []],
                       tools=[[str(a), str(b)] for a, b in rec.get("tools") or []],
                       last=[str(x) for x in rec.get("last") or []], seps=str(rec.get("seps") or ""),
                       # absent in a record from an older pod: no pinned exchange, compaction or context block
                       users=str(rec.get("users") or ""), history=[int(x) for x in rec.get("history") or [0, 0]][:2],
                       last_turns=[str(x) for x in rec.get("last_turns") or []],
                       last_users=str(rec.get("last_users") or ""), first=[str(x) for x in rec.get("first") or []],
                       dates=[str(x) for x in rec.get("dates") or []],
                       schemas=[[str(a), str(b)] for a, b in rec.get("schemas") or []],
                       shapes=[str(x) for x in rec.get("shapes") or []])
        except (TypeError, ValueError):
            return None


_KEY_SEP = re.compile(r"[:=#]")
_SUB_KEY = re.compile(r"[A-Za-z]\w*=(?=\w)")


def _value_start(text: str, span: Span) -> int:
    """Where the value of a span whose pattern includes its key begins ("Request ID: <v>",
    "ts=<v>", "turn <v>", "talking to <Name>")."""
    part = text[span.start:span.end]
    sep = _KEY_SEP.search(part)  # the key's own sign, not one inside the value (`a05979de:d85d:0:1`)
    if sep is not None:
        k = sep.end()
        while k < len(part) and part[k] in " \t\"'$€£":
            k += 1
        sub = _SUB_KEY.match(part, k)  # `Root=` in `X-Amzn-Trace-Id: Root=1-…`
        k = sub.end() if sub is not None else k
        if k < len(part):
            return span.start + k
    if span.kind in ("counter", "epoch"):
        k = next((i for i, ch in enumerate(part) if ch.isdigit()), 0)
        return span.start + k
    if span.kind == "user":
        k = next((i for i, ch in enumerate(part) if i > 0 and ch.isupper() and part[i - 1] == " "), 0)
        return span.start + k
    return span.start


@dataclass(frozen=True)
class _UnitDate:
    """The first date without a "today" cue in one unit, as sorted day numbers (empty: none), and
    how many of the years in it were looked at to find it; `cut`: the budget ran out before."""

    days: tuple[int, ...]
    years: int
    cut: bool = False


def _unit_date(text: str, a: int, b: int, budget: int) -> _UnitDate:
    """`_unit_dates`' reading of one unit, looking at `budget` years at most."""
    b = min(b, a + LINE_SCAN_CHARS)  # a longer unit is a document: its head only, as on every path
    detector = get_detector()
    years = 0
    for year in _YEARISH.finditer(text, a, b):  # the detector around each year, not over the unit
        if years >= budget:
            return _UnitDate((), years, cut=True)
        years += 1
        w0, w1 = max(a, year.start() - DATE_REACH), min(b, year.end() + DATE_REACH)
        span = next((s for s in detector.find(text, w0, w1)
                     if s.kind == "date" and dynamic_kind(text, a, s) is None), None)
        if span is not None:
            return _UnitDate(tuple(sorted(date_days(span.text))), years)
    return _UnitDate((), years)


def _unit_dates(text: str, units: list[tuple[int, int]], tag: str,
                parts: list[_UnitPart] | None = None) -> list[str]:
    """`tag<index>:<day numbers>` for the units holding a date that counts only with a "today" cue
    and has none (`As of 07/16/2026, ...`): the first such date of each, DATE_WINDOWS years looked
    at in all. `parts`: the units' memoised readings, when the caller has them."""
    out = []
    windows = DATE_WINDOWS
    for i, (a, b) in enumerate(units):
        date = parts[i].date if parts is not None else None
        if date is None or date.years > windows or date.cut:
            date = _unit_date(text, a, b, windows)  # read again within what is left of the budget
        if date.cut:
            return out
        windows -= date.years
        if date.days:
            out.append(f"{tag}{i}:" + ",".join(map(str, date.days)))
    return out


def _dates_of(digest: RequestDigest, tag: str, index: int) -> list[int]:
    """The day numbers `_unit_dates` kept for a unit of the digest's request (none: [])."""
    prefix = f"{tag}{index}:"
    entry = next((e for e in digest.dates if e.startswith(prefix)), "")
    return [int(x) for x in entry[len(prefix):].split(",") if x.isdecimal()]


def dynamic_candidates(detector: DynamicDetector, text: str, start: int, end: int,
                       earlier_days: list[int] | None = None) -> list[Span]:
    """The per-request values one line holds, judged from that line alone: detected values of the
    kinds the text diagnosis counts (volatile patterns, dates after a "today" cue, a date a day or
    a few after `earlier_days`, the previous request's date there), else, on a short `key: value`
    line, an epoch, nonce, week, flag or id token, or a weekday after a "today" cue. Without the
    previous text the changed token is unknown, so prose lines never yield a guessed token."""
    out: list[Span] = []
    end = min(end, start + LINE_SCAN_CHARS)  # a longer line is a document: its head only, as on every path
    for span in detector.find(text, start, end):
        kind = dynamic_kind(text, start, span)
        if kind is None and span.kind == "date" and earlier_days and rolled_from(earlier_days, span.text):
            kind = "date"
        if kind is not None:
            if kind == "elapsed":
                s0, e = elapsed_value(text, span)
                out.append(Span(s0, e, kind, text[s0:e]))
                continue
            s0 = _value_start(text, span) if kind in KEYED_KINDS else span.start
            # a counter is its number (`12` of `12 requests remaining`), as on the text path
            e = counter_end(text, s0, max(token_span(text, s0)[1], s0 + 1)) if kind == "counter" \
                else sentence_end(text, s0, span.end)
            out.append(Span(s0, e, kind, text[s0:e]))
    if out or end - start > SHORT_LINE:
        return _or_status(text, start, end, _or_latest_entry(text, start, end, out))
    pos = start
    while pos < end:
        if text[pos].isalnum():
            a, b = token_span(text, pos)
            a, b = value_token(text, a, b, b)  # as on the text path (where it changed is not known here)
            b = min(b, end)
            tok = text[a:b]
            kind = value_kind(text[start:a], tok, tok, text[b:end]) if tok else None
            if kind is not None:
                a = value_start(kind, text, a, b, start)  # `?0`: its key's sign is before the `?`
            keyed = keyed_value(text[start:a], text[b:end])
            if kind is not None and (keyed or kind in ("epoch", "week", "date", "counter", "port")
                                     or (kind == "nonce" and any(c.isdigit() for c in tok))):
                out.append(Span(a, b, kind, text[a:b]))
            pos = max(b, pos + 1)
        else:
            pos += 1
    return _or_status(text, start, end, _or_latest_entry(text, start, end, [_in_query_url(text, s) for s in out]))


def _in_query_url(text: str, span: Span) -> Span:
    """The whole URL when `span` lies in its query (a form's edit token: the link is the value, as
    on the text path; round 53), else `span`."""
    url = query_url(text, span.start, span.end)
    return span if url is None else Span(url[0], url[1], span.kind, text[url[0]:url[1]])


def _or_status(text: str, start: int, end: int, found: list[Span]) -> list[Span]:
    """`found`, or, when its values lie inside a short status that is the whole value of the `key:
    value` line `text[start:end]` ends (`status_whole`, judged by the first), that value whole, as
    the text path reads it."""
    if not found or text[end:end + 1] in (" ", "\t"):  # not a sentence of a longer line
        return found
    span = found[0]
    line0 = text.rfind("\n", 0, start) + 1
    at = whole_value_start(text[line0:span.start])
    if at is None:
        return found
    vstart, vend = line0 + at, before_space(text, line0 + at, end)
    if not status_whole(text, line0, vstart, vend, span) or any(s.end > vend for s in found):
        return found
    return [Span(vstart, vend, span.kind, text[vstart:vend])]


def _or_latest_entry(text: str, start: int, end: int, found: list[Span]) -> list[Span]:
    """`found`, or the value of a line whose key names the newest entry of a series, whole
    (`latest_entry`), as the text path reads it: when nothing else was found there, only an id that
    a note in brackets follows (`Perf. 3215 (The Snow Queen)`), or only values inside that note
    (`CB-26-0613 (Blaufichte 1,50–1,75 m)`: the entry's number changed, not the note's range)."""
    entry = latest_entry(text, start, end)
    if entry is None:
        return found
    if found:
        note = note_start(text, entry[0], entry[1])
        if note is None:
            return found
        id_before_note = len(found) == 1 and found[0].kind == "id" and found[0].end <= note
        if not id_before_note and not all(s.start >= note for s in found):
            return found
    return [Span(entry[0], entry[1], "id", text[entry[0]:entry[1]])]


def _status_value(text: str, start: int, end: int, tally_only: bool = False) -> list[Span]:
    """A `key: value` line that changed in its numbers only, read as a status line or a tally of
    named counts from this side (`reads_as_status`, `named_tally`; only the tally: `tally_only`): its
    whole value, a `counter`; [] otherwise."""
    at = whole_value_start(text[start:end])
    if at is None:
        return []
    vend = before_space(text, start + at, end)
    value = text[start + at:vend]
    whole = value and (named_tally(value, text[start:start + at])
                       or not tally_only and (reads_as_status(value) or match_score(value)))
    return [Span(start + at, vend, "counter", value)] if whole else []


def _tool_keys_change(prev: list[list[str]], cur: list[list[str]]) -> tuple[bool, bool]:
    from collections import Counter

    pc, cc = [c for c, _ in prev], [c for c, _ in cur]
    common = Counter(pc) & Counter(cc)

    def kept(items: list[list[str]]) -> list[tuple[str, str]]:
        left = Counter(common)
        out = []
        for c, r in items:
            if left[c] > 0:
                left[c] -= 1
                out.append((c, r))
        return out

    kp, kc = kept(prev), kept(cur)
    return kp != kc, Counter(pc) != Counter(cc)


def diagnose_digest(prev: RequestDigest, cur: RequestSketch, material: int = 96,
                    extra_patterns: tuple[str, ...] = (), past: TenantPast | None = None) -> Diagnosis:
    """Diagnose `cur` against a request known only by its digest (seen by another pod)."""
    past = past or TenantPast()
    detector = get_detector(tuple(extra_patterns))
    mine = RequestDigest.of(cur)
    bounds = head_lines(cur)
    reordered, set_changed = _tool_keys_change(prev.tools, mine.tools)
    tools_at = tools_span(cur)
    i = next((k for k, (a, b) in enumerate(zip(prev.lines, mine.lines, strict=False))
              if a != b or prev.seps[k:k + 1] != mine.seps[k:k + 1]), min(len(prev.lines), len(mine.lines)))
    head_changed = i < max(len(prev.lines), len(mine.lines))
    if head_changed and not (reordered or set_changed) \
            and (_summary_in_head(prev, mine, cur) or _summary_prepended(prev, mine, cur)):
        return Diagnosis("compaction", head_end(cur), [], None, "the history was replaced by a summary (line level)")
    system = cur.regions[0] if cur.regions and cur.regions[0].role == "system" else None
    if head_changed and system is not None and i < len(bounds) and bounds[i][0] >= system.end \
            and not (reordered or set_changed) and _summary_memory(prev, cur):
        # the system prompt whole: what differs is the template's text before the history's first
        # message, the model's (a summary) where it was the user's
        return Diagnosis("compaction", bounds[i][0], [], None, "the history was replaced by a summary (line level)")
    if head_changed:
        cd = bounds[i][0] if i < len(bounds) else head_end(cur)
        line_end = bounds[i][1] if i < len(bounds) else head_end(cur)
        rest_same = len(prev.lines) == len(mine.lines) and prev.lines[i + 1:] == mine.lines[i + 1:]
        if rest_same and tail_start(cur) - line_end < material and not (reordered or set_changed):
            if cur.kind == "chat" and cur.regions and not continues(cur, past):  # little follows: no loss
                return Diagnosis("new_session", cd, [], None, "a new conversation over the shared head")
            return Diagnosis(None, cd, detail="diverges in the part expected to vary")
        dropped = trimmed(prev.turns, mine.turns, first_exchange([u == "u" for u in prev.users]))
        if dropped and not (reordered or set_changed) and _note_rewritten(prev, mine, cur):
            return Diagnosis("compaction", cd, [], None, "the history was replaced by a summary (line level)")
        if system is not None and cd >= system.end and not (reordered or set_changed) and dropped:
            # the system prompt kept, a system note after it where the first turns were, the history
            # without them: the text path's front trim (`_Pair.classify`), not an edited template
            return Diagnosis("front_trim", cd, [], None, "history was cut or summarised at the front")
        in_tools = tools_at is not None and tools_at[0] - 32 <= cd <= tools_at[1] + 1
        if in_tools and reordered:
            extra = [Finding("template_change", cd, [], "tools added or removed")] if set_changed else []
            return Diagnosis("tool_order", cd, [], None, "same tools, different order (line level)", extra)
        if schemas_reordered(prev.schemas, mine.schemas) and _touches_schemas(cur, cd, line_end):
            return Diagnosis("tool_order", cd, [], None, "tool schemas written in the prompt text, other order")
        rest_p, rest_c = prev.lines[i:], mine.lines[i:]
        tail_p = 0
        while tail_p < min(len(rest_p), len(rest_c)) and rest_p[-1 - tail_p] == rest_c[-1 - tail_p]:
            tail_p += 1
        wp, wc = rest_p[:len(rest_p) - tail_p], rest_c[:len(rest_c) - tail_p]
        if len(wc) >= 2 and sorted(wp) == sorted(wc) and wp != wc:
            cur_lines = [cur.text[a:b] for a, b in bounds[i:i + len(wc)]]
            declaring = {key for key, line in zip(wc, cur_lines, strict=False) if declares_name(line)}
            text_of = dict(zip(wc, cur_lines, strict=False))  # the same lines: the earlier order's text from this one
            if tool_entries(cur_lines) or [k for k in wp if k in declaring] != [k for k in wc if k in declaring] \
                    or templated_blocks([text_of[k] for k in wp], cur_lines):
                return Diagnosis("tool_order", cd, [], None, "tools listed in the system text, other order")
            if i < len(bounds) and _within_schemas(cur, bounds[i][0], bounds[min(i + len(wc), len(bounds)) - 1][1]):
                return Diagnosis("tool_order", cd, [], None, "tool schemas written in the prompt text, other order")
            return Diagnosis("template_change", cd, [], None, "system prompt lines reordered")
        same_shape = len(prev.lines) == len(mine.lines) and prev.lines[i + 1:i + 2] == mine.lines[i + 1:i + 2]
        if same_shape and i < len(bounds):
            shape = _shape_of(mine, i)
            same_numbers_shape = shape is not None and shape == _shape_of(prev, i)
            # a tally changed in its counts is read whole first, as the text path reads it (round 72)
            spans = _status_value(cur.text, *bounds[i], tally_only=True) if same_numbers_shape else []
            spans = spans or dynamic_candidates(detector, cur.text, *bounds[i], _dates_of(prev, "h", i))
            if not spans and same_numbers_shape:
                spans = _status_value(cur.text, *bounds[i])
            if spans:
                later: list[Finding] = []
                for j in range(i + 1, min(len(mine.lines), len(bounds))):
                    if prev.lines[j] == mine.lines[j]:
                        continue
                    in_tools = tools_at is not None and tools_at[0] - 32 <= bounds[j][0] <= tools_at[1] + 1
                    cause = "tool_order" if in_tools and reordered else "template_change"
                    if all(f.cause != cause for f in later):
                        later.append(Finding(cause, bounds[j][0], [], "further down (line level)"))
                return Diagnosis("dynamic_head", spans[0].start, spans[:1], None,
                                 "a per-request value precedes static content (line level)", later)
        if in_tools and set_changed:
            return Diagnosis("template_change", cd, [], None, "tools added, removed or edited (line level)")
        pset, cset = set(prev.lines), set(mine.lines)  # shared in both directions: one short prompt is no match
        shared = min(len(pset & cset) / max(1, len(pset)), len(pset & cset) / max(1, len(cset)))
        if not continues(cur, past) and shared < 0.5:
            return Diagnosis("new_session", cd, [], None, "another agent's prompt: a new conversation")
        return Diagnosis("template_change", cd, [], None, "system prompt or template edited (line level)")
    if reordered and tools_at is None:
        return Diagnosis("tool_order", head_end(cur), [], None, "same tools, different order")
    pm, cm = prev.turns, mine.turns
    if len(cm) >= len(pm) and cm[:len(pm)] == pm:
        return Diagnosis(None, head_end(cur), detail="continues the previous prompt")
    if not (reordered or set_changed) and _compacted(prev, cur):
        return Diagnosis("compaction", head_end(cur), [], None, "the history was replaced by a summary")
    if trimmed(pm, cm, first_exchange([u == "u" for u in prev.users])):
        if not (reordered or set_changed) and _summary_heads(prev, mine, cur):
            return Diagnosis("compaction", head_end(cur), [], None, "the history was replaced by a summary (line level)")
        return Diagnosis("front_trim", head_end(cur), [], None, "history was cut or summarised at the front")
    m = next((k for k, (a, b) in enumerate(zip(pm, cm, strict=False)) if a != b), min(len(pm), len(cm)))
    turns = cur.history_regions()
    # only the first user message changed, the rest follows in place: a value in its context block?
    first_changed = m < len(turns) and turns[m] is next((r for r in turns if r.role == "user"), None) \
        and len(cm) >= len(pm) and cm[m + 1:len(pm)] == pm[m + 1:]
    if not continues(cur, past):
        in_place = _transcript_in_place(prev, mine, cur, reordered or set_changed)
        if in_place is not None:
            return in_place
        pushed = _last_turn_pushed(prev, mine, cur, detector, material)
        if pushed is not None:
            return pushed
        # the request before was that message alone (its lines keyed as its last turn)
        value = _first_turn_value(prev, mine, cur, detector, material) if first_changed and len(pm) == 1 else None
        if value is not None:
            return value
        return Diagnosis("new_session", head_end(cur), [], None, "a new conversation over the shared head")
    cd = turns[m].start if m < len(turns) else len(cur.text)
    if tail_start(cur) - cd < material:
        return Diagnosis(None, cd, detail="diverges in the part expected to vary")
    if first_changed:
        value = _first_turn_value(prev, mine, cur, detector, material)
        if value is not None:
            return value
    return Diagnosis("history_edit", cd, [], None, "an earlier turn was re-sent with other text")


def _transcript_in_place(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch,
                         tools_changed: bool) -> Diagnosis | None:
    """Only the newest user message changed, as a transcript kept in it changes (app/prefix/transcript.py):
    grown in place (no break), or its first lines replaced by a summary (a compaction)."""
    pm, cm = prev.turns, mine.turns
    if not pm or len(pm) != len(cm) or len(pm) != prev.history[0] or pm[:-1] != cm[:-1] \
            or prev.users[-1:] != "u" or mine.users[-1:] != "u":
        return None
    if grew_by_lines(prev.last, mine.last, capped=len(prev.last) >= TAIL_LINES):
        return Diagnosis(None, len(cur.text), detail="the newest message grew in place (line level)")
    bounds = last_turn_lines(cur)
    found = None if tools_changed else summary_replaced(prev.last, mine.last, [cur.text[a:b] for a, b in bounds])
    if found is None:
        return None
    if sum(b - a for a, b in bounds[found[0]:found[1]]) < SUMMARY_MIN_CHARS:
        return None
    return Diagnosis("compaction", bounds[found[0]][0], [], None, "the history was replaced by a summary (line level)")


def _first_turn_value(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch, detector: DynamicDetector,
                      material: int) -> Diagnosis | None:
    """Only the first user message changed, in one line followed by the same lines: a per-request
    value in the agent's context block when that line holds one and static text follows it."""
    if len(prev.first) != len(mine.first) or not mine.first:
        return None
    i = next((k for k, (a, b) in enumerate(zip(prev.first, mine.first, strict=True)) if a != b), None)
    if i is None or prev.first[i + 1:] != mine.first[i + 1:]:
        return None
    bounds = first_turn_lines(cur)
    if i >= len(bounds) or tail_start(cur) - bounds[i][1] < material:
        return None
    spans = dynamic_candidates(detector, cur.text, *bounds[i], _dates_of(prev, "f", i))
    if not spans:
        return None
    return Diagnosis("dynamic_head", spans[0].start, spans[:1], None,
                     "a per-request value in the first user message precedes static content (line level)")


def _compacted(prev: RequestDigest, cur: RequestSketch) -> bool:
    """`compacted` against a digest, whose head and tools the caller found unchanged: its history's
    size, and the keys it holds (the first MAX_TURNS and the last LAST_TURNS), for the kept user
    messages at its end."""
    history = cur.history_regions()
    if len(prev.history) != 2:
        return False
    if prev.history[0] >= COMPACTED_MIN_MESSAGES and summary_alone(cur):
        return True
    if _summary_memory(prev, cur):
        return True

    def keys() -> tuple[HistoryKeys, HistoryKeys]:
        first = list(zip((u == "u" for u in prev.users), prev.turns, strict=False))
        ph = first + list(zip((u == "u" for u in prev.last_users), prev.last_turns, strict=False))
        return ph, [(r.role == "user", span_key(r.role, cur.text, r.start, r.end)) for r in history]
    return history_compacted((prev.history[0], prev.history[1], len(history), sum(r.end - r.start for r in history)),
                             keys)


def _summary_memory(prev: RequestDigest, cur: RequestSketch) -> bool:
    """`summary_memory` against a digest that held a history: neither of the current history's two
    messages among the keys it kept (round 63)."""
    if len(prev.history) != 2 or not prev.history[0] or not summary_memory(cur):
        return False
    keys = {span_key(r.role, cur.text, r.start, r.end) for r in cur.history_regions()}
    return not keys & {*prev.turns, *prev.last_turns}


def _summary_heads(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch) -> bool:
    """`summary_heads_trim` against a digest, whose turns the caller found trimmed: the current
    history, shorter than the previous one, opens with a user message of SUMMARY_REPLY_CHARS or more
    the previous one did not hold."""
    history = cur.history_regions()
    if not mine.turns or not opens_with_summary(history):
        return False
    return len(history) < prev.history[0] and mine.turns[0] not in {*prev.turns, *prev.last_turns}


def _note_rewritten(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch) -> bool:
    """`summary_note_rewritten` against a digest: a system note after the system prompt whose first
    line was there before holds SUMMARY_REPLY_CHARS or more in lines the previous request did not
    have (a running summary rewritten as the history's first turns were dropped; round 55)."""
    if len(cur.regions) < 3 or cur.regions[0].role != "system" or cur.regions[1].role != "system" \
            or cur.regions[2].role == "system":
        return False
    note = cur.regions[1]
    seen = set(prev.lines)
    units = [(key, a, b) for key, (a, b) in zip(mine.lines, head_lines(cur), strict=False) if note.start <= a < note.end]
    if not units or units[0][0] not in seen:
        return False
    return sum(b - a for key, a, b in units if key not in seen) >= SUMMARY_REPLY_CHARS


def _summary_in_head(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch) -> bool:
    """`summary_in_system` against a digest: the head holds a system message of
    SUMMARY_IN_SYSTEM_CHARS or more, most of its lines new (where there was none, or the template's
    default one: the digest's head lines cannot tell which), the previous history
    (COMPACTED_MIN_MESSAGES or more) is gone but for its newest messages (one at least, at most half
    of it), and the current history, at most half as long and its new user message, ends with a
    user message (round 53)."""
    system = cur.regions[0] if cur.regions and cur.regions[0].role == "system" else None
    n = prev.history[0] if len(prev.history) == 2 else 0
    if system is None or system.end - system.start < SUMMARY_IN_SYSTEM_CHARS or n < COMPACTED_MIN_MESSAGES:
        return False
    if mine.users[-1:] != "u" or len(mine.turns) != len(cur.history_regions()):
        return False
    own = [key for key, (a, _) in zip(mine.lines, head_lines(cur), strict=False) if a < system.end]
    seen = set(prev.lines)
    if sum(key in seen for key in own) * 2 >= len(own):
        return False  # the system prompt was there before: an edit of it, not a summary put there
    ph = prev.turns if n <= MAX_TURNS else prev.turns + prev.last_turns
    cm = mine.turns
    kept = next((k for k in range(min(len(cm), len(ph)), 0, -1) if cm[:k] == ph[len(ph) - k:]), 0)
    return 1 <= kept and kept * 2 <= n and (len(cm) - 1) * 2 <= n  # a new conversation keeps no old turn


def _summary_prepended(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch) -> bool:
    """`summary_prepended` against a digest: the head is the previous one with a system message's
    lines put before the system prompt's (SUMMARY_MEMORY_CHARS or more of them new), and the
    history continues the previous one (COMPACTED_MIN_MESSAGES or more) whole (round 68)."""
    regions = cur.regions
    if len(regions) < 3 or regions[0].role != "system" or regions[1].role != "system" \
            or regions[2].role == "system" or len(prev.history) != 2 or prev.history[0] < COMPACTED_MIN_MESSAGES:
        return False
    if len(cur.history_regions()) <= prev.history[0] or mine.users[-1:] != "u" \
            or mine.turns[:len(prev.turns)] != prev.turns:
        return False
    bounds = head_lines(cur)
    j = next((n for n, (a, _) in enumerate(bounds) if a >= regions[0].start), len(bounds))  # the summary's first unit
    k = next((n for n, (a, _) in enumerate(bounds) if a >= regions[1].start), len(bounds))  # the system prompt's
    rest = mine.lines[k:]
    if not rest or mine.lines[:j] != prev.lines[:j] or rest != prev.lines[j:j + len(rest)]:
        return False
    seen = set(prev.lines)
    return sum(b - a for key, (a, b) in zip(mine.lines[j:k], bounds[j:k], strict=False)
               if key not in seen) >= SUMMARY_MEMORY_CHARS and restates_history(cur, regions[0].start, regions[0].end)


def _head_schemas(cur: RequestSketch) -> tuple[int, int, int]:
    """How many JSON tool schemas are written into the head, where the first starts and where the
    last ends (0, 0, 0: none)."""
    schemas = schema_tools(cur.text, 0, head_end(cur))
    if not schemas:
        return 0, 0, 0
    return len(schemas), min(a for _, _, a, _ in schemas), max(b for _, _, _, b in schemas)


def _touches_schemas(cur: RequestSketch, start: int, end: int) -> bool:
    """Does the changed unit `cur.text[start:end]` hold part of the JSON tool schemas written into
    the head (a list of them on one line starts and ends inside its unit)?"""
    n, lo, hi = _head_schemas(cur)
    return n >= 1 and start <= hi and lo <= end


def _within_schemas(cur: RequestSketch, start: int, end: int) -> bool:
    """Do the reordered lines `cur.text[start:end]` lie within JSON tool schemas written into the
    head (at least two of them there)?"""
    n, lo, hi = _head_schemas(cur)
    return n >= 2 and lo <= start and end <= hi


def _last_turn_pushed(prev: RequestDigest, mine: RequestDigest, cur: RequestSketch, detector: DynamicDetector,
                      material: int) -> Diagnosis | None:
    """A single-turn request whose last turn starts with a changed line and then repeats lines of
    the previous one (pasted documents): static text pushed behind a value or a question."""
    if len(mine.last) < 2 or len(prev.last) < 2 or mine.last[0] == prev.last[0]:
        return None
    bounds = last_turn_lines(cur)
    pset = set(prev.last[1:])
    j = next((k for k in range(1, len(mine.last)) if mine.last[k] in pset), None)
    if j is None:
        return None
    static = sum(b - a + 1 for (a, b), k in zip(bounds[j:], mine.last[j:], strict=False) if k in pset)
    if static < material:
        return None
    spans = dynamic_candidates(detector, cur.text, *bounds[0]) if j == 1 else []
    if spans:
        return Diagnosis("dynamic_head", spans[0].start, spans[:1], None,
                         "a per-request value precedes static content (line level)")
    return Diagnosis("question_first", bounds[0][0], [], None, "variable text precedes static text in the last turn")
