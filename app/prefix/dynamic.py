"""The dynamic-value detector: text that typically changes from one request to the next.

A value such as `Current time: 2026-04-14T09:31:07Z` on top of a system prompt changes block 0 of
every prompt and so defeats the engine's prefix cache. This module only says *where* such values
are (`find_dynamic_spans`) and which lines hold them (`dynamic_lines`); whether one actually broke
a chain is decided by diagnosis (app/prefix/diagnose.py), which compares consecutive requests: a
value that looks dynamic but never changes (a fixed policy date, a version, an example UUID) is
not a cause. The hygiene rewrite (`move_dynamic`) reuses `dynamic_lines` to move such lines below
the static content.

Patterns are plain regexes, compiled once; extra ones come from `hygiene.dynamic_patterns`.
Covered: ISO/RFC timestamps (ISO 8601 basic format too; Go's, JavaScript's and Java's zones, web
server and syslog times), numeric dates (Y-M-D, D.M.Y, M/D/Y), written dates in English, German,
French, Spanish, Italian, Portuguese and Dutch, CJK dates, clock times, Unix epochs, UUIDs (braced
too), ULIDs, long hex ids, Claude Code's billing-header hash (`cch=`), request/session/trace ids,
prefixed ids (req_…, sess_…), trace contexts (traceparent, Cloud Trace, sentry-trace, b3, Jaeger),
message ids (WhatsApp, Matrix, e-mail Message-IDs), Kubernetes pod names, emails, user-name lines,
counters (turn 7, request #123, a queue place, a share used, an elapsed time, a time ago) and what
is left of a budget (`Context left: 187655`), weak entity tags (`W/"…"`), base64 JSON (JWTs). A
changed token that no pattern knows is judged by app/prefix/value_kind.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from re import _constants as re_const  # type: ignore[attr-defined]  # the parsed form `needs_digit` reads
from re import _parser as re_parser  # type: ignore[attr-defined]
from typing import Any

# every language's month names, January first (`|`: another spelling of that month): the
# detector's alternatives, in this order, and a name's month number (`date_days`)
_MONTH_NAMES = (
    "january february march april may june july august september october november december",
    "jan feb mar apr may jun jul aug sep|sept oct nov dec",
    "januar|jänner februar märz april mai juni juli august september oktober|okt november dezember|dez",
    "janvier février|fevrier mars avril mai juin juillet août|aout septembre octobre novembre décembre|decembre",
    "enero febrero marzo abril mayo junio julio agosto septiembre|setiembre octubre noviembre diciembre",
    "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro dezembro",
    "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre dicembre",
    "januari februari maart april mei juni juli augustus september oktober november december",
)
_MONTH_SPELLINGS = [(name, month) for row in _MONTH_NAMES for month, names in enumerate(row.split(), 1)
                    for name in names.split("|")]
_MONTHS = "|".join(dict.fromkeys(name for name, _ in _MONTH_SPELLINGS))
# every language's weekday names, Monday first (`|`: another spelling of that day): the detector's
# alternatives, in this order, and a name's day of the week (`weekday_rolled`)
_WEEK_NAMES = (
    "monday tuesday wednesday thursday friday saturday sunday",
    "mon tue|tues wed thu|thur|thurs fri sat sun",
    "montag dienstag mittwoch donnerstag freitag samstag sonntag",
    "lundi mardi mercredi jeudi vendredi samedi dimanche",
    "lunes martes miércoles|miercoles jueves viernes sábado|sabado domingo",
    "lunedì martedì mercoledì giovedì venerdì sabato domenica",
    "maandag dinsdag woensdag donderdag vrijdag zaterdag zondag",
)
_WEEKDAY_INDEX = {name: day for week in _WEEK_NAMES for day, names in enumerate(week.split())
                  for name in names.split("|")}
_WEEKDAYS = "|".join(_WEEKDAY_INDEX)
WEEKDAY_NAMES = frozenset(_WEEKDAYS.split("|"))  # every language's weekday names and abbreviations
_CLOCK = r"(?:[01]?\d|2[0-3])[:h][0-5]\d(?::[0-5]\d(?:[.,]\d{1,9})?)?"
_TIME = rf"{_CLOCK}(?:\s?(?:[AaPp]\.?[Mm]\.?|Uhr|h))?"
# a clock alone: its `Uhr` is the sentence's word (`Es ist 14:53 Uhr.`), not the formatted value's
_BARE_TIME = rf"{_CLOCK}(?:\s?[AaPp]\.?[Mm]\.?)?"
# a zone: Go's `+0000 UTC`, JavaScript's `GMT+0000 (Coordinated Universal Time)` and Intl's `GMT+1` too
_TZ = (r"(?:\s?(?:Z|UTC|GMT(?:[+-]\d{4}|[+-](?:1[0-4]|0?\d)(?::[0-5]\d)?(?!\d))?|[+-](?:[01]\d|2[0-3]):?[0-5]\d|[A-Z]{2,4}T(?:[+-](?:[01]\d|2[0-3])[0-5]\d)?|MES?Z)"
       r"(?: (?:UTC|GMT|[A-Z]{2,4}T))?(?: m=[+-]\d+\.\d{1,9})?"  # Go's `+0100 BST m=+15820.459842479`
       r"(?: \([A-Z][A-Za-z ]{2,40}\))?(?:\[[A-Za-z_]+(?:/[A-Za-z_]+){1,2}\])?"  # Java's `[Europe/Berlin]`
       # or an offset in hours alone, glued to the time (ISO 8601 allows it; PostgreSQL writes `+02`)
       r"|(?<=\d)[+-](?:0\d|1[0-4])(?![\d:.]))?")
# a German clock written with a dot (`13.56 Uhr`): only before its `Uhr`, else it is a decimal number
_DOT_TIME = r"(?:[01]?\d|2[0-3])\.[0-5]\d(?=\s?Uhr\b)"
# Kubernetes' pod names end in the ReplicaSet's hash and a suffix of 5, from its alphabet without vowels
_POD_SUFFIX = r"[bcdfghjklmnpqrstvwxz2-9]"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])"
_MON = r"(?:0?[1-9]|1[0-2])"
_YEAR = r"(?:19|20)\d{2}"
_MON_ABBR = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"  # as logs write them
_WEEKDAYS_EN = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
_MONTHS_EN = "January|February|March|April|May|June|July|August|September|October|November|December"
_ORDINAL = (r"(?:(?:twenty|thirty)[- ])?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)|tenth|eleventh|"
            r"twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_REMAINING = (r"remaining|verbleibend\w*|übrig\w*|restlich\w*|restant\w*|restante\w*|"
              r"rest(?:guthaben|budget|kontingent|betrag|menge|laufzeit)\w*")
_AMOUNT = r"[$€£]?\s?\d+(?:[.,]\d+)*"  # `41`, `$4.17`, `4,17`, `48,213`
_LEFT = rf"left|remain|{_REMAINING}"

# the units of a time held written out or abbreviated, English or German (`Tg.`, `Std.`, `Min.`)
_DAYS_UNIT = r"(?:d|tg\.?|tagen?|days?)"
_HOURS_UNIT = r"(?:h|std\.?|hrs?\.?|hours?|stunden?)"
_MINUTES_UNIT = r"(?:min\.?|mins|minutes|minuten)"

# (kind, pattern). Order matters only for ties; overlapping matches are merged by start/length.
# ISO 8601 basic format (`20260504T220037Z`), recognised by its shape: two-digit fields in range
_BASIC_TS = (r"\b(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3])[0-5]\d"
             r"(?:[0-5]\d(?:[.,]\d{1,9})?)?(?:Z|[+-](?:[01]\d|2[0-3]):?[0-5]\d)?\b(?!-\w)")  # not an id's head

_NAMES = re.compile(rf"(?i)\b(?:{_WEEKDAYS}|{_MONTHS}|{_MON_ABBR})")
_NEEDS_NAME: set[str] = set()  # patterns that match only where a weekday or a month name starts a word


def _named(pattern: str) -> str:
    """`pattern`, registered as one that only matches where `_NAMES` finds a name (`find` skips it
    in a window without one: these are the costliest patterns)."""
    _NEEDS_NAME.add(pattern)
    return pattern


BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    # ISO 8601, and the same date with slashes or dots before its clock (`2026/04/14 01:57:46.3200`)
    ("timestamp", rf"\b{_YEAR}(?:-{_MON}-{_DAY}[T ]|/{_MON}/{_DAY} |\.{_MON}\.{_DAY} ){_TIME}{_TZ}"),
    ("timestamp", _BASIC_TS),
    # the same without its `T`, seconds included (HL7's DTM `20260809055851+0100`, `yyyyMMddHHmmss`),
    # or a space between date and clock (SAP's `20261111 184557`)
    ("timestamp", r"\b(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]) ?(?:[01]\d|2[0-3])[0-5]\d[0-5]\d"
                  r"(?:\.\d{1,6})?(?:[+-](?:[01]\d|2[0-3])[0-5]\d)?(?![\w-])"),
    # Rust's `Debug` of a SystemTime (`SystemTime { tv_sec: 1765409321, tv_nsec: 215993673 }`)
    ("timestamp", r"\bSystemTime \{ tv_sec: \d{9,11}, tv_nsec: \d{1,9} \}"),
    # Python's `repr` of a datetime (`datetime.datetime(2026, 6, 18, 7, 1, 46, 557270)`)
    ("timestamp", r"\bdatetime\.datetime\((?:19|20)\d{2}, \d{1,2}, \d{1,2}(?:, \d{1,6}){0,4}(?:, tzinfo=[^()]{1,60}(?:\([^()]{0,60}\))?)?\)"),
    ("timestamp", _named(rf"\b(?:{_WEEKDAYS}),?\s+{_DAY}\s+(?:{_MONTHS})\.?\s+{_YEAR}\s+{_TIME}{_TZ}")),  # RFC 2822
    ("timestamp", _named(rf"(?i)\b(?:{_WEEKDAYS})\s+(?:{_MONTHS})\s+{_DAY}\s+{_TIME}(?:\s+[A-Z]{{2,5}}|\s+[+-]\d{{4}})?\s+{_YEAR}\b(?:\s[+-]\d{{4}}\b)?")),  # asctime, `date`, Go's RubyDate, git's default (its offset after the year)
    ("date", rf"\b{_YEAR}-{_MON}-{_DAY}\b"),
    ("date", rf"\b{_YEAR}/{_MON}/{_DAY}\b"),
    ("date", rf"(?:\b(?:Mo|Di|Mi|Do|Fr|Sa|So)\.,?\s*)?\b{_DAY}\.{_MON}\.(?:{_YEAR}|\d{{2}})\b(?:(?:,?\s*(?:um\s+)?|\s[-–]\s)(?:{_TIME}|{_DOT_TIME}))?"),
    ("date", rf"\b{_MON}/{_DAY}/(?:{_YEAR}|\d{{2}})\b(?:,?\s*{_TIME})?"),
    ("date", rf"\b{_DAY}/{_MON}/(?:{_YEAR})\b(?:,?\s*{_TIME})?"),
    ("date", _named(rf"(?i)\b(?:(?:{_WEEKDAYS}),?\s+)?(?:{_MONTHS})\.?\s+{_DAY}(?:st|nd|rd|th)?,?\s+{_YEAR}\b(?:,?\s*(?:at\s+|@\s+)?{_TIME})?")),
    ("date", _named(rf"(?i)\b(?:(?:{_WEEKDAYS}|(?-i:Mo|Di|Mi|Do|Fr|Sa|So)\.),?\s+)?(?:the\s+)?{_DAY}(?:st|nd|rd|th|er|º|\.)?\s+(?:de\s+)?(?:{_MONTHS})\.?,?\s+(?:de\s+)?{_YEAR}\b(?:,?\s*(?:um\s+|à\s+|a las\s+|at\s+|@\s+)?{_TIME})?")),
    ("date", _named(rf"(?i)\b(?:{_WEEKDAYS}),?\s+(?:{_MONTHS})\.?\s+{_DAY}(?:st|nd|rd|th)?\b")),
    ("date", _named(rf"(?i)\b(?:{_WEEKDAYS}|(?-i:Mo|Di|Mi|Do|Fr|Sa|So)\.),?\s+(?:der\s+|le\s+|el\s+|the\s+)?{_DAY}"
                    rf"(?:st|nd|rd|th|\.)?\s+(?:de\s+|of\s+)?(?:{_MONTHS})\b")),  # `Sunday the 17th of May` too
    # a weekday before a numeric date belongs to it (Windows' `%date% %time%`: `Thu 10/14/2026  6:58:06.02`;
    # RFC 850's `Wednesday, 06-Nov-26 14:15:26 GMT`), so a day that moves on changes the span's own text
    ("date", _named(rf"(?i)\b(?:{_WEEKDAYS})\.?,?\s+(?:{_MON}/{_DAY}/{_YEAR}|{_DAY}\.{_MON}\.{_YEAR}|{_YEAR}-{_MON}-{_DAY}|"
                    rf"{_DAY}-{_MON_ABBR}-(?:{_YEAR}|\d{{2}}))\b(?:,?\s*{_TIME}(?:\s?GMT)?)?")),  # PHP's cookie `-2026` too
    # an ISO date with its weekday in brackets after it (`2026-09-05 (Sat)`)
    ("date", _named(rf"(?i)\b{_YEAR}-{_MON}-{_DAY} \((?:{_WEEKDAYS})\.?\)")),
    # a weekday and a day and month without a year (`Fri 16/01`, `Dienstag, 9.1.`): a shift plan's or a rota's day
    ("date", _named(rf"(?i)\b(?:{_WEEKDAYS})\.?,?\s+{_DAY}[./]{_MON}(?![./]?\d)\.?")),
    ("date", rf"{_YEAR}\s?年\s?{_MON}\s?月\s?{_DAY}\s?日(?:\s*{_TIME})?"),
    ("date", rf"{_YEAR}\s?년\s?{_MON}\s?월\s?{_DAY}\s?일"),
    # a day and a month without a year, then a clock (`03.05., 02:03`): a time stamp, not a date alone
    ("timestamp", rf"(?<![\d.])\b{_DAY}\.{_MON}\.,?\s*(?:um\s+)?{_CLOCK}(?![\d:])"),
    # a key's clock keeps its `Uhr` (`Uhrzeit an der Kasse: 18:27:07 Uhr`); a sentence's does not (below)
    ("time", rf"(?<=[:=] ){_CLOCK}\s?Uhr\b"),
    ("time", rf"(?<![\w.:/-]){_BARE_TIME}{_TZ}(?![\w:/-]|\.\w)"),  # a full stop may end the sentence
    ("time", rf"(?<![\w.:/-]){_DOT_TIME}"),
    # a web server's log time (`[05/Mar/2026:15:52:25 +0000]`)
    ("timestamp", _named(rf"\b{_DAY}/{_MON_ABBR}/{_YEAR}:(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d"
                  r"(?: [+-]\d{4})?")),
    # base64 of a JSON object (`eyJ` is `{"`): a JWT, a framework's encrypted cookie (`X-XSRF-TOKEN`)
    ("token", r"\beyJ[A-Za-z0-9+/_-]{16,}={0,2}(?:\.[A-Za-z0-9_-]+={0,2}){0,2}"),
    # a weak entity tag (RFC 9110: `W/"<opaque>"`), whole
    ("etag", r'\bW/"[\x21\x23-\x7e]{6,}"'),
    # a time ago (`refreshed 23 minutes ago`, `vor 12 Minuten`): it grows as the clock runs
    # (its unit abbreviated too, `last report 119 s ago`, `vor 69 min`; round 31)
    ("counter", r"(?i)\b\d+\s?(?:seconds?|minutes?|hours?|days?|secs?|mins?|hrs?|s|h)\s+ago\b"
                r"|\bvor\s+\d+\s?(?:Sekunden|Minuten|Stunden|Tagen|Sek\.|Min\.|Std\.|s\b|min\b|h\b)"),
    # `uptime`'s line (procps): the clock, the time since boot, the users and the load averages, one reading
    ("reading", r"\b(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d up (?:\d+ days?, +)?(?:\d{1,2}:[0-5]\d|\d+ min), +\d+ users?, +"
                r"load average: \d+\.\d\d, \d+\.\d\d, \d+\.\d\d"),
    # a METAR's or TAF's wind group (ICAO Annex 3: direction, speed, gusts, unit): `24018G27KT`, `VRB03MPS`
    ("counter", r"\b(?:[0-3]\d0|VRB)\d{2,3}(?:G\d{2,3})?(?:KT|MPS|KMH)\b"),
    ("counter", r"(?i)\bvor\s+\d+\s?(?:minuten|stunden|tagen)\b"),
    ("epoch", r"(?i)(?:time|ts|timestamp|epoch|now|at)\s*[:=]?\s*1[6-9]\d{8}(?:\d{3})?(?:\.\d{1,9})?\b"),
    ("uuid", rf"(?i)\b(?:[a-z]{{1,12}}-)?{_UUID}\b"),  # with a word glued before it (ADK's `e-<uuid>`)
    ("uuid", rf"(?i)\{{{_UUID}\}}"),  # .NET's braced form
    ("ulid", r"\b[0-7][0-9A-HJKMNP-TV-Z]{25}\b"),
    # a prefixed id's random part holds a digit: `session_elapsed` and `Trace-Context` are a key's own name
    ("id", r"(?i)\b(?:req|request|sess|session|trace|span|run|conv|conversation|chatcmpl|msg|call|evt|txn|user|usr|cus|cust)[_-]"
           r"(?=[A-Za-z]*\d)[A-Za-z0-9]{6,}\b"),
    ("id", r"(?i)\b(?:request|session|trace|correlation|conversation|transaction|run|call|user|client|customer|account|device|visitor|interaction|thread|message|ticket|order)[\s_-]?(?:(?:id|identifier|key|token|nr|no|number)\b|#)\s*[:=#]?\s*[\"']?[A-Za-z0-9][A-Za-z0-9_.:=+/-]{3,}"),
    # long hex, with its own minus sign (Java's signed digest in hex: Minecraft's `serverId` hash)
    ("hex", r"(?i)(?:(?<![\w-])-)?\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{16,}\b"),
    # ids without a key, whole (their own `=` or `;` is no key's)
    ("trace", r"\b[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\b"),  # W3C traceparent
    ("trace", r"\b[0-9a-f]{32}/\d{1,20}(?:;o=[01])?"),  # Google Cloud's X-Cloud-Trace-Context
    ("trace", r"\b[0-9a-f]{32}-[0-9a-f]{16}(?:-[01d](?:-[0-9a-f]{16})?)?\b"),  # Sentry's sentry-trace, Zipkin's b3
    ("trace", r"\b[0-9a-f]{16,32}:[0-9a-f]{16}:[0-9a-f]{1,16}:[0-9a-f]{1,2}\b"),  # Jaeger's uber-trace-id
    ("message", r"\bwamid\.[A-Za-z0-9+/_-]{20,}={0,2}"),  # a WhatsApp Cloud API message id
    ("message", r"\$[A-Za-z0-9_-]{43}\b"),  # a Matrix event id
    ("message", r"(?<=<)[^<>@\s]{8,}@[A-Za-z0-9.-]+\.[a-z]{2,}(?=>)"),  # an e-mail's Message-ID
    ("timestamp", _named(rf"\b{_MON_ABBR} [ \d]\d (?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\b")),  # syslog
    ("timestamp", _named(rf"\b{_MON_ABBR}-{_DAY} {_CLOCK}")),  # a log's `May-12 14:03:27.415` (Nextflow's)
    # Oracle's default formats: `SYSTIMESTAMP` (`12-MAY-26 02.03.27.481000 PM +02:00`) and `DD-MON-RR`
    ("timestamp", _named(rf"(?i)\b{_DAY}-{_MON_ABBR}-(?:\d{{2}}|{_YEAR}) (?:0\d|1[0-2])\.[0-5]\d\.[0-5]\d(?:\.\d{{1,9}})?"
                  r" [AP]M(?: [+-](?:0\d|1[0-4]):[0-5]\d)?")),
    ("date", _named(rf"(?i)\b{_DAY}-{_MON_ABBR}-(?:\d{{2}}|{_YEAR})\b")),
    # GNU `date` in a German locale (`Fr 18. Nov 17:24:43 CET 2026`)
    ("timestamp", _named(rf"(?i)\b(?:Mo|Di|Mi|Do|Fr|Sa|So)\.?\s+{_DAY}\.\s+(?:{_MONTHS})\.?\s+{_CLOCK}(?:\s+[A-Z]{{3,5}})?\s+{_YEAR}\b")),
    # a weekday, a clock, then the date (ElevenLabs' `system__time`: `Wednesday, 15:07 8 June 2026`)
    ("timestamp", _named(rf"(?i)\b(?:{_WEEKDAYS}),?\s+{_CLOCK}\s+{_DAY}\.?\s+(?:{_MONTHS})\.?\s+{_YEAR}\b")),
    # a German clock said in words' order (`9 Uhr 10`), a French one written with `h` (`0 h 42`)
    ("time", r"(?<![\w.:])(?:[01]?\d|2[0-3]) (?:Uhr|h) [0-5]\d\b"),
    # a month and a day with a clock to the millisecond (Android's logcat: `11-15 17:11:57.703`)
    ("timestamp", r"(?<![\w./:-])(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01]) (?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{3}\b"),
    # a date spelled for speech (`Wednesday, July seventh`)
    ("date", _named(rf"\b(?:(?:{_WEEKDAYS_EN}),?\s+)?(?:{_MONTHS_EN})\s+(?:the\s+)?(?i:{_ORDINAL})\b")),  # capitalised: 25x cheaper
    # hours and zero-padded minutes (`due in 9h 06m`): a countdown or a time since, as a clock reads it
    ("elapsed", r"\b\d{1,3}h\s?[0-5]\d(?:m|min)\b"),
    # a duration measured to a fraction of a second (systemd's `CPU: 23min 13.597s`), a countdown's
    # minutes and seconds (`9 min 12 s`), a time since (`5h 7min ago`): a clock's reading, not a rule's
    ("elapsed", r"\b(?:\d+(?:h|min)\s)+\d+\.\d{1,6}s\b|\b\d+\s?min\s[0-5]?\d\s?s\b|"
                r"\b\d+(?:h|min|s)(?:\s\d+(?:h|min|s))*\s+ago\b"),
    # minutes and seconds written with primes, as a stopwatch or a sports result reads (`seit 3′33″`; round 39)
    ("elapsed", r"(?<![\d′])\d{1,3}\s?′\s?[0-5]\d\s?″"),
    # a military or emergency services' clock (`0657 hrs`)
    ("time", r"\b(?:[01]\d|2[0-3])[0-5]\d\s?hrs\b"),
    ("instance", rf"\b[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-{_POD_SUFFIX}{{6,10}}-{_POD_SUFFIX}{{5}}\b"),  # a pod's name
    # FIX's UTCTimestamp (`52=20260712-02:30:17.703`), an ISO 8601 ordinal date and time (CCSDS's
    # `2026-036T07:06:34.627Z`), a clock in dotted hours and minutes with am or pm (`11.32am`)
    ("timestamp", rf"\b{_YEAR}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])-(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{{1,9}})?\b"),
    ("timestamp", rf"\b{_YEAR}-(?:[0-2]\d\d|3[0-5]\d|36[0-6])T(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d{{1,9}})?)?Z?"),
    ("timestamp", rf"\b{_YEAR}-(?:[0-2]\d\d|3[0-5]\d|36[0-6])\s{_TIME}"),  # the ordinal date, a space, the clock (round 25)
    # a military date-time group, DDHHMMZ MON YY (`241204Z FEB 26`; round 26)
    ("timestamp", r"\b(?:0[1-9]|[12]\d|3[01])(?:[01]\d|2[0-3])[0-5]\d[A-Z]\s(?:JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC)\s\d{2}\b"),
    ("time", r"(?<![\w.:/-])(?:0?[1-9]|1[0-2])\.[0-5]\d\s?(?:am|pm)\b"),
    # a BEAM process's, port's or reference's inspect form (Elixir's `#PID<0.37766.0>`), whole
    ("instance", r"#(?:PID|Port)<\d+(?:\.\d+){2}>"),
    ("token", r"#Reference<\d+(?:\.\d+){3}>"),
    # IEC 61131-3 literals of a time of day and a date and time (a PLC's `TOD#14:32:07.123`, `DT#2026-05-05-14:32:07`)
    ("time", rf"\bTOD#{_CLOCK}"),
    ("timestamp", rf"\bDT#{_YEAR}-{_MON}-{_DAY}-{_CLOCK}"),
    # SNMP's TimeTicks as Net-SNMP prints them: hundredths since a restart, then the same as days and a clock
    ("timestamp", r"\(\d{3,}\) \d+ days?, \d{1,2}:[0-5]\d:[0-5]\d\.\d\d\b"),
    # uptime(1)'s time since the boot (`up 73 days, 18:36`), whole; a clock, then its date (`06:09:14 MESZ, Mi
    # 21.10.26`, a weekday between them or none), whole (round 28)
    ("timestamp", r"\b(?:up\s+\d+\s+days?|day\s+\d+),\s+\d{1,2}:[0-5]\d\b"),  # or a run's `day 4, 15:19` (round 29)
    ("timestamp", rf"\b{_CLOCK}{_TZ},?\s+(?:(?:{_WEEKDAYS}|Mo|Di|Mi|Do|Fr|Sa|So)\.?,?\s+)?"
                  rf"(?:{_DAY}\.{_MON}\.(?:{_YEAR}|\d\d)|{_YEAR}-{_MON}-{_DAY})\b"),
    # an Elixir sigil's date and time (`~U[2026-02-25 19:25:47.028415Z]`, `~N[…]`), whole
    ("timestamp", rf"~[UN]\[{_YEAR}-{_MON}-{_DAY}[T ]{_CLOCK}(?:\.\d{{1,6}})?Z?\]"),
    # Claude Code's x-anthropic-billing-header: its 5-hex `cch=` changes on every request
    ("billing_header", r"\bcch=[0-9a-fA-F]{5}\b"),
    ("email", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"),
    ("user", r"(?i)\b(?:user(?:\s?name)?|customer|logged in as|signed in as|current user|nutzer(?:name)?|benutzer(?:name)?|utilisateur|usuario|utente)\s*[:=]\s*[\"']?\w[\w.\- ]{0,40}"),
    ("user", r"(?i)\b(?:(?:the )?(?:user|customer|client)(?:'s)? name is|(?:der )?(?:kunde|kundin|nutzer|nutzerin|benutzer) heißt|"
             r"name (?:of the|des) (?:user|customer|kunden|nutzers) is|le client s'appelle)\s+\w[\w.\-]*(?-i:[ \t]+[A-Z][\w.\-]*)?"),
    ("user", r"(?i)\b(?:you are (?:talking|speaking|chatting) (?:to|with)|du sprichst mit|sie sprechen mit|tu parles (?:à|avec)|vous parlez (?:à|avec)|estás hablando con|hablas con)\s+\w[\w.\-]*(?-i:[ \t]+[A-Z][\w.\-]*)?"),
    ("counter", r"(?i)\b(?:turn|request|call|attempt|step|iteration|message|visit|session|round|run|try|versuch|anfrage|tentative|intento)\s*(?:#|no\.?|nr\.?|number)?\s*\d+\b(?:\s*(?:of|/|von|sur|de)\s*\d+)?"),
    # a counter's key, abbreviated too (LoRaWAN's `f_cnt=10922`), a German compound (`Signaturzähler: 44301`)
    ("counter", r"(?i)(?:\b|_)(?:count|counter|cnt|ctr|seq|sequence|index|request_count|n_calls|uptime|\w*zähler)\s*[:=]\s*\d+\b"),
    # what is left of a budget, counting down as a session goes on: a key that says so
    # (`Context left: 187655`, `tokens_remaining: 148907`, `Verbleibendes Kontingent: 41`) or the
    # words after the number (`12 requests remaining`)
    ("counter", rf"(?i)\b(?:[\w-]*?[ _-]?(?:{_LEFT})|(?:{_REMAINING})(?:[ _-][\w-]+){{1,4}}?)\s*[:=]\s*{_AMOUNT}\b"),
    # (`467 tests left before reload`: a clause may follow `left`, not an object: `turn left at`)
    ("counter", rf"(?i)\b\d+(?:[.,]\d+)*(?:[ \t]+[^\W\d_]+){{1,2}}?[ \t]+(?:{_REMAINING}|"
                rf"left\b(?=\s*(?:[.,;)]|$|(?:before|until|till|bis|vor)\b)))\b"),
    # a countdown's time shown with its unit, as a game or a timer says it (`92 s on the clock`,
    # `4 min to go`; round 40)
    ("counter", r"(?i)\b\d+(?:[.,:]\d+)?\s?(?:s|secs?|seconds|min|mins|minutes)[ \t]+(?:on the clock|to go)\b"),
    # a place in a queue (`Position in der Warteschlange: 8`, `queue_position = 3`)
    ("counter", r"(?i)(?:\b|_)(?:position|queue|warteschlange)\b[^\n:=]{0,30}?\s*[:=]\s*\d+\b"),
    # a share of a window or quota that is free, left or used (`81% of the context window is still free`)
    ("counter", rf"(?i)\b\d+(?:[.,]\d+)?\s?%(?:[ \t]+[^\W\d_]+){{0,6}}?[ \t]+(?:free|frei|used|belegt|verbraucht|{_LEFT})\b"),
    # time since a session or a process started (`Elapsed in this session: 6m 41s`, `uptime 5979684 ms`)
    ("elapsed", r"(?i)(?:\b|_)(?:elapsed|uptime|laufzeit)\b[^\n\d]{0,30}?\d+\s?(?:h|min|m|s|ms)\b(?:\s?\d+\s?(?:min|m|s|ms)\b){0,2}"),
    # a state held for a time of two parts (`läuft seit 2 Std. 11 Min.`, `running for 2 hrs 11 mins`; round 35;
    # days and hours, `brennt seit 7 Tg. 5 Std.`, round 38)
    ("elapsed", rf"(?i)\b(?:seit|since|for)\s\d+\s?(?:{_DAYS_UNIT}\s\d+\s?{_HOURS_UNIT}|{_HOURS_UNIT}\s\d+\s?{_MINUTES_UNIT})(?!\w)"),
    # a usage meter: `48,213 / 200K tokens used`
    ("counter", r"(?i)\b\d+(?:[.,]\d+)*\s*/\s*\d+(?:[.,]\d+)*\s?[KkMm]?(?:[ \t]+[^\W\d_]+){0,2}[ \t]+"
                r"(?:used|verbraucht|genutzt|belegt)\b"),
)


# Values are short and sit by their key or cue: a search for them reads a window, never a whole
# line of a pasted document (the patterns above run at ~2 s a MB together). A line longer than
# LINE_SCAN_CHARS is a document: values are read in its first LINE_SCAN_CHARS, on every path
# (the text diagnosis, another pod's digest), so two pods give one answer.
VALUE_WINDOW = 256  # chars each side of a divergence searched for the value that changed there
LINE_SCAN_CHARS = 4096

# Kinds that change per request in practice (a single request can be judged on them alone);
# dates count only with a "now" cue on their line (a fixed policy date is not dynamic).
VOLATILE_KINDS = frozenset({"timestamp", "time", "uuid", "ulid", "id", "trace", "instance", "message", "epoch", "counter",
                            "elapsed", "hex", "etag", "token", "reading",
                            "billing_header"})
NOW_CUE = re.compile(r"(?i)(?:\b(?:current|today|now|heute|aktuell|jetzt|aujourd|nous sommes|hoy|oggi|vandaag|"
                     r"date\s*:|datum\s*:|time\s*:|zeit\s*:|stand\s*:)|今天|今日|现在|本日)")


@dataclass(frozen=True)
class Span:
    """One dynamic-looking value: `text[start:end]`, with its kind (date, uuid, email, ...)."""

    start: int
    end: int
    kind: str
    text: str


@dataclass(frozen=True)
class DynamicLine:
    """A line (without its newline) that holds at least one dynamic value."""

    start: int
    end: int
    text: str
    spans: tuple[Span, ...]


class DynamicDetector:
    """Compiled built-in patterns plus `extra` regexes (kind `custom`). Thread-safe, reusable."""

    def __init__(self, extra: Sequence[str] = ()) -> None:
        compiled: list[tuple[str, re.Pattern[str]]] = [(k, re.compile(p)) for k, p in BUILTIN_PATTERNS]
        compiled.extend(("custom", re.compile(p)) for p in extra)
        # With all of them the detector costs ~2.4 µs a character. Most cannot match without a
        # digit: a window without one skips those. The costliest need a weekday's or a month's
        # name: a window with digits and no name skips those (one scan for names costs less).
        self._variants = {(digit, name): [(k, p) for k, p in compiled
                                          if (digit or not needs_digit(p.pattern)) and (name or p.pattern not in _NEEDS_NAME)]
                          for digit in (False, True) for name in (False, True)}

    def find(self, text: str, start: int = 0, end: int | None = None) -> list[Span]:
        """Dynamic spans in `text[start:end]`, non-overlapping, ordered; the longest match wins."""
        stop = len(text) if end is None else end
        found: list[Span] = []
        if _DIGIT.search(text, start, stop) is None:
            patterns = self._variants[False, True]
        else:
            patterns = self._variants[True, _NAMES.search(text, start, stop) is not None]
        for kind, pattern in patterns:
            for m in pattern.finditer(text, start, stop):
                if m.end() > m.start():
                    found.append(Span(m.start(), m.end(), kind, m.group(0)))
        return _merge(found)

    def lines(self, text: str) -> list[DynamicLine]:
        """Lines holding at least one dynamic value (offsets into `text`)."""
        out: list[DynamicLine] = []
        spans = self.find(text)
        i = 0
        while i < len(spans):
            line_start = text.rfind("\n", 0, spans[i].start) + 1
            line_end = text.find("\n", spans[i].start)
            line_end = len(text) if line_end < 0 else line_end
            members = []
            while i < len(spans) and spans[i].start < line_end:
                members.append(spans[i])
                i += 1
            out.append(DynamicLine(line_start, line_end, text[line_start:line_end], tuple(members)))
        return out


_DIGIT = re.compile(r"\d")


def needs_digit(pattern: str) -> bool:
    """Can a match of `pattern` only be found where a digit is (a digit in every match, or in a
    lookahead every match passes)? Read from the parsed pattern; unsure is False."""
    return _needs_digit(re_parser.parse(pattern))


def _needs_digit(items: Iterable[tuple[Any, Any]]) -> bool:
    for op, av in items:
        if op is re_const.LITERAL and chr(av).isdigit():
            return True
        if op is re_const.IN and _digits_only(av):
            return True
        if op in (re_const.MAX_REPEAT, re_const.MIN_REPEAT) and av[0] >= 1 and _needs_digit(av[2]):
            return True
        if op is re_const.SUBPATTERN and _needs_digit(av[3]):
            return True
        if op is re_const.BRANCH and all(_needs_digit(alt) for alt in av[1]):
            return True
        if op is re_const.ASSERT and av[0] == 1 and _needs_digit(av[1]):  # a lookahead, not a lookbehind
            return True
    return False


def _digits_only(members: list[tuple[Any, Any]]) -> bool:
    """Does a character set hold digits only (`\\d`, `[0-9]`, `[2-9]`)?"""
    for op, av in members:
        if op is re_const.CATEGORY and av is re_const.CATEGORY_DIGIT:
            continue
        if op is re_const.RANGE and chr(av[0]).isdigit() and chr(av[1]).isdigit():
            continue
        if op is re_const.LITERAL and chr(av).isdigit():
            continue
        return False
    return bool(members)


def _merge(spans: Iterable[Span]) -> list[Span]:
    """Overlapping matches become one span (union), named after the earliest, longest match."""
    ordered = sorted(spans, key=lambda s: (s.start, -(s.end - s.start)))
    out: list[Span] = []
    for span in ordered:
        if out and span.start < out[-1].end:
            if span.end > out[-1].end:
                last = out[-1]
                out[-1] = Span(last.start, span.end, last.kind, last.text + span.text[last.end - span.start:])
            continue
        out.append(span)
    return out


@lru_cache(maxsize=16)
def get_detector(extra: tuple[str, ...] = ()) -> DynamicDetector:
    """A shared detector per set of extra patterns (compiling ~25 regexes costs ~5 ms)."""
    return DynamicDetector(extra)


def find_dynamic_spans(text: str, extra_patterns: Sequence[str] = ()) -> list[Span]:
    """Every dynamic-looking value in `text` (see the module docstring for what counts)."""
    return get_detector(tuple(extra_patterns)).find(text)


def dynamic_lines(text: str, extra_patterns: Sequence[str] = ()) -> list[DynamicLine]:
    """The lines of `text` that hold dynamic-looking values: what `move_dynamic` moves."""
    return get_detector(tuple(extra_patterns)).lines(text)


# ------------------------------------------------------------------ where a value's text is
# Helpers that place a value inside its token or span, shared by the text diagnosis and the
# digest so that both report the same characters.
def port_start(text: str, start: int, end: int) -> int:
    """Where the port of a `host:port` token starts (the token's start when it is a bare port)."""
    colon = text.rfind(":", start, end)
    return colon + 1 if colon >= 0 else start


_DIGIT_GROUPS = re.compile(r"\d+(?:[.,]\d+)*")
MINUS = "\u2212"  # the minus sign, as typeset numbers write it (`−18,4 °C`)


def number_token(text: str, start: int, end: int) -> tuple[int, int]:
    """A token of digits widened over the digit groups its `.` or `,` join (`38,9`, `41.213`), and
    over a range its dash makes of two numbers (`10–15`); a leading minus stays (`-26,8`, and a
    true minus sign before the token, U+2212: `−18,4`), and a plus: a signed change (`+0,92`)."""
    if end - start > 1 and text[start] in "-+" and _DIGIT_GROUPS.fullmatch(text, start + 1, end):
        return start, number_token(text, start + 1, end)[1]
    if start < end and _DIGIT_GROUPS.fullmatch(text, start, end):
        start, end = number_start(text, start, max(0, start - 64)), number_end(text, end)
        if start > 0 and (text[start - 1] == MINUS or text[start - 1] in "-+" and (
                start == 1 or _SIGN_AFTER.match(text, start - 2))):
            return start - 1, end  # a signed reading (`Zunahme: +0,92 kg` -> `-1,64 kg`), its sign apart from a word
        glued_after = end < len(text) and (text[end].isalnum() or text[end] in _JOINERS) and not (
            text[end] in ".:" and (end + 1 == len(text) or not text[end + 1].isalnum()))  # a sentence's end
        if not glued_after and (m := _RANGE_BEFORE.search(text, max(0, start - 32), start)) is not None:
            return m.start(), end
        if start > 0 and (text[start - 1].isalnum() or text[start - 1] in _JOINERS):
            return start, end  # a part of a date or an id (`2026-05-24`), not a range's end
        if (m := _RANGE_AFTER.match(text, end)) is not None:
            return start, m.end()
    return start, end


_SIGN_AFTER = re.compile(r"[\s(\[:=]")  # what a number's own sign follows (a `-` after a word or a digit joins them)
_JOINERS = "-–/:._"  # what joins the parts of a date, a time or an id
_RANGE_AFTER = re.compile(r"[–-]\d+(?:[.,]\d+)?(?![\w/:–-]|[.,]\d)")  # a range's upper end, nothing glued after it
_RANGE_BEFORE = re.compile(r"(?<![\w/:._–-])\d+(?:[.,]\d+)?[–-]$")


def number_start(text: str, at: int, floor: int) -> int:
    """`at` moved back over digit groups joined by `.` or `,` (`48,|213` -> `|48,213`); not over
    digits that end a word (`PLC2,|89`: a CSV row's cell before it)."""
    while at - 2 >= floor and text[at - 1] in ".," and text[at - 2].isdigit():
        group = at - 2
        while group > floor and text[group - 1].isdigit():
            group -= 1
        if group > floor and (text[group - 1].isalpha() or text[group - 1] == "_"):
            break
        at = group
    return at


def number_end(text: str, at: int) -> int:
    """`at` moved on over digit groups joined by `.` or `,` (`48|,213` -> `48,213|`)."""
    while at + 1 < len(text) and text[at] in ".," and text[at + 1].isdigit() and text[at - 1:at].isdigit():
        at += 1
        while at < len(text) and text[at].isdigit():
            at += 1
    return at


_DURATION_PART = r"\d+(?:[.,]\d+)?\s?(?:h|min|m|s|ms|Tg\.|Std\.|Min\.)(?:(?<=\.)|\b)"  # `6m`, `13.597s`, `9 min`
_DURATION_PARTS = re.compile(_DURATION_PART)


_MULTI_DURATION = re.compile(rf"{_DURATION_PART}(?:\s{_DURATION_PART})+")  # two parts or more: `6 min 02 s`


def duration_around(text: str, start: int, end: int, at: int) -> tuple[int, int] | None:
    """The duration of two parts or more in `text[start:end]` that holds `at` (`5 min 09 s`, where
    `09` changed), as (start, end); None when there is none."""
    return next(((m.start(), m.end()) for m in _MULTI_DURATION.finditer(text, start, end) if m.start() <= at < m.end()),
                None)


def counter_end(text: str, start: int, at: int) -> int:
    """Where a counter's value that starts at `start` ends: after a duration of two parts or more
    (`Hilfsfrist verbleibend: 6 min 02 s`, whole), else after the number's digit groups from `at`
    (`number_end`)."""
    m = _MULTI_DURATION.match(text, start)
    return m.end() if m is not None else number_end(text, at)


def elapsed_value(text: str, span: Span) -> tuple[int, int]:
    """Where the value of an `elapsed` span is: its duration (`6m 41s`), or the number alone when
    the duration has one unit (`5979684` of `uptime 5979684 ms`)."""
    parts = list(_DURATION_PARTS.finditer(text, span.start, span.end))
    if not parts:
        return span.start, span.end
    start = parts[0].start()
    if len(parts) > 1:
        return start, parts[-1].end()
    end = start
    while end < span.end and text[end].isdigit():
        end += 1
    return start, end


# ------------------------------------------------------------------ a date that rolled over
# a name by its first three letters too (`Mär.`, `déc.`, `set.`)
_MONTH_NUMBER = {name[:3] if len(name) > 3 else name: month for name, month in _MONTH_SPELLINGS}
_MONTH_NUMBER.update(dict(_MONTH_SPELLINGS))
ROLLOVER_DAYS = 3  # a "today" moves forward by a day or a weekend between two requests of a tenant


def date_days(text: str) -> set[int]:
    """The day numbers (proleptic ordinals) a date text may mean: numeric forms read both as
    day-month and month-day, written months by name; empty when it is no date. A clock after the
    date is no part of it (`04.05.26 um 10:15`: its minutes are no two-digit year)."""
    if (clock := _CLOCK_AFTER_DATE.search(text)) is not None:
        text = text[:clock.start()]
    year = re.search(r"(?<!\d)(?:19|20)\d{2}(?!\d)", text)
    nums = [int(n) for n in re.findall(r"(?<!\d)\d{1,2}(?!\d)", text if year is None
                                       else text[:year.start()] + " " + text[year.end():])]
    words = [w.lower().rstrip(".") for w in re.findall(r"[^\W\d_]+\.?", text)]
    month = next((_MONTH_NUMBER[w] for w in words if w in _MONTH_NUMBER), None)
    if year is None:  # a two-digit year ends a date (`04.05.26`, Oracle's `17-APR-26`)
        if len(nums) < (2 if month else 3):
            return set()
        y, nums = 2000 + nums[-1], nums[:-1]
    else:
        y = int(year.group(0))
    if month:
        pairs = [(month, n) for n in nums[:1]]
    else:  # day-month and month-day; fewer than two numbers and no month name: no date
        pairs = [(nums[0], nums[1]), (nums[1], nums[0])] if len(nums) >= 2 else []
    out = set()
    for m, d in pairs:
        try:
            out.add(date(y, m, d).toordinal())
        except ValueError:
            continue
    return out


# a clock after a date: `10:15`, `10h15`, or Oracle's dotted one before its AM/PM (`10.50.40.644712 PM`);
# `13.10` of `Di., 13.10.2026` is the date's
_CLOCK_AFTER_DATE = re.compile(r"[\s,]+(?:um\s+|at\s+|@\s+|à\s+|a las\s+)?(?:[01]?\d|2[0-3])"
                               r"(?:[:h][0-5]\d|\.[0-5]\d\.[0-5]\d(?:\.\d{1,9})?\s?[AP]M)")
CLOCK_DRIFT_DAYS = 366  # two requests of a tenant a year apart or more: a stamp that moved further was edited


def moved_too_far(old: str, new: str) -> bool:
    """Did a stamp move by more than a clock moves between two requests of a tenant (a year), so
    that it was edited (`04.05.26 um 10:15` -> `23.12.37 um 19:11`), not read from a clock?"""
    a, b = date_days(old), date_days(new)
    return bool(a and b) and min(abs(y - x) for x in a for y in b) > CLOCK_DRIFT_DAYS


def rolled_over(old: str, new: str) -> bool:
    """Did a date move forward by a day or a few (a clock's "today"), rather than being edited? A
    date without a year moved on when its weekday moved with it (`weekday_rolled`)."""
    return rolled_from(date_days(old), new) or weekday_rolled(old, new)


_WEEKDAY_DATE = re.compile(r"(?i)([^\W\d_]+)\.?,?\s+(\d{1,2})[./](\d{1,2})")


def weekday_rolled(old: str, new: str) -> bool:
    """Did a weekday and its day and month (no year: `Fri 16/01` -> `Sat 17/01`, `Dienstag, 9.1.` ->
    `Mittwoch, 10.1.`) move forward together by the same day or few, as a clock's "today" does? An
    edited date keeps its weekday or loses step with it."""
    a, b = _WEEKDAY_DATE.match(old), _WEEKDAY_DATE.match(new)
    if a is None or b is None:
        return False
    wa, wb = _WEEKDAY_INDEX.get(a.group(1).lower()), _WEEKDAY_INDEX.get(b.group(1).lower())
    if wa is None or wb is None or not 0 < (wb - wa) % 7 <= ROLLOVER_DAYS:
        return False

    def day(m: re.Match[str], swap: bool) -> int | None:
        d, mo = int(m.group(2)), int(m.group(3))
        d, mo = (mo, d) if swap else (d, mo)
        try:
            return date(2000, mo, d).toordinal()  # a leap year: 29 February is a day too
        except ValueError:
            return None
    for swap in (False, True):  # day-month, or month-day (`10/16`)
        x, y = day(a, swap), day(b, swap)
        if x is not None and y is not None and (y - x) % 366 == (wb - wa) % 7:
            return True
    return False


def rolled_from(days: Iterable[int], new: str) -> bool:
    """Is the date `new` a day or a few after one of `days` (`date_days` of the earlier date)?"""
    later = date_days(new)
    return any(0 < b - a <= ROLLOVER_DAYS for a in days for b in later)
