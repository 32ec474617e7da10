"""The kind of a changed token that no pattern of app/prefix/dynamic.py matched.

Diagnosis compares two prompts, so it sees the value that changed even when no pattern knows its
form. `value_kind` judges such a token by its shape, its key and the rest of its line: a
per-request value (an epoch, a nonce, a flipping flag, a week number, a counter, a port, a
sequence id) has a recognisable shape or sits after a key; an edited sentence or a bumped version
is not per-request and gets no kind. Another pod, which has only the current request, calls it
with the same token twice (`keyed_value` says where a key puts a value).

The word lists here hold nothing that only a held-out diagnosis pool uses:
tests/test_diagnosis_scores.py fails if one is added (docs/diagnosis.md).
"""

from __future__ import annotations

import re
from itertools import zip_longest

from app.prefix.dynamic import MINUS, NOW_CUE, WEEKDAY_NAMES, port_start

_EPOCH = re.compile(r"1[5-9]\d{8}(?:\d{3}(?:\d{3}(?:\d{3})?)?)?(?:\.\d{1,9})?")  # 2017..2033, in s, ms, µs or ns; time.time()
# an ISO week (`2026-W19`), with its day; a fab's work week and day (`WW19.3`) is one too
_ISO_WEEK = re.compile(r"(?i)(?:\d{4}-?)?W{1,2}\d{1,2}(?:[-.]?\d)?")
_DESCRIBE = re.compile(r"(?i)(v?\d+(?:\.\d+){1,3})-(\d+)-g[0-9a-f]{7,40}(?:-dirty)?")  # `git describe`
_VERSION = re.compile(r"(?i)v?\d+(?:\.\d+){1,3}(?:[-+.]?[a-z]+\d*)?(?:-\d+-g[0-9a-f]{7,40})?(?:-dirty)?")  # `git describe` too
_FLAG_WORDS = frozenset({
    "a", "b", "c", "d", "true", "false", "yes", "no", "enabled", "disabled", "control",
    "treatment", "variant", "baseline", "ja", "nein", "an", "aus", "aktiv", "inaktiv",
    "oui", "non", "si", "sí", "on", "off"})
_FLAG_KEY = re.compile(r"(?i)(group|gruppe|variant|variante|bucket|cohort|arm|experiment|flag|feature|mode\b|ab\b)")
# one word (a state's camel case too: `PreparingRebalance`; up to three in quotes: `mode="STAT only"`;
# joined by a hyphen: `walk-in`), or a short upper-case code (`5G`, `LTE`)
_FLAG_VALUE = re.compile(r"[^\W\d_]{1,24}(?:[ -][^\W\d_]{1,16}){0,2}|(?=[0-9]*[A-Z])[0-9A-Z]{1,4}")
_WEEK_NUMBER = re.compile(r"\d{1,2}(?:/\d{4})?")
_WEEK_KEY = re.compile(r"(?i)(?:\bKW|week|woche|wk|semaine|semana|settimana)\W*$")
# `Bid: £6,900`; a key may end in brackets (`Flow at J15 southbound (MIDAS): `)
# a key, its sign, and what may open its value: a quote, a currency, an approximation (`Wartezeit: ca. `)
_KEY = re.compile(r"(?i)([A-Za-z_][\w.\-/ ]{0,40}?(?:\([\w.\-/ ]{1,24}\))?)\s*(?:[:=]|\":|→|->|=>)\s*[\"']?[$€£]?"
                  r"(?:(?:ca\.|about|etwa|rund|~)\s?)?$")
KEY_SIGNS = (":", "=", "→", "->", "=>")  # what ends a key before its value
_TAG_OPEN = re.compile(r"<([A-Za-z_][\w.\-]*)>\s*$")  # `<reasoning_effort>` as a value's key
_LABEL = re.compile(r"^\s*[^\W\d_][\w-]{2,40} $")  # one word and a space: `Rechenzentrum Nord`
_CELL_KEY = re.compile(r"^\s*\|\s*([^|]{1,40}?)\s*\|\s*$")  # a Markdown table row's first cell: `| Kanal | `
_CELL_END = re.compile(r"^\s*(?:%\s*)?\|\s*$")  # the cell's end (a unit sign may come before it)
_DYNAMIC_KEY = re.compile(
    r"(?i)\b(nonce|salt|seed|token|bucket|cohort|variant|variante|experiment|group|flag|"
    r"ts|time|clock|zeit|epoch|request|anfrage|trace|span|session|key|id|run|build)\b|"
    r"(nonce|zeit|stempel|wert|variante)")


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:[kKmM]|[KMGTP]i?B|[GTP]|[x×])?")  # `41`, `41.213`, `41.2k`, `1.6T`, `38214MiB`, `1.3x`
_RANGE = re.compile(r"\d+(?:[.,]\d+)?[–-]\d+(?:[.,]\d+)?")  # `10–15` (minutes), as `dynamic.number_token` widens it
# a key that names something counted as a session goes on, not a setting (`limit`, `max results`)
_COUNTER_KEY = re.compile(r"(?i)(percent|prozent|free|frei|used|usage|auslastung|beleg|remaining|left|übrig|position|"
                          r"queue|warteschlange|elapsed|uptime|spent|cost|kosten|ausgegeben|reset|expires|ttl)")
_DURATION = re.compile(r"(?:\d+h)?(?:\d+m(?!s))?\d+(?:\.\d+)?(?:ms|s|m|h)")  # Go's `2m59.257s`, `322ms`
_COUNTDOWN = re.compile(r"(?i)\b(?:resets?|expires?|ends?|closes?|läuft|endet)\b"
                        r"[^.\n]{0,12}\b(?:in|ab in)\s*$")  # `resets in …`, `boarding closes in …`
# a position (latitude, longitude) with its decimals: a moving one changes per request
_POSITION = re.compile(r"-?\d{1,2}\.\d{4,7},\s?-?\d{1,3}\.\d{4,7}")
# a sum spent so far in a sentence (`This session has cost $0.4390 so far.`)
_SPENT = re.compile(r"(?i)\b(?:spent|cost|costs|kostete|ausgegeben|verbraucht)\b[^.\n]{0,20}$")
# an ephemeral port: after `port` or a loopback host (`127.0.0.1:50242`); a fixed one never changes
_LOOPBACK = r"localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]"
_HOST_PORT = re.compile(rf"(?i)({_LOOPBACK}):(\d{{4,5}})")
_PORT_BEFORE = re.compile(rf"(?i)(?:\bport\s+|(?:{_LOOPBACK}):)$")
# units of what instruments read, not of what rules set; units that rules set too (a time, a size):
# a reading only after a key or with decimals; a key that names a time taken (its last word a unit)
_READING_UNIT = re.compile(r"\s?(?:°\s?C|kWh|kW|Wh|dBm|dB)")
_UNIT_AFTER = re.compile(r"\s?(?:ms\b|s\b|sec\b|min\b|Min\b|minutes\b|Minuten\b|GB\b)")
# a unit written after a key's number, ending the value: one to four letters (`cm`, `Hz`, `LUFS`),
# or a degree or micro sign and letters, or a unit over another (`km/h`, `m³/s`), or a share of a kind (`Vol.-%`)
_UNIT_ENDS_LINE = re.compile(r"\s?[°µ]?[A-Za-z]{1,4}[²³]?(?:/[A-Za-z]{1,3}[²³]?|\.?-?%)?\.?\s*(?:</[\w.:-]+>\s*)?$")
_TIMING_KEY = re.compile(r"(?i)(?:\b(?:ms|us|sec|seconds|min|minutes)$|\b(?:dur|duration|latency)\b)")
LONG_TOKEN = 4096  # a changed token longer than this is judged no value
# a unit of measure after a number with decimals, in a sentence too (`Hs at the buoy 3.1 m`, `95,7 %`)
_MEASURE_UNIT = re.compile(r"\s?(?:[mck]?m[²³]?|m/s|km/h|kn|[hk]?Pa|m?bar|[mk]?g(?:/m[²³])?|t|[hdcm]?l|kg/hl|%|[kM]?[VW]|"
                           r"[kMG]?Hz|ppm|rpm)(?![\w/²³])")
# a threshold a rule states before its number (`only when the wave height is below 1.5 m`)
_THRESHOLD_BEFORE = re.compile(r"(?i)\b(?:below|above|under|over|less than|more than|at most|at least|up to|exceeds?|"
                               r"unter|über|unterhalb|oberhalb|höchstens|mindestens|bis|ab|max(?:imum)?|min(?:imum)?|"
                               r"limit)\W*$")
_BOUND_BEFORE = re.compile(_THRESHOLD_BEFORE.pattern.removesuffix(r"\W*$") + " $")  # the bound's word just before it
# two signed 64-bit numbers and more, joined by `:` (JSF's `javax.faces.ViewState`): random draws
_LONG_DRAWS = re.compile(r"-?\d{15,20}(?::-?\d{15,20})+|-?\d{17,20}")
_FINE = re.compile(r"\d+[.,]\d{4,}")  # a reading with four decimals or more (a decimal comma too: `194,9653`, round 31)
_ISO_DURATION = re.compile(r"P(?:\d+D)?T(?:\d+H)?(?:\d+M)?\d+(?:[.,]\d+)?S")  # ISO 8601, seconds included
_ISO_HOURS_MINUTES = re.compile(r"P(?:\d+D)?T\d+H(\d+)M")  # ISO 8601 in hours and minutes (`PT5H4M`; round 39)
_EPOCH_ID = re.compile(r"1[5-9]\d{11}-\d{1,6}")  # milliseconds since the epoch, then a sequence number
# a count out of a capacity that stays (`53/220 climbers`): the capacity a number, not a month or a year (`KW 15/2026`)
_OF_CAPACITY = re.compile(r"(\d+)/(?!(?:19|20)\d\d$)(\d{2,})")
# a number in scientific notation (`4.7E-07` Torr): what instruments print; a set value is written round
_SCIENTIFIC = re.compile(r"\d+(?:\.\d+)?[eE][+-]?\d{1,3}")
# what may end a line after a key's whole value: punctuation, quotes, a JSON object's or a tag's end
_VALUE_END = re.compile(r"""[\s.,;"'}\]]*(?:</[\w.:-]+>[\s}\],]*)?""")
_OF_TOTAL = re.compile(r"(?i)\s*(?:of|von|/)\s+(?:the\s+|den\s+)?\d")  # `41.2k of the 128k window`


def _mixing(token: str) -> int:
    """How often the character class (lower, upper, digit) changes along the token: random ids
    change class every few characters, words and version numbers rarely."""
    classes = ["d" if c.isdigit() else "u" if c.isupper() else "l" for c in token if c.isalnum()]
    return sum(1 for x, y in zip(classes, classes[1:], strict=False) if x != y)


# a token in a timestamp's shape (`20250412T0930Z`) is a timestamp when valid (a pattern above) and
# an edit when not, never a nonce
_STAMP_SHAPE = re.compile(r"\d{8}T\d{4,6}(?:[.,]\d+)?Z?")


# the words of a name written in camel case (`Linked`, `In`; `Chat`, `GPT`)
_CAMEL_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
WORD_LETTERS = 4  # a name's words are this long on average; a random draw's letters change case every two or so


