"""The per-request value at a divergence: the changed token, its kind and its span
(app/prefix/dynamic.py's patterns, keyed values, words and tokens that read as values), or
none when what changed reads as an edit."""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import zip_longest

from app.prefix.conversation import span_key
from app.prefix.dynamic import (
    LINE_SCAN_CHARS,
    NOW_CUE,
    VALUE_WINDOW,
    VOLATILE_KINDS,
    DynamicDetector,
    Span,
    duration_around,
    elapsed_value,
    moved_too_far,
    number_end,
    number_start,
    number_token,
    rolled_over,
)
from app.prefix.strings import common_prefix_len
from app.prefix.value_kind import (
    DECIMAL_NUMBER,
    LETTER_RUNS,
    RECORD_CHARS,
    RECORD_PARTS,
    SIGN,
    SIGN_OF_NUMBER,
    STAMP_CLOCK,
    STATUS_LETTERS,
    STATUS_VALUE_CHARS,
    after_state,
    clock_minutes,
    code_redrawn,
    in_running_time,
    is_dated,
    on_quarter_hour,
    random_looking,
    reads_as_value,
    status_readings,
    turn_value,
    value_kind,
    value_start,
    whole_value_change,
    whole_value_start,
    without_notes,
)

VALUE_CHARS = frozenset("-_.:/+~")
_HELD_FOR = re.compile(r"(?i)(?:seit|since|for)\s")  # how long a state has held (`läuft seit 2 Std. 11 Min.`)
KEYED_KINDS = frozenset({"id", "user", "epoch", "counter"})  # patterns that include the key's words
ALWAYS_DYNAMIC = VOLATILE_KINDS | {"email", "user", "custom"}


@dataclass(frozen=True)
class ValueChange:
    """What changed at a divergence where the prompts agree again right after one token: the
    per-request value (`span`, ending at `prev_end` in the previous prompt), or None when no rule
    judged the token one. `edit_at` says where a token no form judged changed (the line's text
    before it, as a stable key), so that a later request tells a value that changes there on every
    request from an edit made once."""

    span: Span | None
    prev_end: int
    edit_at: str | None = None


def _is_value_char(ch: str) -> bool:
    return ch.isalnum() or ch in VALUE_CHARS


_HEX = frozenset("0123456789abcdefABCDEF")


def _escape_at(text: str, i: int) -> bool:
    """Does a URL's percent escape (`%3A`) start at `i`, inside a token (a value character before it)?"""
    return (text[i] == "%" and i > 0 and _is_value_char(text[i - 1]) and i + 2 < len(text)
            and text[i + 1] in _HEX and text[i + 2] in _HEX)


def token_span(text: str, at: int) -> tuple[int, int]:
    """The value-like token around `at` (letters, digits, - _ . : / +, a URL's `%XX` escapes: an
    express-session cookie `s%3A…`), without end punctuation."""
    start = at
    while start > 0 and (_is_value_char(text[start - 1]) and text[start - 1] != "\n" or _escape_at(text, start - 1)):
        start -= 1
    end = at
    while end < len(text) and (_is_value_char(text[end]) or _escape_at(text, end)):
        end += 1
    while end > start and text[end - 1] in ".:,;":  # a clause's end, not an id's last `-` or `/`
        end -= 1
    if end - start >= 16:  # base64's padding belongs to its value (`…XtZcQ==`), a key's `=` does not
        pad = end
        while pad < len(text) and pad - end < 2 and text[pad] == "=":
            pad += 1
        if pad > end and (pad == len(text) or not _is_value_char(text[pad])):
            end = pad
        elif pad > end and (m := _B64_HALF_AFTER.match(text, pad)) is not None:
            end = m.end()  # two base64 halves joined by `:` (Nextcloud's requesttoken `…=:…=`)
    if end - start >= 16 and (m := _SIGNATURE_VERSION.search(text, max(0, start - 4), start)) is not None:
        start = m.start()  # a versioned signature (Standard Webhooks' `v1,<base64>`)
    if text[max(0, start - 2):start] == "=:":  # the second half: the first is part of the value
        first = start - 2
        while first > 0 and text[first - 1] == "=" and start - first < 4:
            first -= 1
        k = first
        while k > 0 and first - k < 4096 and (text[k - 1].isalnum() or text[k - 1] in "+/"):
            k -= 1
        if first - k >= 16:
            start = k
    return start, max(end, start)


def url_segment(text: str, start: int, end: int, at: int) -> tuple[int, int]:
    """The part of a URL token between the `/` before `at` and the next `/`, `?` or `#`; in the
    host, the label part between the `.` or `-` around `at` (a preview deployment's hash:
    `app-f9arh59jm-team.vercel.app`; round 24)."""
    seg_start = max(start, text.rfind("/", start, at) + 1)
    stops = [i for i in (text.find(c, at, end) for c in "/?#") if i >= 0]
    seg_end = min(stops, default=end)
    if text.startswith("//", seg_start - 2) and text.rfind("//", start, at) == seg_start - 2:  # the host
        seg_start = max(seg_start, text.rfind(".", seg_start, at) + 1, text.rfind("-", seg_start, at) + 1)
        seg_end = min([i for i in (text.find(c, at, seg_end) for c in ".-:") if i >= 0], default=seg_end)
    return seg_start, seg_end


_PART_TEXT = re.compile(r"[\w.,]+")  # a part's text: what is left is how the parts are set apart


def _parts_changed(prev: str, cur: str, value: tuple[int, int, int], kind: str, line0: int, line1: int,
                   pline1: int, stop: int | None) -> ValueChange | None:
    """A key line's value whole when it opens with the changed value and its later parts, set apart
    as before, changed too (a card payment's `{<GUID>} · £890.00 · NOTAUTHED` -> `{<GUID>} · £640.00 ·
    OK`: the entry, not its id; round 52), an entry short enough (`_holds_entry`). `stop`: where the
    message ends, when the line runs on into the template's text after it (the same in both)."""
    start, end, pend = value
    vs = whole_value_start(cur[line0:start])
    if vs is None or not all(not c.isalnum() for c in cur[line0 + vs:start]) or start - line0 - vs > 2:
        return None
    trailing = line1 - min(line1, stop) if stop is not None else 0
    vend, pvend = before_space(cur, end, line1 - trailing), before_space(prev, pend, pline1 - trailing)
    rest, prest = cur[end:vend], prev[pend:pvend]
    if rest == prest:  # before reading the parts: the rest of a one-line document is read at C speed
        return None
    signs = _PART_TEXT.sub("", rest)
    if signs != _PART_TEXT.sub("", prest) or not signs.strip():
        return None
    pstart = pend - (end - line0 - vs)
    if not (_holds_entry(cur[line0 + vs:vend]) and _holds_entry(prev[max(0, pstart):pvend])):
        return None
    return ValueChange(Span(line0 + vs, vend, kind, cur[line0 + vs:vend]), pvend)


_SIGNATURE_VERSION = re.compile(r"(?<![\w,])v\d{1,2},$")
_B64_HALF_AFTER = re.compile(r":[A-Za-z0-9+/]{16,}={0,2}(?![\w+/=])")


def sentence_end(text: str, start: int, end: int) -> int:
    """`end` without a full stop that ends the sentence ("at 5:00 PM." but not "P.M.")."""
    if end > start and text[end - 1] == "." and "." not in text[max(start, end - 4):end - 1]:
        return end - 1
    return end


def dynamic_kind(text: str, line0: int, span: Span) -> str | None:
    """The kind a detected span counts as per-request with, or None: volatile kinds always, a
    date only after a "today / current / date:" cue on its line (a fixed policy date is static),
    and a date with a clock time as a timestamp (it changes within the day)."""
    kind = span.kind
    if kind == "date" and re.search(r"\d[:h]\d\d|\s\d{1,2}\.\d\d$", span.text):  # `, 21.46` ends it too
        kind = "timestamp"
    if kind in ALWAYS_DYNAMIC or kind == "time" or NOW_CUE.search(text, line0, span.start):
        return kind
    return None