def random_looking(token: str) -> bool:
    """A random draw rather than a word, a version or a code: hex with letters and digits, upper
    case with digits over 12 characters (base32, `RDDS67XS26QNZDFU`), or mixed character classes;
    not a name of words in camel case, without digits (`LinkedIn-Ghostwriter`,
    `ChatGPT-Prompt-Generator`; round 84)."""
    alnum = [c for c in token if c.isalnum()]
    if len(alnum) < 8 or _VERSION.fullmatch(token) or _STAMP_SHAPE.fullmatch(token):
        return False
    if not any(c.isdigit() for c in token) and len(alnum) >= WORD_LETTERS * len(_CAMEL_WORD.findall(token)):
        return False
    has_both = any(c.isdigit() for c in token) and any(c.isalpha() for c in token)
    if has_both and (re.fullmatch(r"[0-9a-fA-F]{8,}", token) or re.fullmatch(r"[0-9A-Z]{12,}", token)):
        return True
    return _mixing(token) >= max(3, len(alnum) // 4)


def _redrawn(old: str, new: str) -> bool:
    """Is `old` another draw of the same kind as `new` (same length and separators, differing in most
    other positions), though by itself it does not read as random (`YSLKOKOBZTKLFDDP`: base32
    without a digit; a hex hash of digits only, `41/289058` after `8b/58b5ae`)?"""
    if len(old) != len(new) or any(a != b for a, b in zip(old, new, strict=True) if not (a.isalnum() and b.isalnum())):
        return False
    drawn = [(a, b) for a, b in zip(old, new, strict=True) if a.isalnum()]
    return sum(a != b for a, b in drawn) * 4 >= len(drawn) * 3


def value_kind(line_prefix: str, old: str, new: str, line_rest: str | None = None) -> str | None:
    """The kind of a changed token `old` -> `new` that no pattern matched, or None when the change
    looks like an edit. `line_prefix`: the text of the line before the token (its key, if any);
    `line_rest`: the text of the line after it (None: unknown). A token that is the whole value of a
    `key: value` line is a per-request value whatever the key's words when it reads as one: a single
    word (a flag: `rollout stage: canary` -> `stable`) or an id (letters and digits or separators,
    `Correlation: web-…`), never a version or a bare number (`limit: 5` -> `10` is an edit)."""
    if not new or not old:
        return None
    if len(new) > 64 or len(old) > 64:  # no word or number: a long random draw (an antiforgery token) or an edit
        return "nonce" if max(len(new), len(old)) <= LONG_TOKEN and random_looking(new) and random_looking(old) else None
    if _EPOCH.fullmatch(new) and _EPOCH.fullmatch(old):
        return "epoch"
    if _POSITION.fullmatch(new) and _POSITION.fullmatch(old):
        return "position"
    if _EPOCH_ID.fullmatch(new) and _EPOCH_ID.fullmatch(old):
        return "epoch"  # an id that opens with the time it was made (a Redis stream id `1775857905933-1`)
    if new in ("0", "1") and old in ("0", "1") and line_prefix.endswith("?"):
        return "flag"  # a structured header's boolean (RFC 8941: `Sec-CH-UA-Mobile: ?0`; `value_start`)
    key = _KEY.search(line_prefix)
    if _counted(line_prefix, key, old, new, line_rest) or _measured(key or _TAG_OPEN.search(line_prefix), old, new,
                                                                     line_rest, line_prefix):
        return "counter"
    number = _line_number_kind(line_prefix, old, new, line_rest)
    if number is not None:
        return number
    if _rising_sequence(old, new):
        return "id"
    if _signed_number_rose(line_prefix, old, new):
        return "id"
    if code_redrawn(old, new):
        return "nonce"  # a code in capitals drawn again: an entry's `EKZN-3FJA` -> `CWXK-TWLC` (round 30)
    if _VERSION.fullmatch(new) and _VERSION.fullmatch(old):
        # a build of the same release, some commits on (`v0.13.8-18-g9711b4d` -> `-19-g5fd58c3`),
        # moves with the working tree; another release is an edit
        a, b = _DESCRIBE.fullmatch(old), _DESCRIBE.fullmatch(new)
        return "value" if a and b and a.group(1) == b.group(1) and a.group(2) != b.group(2) else None
    if _ISO_WEEK.fullmatch(new) and _ISO_WEEK.fullmatch(old):
        return "week"
    if _WEEK_NUMBER.fullmatch(new) and _WEEK_NUMBER.fullmatch(old) and _WEEK_KEY.search(line_prefix) \
            and int(new.split("/")[0]) <= 53:
        return "week"  # `KW 46`, `KW 46/2026`
    if new.isdecimal() and old.isdecimal() and 1024 <= int(new) <= 65535 and _PORT_BEFORE.search(line_prefix):
        return "port"
    a, b = _HOST_PORT.fullmatch(old), _HOST_PORT.fullmatch(new)
    if a and b and a.group(1) == b.group(1) and (a.group(2) != b.group(2) or old == new):
        # `127.0.0.1:50242` -> `:57215` (another pod, reading the one request, passes the token twice)
        return "port"  # its span is the port (`value_start`)
    if _LONG_DRAWS.fullmatch(new) and _LONG_DRAWS.fullmatch(old) and not _rising_sequence(old, new):
        return "nonce"  # no setting is written with 17 digits or more
    if _HEX_LITERAL.fullmatch(old) and _HEX_LITERAL.fullmatch(new) and _redrawn(old[2:], new[2:]) \
            and min(len(set(old[2:].lower())), len(set(new[2:].lower()))) >= 3:
        return "nonce"  # a checksum or a hash as a hex literal, drawn again (`CRC-16 0x5527` -> `0xB14B`; round 42)
    new_random, old_random = random_looking(new), random_looking(old)
    if (new_random or old_random) and (new_random == old_random or _redrawn(old, new)):
        return "nonce"
    if new.lower() in WEEKDAY_NAMES and old.lower() in WEEKDAY_NAMES and (NOW_CUE.search(line_prefix) or key):
        return "date"  # "Today is Tuesday." -> "Wednesday."
    if key is None:
        # a value whose key is a tag around it (`<reasoning_effort>low</reasoning_effort>`) or a label
        # line's one word (`Rechenzentrum Nord`): the whole value, read as a `key: value` line's
        if line_rest is not None and _whole_value_unkeyed(line_prefix, line_rest):
            return _whole_value_kind(old, new)
        return None
    if new.lower() in _FLAG_WORDS and old.lower() in _FLAG_WORDS and len(new) > 1 and len(old) > 1:
        return "flag"  # two flag words after any key (a single letter only after a flag key: "name": "a" is no flag)
    if _FLAG_KEY.search(key.group(1)) and _FLAG_VALUE.fullmatch(new) and _FLAG_VALUE.fullmatch(old):
        return "flag"  # `Gruppe: Kontrolle` -> `Test`, `dark_mode=on` -> `off`, `a` -> `b`: any two words after a flag key
    if _DYNAMIC_KEY.search(_words(key.group(1))) and not (new.isalpha() and old.isalpha() and len(new) > 3):
        return "value"
    if line_rest is not None and _VALUE_END.fullmatch(line_rest):  # the whole value of a `key: value` line
        return _whole_value_kind(old, new)
    return None


def reads_as_value(old: str, new: str) -> bool:
    """Do both tokens read as values, not words (a digit in them, or an id's separators:
    `sleepy_hodgkin` -> `fabulous_hodgkin`)? What `value_kind` did not judge is then a value where
    the place says so (`turn_value`, a change repeated at one place)."""
    def one(token: str) -> bool:
        return any(c.isdigit() for c in token) or _id_like(token)
    return one(old) and one(new)


def turn_value(old: str, new: str, line_prefix: str = "", line_rest: str = "") -> str | None:
    """A token that changed in place in a user turn before the last, the rest of the conversation
    the same, that `value_kind` did not judge: a value when both read as one (`reads_as_value`),
    or when it fills a cell of a delimited row (`HLP2_SELECTOR,…,HAND,`: a word too) or is a word
    of a line in capitals (`_machine_line`). A person who
    edits a turn rewrites words, and chat clients drop the turns after an edited one; a client
    that refreshes a value in the context it sends (an agent's context block) changes one token
    and keeps the rest. A release is no such value (`3.2.1`: a document's revision edited)."""
    if _RELEASE.fullmatch(old) and _RELEASE.fullmatch(new):
        return None
    cell = line_prefix.endswith(_CELL_SIGNS) and (not line_rest or line_rest.startswith(_CELL_SIGNS))
    return "value" if reads_as_value(old, new) or cell or _machine_line(line_prefix, old, new, line_rest) else None


def _machine_line(line_prefix: str, old: str, new: str, line_rest: str) -> bool:
    """Is the token a word of a line a machine wrote in capitals (a report's `BIRD HAZARD LOW`, a
    log's level), two words or more and no small letter: no person's prose to edit?"""
    line = f"{line_prefix}{new}{line_rest}"
    return f"{old}{new}".isupper() and not any(c.islower() for c in line) and len(line.split()) >= 2


_CELL_SIGNS = (",", ";", "\t", "|")
_RELEASE = re.compile(r"(?i)v\d+(?:\.\d+)*|\d+(?:\.\d+){2,3}")  # `v2`, `3.2.1`; `0.47` is a number


def value_start(kind: str, text: str, start: int, end: int, floor: int) -> int:
    """Where the value of a token `value_kind` judged starts, on every path: a port after its host
    (`port_start`), a structured header's boolean at its `?` (`?0`), an id whose parts a `|` joins
    at its first part (a Bot Framework activity id `<conversation>|0000028`, whose counter rose).
    `floor`: the line's start."""
    if kind == "port":
        return port_start(text, start, end)
    if kind == "flag":
        return start - 1 if text[start - 1:start] == "?" else start
    if kind == "id":
        return _joined_start(text, start, floor)
    return start


def _joined_start(text: str, start: int, floor: int) -> int:
    while start - 2 >= floor and text[start - 1] == "|" and _ID_PART.match(text[start - 2]):
        start -= 1
        while start - 1 >= floor and _ID_PART.match(text[start - 1]):
            start -= 1
    return start


_ID_PART = re.compile(r"[\w.:/+-]")


# a line's key, then its sign: what `whole_value_change` reads the value after (`Nächste Kuh an Box 1: `)
# (a clock's colon may be in the key: `Grundkurs (dienstags 19:30 Uhr): `; a range's dash: `J14–J15`)
# `Tonight's decision:` (round 26); a key may open with an elision's apostrophe (`'Oss party:`; round 78)
_LINE_KEY = re.compile(r"^\s*(?:[-*•]\s+)?['’]?[^\W\d_](?:[\w.,\-–/ ()'’]|:(?=\d)){0,48}?\s*[:=]\s+")
# a state's words: one to six, a small number among them (`returning to base`, `unter Meldestufe 1`,
# `Stewards' enquiry`, `ALB recovering up the slip`: round 36; `planner's controls out`: round 58;
# `coaching on lawn 1 this morning`: round 59)
# a word may be a name's short form with its dot (`St. Charles`, `Mt. Hood`; round 86)
_STATE_WORD = r"(?:[^\W\d_]{1,20}(?:['’][^\W\d_]{0,2})?|[A-Z][a-z]{1,2}\.(?= [A-Z]))"
_STATE_CODE = r"[A-Z]{1,2}\d{1,4}"  # a code among a state's words: a transition's `T2`, a road's `A484` (round 65)
_CLOCK_24 = r"(?:[01]?\d|2[0-3]):[0-5]\d"
_STATE_CLOCK = rf"{_CLOCK_24}(?: Uhr)?"
# a state may open with its round's ordinal (`1. Durchgang läuft`, `2nd heat under way`; round 88)
_STATE_ORDINAL = r"(?:\d{1,2}(?:\.|st|nd|rd|th) (?=[^\W\d_]))?"
_STATE_WORDS = re.compile(rf"{_STATE_ORDINAL}(?:(?:{_STATE_WORD}|{_STATE_CODE})(?:[ -](?:{_STATE_WORD}|{_STATE_CODE}|\d{{1,2}})){{0,7}}"
                          r"|[^\W\d_]{1,16}(?: [^\W\d_]{1,16}(?:-[^\W\d_]{1,16})?){5})")  # or six, hyphenated ones whole (round 45)
# a state, with its reason in brackets on either side (`Pen 7: feeding` -> `stopped (low oxygen)`, round 24)
# or its detail after a comma (`free flow` -> `closed, locking in and out`, round 26; or a colon, `Live:
# Breakfast`, `fault: gripper jam`, round 31) or its reading
# (`warming up` -> `running 32 m/min`, `Störung Antrieb` -> `läuft, 10–25 mm`, round 28); a clock may end
# the state (`last entry 17:00`), its detail hold hyphenated words and small numbers (`wood firing,
# side-stoking`, `paused, gusts above 40 mph on the cliff`; round 44); since round 65 seven words, codes among
# them, two details (`Glätte: Schuhhof gestreut, bitte Vorsicht`) and a clock inside one (`Radveranstaltung:
# bis 11:00 Uhr keine Einfahrt für Kfz`)
_STATE_DETAIL = (rf"[,:] (?:\d{{1,3}}[ -])?{_STATE_WORD}(?:[ -](?:{_STATE_WORD}|{_STATE_CODE}|\d{{1,3}}|{_STATE_CLOCK})){{0,6}}"
                 rf"(?: {_CLOCK_24})?"  # a detail's clock: `frost, lawns closed until 11:00` (round 59)
                 r"(?: \d+(?:[.,]\d+)? ?[^\W\d_]{1,4})?")  # a detail with its reading: `GO, surface wind 4 kt` (round 39)
_STATE = re.compile(_STATE_WORDS.pattern + rf"(?: {_CLOCK_24})?"
                    rf"(?: \([^()\n]{{1,40}}\)|(?:{_STATE_DETAIL}){{1,2}}"
                    r"|,? \d+(?:[.,]\d+)?(?:[–-]\d+(?:[.,]\d+)?)? ?(?:°\s?C|%|[^\W\d_]{1,4}(?:/[^\W\d_]{1,3})?))?")
_ID_NOTED = re.compile(r"(\S{3,40}) \([^()\n]{1,40}\)")  # an id and a note on it in brackets
_CODED = re.compile(r"\w{1,6} \([^()\n]{1,40}\)")  # a state's code and its text (`8 (Ankunft am Transportziel)`, `503 (Service Unavailable)`)
_READINGS = re.compile(r"-?\d+(?:[.,]\d+)?(?:,\s+-?\d+(?:[.,]\d+)?)+")  # `0.52, 0.58, 0.59`
_DECIMALS = re.compile(r"\d[.,]\d")  # a decimal point or comma (a list's `, ` is no decimal)
# readings each after its name and with its unit, set apart by a bar, a dot or a semicolon (`Leinen Salbei
# 41,5 m | Seide Altrosa 22,0 m`; round 49)
_NAMED_READING = r"[^\W\d_][\w'’ -]{0,30}? -?\d+(?:[.,]\d+)? ?[^\W\d_]{1,4}"
_NAMED_READINGS = re.compile(rf"{_NAMED_READING}(?: [|·;] {_NAMED_READING})+")


def whole_value_start(line_prefix: str) -> int | None:
    """Where the value of a `key: value` line starts, the line's text before a changed token given
    (`line_prefix`), the key at the line's start or after its last sentence (`… outlined here. MV
    Lonan: `); None when there is no key."""
    m = _LINE_KEY.match(line_prefix)
    if m is not None:
        return m.end()
    ends = list(_SENTENCE_END.finditer(line_prefix))  # a `key: value` put after the line's sentences
    if ends:
        at = ends[-1].end()
        m = _LINE_KEY.match(line_prefix[at:])
        return at + m.end() if m is not None else None
    return None


_SENTENCE_END = re.compile(r"[.!?] +(?=[^\W\d_])")


def whole_value_change(old: str, new: str, key: str = "") -> str | None:
    """The kind of a `key: value` line's whole value that changed in more than one token, when it
    changed as a value the client writes per request does: a state of one or two words on both
    sides (`Gasfackel: in Betrieb` -> `aus`: a `flag`) or a code with its text in brackets
    (`FMS-Status: 8 (Ankunft am Transportziel)` -> `1 (Einsatzbereit über Funk)`), readings listed with decimals, as many on
    both sides (a load average, `TPS from last 1m, 5m, 15m: 19.97, 19.09, 18.9`: a `counter`), or
    an id drawn again in the same shape (`DE 09 524 46487` -> `DE 09 200 33728`: capitals and
    digits, the same length and separators, two parts or more changed: a `value`). A sentence rewritten is
    none of these, nor a setting's one number (`limit: 15` -> `30`). `key`: the line's text before
    the value (a tally's key may name its limits)."""
    if _WORD_TIME.fullmatch(old) and _WORD_TIME.fullmatch(new):
        return "time"  # a clock in words: a word clock's `ES IST ZEHN NACH SIEBEN` -> `HALB ACHT` (round 35)
    if _STATE.fullmatch(old) and _STATE.fullmatch(new) and _replaced(_state_head(old), _state_head(new)) \
            or _CODED.fullmatch(old) and _CODED.fullmatch(new):
        return "flag"
    if _number_noted(old, new):
        return "id"  # a running number with its words and a note (`walk 133 (18 walkers, guide Morag)`; round 45)
    a, b = _ID_NOTED.fullmatch(old), _ID_NOTED.fullmatch(new)
    if a and b and _rising_sequence(a.group(1), b.group(1)):
        return "id"  # the newest record's id, risen, with what it is in brackets (`T-2026-0755 (Meerschweinchen)`; round 35)
    if _READINGS.fullmatch(old) and _READINGS.fullmatch(new) and old.count(",") == new.count(",") \
            and _DECIMALS.search(f"{old} {new}"):
        return "counter"
    if _NAMED_READINGS.fullmatch(old) and _NAMED_READINGS.fullmatch(new) and _DECIMALS.search(f"{old} {new}") \
            and _same_but(_NUMBER_OR_MARK, old, new):
        return "counter"  # the same names and units, their readings changed
    if _counted_state(old, new) or _reading_state(old, new):
        return "flag"
    if _running_status(old, new) or _series_status(old, new):
        return "time"
    if _named_tally(old, new, key) or _running_score(old, new) or _series_record(old, new):
        return "counter"
    if _readings_board(old, new) or _amounts_board(old, new):
        return "counter"
    if _codes_drawn(old, new) or _STRUCTURED_REFERENCE.fullmatch(old) and _STRUCTURED_REFERENCE.fullmatch(new):
        return "value"
    if _entry_record(old, new) or _entry_rose(old, new) or _serial_scanned(old, new):
        return "id"
    if _numbered_report(old, new) or _stamped_report(old, new) or _report_stamped_first(old, new):
        return "value"
    if _match_result(old, new):
        return "value"
    if len(old) != len(new) or not (_CODE.fullmatch(old) and _CODE.fullmatch(new)) or any(
            a != b and not (a.isalnum() and b.isalnum()) for a, b in zip(old, new, strict=True)):
        return None
    changed = [(a, b) for a, b in zip(_RUNS_OF_WORDS.findall(old), _RUNS_OF_WORDS.findall(new), strict=True) if a != b]
    if len(changed) >= 2 and not any(_VERSION.match(a) for a, _ in changed):
        return "value"  # two parts drawn again, not a release bumped with its build (`Godot v4.3.stable [77dcf97d8]`)
    return None


# a time of day in words, as a word clock or a speaking clock says it: English (`quarter past seven`,
# `twenty-five to eight`, `eight o'clock`) and German (`zehn nach sieben`, `fünf vor halb elf`,
# `dreiviertel neun`, `acht Uhr`), after `it is` / `es ist` or not
_HOURS_EN = "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
_HOURS_DE = "eins|ein|zwei|drei|vier|fünf|sechs|sieben|acht|neun|zehn|elf|zwölf"
_WORD_TIME = re.compile(
    rf"(?i)(?:(?:(?:it is|it's) )?(?:(?:(?:five|ten|twenty|twenty-five)(?: minutes)?|(?:a )?quarter|half) (?:past|to) "
    rf"(?:{_HOURS_EN})|(?:{_HOURS_EN}) o'clock)"
    rf"|(?:es ist )?(?:(?:fünf|zehn|zwanzig|viertel) (?:nach|vor) (?:halb )?|halb |dreiviertel )(?:{_HOURS_DE})(?: uhr)?"
    rf"|(?:es ist (?:{_HOURS_DE})|(?:{_HOURS_DE}) uhr)(?: uhr)?"
    r")\.?")  # a sentence's full stop may end it (`Es ist halb sieben.`; round 36)
# a number as a status line writes it: digits with decimal, thousands or clock groups (`12.8`,
# `2.400`, `0,69`, `16:30`); one glued to a letter before it is part of an id or a version (`NH4`, `v5.4`)
_STATUS_NUMBER = re.compile(r"(?<![^\W\d_])\d+(?:[.,:]\d+)*|[^\W\d_]\d+(?:[.,:]\d+)*")
# a wind's direction (`SW`, `NNO`, `Südwest`, `north-east`), redrawn with its speed
_COMPASS = re.compile(r"[NESW]{1,3}|[NSO]{1,3}|(?i:(?:nord|süd|ost|west|north|south|east)(?:-?(?:west|ost|east))?)")
# a date (one separator, twice: not a range `0-24/248`) or a release; or a year alone
_FULL_DATE = re.compile(r"\d{1,4}([./-])\d{1,2}\1\d{1,4}|\d+(?:\.\d+){2,}")
_DATED = re.compile(_FULL_DATE.pattern + r"|(?<!\d)(?:19|20)\d\d(?!\d)")


def without_notes(value: str) -> str:
    """A value without its notes in brackets (`Ofen 2 (Hering, 79 kg): …` -> `Ofen 2: …`)."""
    return _NOTE.sub("", value)


def is_dated(value: str, year: bool = True) -> bool:
    """Does a value hold a date or a release (`2026-05-05`, `4.2.1`), or, with `year`, a year alone
    (`2024`)?"""
    return (_DATED if year else _FULL_DATE).search(value) is not None


def status_readings(old: str, new: str) -> tuple[int, int, int] | None:
    """Where a key line's value that holds two numbers or more changed, when it changed in its
    numbers only (and a wind's direction beside them), its words the same, one changed number
    written to a reading's precision (`_precise`), beside a wind's direction, or not round with a
    time running in the value (`RUNNING_TIME`: `seit 11 Min. an der Luft, nächster Zug in 4 Min.`;
    round 46): a status line the
    client writes per request (`12.8 nm off, SOG 12.7 kn`, `W 6, gusting 7`, `rows_read=34222
    rows_written=0 duration=0.0446ms`). As (start, end) in `new` and the end in `old`: the one
    number that changed, or the whole value when more changed; None otherwise. A rule edited
    changes small round numbers or its words (`4 to 7 business days`); a date, a year or a release
    in the value is read on its own (`gültig ab 01.01.2025`, `Koha 24.11.03`), and so is a number
    glued to a letter (`NH4-N`, `v5.4`); a price is a rule's (`$0.65 per options contract`), and so
    is a number after a bound's word (`ab 9 Jahren`). A game's running score in a record set apart
    by signs is the record's: the whole value (round 64)."""
    if _DATED.search(old) or _DATED.search(new):
        return None
    a, b = list(_STATUS_NUMBER.finditer(old)), list(_STATUS_NUMBER.finditer(new))
    if len(a) == len(b) == 1 and _one_reading(old, a[0], new, b[0]):
        return b[0].start() - _signed(new, b[0].start()), b[0].end(), a[0].end()
    if len(a) != len(b) or len(a) < 2:
        return None
    gaps_a, gaps_b = _gaps(old, a), _gaps(new, b)
    traded = _names_traded(gaps_a, gaps_b)
    if any(g != h and not _compass_only(g, h) and not _agreement_only(g, h) and not traded
           for g, h in zip(gaps_a, gaps_b, strict=True)):
        return None
    changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x.group() != y.group()]
    if changed and all(_hour_of_a_rule(old, a[i]) and _hour_of_a_rule(new, b[i]) for i in changed):
        return None  # a rule's hours edited (`starts at 8.00pm; … seated by 7.15pm` -> `8.30pm; … 7.45pm`; round 81)
    redrawn = [k for k, (g, h) in enumerate(zip(gaps_a, gaps_b, strict=True)) if g != h]  # a wind's direction
    # a price that changes with a count beside it is a reading too (a day's donations beside its
    # visitors, a tote's pool beside its odds; round 59); alone it is a rule's
    counted = any(not _priced(new, b[i]) and _precise(b[i].group()) for i in changed)
    if not (changed or redrawn) or any(not a[i].group()[0].isdigit() or not b[i].group()[0].isdigit()
                                       or _priced(new, b[i]) and not counted for i in changed):
        return None
    if any(_BOUND_BEFORE.search(new, 0, b[i].start()) for i in changed):
        return None  # a rule's bound edited (`Kinder ab 8 Jahren und 1,30 m` -> `ab 9 Jahren und 1,35 m`; round 63)
    compass = bool(redrawn) or _beside_compass(gaps_b)
    # a time running in it that changed to a number not round: a status's clock (round 46); a rule's times are round
    running = RUNNING_TIME.search(old) is not None and any(
        _off_the_five(b[i].group()) and in_running_time(new, b[i].start(), b[i].end()) for i in changed)
    if not compass and not running and not any(_precise(x.group()) for x in b) and not any(
            _precise(a[i].group()) or _unit_glued(old, a[i], new, b[i]) for i in changed) \
            and not _counts_redrawn(b, gaps_b, changed):
        return None
    if len(changed) == 1 and not redrawn and not (_GAME_SCORE.fullmatch(b[changed[0]].group()) and RECORD_PARTS.search(new)):
        return b[changed[0]].start(), b[changed[0]].end(), a[changed[0]].end()  # one reading: the number alone
    if not any(c.isalpha() for g in gaps_b[:-1] for c in g):  # numbers sharing one unit (`9,0 / 4,0 bar`): the numbers
        return b[0].start(), b[-1].end(), a[-1].end()
    return 0, len(new), len(old)  # readings redrawn together: the value, whole


_HALF_OF_DAY = re.compile(r"\s?(?:[ap]\.?m\b\.?|[AP]M\b)")  # what follows a twelve-hour clock: `pm`, `a.m.`


def _hour_of_a_rule(text: str, number: re.Match[str]) -> bool:
    """Is the number a twelve-hour clock (its half of the day after it: `8.30pm`, `7 a.m.`) on the quarter
    hour? A rule's hours are round; a status's clock runs off them, and is read as a clock, not a reading."""
    if not _HALF_OF_DAY.match(text, number.end()):
        return False
    minutes = re.split(r"[.:]", number.group())[1:] or ["00"]
    return len(minutes) == 1 and minutes[0] in ("00", "15", "30", "45")


# a game's running score (`1:0`): one digit after the colon, as no clock has; in a match's record set apart by
# signs it is the record's (`Junioren U15 gegen TC Wil 1:1 · läuft: Einzel 3, 1:0 im Satz`, whole; round 64)
_GAME_SCORE = re.compile(r"\d{1,2}:\d")


def _one_reading(old: str, a: re.Match[str], new: str, b: re.Match[str]) -> bool:
    """A key's value that is one reading with its words (`1.33 Ml` -> `1.58 Ml`, `+5 mm on weir crest,
    rising` -> `+16 mm …`; round 25): the words the same, the number changed, written with a sign
    (which may change) or to two decimals on both sides (a measurement's deviation, a meter's
    reading). A setting's number is unsigned and round (`Max load: 2.5 t per axle` -> `3.0 t`)."""
    sa, sb = _signed(old, a.start()), _signed(new, b.start())
    if a.group() == b.group() or old[:a.start() - sa] != new[:b.start() - sb] or old[a.end():] != new[b.end():] \
            or not (a.group()[0].isdigit() and b.group()[0].isdigit()) or _priced(new, b):
        return False
    return (sa and sb) or all(re.fullmatch(r"\d+[.,]\d\d", n) for n in (a.group(), b.group()))  # `1,500`: thousands


def _signed(text: str, at: int) -> int:
    """1 when the number at `at` has its own sign (`+5`, `-4`, `±2`: after a space or the start), else 0."""
    return int(at >= 1 and text[at - 1] in "+-±" and (at == 1 or not text[at - 2].isalnum()))


def reads_as_status(value: str) -> bool:
    """`status_readings` from one side, for a pod that knows only that a line changed in its digits
    (another pod's digest: `RequestDigest.shapes`): the value holds two numbers or more, none of
    them glued to a letter or priced, no date, year or release, and one written to a reading's
    precision, with a unit glued to it, beside a wind's direction, or not round in a time running
    in it (round 46)."""
    if _DATED.search(value):
        return False
    numbers = list(_STATUS_NUMBER.finditer(value))
    if len(numbers) < 2 or any(not n.group()[0].isdigit() or _priced(value, n) for n in numbers):
        return False
    if _beside_compass(_gaps(value, numbers)):
        return True
    return any(_precise(n.group()) or _unit_glued(value, n, value, n)
               or _off_the_five(n.group()) and in_running_time(value, n.start(), n.end()) for n in numbers)


def _priced(text: str, number: re.Match[str]) -> bool:
    """Is the number a price (a currency sign before or after it)? A rule's, when it changes (`$0.65
    per options contract`)."""
    return bool(_CURRENCY_BEFORE.search(text, 0, number.start())) or bool(_CURRENCY_AFTER.match(text, number.end()))


_CURRENCY_BEFORE = re.compile(r"[$€£¥]\s?$")
_CURRENCY_AFTER = re.compile(r"\s?[$€£¥]")


def _gaps(text: str, numbers: list[re.Match[str]]) -> list[str]:
    """The text before, between and after the numbers found in `text`."""
    edges = [0, *(e for m in numbers for e in (m.start(), m.end())), len(text)]
    return [text[edges[i]:edges[i + 1]] for i in range(0, len(edges), 2)]


_COUNTED = re.compile(r"\s[^\W\d_]{2,}")  # a count's noun after it: `33 offen`, `16 frei`


def _counts_redrawn(numbers: list[re.Match[str]], gaps: list[str], changed: list[int]) -> bool:
    """Every count of a status line changed (its names, `P1`, stay) and each counts something
    named after it (`33 offen, 27 erledigt` -> `31 offen, 29 erledigt`, `P1 Altstadt 16 frei, P2
    Bahnhof 28 frei`): a tally the client writes again, round 24. A rule's numbers change one at a
    time or bound a range (`4 to 7 business days`)."""
    counts = [i for i, n in enumerate(numbers) if n.group()[0].isdigit()]
    if len(counts) < 2 or len(changed) < 2 or not set(changed) <= set(counts):
        return False
    return all(_COUNTED.match(gaps[i + 1]) and not _RANGE_WORD.match(gaps[i + 1]) for i in counts)


_RANGE_WORD = re.compile(r"\s(?:to|bis|and|und|or|oder|of|von|per|pro|je|x|mal)\b", re.IGNORECASE)