def changed_value(detector: DynamicDetector, prev: str, cur: str, pd: int, cd: int,
                  stop: int | None = None, earlier_turn: bool = False,
                  edits: set[str] | frozenset[str] = frozenset(), message_start: int | None = None) -> ValueChange | None:
    """The per-request value that differs at (pd, cd), as a span of `cur` (the value only, not its
    key or line), and where it ends in `prev` (`ValueChange`, its span None when one token, or a
    key line's value, changed that no rule judged); None when more than one token differs
    elsewhere. `stop`: where the message holding `cd` ends (its line ends there, not in the
    template text after it). `earlier_turn`: `cd` is in a user turn before the last (`turn_value`
    judges a token there). `edits`: the places (`ValueChange.edit_at`) where something changed in
    the tenant's recent requests: what changes there again is a per-request value (an edit is made
    once). A value found here keeps its place too (round 24: a queue's `1 waiting, longest 3:45`
    read as a value, then `no callers waiting` at the same key). `message_start`: where the system
    message holding `cd` starts (`_header_record`)."""
    change = _changed_value(detector, prev, cur, pd, cd, stop, earlier_turn, edits, message_start)
    if change is None or change.span is None:
        return change
    if change.span.kind == "counter":  # with the capacity it is read against (`1.43 MW of 2.50 MW`)
        span, end = change.span, _with_capacity(cur, change.span.end)
        change = ValueChange(Span(span.start, end, span.kind, cur[span.start:end]),
                             _with_capacity(prev, change.prev_end), change.edit_at)
    if (status := _status_value(prev, cur, pd, change.span, stop)) is not None:
        change = status  # the short status line the number is part of, whole
    place = change.edit_at or value_place(cur, change.span.start)
    if place in edits:  # changed here before: the key's value changed, all of it that did
        change = _whole_line(prev, cur, pd, change.span, change.prev_end, stop) or change
    return ValueChange(change.span, change.prev_end, place)


def _whole_line(prev: str, cur: str, pd: int, span: Span, pend: int, stop: int | None) -> ValueChange | None:
    """The whole value of the `key: value` line holding `span` when more of it changed after the
    span and the prompts agree again after the line (`11.6 km S` -> `15.3 km SSW`: one reading,
    not a number and a secondary finding); None otherwise."""
    (line0, line1), (pline0, pline1) = line_bounds(cur, span.start), line_bounds(prev, pd)
    value = _line_value(prev, cur, pline0, pline1, line0, line1, span.start, stop)
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    start, end, _, vpend = value
    if cur[span.end:end] == prev[pend:vpend]:
        return None
    return ValueChange(Span(start, end, span.kind, cur[start:end]), vpend)


_STATUS_WORD = re.compile(r"[^\W\d_]{3,}")
_FUNCTION_WORDS = frozenset({"the", "and", "von", "der", "die", "das", "und"})
_OWN_KEY = re.compile(r"(?:[\w\]][=:]|[=/])$")  # a number's own key inside the value (`dur=114.1`, `0-24/158`)
_ENTRY_NOTE = re.compile(r" [·•|–—/] [^\n]{1,40}| \([^()\n]{1,40}\)")  # what an entry is, after its id
# what may lead an entry's id: a word or two and a number's sign (`Raffle #05153 / Miss FNPF / FJ$2`, `Fahrt Nr.
# 590`; round 83), or three words and the sign, a word an abbreviation with its dots (`B.A.A. store order #288290 –
# …`; round 88)
_LEAD_WORD = r"[^\W\d_](?:[\w'’-]{1,20}|(?:\.[^\W\d_])+\.)"
_ENTRY_LEAD = re.compile(rf"(?:(?:{_LEAD_WORD} ){{1,2}}({SIGN_OF_NUMBER} ?)?|(?:{_LEAD_WORD} ){{3}}({SIGN_OF_NUMBER} ?))?")
STATUS_KEY_WORDS = 2  # a status line's label: `Casks:`, `Court timer:`


def _status_value(prev: str, cur: str, pd: int, span: Span, stop: int | None) -> ValueChange | None:
    """The whole value of the `key: value` line holding `span` when it is a short status on both
    sides (`status_whole`); None otherwise."""
    (line0, line1), (pline0, pline1) = line_bounds(cur, span.start), line_bounds(prev, pd)
    value = _line_value(prev, cur, pline0, pline1, line0, line1, span.start, stop)
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    start, end, pstart, pend = value
    if _status_too_long(prev, pstart, pend) or not status_whole(cur, line0, start, end, span):
        return None
    return ValueChange(Span(start, end, span.kind, cur[start:end]), pend)


def status_whole(text: str, line0: int, start: int, end: int, span: Span) -> bool:
    """Is `span`, a value read alone, part of a short status that is the whole value
    `text[start:end]` of the `key: value` line starting at `line0` (round 44)? The client writes
    the status whole on each request (`Court timer: court 1, 36:24 left of 60 min`, `Casks: 12 of
    20 raised today`, `Kiln: cooling, unpack in 7 h 59 min`, `Ticket: MZ26-00364 · family of 4`):
    an id with what the entry is after it, a time running in the status's words (`RUNNING_TIME`,
    words before it), or a number in a value holding two words of its own after a label of
    STATUS_KEY_WORDS words at most. Not a random token (its key's words are no part of it), a
    timestamp (a log line's stamp: `_log_line` reads the line), a number after a key of its own in
    the value (`retrieval;dur=114.1`), or one in a URL."""
    if span.kind == "nonce" or _status_too_long(text, start, end) or not start <= span.start < span.end <= end \
            or (start, end) == (span.start, span.end):
        return False
    if (stamp := stamp_of(text, start, end)) is not None and span.end <= stamp.end(1):
        return True  # the clock a status is stamped with, first (with its day's date: round 65): the status whole
    if span.kind == "timestamp":
        return False
    if span.kind == "id" and (lead := _ENTRY_LEAD.fullmatch(text, start, span.start)) is not None \
            and (_ENTRY_NOTE.fullmatch(text, span.end, end) or span.end == end and (lead.group(1) or lead.group(2))):
        return True  # an id, what the entry is after it; or an entry's number, its words and its sign before it
    if in_running_time(text, span.start, span.end, start, end) and STATUS_LETTERS.search(text, start, span.start):
        return True
    words = [w for w in _STATUS_WORD.findall(f"{text[start:span.start]} {text[span.end:end]}")
             if w.lower() not in _FUNCTION_WORDS]
    return len(words) >= 2 and len(text[line0:start].strip().rstrip(":=").split()) <= STATUS_KEY_WORDS \
        and "://" not in text[start:end] and any(c.isdigit() for c in span.text) \
        and not _OWN_KEY.search(text, start, span.start)


# a status stamped with its clock first (after a word: `Stand 18:03 Uhr`), then set apart by a sign, what
# it says (`15:01 · T1 Otis (border terrier) drying (18') · T2 …`, `08:59 | Dev with Amira K. till 09:45 |
# …`; round 50): as long as its entries make it; not a range (`14:00 – 15:30`; after a dot or a bar its first part
# may open with another clock, a train's: `Wed 11:18 · 10:55 from Polmear left …`, round 61), but it may open with a count
# (`10:36 · 9/14 day launches out · …`; round 53); a clock written with a dot is one with `Uhr` (`07.13 Uhr · Büro
# zu · …`; round 54), not a price
# (its clock may name its zone: `Thu 18:40 BST · tide 1.6 m …`, round 64; a day's date may come before it: `Mi
# 16.12. 11:40 Uhr · Bühne ab 16:00 Uhr: …`, round 65; or in words, `Sat 30 May 21:59 · …`, and the clock may
# read to the second, `Mo 16:38:57 · …`, round 68; `»` and a `;` glued to the clock set it apart too, `SA 02:04 »
# Main Stages Ende » …`, `Thu 21/05 17:11; afternoon session in; …`, its date may be a day and month with a slash,
# a place's name and a comma may come before it, `Bahn Echo, 11:55:51 Uhr: …`, and a clock to the second, which no
# rule writes, needs no sign, `Wed 12 Aug 22:41:56 SHOW DOWN at 22:30 / …`, round 69; the place may be up to
# three words and a number, its date followed by a comma, `Zoo Palast 1, 21.02., 09:13 Uhr | läuft: …`, round 70;
# the place, a day's name and a date may each come, set apart by a dot or a comma, and `→` sets the clock apart,
# `Paulaner Festzelt · Sa 03.10. · 08:50 Uhr → …`, `West Holts, Sun 28 Jun 23:20 | …`, round 71; a sign of any
# kind, a bullet, an arrow, a shape, a dingbat, may set the clock apart, `So 5.7. 11:09 Uhr ▹ Spitze: …`, `Dispatch
# 19:54 ⇒ …`, and two words may name the place before it, `WSP Koblenz 21:34 – km 590,3: …`, round 72; any sign but
# prose's punctuation, brackets, quotes and the signs of sums and money (`SIGN`), runic punctuation too, `Thu 18 Feb
# ᛫ 14:45 ᛫ …`, and such a sign or a dash may set the date apart from the clock, `Sat 14 Nov – 14:19 GMT – …`, round
# 73; such a sign may set the place apart too, `Flora Day ‖ 09:27 ‖ …`, a date in brackets may follow it, `SU26 day 4
# (Thu 23 Jul) ∷ 08:55 BST ∷ …`, and a month may be written in Roman numerals, `6.XI. ⊳ 8:39 Uhr ⊳ …`, round 74; a
# day's word or a name before the clock may hold digits and be up to 20 characters long, `TT26 Sat 30 May ┊ 10:23 ┊
# …`, `Fasnetsdienstag 17.02. ◆ 9:47 Uhr ◆ …`, round 75; the clock may be in twelve hours (`CLOCK_12`) and name its
# zone, the month may come before the day (then a sign sets the date apart: a log line's `Jul 24 15:29:20 pppd[812]:`
# is no board), and the day's name in brackets after the date, `Stampede ✦ Sat Jul 3 ✦
# 2:35 p.m. MDT ✦ …`, `Puck Fair ☘ Thu 12 Aug (Scattering Day) ☘ 9.03pm ☘ …`, round 76; the date may be given again
# in a second language after a slash, `RWS27 ❧ Tue 20 Jul / Maw 20 Gorff ❧ 2.02pm / 2.02yp ❧ …`, and, from the
# conventions themselves, a day's number may be ordinal, `Sat 20th Jul`, a date may hold its year, `20.07.2026`,
# `20/07/26`, or be ISO 8601's, `2026-07-20`, round 77; or the day, month and year set apart by dashes, as
# India and much of Europe write them, `08-11-2027`, round 80; the place may be four words, an event and its
# day's name, `JUNKANOO New Year's Day ~ 6:26 a.m. ~ …`, round 81; a day counted in the festival's run in place of
# a date, `Hibiscus Festival · Day 5 of 9 · 16:10 FJT · …`, round 83)
_STAMP_SIGN = rf"(?:{SIGN}|::)"  # a sign, or a doubled colon (`Gallimarkt Donnerstag :: 08:39 :: …`; round 82)
# a dash, or a hyphen or two typed for one (`KADOOMENT road board - 5:41 pm AST - …`, `Sat, Jan 17 -- 12:55 PM PHT
# -- …`; round 84)
_DASH = r"(?:[–—]|--?)"
# the place: up to five words (an event on its place, `Regatta Day on Quidi Vidi: 10:49 a.m. NDT; …`, five words
# and a colon since round 85), and a number; an `@` or a bracket may set the clock after it, a colon after the clock
# (a report stamped with its place and clock, `Kisama control room @ 9:16 pm: …`, `Meldung der Einsatzzentrale
# (17.21 Uhr): …`; round 86)
_STAMP_PLACE = (rf"[^\W\d_][\w'’.-]{{1,20}}(?: [^\W\d_][\w'’.-]{{1,20}}){{0,4}}(?: \d{{1,2}})?"
                rf"(?:, | {_STAMP_SIGN} | {_DASH} |: | @ | \(|(?=\())")