def _precise(number: str) -> bool:
    """A number written to a reading's precision: decimals or digit groups, three digits or more,
    zero-padded (`07`), a clock off the quarter hours (a rule's hours are round: `open 06:30 to
    20:00`)."""
    if ":" in number:
        return not number.rsplit(":", 1)[1].isdecimal() or int(number.rsplit(":", 1)[1]) % 15 != 0
    return "." in number or "," in number or len(number) >= 3 or (len(number) >= 2 and number[0] == "0")


def _unit_glued(old: str, a: re.Match[str], new: str, b: re.Match[str]) -> bool:
    """A changed number with its unit glued to it, as machines write readings (`55%`, `35m 45s`),
    not round on both sides (`30s` -> `60s` is a setting's)."""
    glued = a.end() < len(old) and _GLUED_UNIT.match(old, a.end()) and b.end() < len(new) and _GLUED_UNIT.match(new, b.end())
    return bool(glued) and max(_significant(a.group()), _significant(b.group())) > 1


_GLUED_UNIT = re.compile(r"(?:%|°|[a-zµ]{1,3})(?![\w])")


def _compass_only(old: str, new: str) -> bool:
    """Do two stretches between numbers differ only in a wind's direction (`NW ` -> `W `)?"""
    x, y = old.split(), new.split()
    return len(x) == len(y) and all(p == q or (_is_compass(p) and _is_compass(q)) for p, q in zip(x, y, strict=True))


# a time that runs in a status's words: hours and minutes, minutes and seconds, a countdown
RUNNING_TIME = re.compile(r"\d{1,3} ?h \d{1,2} ?min|\d{1,3}:\d\d ?min|\b(?:in|noch) \d{1,3} ?(?:min\b|Min\.)"
                          r"|\b(?:in|noch) \d{1,2}:\d\d ?h\b"  # hours and minutes left (`noch 0:35 h`; round 49)
                          r"|\b\d{1,3} ?min(?:utes)? (?:played|gone|elapsed|gespielt|vorbei)\b")  # `9 min played` (round 59)
_MINUTES = re.compile(r"(?<![\d:.,])(\d{1,3}) ?min\b")  # minutes alone (`44 min under steam`)
_NOTE = re.compile(r" ?\([^()\n]{1,40}\)")
_AFTER_TIME = re.compile(r",? [^\W\d_][^\n]{0,30}$")  # a state after the time (`noch 22 Min., Polieren`)
STATUS_LETTERS = re.compile(r"[^\W\d_]{2,}")
STATUS_VALUE_CHARS = 56  # a status line's value; a longer one is text or a log (48 before round 46)


def in_running_time(text: str, start: int, end: int, lo: int = 0, hi: int | None = None) -> bool:
    """Does `text[start:end]` lie inside a time running in `text[lo:hi]` (`RUNNING_TIME`)?"""
    return any(m.start() <= start and end <= m.end()
               for m in RUNNING_TIME.finditer(text, lo, len(text) if hi is None else hi))


def _off_the_five(number: str) -> bool:
    """Is a whole number off the five minutes? A rule's times are round (`in 30 min`), a clock's not."""
    return number.isdigit() and int(number) % 5 != 0


def _running_status(old: str, new: str) -> bool:
    """A short status whose time runs (`RUNNING_TIME`, after its words) and changed with at most one
    of its words (`Maud departs 12:18 (in 2 min)` -> `Lily departs 12:21 (in 3 min)`, `day 2 of 5, 41 h
    45 min since lighting` -> `41 h 57 min`; round 44): the client writes it on each request."""
    bare_old, bare_new = without_notes(old), without_notes(new)
    if max(len(bare_old), len(bare_new)) > STATUS_VALUE_CHARS:  # its notes aside (round 47)
        return False
    a, b = RUNNING_TIME.search(old), RUNNING_TIME.search(new)
    if a is None or b is None:
        a, b = _MINUTES.search(old), _MINUTES.search(new)  # minutes alone: a rule's are round
        if a is None or b is None or not (_off_the_five(a.group(1)) or _off_the_five(b.group(1))):
            return False
    if a.group() == b.group() and old.replace(a.group(), "") == new.replace(b.group(), ""):
        return False
    x, y = STATUS_LETTERS.findall(old[:a.start()]), STATUS_LETTERS.findall(new[:b.start()])
    # what the status says beside its time: its notes in brackets and a state after it may change with it
    ox = _NOTE.sub("", old[:a.start()]) + old[a.start():a.end()] + _AFTER_TIME.sub("", old[a.end():])
    ny = _NOTE.sub("", new[:b.start()]) + new[b.start():b.end()] + _AFTER_TIME.sub("", new[b.end():])
    wx, wy = STATUS_LETTERS.findall(ox), STATUS_LETTERS.findall(ny)
    return bool(x and y) and len(wx) == len(wy) and sum(p != q for p, q in zip(wx, wy, strict=True)) <= 1 \
        and len(_STATUS_NUMBER.findall(bare_old)) == len(_STATUS_NUMBER.findall(bare_new))


# a tally of three counts or more, each after its name (`small room 2, big room 4, walking 2, collected 0`)
# (round 49); a count may be a fraction, and the tally's total may come first (`15/26 · cornets 4/10, horns 3/3,
# …`; round 50)
_COUNT = r"\d{1,4}(?:[.,]\d)?(?:/\d{1,4})?"  # a score to one decimal too (penalties `24.0`; round 66)
# (each name may follow its own number, a car's or a bib's: `19 Halliday 407 · 217 Pryce 399 · …`; round 64)
_NAMED_COUNTS = re.compile(rf"(?:{_COUNT} [·|:] )?(?:\d{{1,4}} )?[^\W\d_][\w'’ -]{{0,30}}? {_COUNT}"
                           rf"(?:(?:, | [·|;] )(?:\d{{1,4}} )?[^\W\d_][\w'’ -]{{0,30}}? {_COUNT}){{2,}}")  # `·` apart too (round 51)
# or each before its name (`1 minke, 2 porpoise, 0 dolphin, 3 basking shark today`; round 58)
_COUNTED_NAMES = re.compile(rf"{_COUNT} [^\W\d_][\w'’ -]{{0,30}}?(?:(?:, | [·|;] ){_COUNT} [^\W\d_][\w'’ -]{{0,30}}?){{2,}}")
_WHOLE_NUMBER = re.compile(r"\d+")
_SHARE = re.compile(r"\d+(?:/\d+)?")  # a count, or a share of a capacity (`12/14`)
_NUMBER_OR_MARK = re.compile(r"\d+|[.,]")  # a reading's digits and its decimal or group marks, each apart


def _same_but(numbers: re.Pattern[str], old: str, new: str) -> bool:
    """Are two values the same text but for what `numbers` matches (their words and units kept)?"""
    return numbers.sub("#", old) == numbers.sub("#", new)


DECIMAL_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# a sign of any kind but prose's punctuation, brackets, quotes and the signs of sums and money: what sets a board's or
# a record's parts apart (`·`, `|`, `¦`, `»`, `→`, `▹`, `┊`, `◆`, runic punctuation `᛫`; any such sign since round 75)
SIGN = r"[^\w\s\-–—,.:;!?'\"„“”‘’()\[\]{}<=+*/\\&%#@$€£]"
# a clock in twelve hours with its half of the day, written with a colon or a dot (`9.03pm`, `2:35 p.m.`, `10:06
# a.m.`; round 76), or a US schedule's letter alone after a colon's clock (`7:25a`; round 77): a board's or a
# report's stamp as the 24-hour clock is; or the hour alone with its half of the day, or noon or midnight, as
# British and Irish notices write them (`11pm`, `9 a.m.`, `12 noon`; round 80)
CLOCK_12 = (r"(?:(?:1[0-2]|0?[1-9])(?:[.:][0-5]\d ?(?:[ap]m|[AP]M|[ap]\.m\.)|:[0-5]\d[ap](?!\w)| ?(?:[ap]m|[ap]\.m\.)(?!\w))"
            r"|12 (?:noon|midnight)(?!\w))")
RAISED_DIGITS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
# a stamp's clock as boards and logs write it: 24-hour, to the minute or the second, in brackets or not, or
# twelve-hour; `Uhr` or `h` after it; dotted with `Uhr` or `h` after it (`07.13 Uhr`) or the word for o'clock before
# it (`kl. 14.12`, `klo 14.12`, `ore 18.30`, `godz. 9.05`), or with an `h` between the hours and the minutes
# (`19h12`, `14 h 30`; round 76); its minutes raised, as a poster writes them (`8⁴⁵ Uhr`), and the clock given
# again in a second language after a slash (`2.02pm / 2.02yp`); and, from the conventions themselves, `uur`, `hrs`
# or `u` after it, a Belgian `14u30`, and a services' clock of four digits with `hrs`, `Z` or `L` (`1430 hrs`;
# round 77), or with `H` after it as Singapore writes it, the evening's hours too (`2245H`; round 81); in brackets
# with its zone, as a logger stamps a line (`[09:44 HKT] Festival control: …`; round 84); the hour, `Uhr`, then the
# minutes, as Austrian radio says the time (`13 Uhr 33`; round 85)
_CLOCK_WORD = r"(?:Uhr|uur|hrs?|h|u\.?)(?!\w)"  # what follows a clock: German's, Dutch's, the services' `hrs`, `h`, `u`
STAMP_CLOCK = (rf"(?:\[?(?:\d{{1,2}}:\d\d(?::\d\d)?|{CLOCK_12})\]?(?: ?{_CLOCK_WORD})?|\d{{1,2}}\.\d\d ?{_CLOCK_WORD}"
               rf"|\[(?:\d{{1,2}}:\d\d(?::\d\d)?|{CLOCK_12}) [A-Z]{{2,4}}\]|\d{{1,2}} Uhr [0-5]\d(?!\d)"
               rf"|(?:kl\.?|klo|ore|godz\.) \d{{1,2}}[.:][0-5]\d|\d{{1,2}} ?[hu] ?[0-5]\d(?!\w)"
               rf"|\d{{1,2}}[{RAISED_DIGITS}]{{2}}(?: ?Uhr)?|(?:[01]\d|2[0-3])[0-5]\d ?(?:hrs?|[ZLH])(?!\w))"
               r"(?: / \d{1,2}[.:][0-5]\d ?[^\W\d_]{0,4}\.?)?")
_RAISED = str.maketrans(RAISED_DIGITS, "0123456789")
_RAISED_MINUTES = re.compile(f"[{RAISED_DIGITS}]+")


def clock_minutes(clock: str) -> int:
    """Minutes since midnight of a stamp's clock, 24-hour or twelve-hour (`CLOCK_12`: `12.10am` is
    00:10, `1.03pm` is 13:03, `7:25a` is 07:25, `11pm` is 23:00, `12 midnight` 00:00), its minutes raised
    or not (`8⁴⁵`), or four digits (`1430 hrs`)."""
    clock = _RAISED_MINUTES.sub(lambda m: ":" + m.group().translate(_RAISED), clock)
    numbers = re.findall(r"\d+", clock)
    if len(numbers[0]) > 2:
        hours, minutes = divmod(int(numbers[0]), 100)
    else:  # the hour alone (`11pm`) has no minutes
        hours, minutes = int(numbers[0]), int(numbers[1]) if len(numbers) > 1 else 0
    half = re.search(r"(?i)\d ?([ap])(?:\.?m\b|(?!\w))", clock)
    if half is not None:
        hours = hours % 12 + (12 if half.group(1).lower() == "p" else 0)
    elif "midnight" in clock:
        hours = 0
    return hours * 60 + minutes


_BOARD_PARTS = re.compile(rf" (?:{SIGN}|;) ")


def _readings_board(old: str, new: str) -> bool:
    """A board of readings in parts set apart by a sign, its words and units the same, two readings
    or more changed, each written with decimals on both sides (`Au 999,9 – 99,01 €/g · Ag 999 – 1,380
    €/g · …` -> `… 99,14 €/g · … 1,376 €/g · …`; round 51): prices or measurements read again. A
    rule's numbers are whole (`9–17 · Sat 10–14`)."""
    if not _BOARD_PARTS.search(old) or not _same_but(DECIMAL_NUMBER, old, new):
        return False
    changed = [(a, b) for a, b in zip(DECIMAL_NUMBER.findall(old), DECIMAL_NUMBER.findall(new), strict=True) if a != b]
    return len(changed) >= 2 and all(_DECIMALS.search(a) and _DECIMALS.search(b) for a, b in changed)


# sums of money each after its name, three or more (`win £1,182 · forecast £1,024 · trifecta £369`; round 63)
_AMOUNT = r"[$€£]\d{1,3}(?:,\d{3})*(?:\.\d\d)?|\d{1,3}(?:\.\d{3})*(?:,\d\d)? ?€"
_NAMED_AMOUNTS = re.compile(rf"[^\W\d_][\w'’ -]{{0,30}}? (?:{_AMOUNT})(?: [·|;] [^\W\d_][\w'’ -]{{0,30}}? (?:{_AMOUNT})){{2,}}")


def _amounts_board(old: str, new: str) -> bool:
    """A board of sums each after its name, the names the same, two sums or more changed (a tote's
    pools, `race 6 pools: win £1,048 · forecast £938 · …` -> `win £1,182 · forecast £1,024 · …`;
    round 63): takings counted again. What the board is of may head it (`_tally_core`). A price
    list with one price edited (`adult £12 · child £8 · …` -> `adult £13 · …`) is a rule's edit."""
    old, new = _tally_core(old), _tally_core(new)
    if not (_NAMED_AMOUNTS.fullmatch(old) and _NAMED_AMOUNTS.fullmatch(new)) or not _same_but(DECIMAL_NUMBER, old, new):
        return False
    return sum(a != b for a, b in zip(DECIMAL_NUMBER.findall(old), DECIMAL_NUMBER.findall(new), strict=True)) >= 2


def named_tally(value: str, line_prefix: str) -> bool:
    """Is a value a tally of counts after their names whose key names no limits (`_named_tally`
    from one side: another pod that knows only that the line changed in its digits reads it whole,
    as the text path does whichever count changed)?"""
    return _is_tally(_tally_core(value)) and _LIMIT_KEY.search(line_prefix) is None


def _is_tally(core: str) -> bool:
    """Three counts or more, each after its name or each before it (`_NAMED_COUNTS`, `_COUNTED_NAMES`),
    or parts that each hold one (`_counted_parts`)."""
    return _NAMED_COUNTS.fullmatch(core) is not None or _COUNTED_NAMES.fullmatch(core) is not None \
        or _counted_parts(core)