_ORDINAL = r"(?:st|nd|rd|th)?"
# a festival's day counted in its run, in place of a date (`Day 5 of 9`, `Tag 3 von 10`, `Day 5/9`; round 83), or
# its number alone with the day's name in brackets (`Day 1 (Emancipation Day)`; round 85)
_DAY_OF_RUN = r"[^\W\d_]{3,9} \d{1,2}(?:(?: (?:of|von|de|sur) |/)\d{1,2}| \([^\W\d_][^()\n]{1,24}\))"
_STAMP_DATE = (rf"(?:(?:\d{{1,2}}\.(?:\d{{1,2}}|[IVX]{{1,4}})\.(?:\d{{2}}|\d{{4}})?|\d{{1,2}}(?:{_ORDINAL}|\.) (?:de )?[^\W\d_]{{3,9}}\.?"
               r"|\d{1,2}/\d{1,2}(?:/\d{2,4})?|\d{4}-\d\d-\d\d|\d{1,2}-\d{1,2}-(?:\d{4}|\d{2})"
               r"|\((?:[^\W\d_]{2,3} )?\d{1,2} [^\W\d_]{3,9}\))(?: \([^\W\d_][^()\n]{1,24}\))?"
               r"(?: / (?:[^\W\d_]\w{1,19}\.? )?\d{1,2} [^\W\d_]{3,9}\.?)?"
               rf"(?:,? | {_STAMP_SIGN} | {_DASH} )|[^\W\d_]{{3,9}} \d{{1,2}}{_ORDINAL} (?:{_STAMP_SIGN}|{_DASH}) "
               rf"|{_DAY_OF_RUN}(?:,? | {_STAMP_SIGN} | {_DASH} ))")
# the clock read out in words in brackets after it, before the sign (`08:39 (Viertel vor neun) :: …`; round 82)
_CLOCK_IN_WORDS = r"(?: \([^()\n]{1,30}\))?"
# what sets the stamp apart from the board
_STAMP_AFTER = (rf"{_CLOCK_IN_WORDS}"
                rf"(?: (?:{_STAMP_SIGN} |{_DASH} (?!\d{{1,2}}[:.]\d\d))|; |\)?: |(?:(?<=\d:\d\d:\d\d)|(?<=\d:\d\d:\d\d Uhr)):? )\S")
# the words before the date: a day's name, with a comma after it or not (`Montag, 29. Juli`, `Sat, Jan 17`; round 84),
# a sign after them (`PERAHERA Randoli Perahera, final night :: 8.55 p.m. :: …`; round 85)
_DAY_WORDS = rf"(?:(?:[^\W\d_]\w{{1,19}}\.?,? ){{1,2}}(?:{_STAMP_SIGN} )?)?"
_STAMPED_CLOCK = re.compile(rf"(?:{_STAMP_PLACE})?{_DAY_WORDS}(?:{_STAMP_DATE})?"
                            rf"((?:{STAMP_CLOCK})(?: [A-Z]{{2,4}})?){_STAMP_AFTER}")
# after a date, a clock written with a dot alone (an Austrian programme's `Mi 18.08. ♫ 21.01 ♫ …`; round 78): a date
# before it makes it no price
_STAMPED_DATED = re.compile(rf"(?:{_STAMP_PLACE})?{_DAY_WORDS}{_STAMP_DATE}"
                            rf"((?:[01]?\d|2[0-3])\.[0-5]\d(?: [A-Z]{{2,4}})?){_STAMP_AFTER}")
# a report stamped `as of` its clock, first or after its place, a comma, a colon or a dash after the clock (`As
# of 9:48 a.m., Class 7 of 22 is being judged`, `Show Control advisory as of 6:31 a.m.: …`; round 87)
_AS_OF_STAMP = re.compile(rf"(?:[^\W\d_][\w'’.-]{{1,20}}(?: [^\W\d_][\w'’.-]{{1,20}}){{0,4}} )??[Aa]s (?:of|at) "
                          rf"((?:{STAMP_CLOCK})(?: [A-Z]{{2,4}})?)(?:,|:| {_DASH}) \S")
# a clock in brackets with the day's short name before it, then the board's words (`[So 12:44] Wäldchestag – nächste
# Straßenbahn … in 6 Min.`; round 89): the day is the stamp's own
_BRACKETED_DAY_STAMP = re.compile(r"\[[^\W\d_]{2,3}\.? ((?:[01]?\d|2[0-3]):[0-5]\d)\] (?=[^\W\d_])")
_SIGN_AFTER = re.compile(rf"{_CLOCK_IN_WORDS} (?:{_STAMP_SIGN}|{_DASH}) ")  # a sign that sets a stamp apart from what follows it


def stamp_of(text: str, start: int, end: int) -> re.Match[str] | None:
    """The stamp `text[start:end]` opens with, its clock as group 1: a clock (`_STAMPED_CLOCK`), or a
    dotted clock after a date (`_STAMPED_DATED`), a clock after `as of` (`_AS_OF_STAMP`), or a clock in
    brackets with its day's short name (`_BRACKETED_DAY_STAMP`)."""
    return _STAMPED_CLOCK.match(text, start, end) or _STAMPED_DATED.match(text, start, end) \
        or _AS_OF_STAMP.match(text, start, end) or _BRACKETED_DAY_STAMP.match(text, start, end)


STAMPED_STATUS_CHARS = 320  # a board of several entries (`Fri 14:35 · Fell View: … · Beck Cottage: …`; 160 before round 55, 240 before 58)


def _status_too_long(text: str, start: int, end: int) -> bool:
    """Is `text[start:end]` too long to be a status read whole? Its length leaves out its notes in
    brackets (`next fell walk at 09:30 (in 13 h 42 min)`: a countdown to its clock, round 48;
    `[10:10] tuning at Pontesbury (Blüthner upright), done ~10:15`, round 49), unless it holds a
    date (a log line's `active (running) since Tue 2026-05-05 09:12:44 BST`); it may be
    STAMPED_STATUS_CHARS long stamped with its clock first, STATUS_VALUE_CHARS otherwise. A year
    alone in a stamped board names what it is of (`Mo 13:13 Uhr · Zibelemärit 2027: Markt offen ·
    …`; round 67), no date."""
    value = text[start:end]
    stamp = stamp_of(text, start, end)
    # the stamp's own date is the board's when a sign sets the stamp apart (`ITC ✧ 03/06/2027 09:42:52 AKST ✧ …`;
    # round 78) or brackets hold it (`[So 12:44] …`; round 89); a date after it is a log's, and a dated stamp with its
    # message after a space a log line's
    own_date = stamp is not None and (_SIGN_AFTER.match(text, stamp.end(1)) is not None or stamp.re is _BRACKETED_DAY_STAMP)
    if is_dated(text[stamp.end(1):end] if own_date else value, year=stamp is None):
        return len(value) > STATUS_VALUE_CHARS
    stamped = stamp is not None
    return len(without_notes(value)) > (STAMPED_STATUS_CHARS if stamped else STATUS_VALUE_CHARS)


def agree_after(prev: str, cur: str, p: int, c: int) -> bool:
    """Do the prompts agree again right after `p` (previous) and `c` (current): 4 characters, or
    to the end of the shorter one?"""
    return common_prefix_len(prev, cur, p, c) >= min(4, len(cur) - c, len(prev) - p)


def line_bounds(text: str, at: int) -> tuple[int, int]:
    """The start and end (its newline, or the text's end) of the line holding `at`."""
    end = text.find("\n", at)
    return text.rfind("\n", 0, at) + 1, len(text) if end < 0 else end


def value_place(text: str, at: int) -> str:
    """Where a value starting at `at` sits, as a stable key (no text): its key when its line is a
    `key: value` line (any token of that value changes at the same place), else its line's text
    before it."""
    line0 = text.rfind("\n", 0, at) + 1
    vs = whole_value_start(text[line0:at]) if at - line0 < LINE_SCAN_CHARS else None
    if vs is not None:
        at = line0 + vs
    return span_key("edit", text, max(line0, at - VALUE_WINDOW), at)


def _changed_value(detector: DynamicDetector, prev: str, cur: str, pd: int, cd: int, stop: int | None,
                   earlier_turn: bool, edits: set[str] | frozenset[str], message_start: int | None) -> ValueChange | None:
    cs, ce = token_span(cur, cd)
    ps, pe = token_span(prev, pd)
    (line0, line1), (pline0, pline1) = line_bounds(cur, cd), line_bounds(prev, pd)  # the token holds no newline
    if cd - line0 >= LINE_SCAN_CHARS or pd - pline0 >= LINE_SCAN_CHARS:
        return None  # deep in a document's line: no value is read there (dynamic.LINE_SCAN_CHARS)
    # the window reaches past the changed token's end: a long token (a JWT) is read whole
    span = next((s for s in detector.find(cur, max(line0, cd - VALUE_WINDOW),
                                          min(line1, max(cd + VALUE_WINDOW, ce + 2), line0 + LINE_SCAN_CHARS))
                 if s.start <= cd <= s.end), None)
    pspan = next((s for s in detector.find(prev, max(pline0, pd - VALUE_WINDOW),
                                           min(pline1, max(pd + VALUE_WINDOW, pe + 2), pline0 + LINE_SCAN_CHARS))
                  if s.start <= pd <= s.end), None)
    if span is not None and pspan is not None and span.start - line0 == pspan.start - pline0:
        kind = dynamic_kind(cur, line0, span)
        if kind is None and span.kind == pspan.kind == "date" and rolled_over(pspan.text, span.text):
            kind = "date"  # no "today" cue, but it moved on by a day: a clock's date, not an edit
        elif kind in ("timestamp", "date") and moved_too_far(pspan.text, span.text):
            kind = None  # years on: an edited stamp that is still a valid one
        elif kind == "time" and rule_hours(prev, pspan.start, pspan.end, cur, span.start, span.end) \
                and not NOW_CUE.search(cur, line0, span.start):
            kind = None  # `held until 10:00` -> `11:00`: a rule's hour edited; a clock read twice on the hour or half is rare
        if kind is not None:
            start, end, pend = span.start, span.end, pspan.end
            trim = end - sentence_end(cur, start, end)
            end, pend = end - trim, pend - trim
            dur, pdur = (duration_around(cur, span.start, line1, cd), duration_around(prev, pspan.start, pline1, pd)) \
                if kind == "time" else (None, None)
            if dur is not None and pdur is not None:  # `3 h 47` read as a clock is `3 h 47 min`, a duration (round 26)
                kind, (start, end), pend = "counter", dur, pdur[1]
            elif kind == "elapsed":  # the duration, not the words before it
                start, end = elapsed_value(cur, span)
                pend = elapsed_value(prev, pspan)[1]
                if _HELD_FOR.match(cur, span.start) and after_state(cur[line0:span.start]):
                    # a key's state held for a time, whole: `läuft seit 2 Std. 11 Min.` (round 35)
                    start = line0 + (whole_value_start(cur[line0:span.start]) or 0)
            elif kind in KEYED_KINDS:  # the value, not the words of its key
                start = max(start, cs)
                dur, pdur = duration_around(cur, span.start, span.end, cd), duration_around(prev, pspan.start, pspan.end, pd)
                if kind == "counter" and dur is not None and pdur is not None:  # a duration, whole (`5 min 09 s`)
                    (start, end), pend = dur, pdur[1]
                elif kind == "counter":  # the number, with its decimal or thousands groups (`48,213`)
                    start = number_start(cur, start, span.start)
                    end, pend = number_end(cur, max(ce, cd + 1)), number_end(prev, max(pe, pd + 1))
            if agree_after(prev, cur, pend, end):
                return _parts_changed(prev, cur, (start, end, pend), kind, line0, line1, pline1, stop) \
                    or ValueChange(Span(start, end, kind, cur[start:end]), pend)
            if (kind == "timestamp" or kind == "time" and _SECONDS.search(span.text)) and (logged := _log_line(
                    prev, cur, span, pspan, (pline0, pline1, line0, line1), stop)) is not None:
                return logged
    if (url := _changed_url(prev, cur, ps, pe, cs, ce, pd, cd)) is not None:
        return url
    (cs, ce), (ps, pe) = value_token(cur, cs, ce, cd), value_token(prev, ps, pe, pd)
    if ce <= cs or pe <= ps:  # no value's token where they part (`heat 24 (7 drivers) …` -> `heat 24 clearing …`)
        return _whole_value(prev, cur, _line_value(prev, cur, pline0, pline1, line0, line1, cs, stop), pline1, line1)
    quoted, pquoted = quoted_words(cur, cs, ce), quoted_words(prev, ps, pe)
    if quoted is not None and pquoted is not None and (quoted != (cs, ce) or pquoted != (ps, pe)):
        (cs, ce), (ps, pe) = quoted, pquoted  # `mode="STAT only"` -> `"routine"`: the quoted words
    if not agree_after(prev, cur, pe, ce):
        # more than one token changed: an edit, not a value, unless a key line's whole value changed
        # in a shape values have (`whole_value_change`)
        if earlier_turn and (tagged := _tag_line_value(prev, cur, pline0, pline1, line0, line1)) is not None:
            return tagged
        line_value = _line_value(prev, cur, pline0, pline1, line0, line1, cs, stop)
        if earlier_turn and (block := _block_line_value(prev, cur, line_value, line0, pline1, line1, stop)) is not None:
            return block
        return _whole_value(prev, cur, line_value, pline1, line1) or _latest_entry(prev, cur, line_value, pline1, line1) \
            or _status_reading(prev, cur, line_value) \
            or _header_or_again(prev, cur, line_value, pline1, line1, edits, line0 == message_start)
    rest_end = min(line1 if stop is None else min(line1, stop), ce + VALUE_WINDOW)
    before = cur[max(line0, cs - VALUE_WINDOW):cs]
    line_value = _line_value(prev, cur, pline0, pline1, line0, line1, cs, stop)
    whole = _whole_value(prev, cur, line_value, pline1, line1)
    if whole is not None and whole.span is not None and whole.span.kind == "counter":
        return whole  # a list of readings, whole, though one of them changed (`2427, 109343.643` -> `2427, 110167.307`)
    kind = value_kind(before, prev[ps:pe], cur[cs:ce], cur[ce:rest_end])
    if kind == "counter" and line_value is not None and after_state(cur[line0:cs]) and agree_after(prev, cur, pline1, line1):
        start, end, _, vpend = line_value  # a state and its reading: the line's value, whole (round 28)
        return ValueChange(Span(start, end, kind, cur[start:end]), vpend)
    if (kind is None or kind == "id" and note_start(cur, cs, line_value[1] if line_value else cs) is not None
            or kind == "nonce" and line_value is not None and _NOTE.search(cur, line_value[0], cs) is not None
            or kind in ("id", "nonce") and line_value is not None and RECORD_PARTS.search(cur, ce, line_value[1])) \
            and (latest := _latest_entry(prev, cur, line_value, pline1, line1)) is not None:
        # the newest entry of a series, whole: its number alone read, it is whole with the note
        # that says what it is (`Last performance: Perf. 3215 (The Snow Queen)`), as `_ID_NOTED`
        return latest
    if kind is None and earlier_turn and \
            (block := _block_line_value(prev, cur, line_value, line0, pline1, line1, stop)) is not None:
        return block
    if kind is None and earlier_turn:
        kind = turn_value(prev[ps:pe], cur[cs:ce], before, cur[ce:rest_end])
    if kind is None and whole is not None:
        return whole  # a key line's whole value that changed as values do (`whole_value_change`)
    if kind is None and (reading := _status_reading(prev, cur, line_value)) is not None:
        return reading  # one of a status line's readings (`status_readings`)
    if kind is None and line_value is not None and cur[ce:line_value[1]] != prev[pe:line_value[3]]:
        # more of the key's value changed after the token (`/outings in 4.0s` -> `/bookings in 2.6s`)
        return _header_or_again(prev, cur, line_value, pline1, line1, edits, line0 == message_start)
    key = None
    if kind is None:
        token_key = span_key("edit", before, 0, len(before))
        key = token_key if line_value is None else value_place(cur, cs)
        old, new = prev[ps:pe], cur[cs:ce]
        if (key not in edits and token_key not in edits) or not ((reads_as_value(old, new) and any(c.isdigit() for c in old + new))
                                     or (old.isalpha() and new.isalpha())):
            return ValueChange(None, pe, key)
        kind = "value"  # changed here again: a value the client writes per request
    cs = value_start(kind, cur, cs, ce, line0)
    return ValueChange(Span(cs, ce, kind, cur[cs:ce]), pe, key)