_TALLY_PARTS = re.compile(rf" (?:{SIGN}|[;–—]) |; ")  # a semicolon as prose sets it too (`… 6/31; ladders …`; round 86)
_MONEY = re.compile(r"[$€£]")  # a currency sign: sums of money
TALLY_PARTS = 3


def _counted_parts(core: str) -> bool:
    """TALLY_PARTS parts or more set apart by a sign, a dash too, each holding a count, no clock, no
    longer than a record (`Führung #411 nach 30 Runden – im Rennen 122 von 135 – Code-60-Phasen 19`;
    round 72): a race's counts in words of their own. A rule's hours hold clocks or none of a part's
    own (`Mon 9 – 17`: a part of one number is a bound), and a price list sums of money in half its
    parts or more (`adult £12 · child £8 · family £35`: a price edited is a rule's edit; an auction's
    `Uhr 2 · Partie 4605 · … · 4 Karren · Zeiger 0,68 €/Stiel` is a tally)."""
    parts = _TALLY_PARTS.split(core)
    return len(parts) >= TALLY_PARTS and len(core) <= RECORD_CHARS and not _CLOCK.search(core) \
        and 2 * sum(_MONEY.search(p) is not None for p in parts) < len(parts) \
        and all(_WHOLE_NUMBER.search(p) and LETTER_RUNS.search(p) for p in parts)


# what a tally is of, before it (`Lane 1, game 1 (10 throws): `), and a last part of words after it
# (` · Manni to throw`): neither counts
_TALLY_HEADING = re.compile(r"[^\n·|;]{1,80}?: (?=[^\W\d_]|\d{1,4} [^\W\d_])")  # before a name's own number too (round 64)
_WORDS_PART = re.compile(r" [·|;] [^\d·|;\n]{1,30}$")


def _tally_core(value: str) -> str:
    """A value without what heads its tally, a last part of words (`_TALLY_HEADING`, `_WORDS_PART`)
    and its notes in brackets (`deferred 0 (low Hb 0, travel 0)`; round 58)."""
    head = _TALLY_HEADING.match(value)
    core = value[head.end():] if head is not None else value
    return _WORDS_PART.sub("", without_notes(core))


# a key that names a tally's limits, a rule's (`Limits: small dogs 2, big dogs 4`), not what it counts now
_LIMIT_KEY = re.compile(r"(?i)\b(?:limits?|max(?:ima|imum)?|quotas?|allowed|höchst\w*|grenzen?)\b")


def _named_tally(old: str, new: str, line_prefix: str) -> bool:
    """The same names, each before its count, a count or more changed (`small room 2, big room 4,
    walking 2, collected 0` -> `small room 2, big room 2, walking 2, collected 2`; round 49): a tally
    the client writes again, as `_counts_redrawn` reads counts before their names. One count
    changed is one too (round 53: a lab's trays, `in 8 · glazing 3 · …` -> `in 9 · …`, a daycare's
    rooms, a choir's seats, in three pools), unless the key names limits (`Limits: small dogs 2,
    big dogs 4` -> `big dogs 5`: a rule edited; round 49's guard). What the tally is of may head it,
    and a last part of words may follow it (`Lane 1, game 1: Heinz 28 · Manni 26 · … · Manni to
    throw`; round 57): `_tally_core`."""
    old, new = _tally_core(old), _tally_core(new)
    if not (_is_tally(old) and _is_tally(new)) or not _same_but(_WHOLE_NUMBER, old, new):
        return False
    changed = sum(a != b for a, b in zip(_SHARE.findall(old), _SHARE.findall(new), strict=True))
    return changed >= 2 or changed == 1 and _LIMIT_KEY.search(line_prefix) is None


# a match's score: each side's name beside its count, the counts set apart by a dash or a colon (`Kestrels 38 –
# 40 Hammers`, `Hearts 2:1 Celtic`); a side's name of three letters or more, neither a clock's nor a day's word
_SCORE = re.compile(r"(?<![\w'’.-])([^\W\d_][\w'’.-]{2,}) (\d{1,3}) ?[–—:-] ?(\d{1,3}) ([^\W\d_][\w'’.-]{2,})(?![\w'’-])")
_NO_SIDE = re.compile(r"(?i)uhr|hrs?|std|min|mins|am|pm|mon|tue|wed|thu|fri|sat|sun|[a-z]+day|[a-z]+tag")
SCORE_CHARS = 64  # a score with what it is after (`after heat 13: `), as short as a series' status


def _running_score(old: str, new: str) -> bool:
    """A match's score as it goes on (`after heat 11: Kestrels 35 – 31 Hammers` -> `after heat 13:
    Kestrels 38 – 40 Hammers`; round 57): the same words, two numbers or more changed, none of the
    score's counts fell. A rule's hours (`Mon 9 – 17 Uhr`) name no sides."""
    if len(old) > SCORE_CHARS or not _same_but(_WHOLE_NUMBER, old, new):
        return False
    a, b = _SCORE.search(old), _score(new)
    if a is None or b is None or _WHOLE_NUMBER.sub("#", old[:a.start()]) != _WHOLE_NUMBER.sub("#", new[:b.start()]):
        return False
    changed = sum(x != y for x, y in zip(_WHOLE_NUMBER.findall(old), _WHOLE_NUMBER.findall(new), strict=True))
    return changed >= 2 and int(b.group(2)) >= int(a.group(2)) and int(b.group(3)) >= int(a.group(3))


# a record's parts set apart by a sign (`MOT test number 2037 5336 5606 · class 4 · PRS`), and how long a record
# may be to be one entry: prose is not set apart so (96 before round 57); the running number that names its item,
# thousands grouped by dots too (`Charge 1.935`); a reading with its unit, a rate per hour too (`49 kg`, `70 °C`,
# `442 Teile/h`)
RECORD_PARTS = re.compile(rf" {SIGN} ")
RECORD_CHARS = 128
_ITEM_NUMBER = re.compile(r"(\d{1,3}(?:\.\d{3})+|\d{1,6})(?![\d.,:]?\d)")
_VERSION_WORD = re.compile(r"(?i)(?:\bv|version|rev(?:ision)?|edition|stand|fassung|ausgabe)\W*$")
_UNIT_READING = re.compile(rf"(\d+(?:[.,]\d+)?)(?:{_MEASURE_UNIT.pattern}|{_READING_UNIT.pattern}|\s?[^\W\d_]{{1,8}}/h\b)")
SERIES_RECORD_CHARS = 160


def _series_record(old: str, new: str) -> bool:
    """A record of three parts or more set apart by signs, its first part naming a running item
    whose number rose by RUNNING_NUMBER_STEP at most, and another part changed with a reading in it
    (a tunnel washer's `Charge 1.935 · 43 kg Tischwäsche 60 °C · Presse 2 · …` -> `Charge 1.939 · 49
    kg Pflegeheim … 70 °C · …`; round 58): the status of a series' item, rewritten as the item moves
    on. A rule's version bumped beside an edit (`plan v6 · …` -> `v7`) and a threshold (`limit 40
    km/h`) are no running item and no reading."""
    a, b = RECORD_PARTS.split(old), RECORD_PARTS.split(new)
    if len(a) != len(b) or len(a) < 3 or max(len(old), len(new)) > SERIES_RECORD_CHARS:
        return False
    na, nb = _ITEM_NUMBER.search(a[0]), _ITEM_NUMBER.search(b[0])  # the item's number: the first (`Rennen 6: 1. Nr. 1 …`)
    if not na or not nb or a[0][:na.start()] != b[0][:nb.start()] or _VERSION_WORD.search(b[0], 0, nb.start()):
        return False
    step = int(nb.group(1).replace(".", "")) - int(na.group(1).replace(".", ""))
    # what changed: the first part after the item's number (`Waage 2: 0,88 kg …`), the other parts
    changed = [y for x, y in zip([a[0][na.end():], *a[1:]], [b[0][nb.end():], *b[1:]], strict=True) if x != y]
    return 0 < step <= RUNNING_NUMBER_STEP and any(
        not _THRESHOLD_BEFORE.search(part, 0, m.start()) for part in changed for m in _UNIT_READING.finditer(part))


_ENTRY_TOKEN = re.compile(r"[\w./-]+")


def _entry_record(old: str, new: str) -> bool:
    """Two records of three parts or more set apart by signs (a part may come or go with the entry,
    `… · rides with an adult`; round 60), each short enough to be an entry, whose first part names
    the entry by a code drawn again, an id that rose a little (`_rising_sequence`), a waiting
    ticket's number or a running number with its year (`_ticket_rose`), in a value that changed in
    more than that name (`Ticket EXC-ERE77U · tower tour 13:00 · family ticket · …` -> `Ticket
    EXC-PK3K2E · crypt and library · 1 adult · …`, `Group visit GV-26-0879 · 17 bell-ringers · …` ->
    `GV-26-0880 · 38 pupils · …`, `Aufruf A096 an Platz 2 · …` -> `Aufruf A097 an Platz 3 · …`; round
    59): the newest entry replaced, whatever its key says. A rule's record holds no drawn code, and
    its number is no series."""
    a, b = RECORD_PARTS.split(old), RECORD_PARTS.split(new)
    if len(a) == len(b) and _attempt_measured(a, b):
        return True
    if len(a) == len(b) >= LONG_RECORD_PARTS and max(len(old), len(new)) <= SERIES_RECORD_CHARS \
            and sum(x != y for x, y in zip(a, b, strict=True)) >= len(a) - 1:
        return True  # a long record, every part but one another (a race's verdict, `Race 70 · … · Berks station`; round 68)
    if abs(len(a) - len(b)) > 1 or min(len(a), len(b)) < 3 or max(len(old), len(new)) > RECORD_CHARS:
        return False
    if len(a) == len(b) and _named_fields(a, b):
        return True
    if a[0] != b[0] and _INITIALLED.fullmatch(a[0]) and _INITIALLED.fullmatch(b[0]):
        return True  # named by a person, a first name and an initial (a waiver's `Kerry E. · adult · …`; round 62)
    pa, pb = _POSSESSOR.match(a[0]), _POSSESSOR.match(b[0])
    if pa and pb and pa.group() != pb.group():
        return True  # a person's piece (`Rob's tumbler, ruby red · shelf B9 · made Sat` -> `Lee's …`; round 63)
    if len(a) == len(b) and _numbered_check(a, b):
        return True
    if len(a) == len(b) >= REPLACED_RECORD_PARTS and all(x != y for x, y in zip(a, b, strict=True)):
        return True  # every part another (a train report, `Talent 2 · RE 21 Goslar – … · … · +1` -> `143 250 · …`; round 64)
    ta, tb = _ENTRY_TOKEN.findall(a[0]), _ENTRY_TOKEN.findall(b[0])
    k = next((k for k, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
    if k is None:
        return False
    x, y = ta[k], tb[k]
    if _rising_sequence(x, y) or _ticket_rose(_LETTERS_BEFORE, x, y) or _ticket_rose(_NUMBER_OF_YEAR, x, y):
        return True
    if k > 0 and _ticket_rose(_NUMBER_ALONE, x, y):
        return True  # a number the word before it names (`tab 2463` -> `tab 2468`; round 61)
    # the code's parts drawn again, its fixed prefix aside (`EXC-` of `EXC-ERE77U`, `MB-` of `MB-LXG7-S659`)
    px, py = _CODE_SEPARATORS.split(x), _CODE_SEPARATORS.split(y)
    if len(px) != len(py):
        return False
    same = next((i for i, (p, q) in enumerate(zip(px, py, strict=True)) if p != q), len(px))
    return code_redrawn("-".join(px[same:]), "-".join(py[same:]), REDRAWN_CODE_CHARS)


LONG_RECORD_PARTS = 5  # a record this long with every part but one changed is another entry; an edit keeps more
# a competitor's attempt: a first and a last name, then which attempt (`Lorne Colthart, 2nd throw`, `attempt 2`)
_ATTEMPT = re.compile(r"[A-Z][\w'’-]+ (?:Ma?c)?[A-Z][\w'’-]+, (?:\d(?:st|nd|rd|th) [a-z]+|[a-z]+ \d)$")
# a distance measured in feet and inches, or in metres and centimetres (`117 ft 8 in`, `15 ft 0 in`, `8,21 m`)
_MEASURED = re.compile(r"\d{1,3} ft(?: \d{1,2} in)?|\d{1,3}[.,]\d{2} m")


def _attempt_measured(a: list[str], b: list[str]) -> bool:
    """Two records of a competitor's attempt and its measure (`Braemar stone: Lorne Colthart, 1st throw
    · 34 ft 4 in` -> `Weight over the bar: Euan McIntyre, 2nd throw · 15 ft 0 in`; round 68): the first
    part ends with a person's name and which attempt it was, the last part is a distance, and both
    changed: the newest attempt reported. A rule's record names no person's attempt."""
    if len(a) < 2 or a[0] == b[0] or a[-1] == b[-1]:
        return False
    return all(_ATTEMPT.search(x[0]) and _MEASURED.fullmatch(x[-1]) for x in (a, b))


LETTER_RUNS = re.compile(r"[^\W\d_]+")  # a value's words, its numbers and signs aside


def _named_fields(a: list[str], b: list[str]) -> bool:
    """Two records whose first part names another entry in other words, and whose every other part
    keeps its first word with the rest changed (`Nia Rhys-Evans (event 630) · queue about 150 · signing
    until 13:05` -> `Prof. Aled Morgan (event 322) · queue about 134 · signing until 12:45`; round 68):
    the same fields filled in for another entry. A rule's hours edited (`Doors 09:00 · Bar 22:00` ->
    `Doors 10:00 · …`) keep their names' words."""
    if LETTER_RUNS.findall(a[0]) == LETTER_RUNS.findall(b[0]) or any(x == y for x, y in zip(a, b, strict=True)):
        return False
    return all(x.split(" ", 1)[0] == y.split(" ", 1)[0] for x, y in zip(a[1:], b[1:], strict=True))


# an entry's running number: three digits or more, thousands grouped or not (`CAD 5480/31Aug`, `Nr. 41.486`)
_RUNNING_ENTRY = re.compile(r"(?<![\d.,])(\d{1,3}(?:[.,]\d{3})+|\d{3,})(?!\d|[.,]\d)")
ENTRY_LEAD_WORDS = 2  # words before an entry's running number: it leads its record (`CAD 5480/…`, `Nr. 41.486 …`)
# a number's sign: `#`, `Nr.`, `No.`, `Nº` (round 83)
SIGN_OF_NUMBER = r"(?:#|(?<![^\W\d_])(?:N[ro]\.|no\.|Nº))"
_NUMBER_SIGNS = re.compile(SIGN_OF_NUMBER)
_CODE_PARTS = re.compile(r"\S*[\d/]\S*")
_ABBREVIATION = re.compile(r"(?<![^\W\d_])(?:[^\W\d_]\.){2,}")  # `B.A.A.`, `U.S.`: one word


def _lead_words(lead: str) -> int:
    """The words before an entry's number; neither a number's sign nor the code the number ends counts
    (`Ticket No. HBF/27/059496 – …` has one; round 86), and an abbreviation with its dots is one word
    (`B.A.A. store order #288290 – …` has three; round 88)."""
    return len(LETTER_RUNS.findall(_ABBREVIATION.sub("A", _NUMBER_SIGNS.sub("", _CODE_PARTS.sub("", lead)))))


def _lead_allows(lead: str) -> bool:
    """May `lead` stand before an entry's running number: ENTRY_LEAD_WORDS words, or one more before the
    number's sign (`B.A.A. store order #288290 – …`; round 88)?"""
    return _lead_words(lead) <= ENTRY_LEAD_WORDS + (_NUMBER_SIGNS.search(lead) is not None)


def _entry_rose(old: str, new: str) -> bool:
    """Two values up to RECORD_CHARS whose first entry's number rose by TICKET_STEP at most (or by 1%
    of itself when that is more: `Maß Nr. 320.565` -> `320.655`; round 83) after the same words, the
    rest changed in its words too (`CAD 5480/31Aug – Great Western Road` -> `CAD 5482/31Aug –
    Ladbroke Grove`; round 70), or only in its numbers after a number's sign (`Expo order #216258 – 1 x
    jacket – R950` -> `#216299 – 2 x jacket – R1 900`; round 89): the newest entry of a log, whatever
    its key says, its number leading it (ENTRY_LEAD_WORDS). A rule's number edited keeps its words (`Hotline 0800 123
    456`), a rule's record names no entry's number (`Form 12 · …`), and a note's number deep in its
    prose is no entry's (`replaced the pump seal on unit 204 …`)."""
    if max(len(old), len(new)) > RECORD_CHARS:
        return False
    a, b = _RUNNING_ENTRY.search(old), _RUNNING_ENTRY.search(new)
    if a is None or b is None or old[:a.start()] != new[:b.start()] or old[a.end():] == new[b.end():] \
            or not _lead_allows(old[:a.start()]):
        return False
    if LETTER_RUNS.findall(old) == LETTER_RUNS.findall(new) and _NUMBER_SIGNS.search(old, 0, a.start()) is None:
        return False  # the same words: a rule's numbers edited, unless a sign numbers the entry (round 89)
    return _rose_a_little(int(re.sub(r"\D", "", a.group(1))), int(re.sub(r"\D", "", b.group(1))))


# a numbered item, then its report after a colon or an `@` (`Door 11: returned …`, `Steward 410 @ … : …`; since
# round 71 the number may follow up to three words and a note in brackets may follow it, `Zugleitung an Nr. 49
# (Treuer Husar): …`)
_NUMBERED_HEAD = re.compile(r"((?:[^\W\d_][\w.-]{0,20} ){1,3}\d{1,4})(?: \([^()\n]{1,40}\))?(?::| @) ")
_WORD_TOKEN = re.compile(r"\w+")
REPORT_TOKENS = 3  # tokens of a numbered item's report that change with the item, at least


def _numbered_report(old: str, new: str) -> bool:
    """Two values up to RECORD_CHARS that each open with a numbered item and its report after a colon
    or an `@`, the item another and REPORT_TOKENS tokens of the report or more changed (`Door 11:
    returned Loggia box 23, seat 2, £36.00 – …` -> `Door 12: returned Loggia box 21, seat 6, £85.00 –
    …`, `Infostand 3: Rowohlt → Halle 3.1, Stand C 20` -> `Infostand 5: Suhrkamp → …, Stand G 64`;
    round 70): another item's report, not an edit of one. A rule's record set apart by dots (`Form 12
    · signed by a parent`) has no such head, and an edit changes a token or two."""
    if max(len(old), len(new)) > RECORD_CHARS:
        return False
    a, b = _NUMBERED_HEAD.match(old), _NUMBERED_HEAD.match(new)
    if a is None or b is None or a.group(1) == b.group(1) or a.group(1).split()[0] != b.group(1).split()[0]:
        return False
    ta, tb = _WORD_TOKEN.findall(old[a.end():]), _WORD_TOKEN.findall(new[b.end():])
    return sum(x != y for x, y in zip_longest(ta, tb)) >= REPORT_TOKENS


# a report stamped with its place and its clock (`Info point Row Mead @ 23:08: friend missing, …`)
_STAMPED_REPORT = re.compile(r"((?:[^\W\d_][\w.'’-]{0,20} ){1,4})@ (\d{1,2}:\d\d): \S")
_HALF_HOUR = re.compile(r"\d{1,2}:[03]0")


def _stamped_report(old: str, new: str) -> bool:
    """Two values up to RECORD_CHARS that each are a report stamped with its place and its clock after
    an `@`, its first word the same, the clock moved and the place or the report changed too (a
    welfare log's `Info point Row Mead @ 23:08: friend missing, …` -> `Info point Spring Ground @ 10:37:
    phone handed in, …`; round 71): the newest entry of a log. A rule's hours are on the hour or the
    half (`Desk @ 09:00: opens` -> `@ 09:30: opens`)."""
    if max(len(old), len(new)) > RECORD_CHARS:
        return False
    a, b = _STAMPED_REPORT.match(old), _STAMPED_REPORT.match(new)
    if a is None or b is None or a.group(1).split()[0] != b.group(1).split()[0] or a.group(2) == b.group(2):
        return False
    if _HALF_HOUR.fullmatch(a.group(2)) and _HALF_HOUR.fullmatch(b.group(2)):
        return False
    return a.group(1) != b.group(1) or old[a.end() - 1:] != new[b.end() - 1:]


# a report stamped near its start: up to six short words, numbers or signs (a channel, a pass's number; four before
# round 75), then its clock, in brackets or not, or a clock in Zulu time, then a sign or a colon, or a call sign after
# a Zulu clock (`Ch 6 · 13:18 · King's Staith: …`, `11. Gang (16:21) – …`, `0937Z EGVA TWR ↔ LTNG21: …`); the
# clock may be any `STAMP_CLOCK`, and a word may be up to 20 characters long (`Stand ☘ 12.10pm ☘ …`,
# `Schubkärchler 33 ♦ 20:35 Uhr: …`; round 76), or a clock written with a dot alone before a colon (`Inspizienz ♫
# 19.37: …`; round 78); the clock may name its zone before the sign (`Zebra 14 ◈ 07:45 MDT ◈ …`; round 79); a clock
# in brackets may be followed by who reports, as a logger's line is (`[09:44 HKT] Festival control: …`; round 84)
_FIRST_STAMP = re.compile(r"((?:[^\s:]{1,20} ){0,6}?\(?)"
                          rf"({STAMP_CLOCK}|[0-2]\d[0-5]\dZ|(?:[01]?\d|2[0-3])\.[0-5]\d(?=:))(?: [A-Z]{{2,4}}(?= [^\w\s]))?"
                          r"\)?(?: [^\w\s]|:| (?<=Z )[A-Z]| (?<=\] )[^\W\d_])")
_QUARTER_HOUR = re.compile(r"\[?\d{1,2}(?:[:.]| ?h ?)?(?:00|15|30|45)\]?(?:[ZH]| ?(?:Uhr|hrs?|h)| ?[ap]\.?m\.?|[AP]M|[ap])?"
                           r"(?: / \d{1,2}[.:](?:00|15|30|45) ?[^\W\d_]{0,4}\.?)?"
                           r"|\d{1,2} ?[ap]\.?m\.?|12 (?:noon|midnight)")  # the hour alone (`11pm`): on the hour
STAMPED_REPORT_CHARS = 240  # a report with its stamp: as long as two records


def on_quarter_hour(clock: str) -> bool:
    """Is a stamp's clock on the quarter hour, as a rule's hours are (`14:30`, `7.45pm`, `11pm`, `2045H`)?"""
    return _QUARTER_HOUR.fullmatch(clock) is not None


def _stamp_head(before: str) -> str:
    """The shape of what a report's stamp opens with, up to its first sign: a word as `w`, a number as
    `#`, the sign itself (`Ch 6 ·` and `Post 31 ·` are `w#·`, `Green 26 @` and `Blue 9 @` are `w#@`,
    `11. Gang (` is `#w(`): who reports, and from where, may change; the stamp's form stays. A name of
    several words is one `w` (`Inspizienz Haus für Mozart ♫` and `Inspizienz Großes Festspielhaus ♫` are
    `w♫`; round 78)."""
    shape: list[str] = []
    for token in before.split():
        if any(c.isdigit() for c in token):
            shape.append("#")
        elif any(c.isalpha() for c in token):
            if shape[-1:] != ["w"]:
                shape.append("w")
        else:
            shape.append(token)
            break
    return "".join(shape)


def _report_stamped_first(old: str, new: str) -> bool:
    """Two values up to STAMPED_REPORT_CHARS that each open with a report's stamp (`_FIRST_STAMP`) of one
    form (`_stamp_head`), the clock another and the place or the report after it changed too
    (stewards' radio calls `Ch 2 · 10:48 · Museum Gardens: …` -> `Ch 6 · 13:18 · King's Staith: …`, a
    tower's calls in Zulu time, a tournament's passes `3. Gang (15:51) – …`; round 73; who reports may
    change and a place may come before the clock, `Blue 9 @ Market Place 13:56: …` -> `Green 26 @ Old
    Elvet 15:35: …`, `Post 31 · Governor's Bridge · 15:21 · all clear` -> `Post 54 · Bray Hill · 15:40 ·
    all clear`, round 75), or the clock alone, neither side on the quarter hour (round 77): the newest
    entry of a log, its clock whatever the report's. A rule's hours are on the quarter hour (`Mass
    (10:30) – Sundays` -> `(11:00) – …`)."""
    if max(len(old), len(new)) > STAMPED_REPORT_CHARS:
        return False
    a, b = _FIRST_STAMP.match(old), _FIRST_STAMP.match(new)
    if a is None or b is None or a.group(2) == b.group(2) or _stamp_head(a.group(1)) != _stamp_head(b.group(1)):
        return False
    if on_quarter_hour(a.group(2)) and on_quarter_hour(b.group(2)):
        # on the quarter hour, a rule's hours, unless who reports and the report changed too, in most of its words:
        # another entry whole (a launch director's call, `Zebra 14 ◈ 07:45 MDT ◈ hold launches in row B, …` ->
        # `Zebra 11 ◈ 07:30 MDT ◈ red flag: launches stopped`; round 79)
        return a.group(1) != b.group(1) and _words_replaced(old[a.end():], new[b.end():])
    if old[a.end():] != new[b.end():] or a.group(1) != b.group(1):
        return True
    # the clock alone changed, neither on the quarter hour: a clock, not a rule's hour (`Ring commentary ❧ 11.33am
    # / 11.33yb ❧ …` -> `4.35pm / 4.35yp ❧ …`; round 77)
    return not (on_quarter_hour(a.group(2)) or on_quarter_hour(b.group(2)))


def _words_replaced(old: str, new: str) -> bool:
    """Do two texts share fewer than half the words of the longer one: one text in place of another,
    not an edit of it?"""
    a, b = _WORD_TOKEN.findall(old.lower()), _WORD_TOKEN.findall(new.lower())
    return 2 * len(set(a) & set(b)) < max(len(a), len(b))


# a match's result: its two sides, then two sets' scores or more, one of them with a game count of one digit
# after the colon, as no clock has (`Wyss – Gerber 7:6 6:3`, `Frei – Schmid 6:3 4:6 10:7`)
_SIDES = r"[^\W\d_][\w'’.-]+(?: [^\W\d_][\w'’.-]+)? [–—-] [^\W\d_][\w'’.-]+(?: [^\W\d_][\w'’.-]+)?"
_RESULT = re.compile(rf"({_SIDES}) ((?:\d{{1,2}}[:-]\d{{1,2}} ){{1,4}}\d{{1,2}}[:-]\d{{1,2}})(?![\d:])")
_ONE_DIGIT_GAMES = re.compile(r"[:-]\d(?!\d)")


def _match_result(old: str, new: str) -> bool:
    """A match's result reported again for another match (`Herren 1. Liga · Einzel 5: Zürcher – Moser 7:5
    1:6 10:4` -> `… Einzel 1: Wyss – Gerber 7:6 6:3`; round 64): both values, up to RECORD_CHARS, hold
    a result, two sides then two sets' scores or more (one with a single digit after its colon: no
    clock), and the sides or the scores changed. A rule's timetable (`Zürich – Bern 7:05 8:05`) has
    no such score."""
    if max(len(old), len(new)) > RECORD_CHARS:
        return False
    a, b = _RESULT.search(old), _RESULT.search(new)
    return bool(a and b) and a.group() != b.group() \
        and all(_ONE_DIGIT_GAMES.search(m.group(2)) for m in (a, b))


_CODE_SEPARATORS = re.compile(r"[-/.]")
_INITIALLED = re.compile(r"[^\W\d_][\w'’-]{1,20} [A-Z]\.")
_POSSESSOR = re.compile(r"[A-Z][\w-]{1,20}['’]s (?=[^\W\d_])")
_NUMBERED = re.compile(r"[^\W\d_][\w'’.-]*(?: [^\W\d_][\w'’.-]*){0,2} \d{1,6}")  # `Gurt 37`, `Harness no 12`
REPLACED_RECORD_PARTS = 4  # a record this long with every part changed is another entry; an edit keeps a part
NUMBERED_CHECK_PARTS = 3  # parts of a numbered item's record that change with it, its number's among them


def _numbered_check(a: list[str], b: list[str]) -> bool:
    """A record whose first part names an item by its number (`Gurt 36 · Größe XS · Gruppe 11 ·
    geprüft von Timo` -> `Gurt 37 · Größe M · Gruppe 11 · geprüft von Jonas`; round 63), the number
    and NUMBERED_CHECK_PARTS parts or more changed, each part keeping its first word: another
    item's record. A rule's record names no item by its number, and an edit changes a part or two."""
    if a[0] == b[0] or not (_NUMBERED.fullmatch(a[0]) and _NUMBERED.fullmatch(b[0])):
        return False
    if any(x.split(" ", 1)[0] != y.split(" ", 1)[0] for x, y in zip(a, b, strict=True)):
        return False
    return sum(x != y for x, y in zip(a, b, strict=True)) >= NUMBERED_CHECK_PARTS


# a waiting ticket's number after its letters (`A096`), a running number before its year (a deed's `2886/2026`;
# round 60), a number of three digits or more alone (round 61): the part that stays, then the number
_LETTERS_BEFORE = re.compile(r"([A-Za-z]{1,3})(\d{3,})")
_NUMBER_OF_YEAR = re.compile(r"(?=\d{3,}/(?:19|20)\d\d$)()(\d+)")
_NUMBER_ALONE = re.compile(r"()(\d{3,})$")
TICKET_STEP = 50  # such a number rises by this much at most between two requests, or by 1% of itself (round 81)


def _rose_a_little(before: int, after: int) -> bool:
    """Did a running number rise by TICKET_STEP at most, or by 1% of itself when that is more?"""
    return 0 < after - before <= max(TICKET_STEP, before // 100)


_NUMBER_SIGN = re.compile(SIGN_OF_NUMBER + r"\s?$")  # the sign just before a number
# a number grouped in thousands, one separator throughout (`129.846`, `1,204,311`, `12'400`)
_THOUSANDS = re.compile(r"\d{1,3}(?:([.,'’])\d{3})+")


def _signed_number_rose(line_prefix: str, old: str, new: str) -> bool:
    """A number after its sign that rose a little (`Check-in #597` -> `#606`; round 30), its
    thousands grouped or not (a tent's `Maß Nr. 129.846` -> `129.906`; round 83): by TICKET_STEP at
    most, or by 1% of itself when that is more. A setting is no numbered item."""
    if not _NUMBER_SIGN.search(line_prefix):
        return False
    a, b = _THOUSANDS.fullmatch(old), _THOUSANDS.fullmatch(new)
    if a and b and a.group(1) == b.group(1) and len(old) == len(new):
        old, new = old.replace(a.group(1), ""), new.replace(b.group(1), "")
    if len(old) < 3 or not (old.isdecimal() and new.isdecimal()):
        return False
    return _rose_a_little(int(old), int(new))


def _ticket_rose(shape: re.Pattern[str], x: str, y: str) -> bool:
    """Are `x` and `y` one shape (`shape`: what stays, then the number) with the same part that
    stays and a number of the same length that rose by TICKET_STEP at most, or by 1% of itself when that is
    more (a fair's receipts, `Bong 16306` -> `Bong 16366`; round 81)?"""
    mx, my = shape.match(x), shape.match(y)
    if not (mx and my) or mx.group(1) != my.group(1) or x[mx.end():] != y[my.end():] or len(mx.group(2)) != len(my.group(2)):
        return False
    return _rose_a_little(int(mx.group(2)), int(my.group(2)))


REDRAWN_CODE_CHARS = 5  # a record's code drawn again: five capitals and digits at least (`EXC-PK3K2E`)


def match_score(value: str) -> bool:
    """Is a value a match's score (`_running_score` from one side: another pod that knows only that
    the line changed in its digits reads it whole)?"""
    return _score(value) is not None


def _score(value: str) -> re.Match[str] | None:
    """The score in a value short enough to be one, its sides named by no clock's or day's word."""
    m = _SCORE.search(value) if len(value) <= SCORE_CHARS else None
    return m if m is not None and not any(_NO_SIDE.fullmatch(m.group(k)) for k in (1, 4)) else None


# what a status is about: words, then a running number (`heat 24`, `Lauf 3`), a year's series before it
# (`Kom. 26/062`; round 49); a clock's time of day
_SERIES_ITEM = re.compile(r"((?:[^\W\d_][\w'’.-]* ){1,3}(?:\d{2}[-/])?)(\d{1,6})(?![\d:.,]?\d)")  # no clock, no decimals
_CLOCK = re.compile(r"(?<![\d:.,])\d{1,2}:\d\d(?![\d:])")
SERIES_STATUS_CHARS = 64  # its item named first, a series' status is as long as a newest entry (56 in round 48)


def _series_status(old: str, new: str) -> bool:
    """A short status of a running series' item, rewritten whole as the item moves on (`heat 24 (7
    drivers) on track, chequered flag in 6 min` -> `heat 24 clearing the pit lane, heat 25 briefing
    at 18:00`; round 48): the same words and a number that stayed or rose a little, a time on both
    sides, running on one of them at least or the item the next. A rule's time does not run."""
    if max(len(without_notes(old)), len(without_notes(new))) > SERIES_STATUS_CHARS:  # its notes aside
        return False
    a, b = _SERIES_ITEM.match(old), _SERIES_ITEM.match(new)
    if not (a and b and a.group(1) == b.group(1) and 0 <= int(b.group(2)) - int(a.group(2)) <= RUNNING_NUMBER_STEP):
        return False
    running_old, running_new = RUNNING_TIME.search(old), RUNNING_TIME.search(new)
    minutes = [m.group(1) for m in (_MINUTES.search(old), _MINUTES.search(new)) if m is not None]
    moved = running_old or running_new or int(b.group(2)) > int(a.group(2)) \
        or any(_off_the_five(n) for n in minutes)  # minutes alone running (`11 min`; round 50)
    return bool(moved and (running_old or _CLOCK.search(old)) and (running_new or _CLOCK.search(new)))


# words, then a running number, then a note on it in brackets (`Pilgrims' Way walk 133 (18 walkers)`)
_NUMBER_NOTED = re.compile(r"((?:[^\W\d_][\w'’.-]* ){1,4}(?:\d{2}[-/])?)(\d{1,6}) \([^()\n]{1,48}\)")
RUNNING_NUMBER_STEP = 5  # a running number moves on by this much at most between two requests


def _number_noted(old: str, new: str) -> bool:
    """The same words, then a number that rose a little, then a note in brackets that may change
    (`Führung Nr. 13 (Fußführung, 15:00 Uhr)`, `walk 133 (18 walkers, guide Morag)` -> `walk 134 (17
    walkers, guide Dev)`): the newest of a running series, whole (round 45); a year's series may
    come before the number (`trip 26-0280 (sunset paddle, 10 paddlers)`, round 46). A year in it (`guide 4
    (2024 print)` -> `guide 5 (2026 print)`) makes it an edition, edited."""
    a, b = _NUMBER_NOTED.fullmatch(old), _NUMBER_NOTED.fullmatch(new)
    return bool(a and b and a.group(1) == b.group(1) and not _DATED.search(f"{old} {new}")
                and 0 < int(b.group(2)) - int(a.group(2)) <= RUNNING_NUMBER_STEP)


_AGREEMENT = ("s", "es", "e", "en", "n")  # a noun's plural endings, English and German


def _agreement_only(old: str, new: str) -> bool:
    """Do two stretches between numbers differ only in a noun that agrees with its count (`1 flag
    up` -> `2 flags up`, round 44)?"""
    x, y = old.split(), new.split()
    return len(x) == len(y) and all(
        p == q or any(p + e == q or q + e == p for e in _AGREEMENT) for p, q in zip(x, y, strict=True))


def _names_traded(old: list[str], new: list[str]) -> bool:
    """Did the words between a value's numbers trade places, none gained or lost (`Maud 3,280 gal at
    the top, Lily 200 gal below` -> `Lily 2,600 gal at the top, Maud 300 gal below`: the two cars of
    a funicular, round 44)?"""
    x, y = [g.split() for g in old], [g.split() for g in new]
    return x != y and sorted(w for g in x for w in g) == sorted(w for g in y for w in g) \
        and all(len(g) == len(h) for g, h in zip(x, y, strict=True))


def _is_compass(word: str) -> bool:
    """Is a word (its list punctuation aside: `Südwest,`) a wind's direction?"""
    return _COMPASS.fullmatch(word.strip(",;()")) is not None


def _beside_compass(gaps: list[str]) -> bool:
    """Does a wind's direction stand among the words between a value's numbers?"""
    return any(_is_compass(w) for g in gaps for w in g.split())


# a state counted in its first word (`1 pending`, `3 offen`) or told in words (`up to date`)
# (with what it counts in brackets: `no crews out` -> `1 crew (J16 2x)`, round 24)
_COUNTED_STATE = re.compile(r"(?:\d{1,3} )?[^\W\d_]{1,16}(?: [^\W\d_]{1,16}){0,3}(?: \([^()\n]{1,40}\))?")


def _counted_state(old: str, new: str) -> bool:
    """A state one side of which opens with a count and whose words changed (`1 pending` ->
    `up to date`): the words kept and the count changed is a setting's (`2 per call` -> `3 per call`)."""
    if _NO_COUNT.fullmatch(old) and _COUNTS.fullmatch(new) or _NO_COUNT.fullmatch(new) and _COUNTS.fullmatch(old):
        return True  # nothing to count, then counts (`no boats waiting` -> `1 boat waiting below, 0 above`; round 25)
    if not (_COUNTED_STATE.fullmatch(old) and _COUNTED_STATE.fullmatch(new)):
        return False
    words = [w for w in old.split() if not w.isdigit()], [w for w in new.split() if not w.isdigit()]
    return (old[0].isdigit() or new[0].isdigit()) and not set(words[0]) & set(words[1])


def _reading_state(old: str, new: str) -> bool:
    """A state in words replaced by a reading and its state's word, or the reverse (`Störung
    Hydraulik` -> `5 % offen`; round 30)."""
    return bool(_NO_COUNT.fullmatch(old) and _READING_WORDS.fullmatch(new)
                or _NO_COUNT.fullmatch(new) and _READING_WORDS.fullmatch(old))


# a reading, then a state's word or two (`5 % offen`, `12 m³/s steigend`)
_READING_WORDS = re.compile(r"\d+(?:[.,]\d+)?\s?(?:%|[^\W\d_]{1,4}[²³]?(?:/[^\W\d_]{1,3})?) [^\W\d_]{2,16}(?: [^\W\d_]{2,16})?")
_NO_COUNT = re.compile(r"[^\W\d_]{1,16}(?: [^\W\d_]{1,16}){0,3}")  # a state in words only
# counts of named things, two or more (`1 boat waiting below, 0 above`, `2 open, 1 closed`)
_COUNTS = re.compile(r"\d{1,3} [^\W\d_]{1,16}(?: [^\W\d_]{1,16}){0,3}(?:, \d{1,3}(?: [^\W\d_]{1,16}){1,4})+")


def _state_head(state: str) -> list[str]:
    """A state's words without its detail or reason (`Spalt offen, nachgeführt` -> `Spalt offen`,
    `Spalt zu (Regenmelder)` -> `Spalt zu`; round 27): the state is what must have been replaced."""
    return re.split(r",| \(", state, maxsplit=1)[0].split()


def _replaced(old: list[str], new: list[str]) -> bool:
    """A state replaced by another, not a word swapped inside a phrase that stays: two words or
    fewer, or phrases of other lengths (`Meldestufe 1` -> `unter Meldestufe 1`) or with fewer than
    half of their words in common (`on station` -> `returning to base`, `shunting in the yard` ->
    `fiddle yard being reset`: round 36). In `information Foxtrot is current` -> `Golf` (or `Tone:
    friendly and brief` -> `formal and brief`) one word changed in place: read on its own."""
    return max(len(old), len(new)) <= 2 or len(old) != len(new) or len(set(old) & set(new)) * 2 < len(old)


_RUNS_OF_WORDS = re.compile(r"[\w.]+")


# a serial code: groups of capitals and digits, then a serial of five digits or more (a wristband's `HG26-SP-0040903`)
_SERIAL_CODE = re.compile(r"(?<![\w-])((?:[A-Z0-9]*[A-Z][A-Z0-9]*-){1,3})(\d{5,})(?![\w-])")


def _serial_scanned(old: str, new: str) -> bool:
    """Two records of parts set apart by signs, each short enough to be an entry, each holding one
    serial code of one series (the same groups before the serial, as many digits), the serial another
    and another part changed with it (`Gate 2 Frederick Street · HG26-SP-0025343 ✗ name not matching
    …` -> `Gate 1 Hanover Street · HG26-SP-0040903 ✓ admitted with a carer`; round 72): a scan, the
    newest entry, whatever its key says. A rule's record names no serial drawn from a series."""
    a, b = _SERIAL_CODE.findall(old), _SERIAL_CODE.findall(new)
    if len(a) != 1 or len(b) != 1 or a[0][0] != b[0][0] or a[0][1] == b[0][1] or len(a[0][1]) != len(b[0][1]):
        return False
    pa, pb = RECORD_PARTS.split(old), RECORD_PARTS.split(new)
    return min(len(pa), len(pb)) >= 2 and max(len(old), len(new)) <= RECORD_CHARS \
        and sum(x != y for x, y in zip(pa, pb, strict=False)) >= 2


def _codes_drawn(old: str, new: str) -> bool:
    """Its words the same, two codes or more changed, each drawn again (5 characters or more, most
    of them different, a digit on one side at least) or a sequence that rose (`_rising_sequence`):
    a payment's `Autorisierung DM4M0B, Trace 080585` -> `Autorisierung 7EV8WM, Trace 080587`
    (round 29)."""
    a, b = _RUNS_OF_WORDS.findall(old), _RUNS_OF_WORDS.findall(new)
    if len(a) != len(b) or _RUNS_OF_WORDS.sub("", old) != _RUNS_OF_WORDS.sub("", new):
        return False
    changed = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    return len(changed) >= 2 and all(
        any(c.isdigit() for c in x + y) and (len(x) >= 5 and _redrawn(x, y) or _rising_sequence(x, y))
        for x, y in changed)


_CODE = re.compile(r"(?=.*\d)[A-Z0-9 ./-]+")  # capitals and digit groups, no word of prose: an id
# a reference written as an IBAN or an ISO 11649 creditor reference is: two letters, two check digits,
# groups of four (the last may be shorter), a different length once drawn again (`RF47 SSTU MHK6 IOK`;
# round 40)
_STRUCTURED_REFERENCE = re.compile(r"[A-Z]{2}\d\d(?: [A-Z0-9]{4}){1,7}(?: [A-Z0-9]{1,3})?")


def _whole_value_kind(old: str, new: str) -> str | None:
    """A key line's whole value that changed: a flag when both are one word (or a short code), a
    value when both are ids; else an edit."""
    if _id_like(new) and _id_like(old):
        return "value"  # before a flag's words: `edge-pqtrmxwz` is an id, `walk-in` a flag after a flag key
    if _FLAG_VALUE.fullmatch(new) and _FLAG_VALUE.fullmatch(old):
        return "flag"
    return None


_RUNS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]+")


def code_redrawn(old: str, new: str, least: int = 6) -> bool:
    """A code of capitals and digits (`least` or more of them, a third of them letters at least on
    both sides: a date or a stamp is no code; a digit on one side at least) drawn again:
    the same length and separators, most of its characters different."""
    return (len(old) == len(new) and sum(c.isalnum() for c in new) >= least and any(c.isdigit() for c in old + new)
            and sum(c.isalpha() for c in old) * 3 >= len(old) and sum(c.isalpha() for c in new) * 3 >= len(new)
            and _CAPITALS_CODE.fullmatch(old) is not None and _CAPITALS_CODE.fullmatch(new) is not None
            and _redrawn(old, new))


# a hex literal of four digits or more; `value_kind` reads one as drawn again only with three different
# digits or more on each side (a mask's `0xFF00` repeats two)
_HEX_LITERAL = re.compile(r"0[xX][0-9A-Fa-f]{4,}")
_CAPITALS_CODE = re.compile(r"[A-Z0-9]+(?:[-/.][A-Z0-9]+)*")


def _rising_sequence(old: str, new: str) -> bool:
    """A value of one shape whose first changed part is a number that rose a little: a sequence
    others advance too (a CI run id, an update id, a log position `10/9C5FA374`, a waiting ticket
    `E-080`), not an edited setting (`limit: 5` -> `10`). The number is long (6+ digits, decimal or
    hex, risen by at most 1%) or zero-padded (`079`, risen by at most 50): a setting is neither."""
    a, b = _RUNS.findall(old), _RUNS.findall(new)
    if len(a) != len(b) or len(old) != len(new):
        return False
    numbers = [k for k, r in enumerate(a) if r.isdigit()]
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            continue
        if not x.isalnum() or len(x) != len(y):
            return False
        base = 10 if x.isdigit() and y.isdigit() else 16
        try:
            u, v = int(x, base), int(y, base)
        except ValueError:
            return False
        if base == 16 and not (any(c.isdigit() for c in x) and any(c.isdigit() for c in y)):
            return False  # a word of hex letters (`cafe`) is no number
        if base == 10 and len(x) >= 3 and x[0] == "0":
            # zero-padded: a formatted counter (`0000028`); a long one may rise as a long number does
            # (a rental's `#016327` -> `#016398`; round 79)
            return _rose_a_little(u, v) if len(x) >= 6 else 0 < v - u <= TICKET_STEP
        if base == 10 and 3 <= len(x) < 6 and any(r.isalpha() for r in a) and (len(numbers) == 1 or k == numbers[-1]):
            # the one number between a code's letters: a booking's `BK-3859-TL` (round 30); or a code's
            # last number, a year or a series before it: a flight card's `FC-26-823` (round 42)
            return 0 < v - u <= 50
        return len(x) >= 6 and 0 < v - u <= u // 100
    return False


# a `key: value` line up to its value, when the value is one number, after its currency or the
# capitals of its scale (`Tote Placepot pool: £`, `Latest event magnitude: ML `); what may end the line after it
_KEYED_NUMBER = re.compile(_LINE_KEY.pattern + r"(?:[$€£]|[A-Z]{1,4} )?$")
_LINE_END = re.compile(r"\s*(?:</[\w.:-]+>\s*)?")
# decimals or thousands groups (`2.4`, `59,112`, `6.814`, `1,234.5`), not a release's `4.3.2`
_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?:\.\d{3})+(?:,\d+)?|\d+[.,]\d+")
_EDITION_KEY = re.compile(r"(?i)\b(?:version|release|revision|fassung|edition|build)\b")


def _line_number_kind(line_prefix: str, old: str, new: str, line_rest: str | None) -> str | None:
    """The kind of a number that is a key line's whole value: a `counter` when written with decimals
    or digit groups on both sides and two significant digits or more (`Racegoers through the
    turnstiles: 6,814` -> `7,387`, `ML 0.2` -> `2.4`: a reading or a running total); an `id` when
    long and drawn again (six digits or more, as many, most of them different: `Vessel in focus:
    MMSI 257978390` -> `235398212`). A setting is written round and ungrouped (`limit: 15` -> `30`)
    and keeps most digits (`100000` -> `200000`); a release's number is an edit (`Version: 3.2`)."""
    if line_rest is None or not _LINE_END.fullmatch(line_rest) or not _KEYED_NUMBER.match(line_prefix):
        return None
    if _GROUPED.fullmatch(old) and _GROUPED.fullmatch(new) and max(_significant(old), _significant(new)) > 1 \
            and not _EDITION_KEY.search(line_prefix):
        return "counter"
    if len(new) >= 6 and new.isdigit() and old.isdigit() and _redrawn(old, new):
        return "id"
    return None


def _significant(number: str) -> int:
    """How many significant digits a number is written with (`30` 1, `6.4` 2, `354.8` 4, `7.0E-07` 2)."""
    mantissa, *exponent = re.split("[eE]", number)
    digits = "".join(c for c in mantissa if c.isdigit()).lstrip("0")
    return len(digits) if exponent else len(digits.rstrip("0"))  # `7.0E-07`: its zero is written to count


def _measured(key: re.Match[str] | None, old: str, new: str, line_rest: str | None, line_prefix: str) -> bool:
    """A reading that moves per request: a number before the unit of an instrument's reading (`6.4
    °C`, `18.42 kWh`, `-63 dBm`) or of a time after a key, with decimals or counted down
    (`Wartezeit: 12 Min.`, `boarding closes in 41 min`),
    or after a key that names a time taken (`openai-processing-ms`, `dur=`) or the current value
    (`Current bid: £6,900`), or after a key with a unit ending the value (`Pegel Kaub: 465 cm`),
    not round in both (`Timeout: 30 s` -> `60 s` is an edit); an instrument's reading with four
    decimals or more (`MJD 61292.24174`); an ISO 8601 duration with seconds (`PT8M1S`), or in
    hours and minutes not round on both sides (`PT5H4M` -> `PT5H50M`, round 39); a number with
    decimals before a unit of measure, in a sentence too (`3.1 m`, `95,7 %`), unless a threshold's
    word precedes it (`below 1.5 m`)."""
    if _ISO_DURATION.fullmatch(new) and _ISO_DURATION.fullmatch(old):
        return True
    a, b = _ISO_HOURS_MINUTES.fullmatch(old), _ISO_HOURS_MINUTES.fullmatch(new)
    if a and b:  # a time taken in hours and minutes, not a setting's round one (`PT30M`, `PT1H45M`)
        return int(a.group(1)) % 5 != 0 or int(b.group(1)) % 5 != 0
    if key is not None and _SCIENTIFIC.fullmatch(new) and _SCIENTIFIC.fullmatch(old):
        return max(_significant(new), _significant(old)) > 1  # `1e-4` -> `3e-4` is a setting edited
    new, old = new.lstrip("+-" + MINUS), old.lstrip("+-" + MINUS)  # `-63 dBm`, `−18,4 °C`, `+0,92 kg`
    if not (_NUMBER.fullmatch(new) and _NUMBER.fullmatch(old) or _RANGE.fullmatch(new) and _RANGE.fullmatch(old)):
        return False
    if max(_significant(new), _significant(old)) <= 1:
        return False
    if _FINE.fullmatch(new) and _FINE.fullmatch(old):
        return _moved_little(old, new)  # a fine reading moves a little; one years on is an edit (`46023,25` -> `57134,36`)
    decimals = ("." in new and "." in old) or ("," in new and "," in old)
    if decimals and line_rest is not None and _MEASURE_UNIT.match(line_rest) and not _THRESHOLD_BEFORE.search(line_prefix):
        return True  # a measurement, not a rule's threshold (`below 1.5 m` -> `1.2 m` is an edit)
    if line_rest is not None and (_READING_UNIT.match(line_rest) or _UNIT_AFTER.match(line_rest) and (
            key is not None or ("." in new and "." in old) or ("," in new and "," in old)
            or _COUNTDOWN.search(line_prefix))) \
            and not _THRESHOLD_BEFORE.search(line_prefix):
        # a time after a key or with decimals: in a sentence, `below 30 ms` -> `15 ms` is an edit, and
        # a reading's unit after a threshold's word is a rule's (`above 27 °C` -> `25 °C`)
        return True
    if key is not None and line_rest is not None and _UNIT_ENDS_LINE.match(line_rest):
        return True  # `Pegel Kaub: 465 cm`, `<Lautheit>-26,8 LUFS</Lautheit>`: a key's value, with its unit
    if line_rest is not None and _UNIT_ENDS_LINE.match(line_rest) and not line_rest.rstrip().endswith(".") \
            and after_state(line_prefix) and not _THRESHOLD_BEFORE.search(line_prefix):
        # `Presse 2: läuft, 14 t/h`: a key's value, its state's word before the reading; a sentence's
        # (`Note: within 15 km.`) is a rule's (round 28)
        return True
    return key is not None and (_TIMING_KEY.search(_words(key.group(1))) is not None
                                or NOW_CUE.search(key.group(1)) is not None)  # `Current bid: £6,900`


# a state's word or two before a reading in a key line's value (`running `, `läuft, `, `in Betrieb mit `)
_STATE_LEAD = re.compile(r"[^\W\d_]{2,16}(?: [^\W\d_]{2,16})?,? ")


def after_state(line_prefix: str) -> bool:
    """Is the text before a number a key line's key, then a state's word or two (round 28)? The
    state and its reading are then the line's value, whole (`running 38 m/min`)."""
    vs = whole_value_start(line_prefix)
    if vs is None or _STATE_LEAD.fullmatch(line_prefix[vs:]) is None:
        return False
    return not any(w.isupper() for w in line_prefix[vs:].split())  # a currency's or a scale's code (`GBP `, `ML `)


def _moved_little(old: str, new: str) -> bool:
    """Did a number written with four decimals or more move by 1% of itself at most (round 31)?"""
    a, b = float(old.replace(",", ".")), float(new.replace(",", "."))
    return abs(b - a) <= 0.01 * max(abs(a), abs(b))


def _words(key: str) -> str:
    """A key's words apart (`GITHUB_RUN_ID` -> `GITHUB RUN ID`), so the key-word patterns find them."""
    return key.replace("_", " ").replace("-", " ")


def _counted(line_prefix: str, key: re.Match[str] | None, old: str, new: str, line_rest: str | None) -> bool:
    """A number that counts something as a session goes on: after a key naming a share, a place or
    a time that passes (also a tag's: `<context_free_percent>81</…>`), or as the first part of a
    usage meter (`41.2k of the 128k window`, `41.213 von 128.000 Tokens`), or out of a capacity
    that stays (`53/220`)."""
    a, b = _OF_CAPACITY.fullmatch(old), _OF_CAPACITY.fullmatch(new)
    if a and b:  # no more than the capacity (`2025/26`, a season, is none); another pod passes the token twice
        return a.group(2) == b.group(2) and (a.group(1) != b.group(1) or old == new) and \
            max(int(a.group(1)), int(b.group(1))) <= int(a.group(2))
    if _DURATION.fullmatch(new) and _DURATION.fullmatch(old) and not (new.isdigit() or old.isdigit()):
        return _COUNTDOWN.search(line_prefix) is not None or (
            key is not None and _COUNTER_KEY.search(key.group(1)) is not None)
    if not (_NUMBER.fullmatch(new) and _NUMBER.fullmatch(old)):
        return False
    if line_rest is not None and _OF_TOTAL.match(line_rest):
        return True
    if _SPENT.search(line_prefix.rstrip("$€£ ")) and ("." in new or "," in new):
        return True
    key = key or _TAG_OPEN.search(line_prefix) or _CELL_KEY.search(line_prefix)
    return key is not None and _COUNTER_KEY.search(key.group(1)) is not None


def _whole_value_unkeyed(line_prefix: str, line_rest: str) -> bool:
    """Is the token the whole content of a tag on its line, or the value of a label line (one word
    before it, nothing after)?"""
    if _CELL_KEY.match(line_prefix):
        return _CELL_END.match(line_rest) is not None
    tag = _TAG_OPEN.search(line_prefix)
    if tag is not None:
        close = f"</{tag.group(1)}>"
        return line_rest.lstrip().startswith(close) and not line_rest.lstrip()[len(close):].strip()
    return _LABEL.match(line_prefix) is not None and not line_rest.strip(" \t.,;")


def keyed_value(line_prefix: str, line_rest: str) -> bool:
    """Does the token after `line_prefix` sit where a key puts a value (after `:`, `=`, an arrow,
    inside a tag, after a label's word)? What another pod, reading one request, needs before it
    takes a word or an id for a per-request value. A quote may open the value (`value="…"`)."""
    return line_prefix.rstrip().rstrip("\"'").endswith(KEY_SIGNS) or _whole_value_unkeyed(line_prefix, line_rest)


def _id_like(token: str) -> bool:
    """An id rather than a word, a number or a version: 6+ characters, letters with digits or
    with a separator inside (`web-k3x9`, `a1b2c3`)."""
    return (len(token) >= 6 and not _VERSION.fullmatch(token) and any(c.isalpha() for c in token)
            and (any(c.isdigit() for c in token) or any(c in "-_.:/+" for c in token[1:-1])))