# a reading's unit and the capacity it is read against (`1.43 MW of 2.50 MW`, `40 von 120 kg`)
_CAPACITY_AFTER = re.compile(r"( ?[^\W\d_]{1,3}) (?:of|von) \d+(?:[.,]\d+)*\1(?![\w.,])")


def _with_capacity(text: str, end: int) -> int:
    """A counter's end, taken past its unit and the capacity after it, the same unit (round 28)."""
    m = _CAPACITY_AFTER.match(text, end)
    return m.end() if m is not None else end


_TAG_LINE = re.compile(r"[ \t]*<([\w.:-]+)>([^<>\n]+)</\1>[ \t]*")


def _tag_line_value(prev: str, cur: str, pline0: int, pline1: int, line0: int, line1: int) -> ValueChange | None:
    """In a user turn before the last, a line that is one tag element (`<last_game>game 2362 · The
    Vault</last_game>`) whose content changed, the prompts agreeing again after the line: an
    agent's context block refreshed (Codex CLI's `<environment_context>`), its content a value,
    whole (round 34). A person who edits a turn writes prose, not a tag's content."""
    m, pm = _TAG_LINE.fullmatch(cur, line0, line1), _TAG_LINE.fullmatch(prev, pline0, pline1)
    if m is None or pm is None or m.group(1) != pm.group(1) or not agree_after(prev, cur, pline1, line1):
        return None
    return ValueChange(Span(m.start(2), m.end(2), "value", m.group(2)), pm.end(2))


_BLOCK_OPEN = re.compile(r"[ \t]*<([A-Za-z_][\w.:-]*)(?:\s[^<>\n]*)?>[ \t]*")  # a tag alone on its line
BLOCK_LINES = 32  # lines looked at above a changed line for the tag that opens its block


def _block_line_value(prev: str, cur: str, value: LineValue | None, line0: int, pline1: int, line1: int,
                      stop: int | None) -> ValueChange | None:
    """In a user turn before the last, the value of a `key: value` line inside a block that a tag
    alone on its line opens and closes (`<workspace>` … `</workspace>`: an agent's context block,
    refreshed on every request), when the prompts agree again after the line: a value, whole
    (round 40). A person who edits a turn rewrites its prose, not a block the client wrote."""
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    end = line0 - 1  # the newline before the changed line
    for _ in range(BLOCK_LINES):
        if end < 0:
            return None
        start = cur.rfind("\n", 0, end) + 1
        opened = _BLOCK_OPEN.fullmatch(cur, start, end)
        if opened is not None:
            close = cur.find(f"</{opened.group(1)}>", line1, len(cur) if stop is None else stop)
            if close < 0:
                return None
            vstart, vend, _, pend = value
            return ValueChange(Span(vstart, vend, "value", cur[vstart:vend]), pend)
        if cur.startswith("</", start) or start == end:  # another block closed, or a blank line: not in one
            return None
        end = start - 1
    return None


def _log_line(prev: str, cur: str, span: Span, pspan: Span, lines: tuple[int, int, int, int],
              stop: int | None) -> ValueChange | None:
    """A key line's whole value that a timestamp opens (or a clock read to the second, in brackets
    too: `[19:22:32 DBG] …`, round 39), the stamp moved on and the message after it changed too: a
    log line the client writes per request (`Log: 2026-10-18T15:38:17…+01:00 info: reading …` ->
    `…T15:52:16…+01:00 warning: sensor 2 late`; round 38), whole, the prompts agreeing again after
    the line."""
    pline0, pline1, line0, line1 = lines
    value = _line_value(prev, cur, pline0, pline1, line0, line1, span.start, stop)
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    opens = cur[value[0]:span.start], prev[value[2]:pspan.start]  # nothing before the stamp, or one bracket
    if opens[0] != opens[1] or opens[0] not in ("", "[", "("):  # (Serilog's `[19:22:32 DBG] …`; round 39)
        return None
    start, end, _, pend = value
    return ValueChange(Span(start, end, "timestamp", cur[start:end]), pend)


_SECONDS = re.compile(r"\d:[0-5]\d:[0-5]\d")  # a clock read to the second: a log's, not a rule's hour


LineValue = tuple[int, int, int, int]  # a key line's value: (start, end) in the current prompt, then in the previous


def _line_value(prev: str, cur: str, pline0: int, pline1: int, line0: int, line1: int, cs: int,
                stop: int | None) -> LineValue | None:
    """Where the value of the `key: value` line holding the change at `cs` lies in both prompts:
    from after the key's sign to the line's or its message's end (`stop`; the template text after a
    message is no part of it, and ends the line in both), without the white space before that end;
    None when the line has no key or a side's value is empty."""
    at = whole_value_start(cur[line0:cs])
    vend = line1 if stop is None else min(line1, stop)
    tail = cur[vend:line1]
    if at is None or not prev.endswith(tail, 0, pline1):
        return None
    start, end = line0 + at, before_space(cur, line0, vend)
    pstart, pend = pline0 + at, before_space(prev, pline0, pline1 - len(tail))
    if _enclosed(cur, start, end) and _enclosed(prev, pstart, pend):  # `{very tired, …}`: what the braces hold
        start, end, pstart, pend = start + 1, end - 1, pstart + 1, pend - 1
    return (start, end, pstart, pend) if start < end and pstart < pend else None


_CLOSERS = {"{": "}", "[": "]", "(": ")", "<": ">", '"': '"', "'": "'"}


def _enclosed(text: str, start: int, end: int) -> bool:
    """Is text[start:end] one pair of brackets or quotes and what they hold (round 26)?"""
    if end - start < 3 or _CLOSERS.get(text[start]) != text[end - 1]:
        return False
    inner = text[start + 1:end - 1]
    return text[start] not in inner and text[end - 1] not in inner


def _whole_value(prev: str, cur: str, value: LineValue | None, pline1: int, line1: int) -> ValueChange | None:
    """The whole value of a `key: value` line (`_line_value`) in which more than one token changed,
    when it changed as values do (`whole_value_change`: `in Betrieb` -> `aus`, `19.97, 19.09, 18.9`
    -> `20.0, …`, `DE 09 524 46487` -> `DE 09 200 33728`) and the prompts agree again after the
    line; None otherwise."""
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    start, end, pstart, pend = value
    kind = whole_value_change(prev[pstart:pend], cur[start:end], cur[cur.rfind("\n", 0, start) + 1:start]) or _stamped_moved(prev, pstart, pend, cur, start, end)
    return ValueChange(Span(start, end, kind, cur[start:end]), pend) if kind is not None else None


STAMP_STEP_MINUTES = 60  # a status's clock moves on by this much at most between two requests


def _stamped_moved(prev: str, pstart: int, pend: int, cur: str, start: int, end: int) -> str | None:
    """`time` when both values are statuses stamped with their clock first (`stamp_of`, within
    `_status_too_long`) and the clock moved on, by STAMP_STEP_MINUTES at most: the status rewritten
    whole as time goes on (`15:51 — visit 8/8 …` -> `16:02 — round done, reports syncing`; round 51). A
    clock on the quarter hour on both sides with nothing else changed is a rule's hour edited (`Einlass ::
    14:00 (mit Ticket) :: …` -> `14:30`; round 82), and so is a place's hour after its `@` or in brackets
    whatever else changed (`Info desk @ 09:00: opens for the day` -> `@ 09:30: opens after the briefing`,
    as `_stamped_report` reads it; round 86)."""
    a, b = stamp_of(prev, pstart, pend), stamp_of(cur, start, end)
    if a is None or b is None or _status_too_long(cur, start, end) or _status_too_long(prev, pstart, pend):
        return None
    if on_quarter_hour(a.group(1)) and on_quarter_hour(b.group(1)) and prev[pstart:a.start(1)] == cur[start:b.start(1)]:
        if prev[a.end(1):pend] == cur[b.end(1):end]:
            return None  # the hour alone moved, on the quarter hour both: a rule's hour edited (round 82)
        if prev[pstart:a.start(1)].endswith((" @ ", " (")):
            return None  # a place's hour after its `@` or in brackets: a desk's rule (`Desk @ 09:00: opens …`; round 86)
    moved = (clock_minutes(b.group(1).strip("[]")) - clock_minutes(a.group(1).strip("[]"))) % (24 * 60)
    return "time" if 0 < moved <= STAMP_STEP_MINUTES else None


# a key that names the newest entry of a series (`Last lane booking:`, `Letzter Auftrag:`, `Current run:`, `Zuletzt
# ausgestellt:`, round 59)
LATEST_WORDS = r"last|latest|newest|current|letzte[rsn]?|neueste[rsn]?|aktuelle[rsn]?|jüngste[rsn]?|zuletzt"
# or the event that brought the newest entry, after what it happened to (`Ticket scanned:`, `Claim checked:`,
# `Just checked in:`; round 60)
EVENT_WORDS = (r"scanned|checked(?: in| out)?|judged|issued|sold|served|called|logged|delivered|dispatched|shipped|"
               r"received|arrived|departed|finished|completed|gescannt|geprüft|verkauft|eingecheckt|geliefert|ausgestellt")
_LATEST_KEY = re.compile(rf"(?i)[^\w\n]*(?:(?:{LATEST_WORDS})\b[^:=\n]{{0,40}}|(?:just |gerade )?[^\W\d_][\w -]{{0,30}}?"
                         rf"\b(?:{EVENT_WORDS}))[:=]\s*[\"']?")
LATEST_VALUE_CHARS = 72  # an entry's number with its note; a longer value is text (48 before round 46, 64 before 51)
# an entry written as a record, its parts set apart by a sign, may be longer: up to RECORD_CHARS (round 54)


def _entry_chars(value: str) -> int:
    """How long a newest entry may be: a record's parts set apart by signs, or an entry's number with its note."""
    return RECORD_CHARS if RECORD_PARTS.search(value) else LATEST_VALUE_CHARS


def _latest_entry(prev: str, cur: str, value: LineValue | None, pline1: int, line1: int) -> ValueChange | None:
    """The whole value of a `key: value` line whose key names the newest entry of a series (`Last
    lane booking: LB00434/lane 9` -> `LB00439/lane 6`), when both values hold an entry's number (three
    digits or more, not a clock's): the client writes whichever entry came last, replaced as entries
    come, not an edit (round 40). A setting's key names no such entry (`limit: 15`), and a rule's
    `Last admission: 17:30` holds no entry's number."""
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    start, end, pstart, pend = value
    old, new = prev[pstart:pend], cur[start:end]
    if old == new or not (_holds_entry(old) and _holds_entry(new) or _reference_redrawn(old, new)
                          or _record_replaced(old, new) or _numbers_replaced(old, new)):
        return None
    line0 = cur.rfind("\n", 0, start) + 1
    if _LATEST_KEY.fullmatch(cur, line0, start) is None:
        return None
    return ValueChange(Span(start, end, "id", new), pend)


HEADER_KEY_WORDS = 3  # a header line's label: `Steward call:`, `Bändchen ausgegeben:`
# a short code of capitals glued to digits that names a place or an item (a seat's `K7`, a stand's `GP44`, a
# car's `MP4/4`): what a header's record carries, no rule's words
_SHORT_CODE = re.compile(r"(?<![\w-])[A-Z]{1,3}\d{1,4}(?![\w-])")


def _header_or_again(prev: str, cur: str, value: LineValue | None, pline1: int, line1: int,
                     edits: set[str] | frozenset[str], opening: bool) -> ValueChange | None:
    """A key line's value that changed in more than one token and in no other shape a rule judged: a
    header when the line opens the system message (`opening`, `_header_record`), else what
    `_changed_again` makes of it."""
    return (_header_record(prev, cur, value, pline1, line1) if opening else None) \
        or _changed_again(prev, cur, value, pline1, line1, edits)


def _header_record(prev: str, cur: str, value: LineValue | None, pline1: int, line1: int) -> ValueChange | None:
    """The whole value of the `key: value` line that opens the system message, its key of
    HEADER_KEY_WORDS words at most, when it changed in more than one token, a short code in it before
    or after (`_SHORT_CODE`), each side short enough to be one entry (RECORD_CHARS): a header the client writes on
    each request, before the prompt it heads (`Steward call: South Stand K7 → first aid, walking
    (steward 41)` -> `South Stand L2 → flash photography (steward 55)`; round 69). A rule edited
    sits among the rules, below the prompt's opening line; a date or a year in the value is read on
    its own (`Gebührenstand: 1. Jan. 2026`), and a value whose words stayed, its numbers bumped, is
    a version or a device edited (`Godot v4.3.stable` -> `v5.4.stable`, `Pixel 8, API 35` -> `Pixel
    9, API 46`)."""
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    start, end, pstart, pend = value
    old, new = prev[pstart:pend], cur[start:end]
    key = cur[cur.rfind("\n", 0, start) + 1:start]
    if len(key.split()) > HEADER_KEY_WORDS or max(len(old), len(new)) > RECORD_CHARS \
            or not (_SHORT_CODE.search(old) or _SHORT_CODE.search(new)) or is_dated(old) or is_dated(new) \
            or LETTER_RUNS.findall(old) == LETTER_RUNS.findall(new):
        return None
    return ValueChange(Span(start, end, "value", new), pend)


def _record_replaced(old: str, new: str) -> bool:
    """Two records of as many parts set apart by signs, two parts or more changed, each short enough
    to be an entry (`60 out: T18 D3 · Dave Hedley (The Cluny B), board 2` -> `68 out: 18 14 D18 · Tony
    Errington (…), board 1`; round 56): the newest entry written as a record, not an edit of one part."""
    a, b = RECORD_PARTS.split(old), RECORD_PARTS.split(new)
    return min(len(a), len(b)) >= 2 and abs(len(a) - len(b)) <= RECORD_PARTS_GONE \
        and sum(x != y for x, y in zip(a, b, strict=False)) >= 2 \
        and len(old) <= RECORD_CHARS and len(new) <= RECORD_CHARS


RECORD_PARTS_GONE = 2  # parts a newest entry's record may gain or lose (`· Kreditkarte · Audioguide`; round 61)


_CLOCK_GROUP = re.compile(r"\d:\d")


def _numbers_replaced(old: str, new: str) -> bool:
    """Two entries in the same words, each short enough to be one, two numbers or more changed and
    no clock among them (`Lane 1, throw 30 (full set): 3 pins, standing: 1, 2, 3, 4, 6, 9` -> `Lane 1,
    throw 26 (full set): 6 pins, standing: 1, 6, 9`; round 57): the newest entry replaced, not an
    edit. A rule's `Last orders: 21:30, kitchen 21:00` holds clocks."""
    if not (len(old) <= _entry_chars(old) and len(new) <= _entry_chars(new)) \
            or _CLOCK_GROUP.search(old) or _CLOCK_GROUP.search(new) or _FEW_WORDS.findall(old) != _FEW_WORDS.findall(new):
        return False
    a, b = DECIMAL_NUMBER.findall(old), DECIMAL_NUMBER.findall(new)  # `213.6`, `1,500`: one number each
    return sum(x != y for x, y in zip_longest(a, b)) >= 2


def latest_entry(text: str, start: int, end: int) -> tuple[int, int] | None:
    """(start, end) of the value of the `key: value` line `text[start:end]` when its key names the
    newest entry of a series and the value holds an entry's number (`_latest_entry`): what another
    pod, reading one request, takes for a value whole."""
    key = _LATEST_KEY.match(text, start, end)
    if key is None:
        return None
    vend = before_space(text, key.end(), end)
    return (key.end(), vend) if _holds_entry(text[key.end():vend]) else None


_ENTRY_NUMBER = re.compile(r"(?<![\d:.,])\d{3,}(?!\d|[:.,]\d)")  # `LB00434`, `CP-J0865:`; not `17:30`, `2.500`


# a reference of capitals and digits, set apart (SumUp's transaction code `DI9VTWSKGI`); one of 12 or more
# drawn at random marks an entry by itself (a payment's `PSP-Referenz ZP4KEJLO6FGLGZ2R`, round 46)
_CAPITALS_REFERENCE = re.compile(r"(?<![\w-])[0-9A-Z]{5,}(?![\w-])")
# beside the other draw, in an entry a `Last …` key names, five characters read as drawn (pretix's
# order codes: `Bestellung J938Z` -> `CYCQX`; round 52); alone, six
REDRAWN_REFERENCE_CHARS = 5
DRAWN_REFERENCE_CHARS = 12


def _reference_redrawn(old: str, new: str) -> bool:
    """Do two short values each hold one reference, drawn again from one to the other (`£5.50
    (watercress pesto), SumUp DI9VTWSKGI` -> `£32.00 (gift box), SumUp 33ZEWIIPTI`; round 48)? A
    code of ten drawn characters reads as random only beside the other draw."""
    if not (0 < len(old) <= _entry_chars(old) and 0 < len(new) <= _entry_chars(new)):
        return False
    a, b = _CAPITALS_REFERENCE.findall(old), _CAPITALS_REFERENCE.findall(new)
    return len(a) == len(b) == 1 and code_redrawn(a[0], b[0], REDRAWN_REFERENCE_CHARS)


# a long token drawn at random (a UUID, a hex digest, a base64 signature: a TSE receipt's, round 52): one
# character of an entry's length
_LONG_TOKEN = re.compile(r"[0-9A-Za-z][0-9A-Za-z+/=-]{15,}")


_LOGGED_FIELD = re.compile(r"(?<!\S)[a-z_]{2,20}=\S")  # a log line's `key=value` field


def _drawn_tokens(value: str) -> list[str]:
    """A value's long tokens drawn at random (a UUID, a hex digest: `Klarna bd730a44-cd46-…`; a
    number of 17 digits or more, which no one writes by hand: a DICOM UID's `2.25.<UUID as a
    decimal>`, round 53; a link whose path holds a part of 8 characters or more drawn at random,
    `https://we.tl/t-TNHCfq6dlK`, whole, round 54; a machine-readable code of 48 characters or more
    with such a part, whole, round 55)."""
    links = [m for m in _LINK.finditer(value) if _drawn_part(m.group(), _LINK_PARTS)]
    links += [m for m in _MACHINE_CODE.finditer(value) if not _inside(m, links) and _drawn_part(m.group(), _CODE_PARTS)]
    return [m.group() for m in links] + [
        m.group() for m in _LONG_TOKEN.finditer(value)
        if not _inside(m, links) and (random_looking(m.group()) or _LONG_NUMBER.fullmatch(m.group()))]


def _drawn_part(token: str, parts: re.Pattern[str]) -> bool:
    """Does a token hold a part of 8 characters or more drawn at random, split where `parts` match?"""
    return any(len(part) >= 8 and random_looking(part) for part in parts.split(token))


def _inside(m: re.Match[str], found: list[re.Match[str]]) -> bool:
    """Does `m` start inside one of the tokens already `found`?"""
    return any(a.start() <= m.start() < a.end() for a in found)


_LINK = re.compile(r"https?://[^\s<>\"'`()\[\]{}]+")
# a machine-readable code of 48 characters or more without a space (an Austrian receipt's signed
# `_R1-AT1_KASSE-01_23586_2026-02-12T10:17:19_58,00_…`; round 55): one token when a part of it is drawn
_MACHINE_CODE = re.compile(r"(?<!\S)\S{48,}")
_CODE_PARTS = re.compile(r"[_/.:,;|]")
_LINK_PARTS = re.compile(r"[/?&=#.:]")


_LONG_NUMBER = re.compile(r"\d{17,}")


def _holds_entry(value: str) -> bool:
    """Is a value short enough to be an entry's number with its note, and does it hold one (or a
    reference drawn at random: a payment's `PSP-Referenz ZP4KEJLO6FGLGZ2R`, a UUID)? A token drawn
    at random counts as one character of its length (round 49): a payment's id is no prose,
    whatever its length."""
    if len(_LOGGED_FIELD.findall(value)) >= 2:
        return False  # a structured log line's fields (`level=ERROR thread=#zio-fiber-91147 …`): no entry
    drawn = _drawn_tokens(value)
    return 0 < len(value) - sum(len(t) - 1 for t in drawn) <= _entry_chars(value) and (
        bool(drawn) or _ENTRY_NUMBER.search(value) is not None
        or any(len(r) >= DRAWN_REFERENCE_CHARS and random_looking(r) for r in _CAPITALS_REFERENCE.findall(value)))


_NOTE = re.compile(r"\([^()\n]{1,40}\)")  # what an entry is, in brackets: `£5.50 (watercress pesto), SumUp …`
_NOTED = re.compile(rf"{_NOTE.pattern}\s*$")


def note_start(text: str, start: int, end: int) -> int | None:
    """Where the note in brackets that ends `text[start:end]` starts (`S-2026/0794 (Maßsattel)`),
    if one does."""
    m = _NOTED.search(text, start, end)
    return m.start() if m is not None else None


def _changed_again(prev: str, cur: str, value: LineValue | None, pline1: int, line1: int,
                   edits: set[str] | frozenset[str]) -> ValueChange | None:
    """A `key: value` line's value that changed in more than one token and in no shape a rule
    judged: a value when something changed at its key in a recent request of the tenant (a dev
    server's `✓ Compiled /outings in 4.0s (1291 modules)` -> `✓ Compiled /bookings in 2.6s (1280
    modules)` -> …; round 24), else an edit whose place (`edit_at`) is kept for the next request;
    None when the prompts do not agree again after the line."""
    if value is None or not agree_after(prev, cur, pline1, line1):
        return None
    start, end, _, pend = value
    key = value_place(cur, start)
    if key not in edits:
        return ValueChange(None, pend, key)
    return ValueChange(Span(start, end, "value", cur[start:end]), pend, key)


def _status_reading(prev: str, cur: str, value: LineValue | None) -> ValueChange | None:
    """The readings that changed in a `key: value` line's value holding several (`status_readings`:
    `MV Lonan: 8.2 nm off, SOG 13.5 kn` -> `7.8 nm off, SOG 13.9 kn`), as a `counter`; None when the
    line's value did not change as a status line's does."""
    if value is None:
        return None
    start, end, pstart, pend = value
    found = status_readings(prev[pstart:pend], cur[start:end])
    if found is None:
        return None
    s, e, pe = found
    if rule_hours(prev, pstart + s, pstart + pe, cur, start + s, start + e) or hours_edited(prev[pstart:pend], cur[start:end]):
        return None  # a rule's hour edited (`booked from 08:00` -> `08:30`), not a reading (round 54)
    return ValueChange(Span(start + s, start + e, "counter", cur[start + s:start + e]), pstart + pe)


def before_space(text: str, floor: int, end: int) -> int:
    """`end` moved back over the white space before it, not past `floor` (a line's start): the line's
    text is read, never the prompt before it."""
    while end > floor and text[end - 1].isspace():
        end -= 1
    return end


def value_token(text: str, start: int, end: int, at: int) -> tuple[int, int]:
    """The value of the token at start..end, as the text path and another pod's digest both read
    it: after a key glued to it (`after_glued_key`), over a number's digit groups (`38,9`, not
    `38`), and in a URL the path segment at `at` (a build scan's id). `at`: where it changed, or
    the token's end when that is not known."""
    start = after_glued_key(text, start, at)
    start, end = number_token(text, start, end)
    return url_segment(text, start, end, at) if "://" in text[start:end] else (start, end)


_URL_TAIL = re.compile(r"[^\s<>\"'`()\[\]{}]*")


def _url_end(text: str, start: int) -> int:
    """Where the URL starting at `start` ends: its query and fragment included, not the
    punctuation that ends a clause."""
    end = _URL_TAIL.match(text, start).end()  # type: ignore[union-attr]
    while end > start and text[end - 1] in ".,;:!?":
        end -= 1
    return end


def _changed_url(prev: str, cur: str, ps: int, pe: int, cs: int, ce: int, pd: int, cd: int) -> ValueChange | None:
    """The whole URL when the URL token where the prompts part changed in more than the part there,
    and that part as a value (`…/fi/<id>/SBX-80404_scans.zip?rlkey=<key>` -> `…/fi/<id>/SBX-80999_…`:
    a link drawn again; round 52), or when it changed in its query (a form's edit link,
    `…/viewform?edit2=<token>`: the link is the value, not its token; round 53); None when only a
    path segment or a host's part changed (a build scan's id in its path: `value_token` reads it),
    or the token is in no URL."""
    line0 = cur.rfind("\n", 0, cs) + 1
    if "://" in cur[cs:ce] and "://" in prev[ps:pe]:
        (a, b), (pa, pb) = url_segment(cur, cs, ce, cd), url_segment(prev, ps, pe, pd)
        start, pstart = cs, ps
    elif (start := _query_url(cur, line0, cs)) is not None \
            and (pstart := _query_url(prev, prev.rfind("\n", 0, ps) + 1, ps)) is not None:
        (a, b), (pa, pb) = (after_glued_key(cur, cs, cd), ce), (after_glued_key(prev, ps, pd), pe)
    else:
        return None
    end, pend = _url_end(cur, start), _url_end(prev, pstart)
    if start == cs and cur[b:end] == prev[pb:pend] or not agree_after(prev, cur, pend, end):
        return None
    kind = value_kind(cur[line0:a], prev[pa:pb], cur[a:b], cur[b:line_bounds(cur, b)[1]])
    return ValueChange(Span(start, end, kind, cur[start:end]), pend) if kind is not None else None


_QUERY_URL = re.compile(r"https?://[^\s<>\"'`()\[\]{}?#]*\?[^\s<>\"'`()\[\]{}#]*$")


def query_url(text: str, start: int, end: int) -> tuple[int, int] | None:
    """(start, end) of the URL whose query holds `text[start:end]`, or None: what another pod,
    reading one request, takes for the value (`_changed_url`)."""
    url = _query_url(text, text.rfind("\n", 0, start) + 1, start)
    if url is None:
        return None
    url_end = _url_end(text, url)
    return None if url_end < end else (url, url_end)


def _query_url(text: str, line0: int, at: int) -> int | None:
    """Where the URL starts whose query holds the token at `at` (`…/viewform?edit2=` before it), or None."""
    m = _QUERY_URL.search(text, max(line0, at - 2048), at)
    return m.start() if m is not None else None


_GLUED_KEY = re.compile(r"(?:[A-Za-z](?:[\w.-]*[A-Za-z_-])?[:=])+(?=[^\s=:/])")  # not base64's padding, not `://`


def after_glued_key(text: str, start: int, at: int) -> int:
    """Where a token's value starts when a key is glued to it before `at` (the divergence, or
    the token's end: iCalendar's `X-SMH-EINSATZSTUFE:Volleinsatz`, `mode=on`): after the key's sign."""
    m = _GLUED_KEY.match(text, start, min(len(text), at + 1))
    return m.end() if m is not None and m.end() <= at else start


def _clock_at(minutes: str, seconds: str = r"(?:[:.]00)?") -> re.Pattern[str]:
    """A clock whose minutes match `minutes`, with `seconds` after them, half of the day and zone
    optional: one frame for a rule's hours and any clock."""
    return re.compile(rf"(?:[01]?\d|2[0-3])[:h.]{minutes}{seconds}(?:\s?[AaPp]\.?[Mm]\.?)?(?: [A-Z]{{2,4}})?")


# a rule's hour: on the hour or the half hour (`back by 17:30` -> `18:00`; round 53), or the quarter hour; its zone
# may follow (`11:00 a.m. AKST`; round 78)
_ON_THE_HOUR = _clock_at(r"[03]0")
_ON_THE_QUARTER = _clock_at(r"(?:[03]0|15|45)")
_RANGE_DASHES = frozenset("–—-")


# a rule's sentence in a list: a bullet or a number, then words (four or more) before the clock; or in a note, two
# words or more after `Note:` (`Note: The parade starts at 8:00 a.m. PT.`; round 78). The words may hold another
# clause's clock, and a word of approximation may come after `at` (group 1: `- Gates open at 8.30am …; the parade
# starts at about 10.45am.`; round 87)
_RULE_SENTENCE = re.compile(r"[ \t]*(?:(?:[-*•]|\d{1,2}[.)]) (?:\S+ ){4,}"
                            r"|(?:Note|NB|Hinweis|Achtung|Please note): (?:[^\W\d_][\w'’,-]* ){2,})(?:at|um|ab|from|until|bis) "
                            r"((?:about|around|approx\.|approximately|roughly|circa|ca\.|etwa|gegen) )?")


def rule_hours(prev: str, ps: int, pe: int, cur: str, cs: int, ce: int) -> bool:
    """Are `prev[ps:pe]` and `cur[cs:ce]` a rule's hour edited: both on the hour or the half hour
    (round 53), or both on the quarter hours (`Doors open at 19:00.` -> `18:45.`; round 61) where
    neither bounds a range (a load profile's quarter `02:00–02:15` -> `02:30–02:45` runs on)? Or one
    on the hour or the half in a rule's sentence in a list, after `at`, `from`, `until` and the like
    (`- The Midday Dance leaves the Guildhall at 12:00 and …` -> `at 12:10 …`; round 74), or on the
    quarter hour after a word of approximation (`… starts at about 10.45am.` -> `11.10am.`; round 87), or
    a clock gone back a little, whatever its minutes (`_went_back`; round 88)."""
    if _ON_THE_HOUR.fullmatch(prev, ps, pe) and _ON_THE_HOUR.fullmatch(cur, cs, ce):
        return True
    rule = _RULE_SENTENCE.fullmatch(cur, cur.rfind("\n", 0, cs) + 1, cs)
    if rule is not None and (_ON_THE_HOUR.fullmatch(prev, ps, pe) or _ON_THE_HOUR.fullmatch(cur, cs, ce)
                             or _went_back(prev[ps:pe], cur[cs:ce]) or rule.group(1)
                             and (_ON_THE_QUARTER.fullmatch(prev, ps, pe) or _ON_THE_QUARTER.fullmatch(cur, cs, ce))):
        return True
    return not (_bounds_range(prev, ps, pe) or _bounds_range(cur, cs, ce)) \
        and _ON_THE_QUARTER.fullmatch(prev, ps, pe) is not None and _ON_THE_QUARTER.fullmatch(cur, cs, ce) is not None


_A_CLOCK = _clock_at(r"[0-5]\d", seconds="")  # any clock to the minute


def _went_back(old: str, new: str) -> bool:
    """Are both clocks, the second back by STAMP_STEP_MINUTES at most (`starts at 9:37 AM` -> `9:35
    AM`)? A clock read twice never goes back: in a rule's sentence, its hour edited (round 88). A
    reading that fell (`holding at 8.25 nm` -> `7.80 nm`) is no clock."""
    return _A_CLOCK.fullmatch(old) is not None and _A_CLOCK.fullmatch(new) is not None \
        and 0 < (clock_minutes(old) - clock_minutes(new)) % (24 * 60) <= STAMP_STEP_MINUTES


_CLOCK_TOKEN = re.compile(r"(?<![\w.:])\d{1,2}[:h.]\d\d(?:\s?[AaPp]\.?[Mm]\.?)?(?![\d:])")


def hours_edited(old: str, new: str) -> bool:
    """Are two values the same but for clocks that were each on the hour or the half and still are (a
    rule's hour given in two languages or two notations, `Gates open at 7.00am / 7.00yb.` -> `7.30am /
    7.30yb.`; round 77)? `rule_hours` reads one clock; a rule written twice changes two."""
    a, b = _CLOCK_TOKEN.findall(old), _CLOCK_TOKEN.findall(new)
    if not a or len(a) != len(b) or _CLOCK_TOKEN.sub("#", old) != _CLOCK_TOKEN.sub("#", new):
        return False
    return all(x == y or (_ON_THE_HOUR.fullmatch(x) and _ON_THE_HOUR.fullmatch(y)) for x, y in zip(a, b, strict=True))


def _bounds_range(text: str, start: int, end: int) -> bool:
    """Does a range's dash touch `text[start:end]` on either side?"""
    return text[start - 1:start] in _RANGE_DASHES or text[end:end + 1] in _RANGE_DASHES


_QUOTED_AFTER_KEY = re.compile(r"""(?:[=:]\s*)"$""")


def quoted_words(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The words (one to three) between the quotes a key's value opens with (`{mode="STAT only"}`,
    `"shift": "Tagschicht Nord"`) when the token at start..end is one of them; None otherwise."""
    line0 = text.rfind("\n", 0, start) + 1
    open_at = text.rfind('"', line0, start)
    if open_at < 0 or not _QUOTED_AFTER_KEY.search(text, max(line0, open_at - 4), open_at + 1):
        return None
    close = text.find('"', end)
    if close < 0 or close - open_at > 64 or "\n" in text[end:close]:
        return None
    inner = text[open_at + 1:close]
    return (open_at + 1, close) if _FEW_WORDS.fullmatch(inner) else None


_FEW_WORDS = re.compile(r"[^\W\d_]+(?: [^\W\d_]+){0,2}")  # one to three words: a quoted value, an entry's wording
