"""Why did the cache miss: the first divergence between two prompts of a tenant, its cause, and
the other causes further down. Definitions and examples: docs/diagnosis.md.

Pure functions over two `RequestSketch`es (the previous request the current one is compared with,
and the current one) plus what the tenant sent before (`TenantPast`: which conversations exist).

A divergence costs reusable content (a *break*) when
- it lies before the part of the current prompt expected to vary (its last user turn and what
  follows) and before the end of the previous prompt's reusable part (a trailing system message
  after the history is not reusable) by at least `material` characters, or
- after it, the two prompts re-align for at least `material` characters (static content was
  pushed behind something variable, so the engine recomputes content it already had).

Causes (the first divergence in prompt order is the primary one; the next divergences after each
re-alignment are secondary findings):
- `front_trim`: the system part is unchanged and the history starts later (early turns dropped or
  summarised), possibly after the first message or exchange kept pinned (a sliding window that
  keeps the task).
- `tool_order`: the same tools in another order, or the same tool with its (nested) keys in
  another order, where the divergence lies in the rendered tools; or tool entries listed in the
  system text in another order; or JSON tool schemas written into the message where the prompts
  diverge, in another order. Tools added or removed at the same time are a secondary
  `template_change`.
- `dynamic_head`: the divergence is a changed per-request value (app/prefix/dynamic.py: a known
  pattern, or a changed token whose shape or key marks it as per-request); the span is that value.
- `new_session`: a new conversation. The current request matches the previous ones only through
  the static head and none of its messages continues a conversation the tenant sent before (it
  does not contain the last user turn of any earlier request), or its system prompt is another
  agent's. Not a problem: counted apart from breaks (docs/diagnosis.md).
- `template_change`: the system prompt, the tools or the template's own text were edited.
- `history_edit`: an earlier turn of a continuing conversation was re-sent with other text (or a
  turn inserted or removed before the last one).
- `question_first`: the last user turn starts with variable text and static text follows it.
- `compaction`: the agent compacted its context: the system prompt and tools are kept, at most half
  of the history's text is left (or half of its messages, in less text unless the earlier user
  messages are kept before the summary: it may outweigh short turns), and a message the
  previous history did not have stands in for the dropped turns (a summary: before the newest turn, or as the newest message after the kept
  user messages, Codex's shape). Paid once: the session continues from the new prefix. Not a
  problem: counted apart from breaks, as `new_session` is. A history trimmed a little on every
  turn keeps its length and stays `front_trim`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.prefix.dynamic import (
    LINE_SCAN_CHARS,
    NOW_CUE,
    VALUE_WINDOW,
    VOLATILE_KINDS,
    DynamicDetector,
    Span,
    duration_around,
    elapsed_value,
    get_detector,
    moved_too_far,
    number_end,
    number_start,
    number_token,
    rolled_over,
)
from app.prefix.sketch import Region, RequestSketch
from app.prefix.strings import common_prefix_len
from app.prefix.value_kind import (
    reads_as_value,
    turn_value,
    value_kind,
    value_start,
    whole_value_change,
    whole_value_start,
)

CAUSES = ("dynamic_head", "tool_order", "front_trim", "template_change", "history_edit",
          "question_first", "new_session", "compaction")
NOT_A_PROBLEM = frozenset({"new_session", "compaction"})
COMPACTED_MIN_MESSAGES = 4  # a history this long before it, at least (one exchange is no context to compact)
PINNED_MESSAGES = 2  # a front trim may keep this many first history messages (the task, its first reply)
MAX_PINNED_EXCHANGE = 32  # ... or the whole first exchange (an agent's: its tool calls too), up to this long
COMPACTED_SHARE = 0.5  # the history after a compaction holds at most this share of the text before
ANCHOR_CHARS = 24
MAX_ANCHORS = 160
NEAR_WINDOW = 512  # chars after the divergence where anchors are tried at every word start
LINE_WINDOW = 65_536  # beyond that, only at line starts
MAX_SECONDARY = 4
VALUE_CHARS = frozenset("-_.:/+~")
KEYED_KINDS = frozenset({"id", "user", "epoch", "counter"})  # patterns that include the key's words
ALWAYS_DYNAMIC = VOLATILE_KINDS | {"email", "user", "custom"}
# a tool entry in system text, as public prompts list them: `- name(args): ...`, `1. name - ...`,
# `* name -> ...` (`nox --list`),
# `` `name`: ...``, `<function>{...}</function>` (Anthropic's legacy tool prompt; a case test has
# it), `{"name": ...}`, `## name`, a declaration in code, lower-case keywords before the name
# and its parameters (`def name(`, `async function name(`, `pub fn name(`), an HTTP route
# (`GET /lessons/{id} - ...`), and a name in columns: its arguments, then a tab or a gap of two
# spaces or more before the description (a CLI's `--help`, `bin/rails -T`, a tab-separated table)
# what stands before a declared name in code: lower-case keywords (`def`, `pub fn`), Java's
# modifiers and capitalised type, C#'s access modifier, modifiers and type
_KEYWORDS = r"(?:[a-z]+\s+){1,3}"
_JAVA_TYPE = r"(?:(?:public|private|protected|static|final|abstract)\s+)*[A-Z][\w<>\[\],.? ]*\s"
_CSHARP_TYPE = r"(?:public|private|protected|internal)\s+(?:(?:static|async|virtual|override|sealed)\s+)*[A-Za-z_][\w<>\[\],.?]*\s+"
TOOL_LINE = re.compile(
    r"""^\s*(?:<function\b|\{\s*"(?:name|type)"|#+\s*`?[A-Za-z_][\w.\-]*`?\s*$|"""
    rf"""{_KEYWORDS}[A-Za-z_][\w.]*\s*\(|(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)\s+/|"""
    r"""\(\d{1,3}\)\s*`?[A-Za-z_][\w.\-]*`?[,:(]|"""
    rf"""{_JAVA_TYPE}[a-z_]\w*\s*\(|{_CSHARP_TYPE}[A-Za-z_]\w*\s*\(|"""
    r"""[A-Za-z_][\w.\-/:]*(?: [^ \t]+)*(?:\t| {2,})\S|"""
    r"""(?:[-*•+]|\d+[.)])?\s*`?[A-Za-z_][\w.\-]*`?\s*(?:\(|:|\s[-—–]\s|\s(?:->|→|=>)\s))""")
# a line that opens with a name set apart by its markup, whatever the tag or the markdown: a tag
# with a name or id attribute (`<tool name="x">`, `<command id="x"/>`), a tag holding only a name
# (`<tool_name>x</tool_name>`), a bold, code or table-cell name (`**x**`, `` `x` ``, `| x |`). Outside
# an attribute or code the name must read as an identifier (lower-case first, or with `_ . : /`
# inside): `- **Tone**: friendly` is a rule with a bold heading, not a tool.
_NAME = r"[A-Za-z_][\w\-]*(?:[.:/][A-Za-z_][\w\-]*)*"
# a command named by a sign glued to it, whatever the sign (`/status`, a bot's `!cmd`, `@name`):
# punctuation that is not a bullet, a quote, a bracket or other markup handled above
_SIGIL = r"""[^\w\s"'`(\[{<|*#>•+\-.,:;]"""
_IDENT = r"(?:[a-z_][\w\-]*(?:[.:/][A-Za-z_][\w\-]*)*|[A-Za-z][A-Za-z\d]*(?:[_.:/][A-Za-z\d][\w\-]*)+)"
NAMED_LINE = re.compile(
    rf"""^\s*(?:[-*•+>]|\d+[.)])?\s*(?:<[\w:\-]+\s[^>]*?\b(?:name|id)\s*=\s*["']?{_NAME}"""
    rf"""|<([\w:\-]+)>\s*(?:`{_NAME}`|{_IDENT})\s*</\1>\s*$|\*\*(?:`{_NAME}`|{_IDENT})\*\*|`{_NAME}`"""
    rf"""|\|\s*(?:`{_NAME}`|{_IDENT})\s*\|"""
    rf"""|{_SIGIL}{_IDENT}(?=[\s(:]|$))""")
# a tool's name on a line of its own after a name key (CrewAI's `Tool Name: x`, LlamaIndex's
# `> Tool Name: x`, ADK's `Agent name: x`, `name: x`, a Lisp keyword's `:name "x"`: gptel's
# `gptel-make-tool`, a Clojure map's `:function {:name "x"`, a PHP array's `'name' => 'x',`), the
# first line of a block that describes the tool
TOOL_NAME_LINE = re.compile(rf"""(?i)^\s*(?:>\s*)?(?:(?:[a-z]+[ _]?)?name\s*[:=]\s*["'`]?{_NAME}["'`]?|"""
                            rf"""(?::[a-z]+\s*\{{\s*)?:name\s+"{_NAME}"|["']name["']\s*=>\s*["']{_NAME}["'])\s*,?\s*$""")
# a name written as code (snake_case, dotted, camelCase): `- rom_report: ...` names a tool, `- Tone: ...` does not
_CODE_NAME = re.compile(r"^\s*(?:[-*•+]|\d+[.)])?\s*`?(?:[a-z][a-z0-9]*(?:[_.][A-Za-z0-9]+)+|[a-z]+[A-Z]\w*)`?\s*[(:]")
_ENUMERATOR = re.compile(r"^\s*(?:\(\d{1,3}\)|\d{1,3}[.)])\s*")  # `1. `, `2) `, `(3) `
# a declaration in code: keywords, a Java or a C# type before a name and `(`
_DECLARATION = re.compile(rf"^\s*(?:{_KEYWORDS}|{_JAVA_TYPE}|{_CSHARP_TYPE})[A-Za-z_]\w*\s*\(")
# a type declared in code (`class WeinSuchen < RubyLLM::Tool`, `struct StartSessionTool: Tool {`,
# Go's `type SiloStand struct{`)
_TYPE_DECLARATION = re.compile(r"^\s*(?:(?:public|private|internal|open|final|abstract|export|sealed)\s+)*"
                               r"(?:class|struct|interface|record|object|protocol|enum|module)\s+[A-Z]\w*"
                               r"|^\s*type\s+[A-Z]\w*\s+(?:struct|interface)\b"  # Go: `type SiloStand struct{`
                               r"|^\s*impl(?:<[^>]*>)?\s+[\w:]+\s+for\s+[A-Z]\w*")  # Rust: `impl Tool for Rufbereitschaft {`
# a call whose first argument is the tool's quoted name (Prism's `Tool::as('x')`, `FunctionSchema("x", …)`,
# a constructor's: `new McpSchema.Tool("x", …)`)
_CALL_NAMED = re.compile(rf"""^\s*(?:\.|new\s+)?(?:[\w\\]+(?:::|->|\.))*\w+\(\s*(?:name\s*=\s*)?["']{_NAME}["']\s*[,)]""")
# a name alone on its line in a call's arguments (ellmer's `tool(\n  wave_forecast,`, a quoted `"kurs_buchen",`)
_LONE_NAME = re.compile(r"""^\s*(?:["'][A-Za-z_][\w.-]*["']|[a-z][a-z0-9]*(?:_[a-z0-9]+)+),\s*$"""
                        r"""|^\s+[a-z][a-z0-9]*(?:_[a-z0-9]+)+\s*$""")  # indented alone: Django's `manage.py help`
_NAME_ASSIGNED = re.compile(rf"""(?i)^\s*(?:(?:let|var|const|val|static)\s+)*name\s*(?::\s*[^=\n]{{1,30}})?[:=]\s*["']{_NAME}["']""")
# a banner that opens a tool's block (OpenHands' `---- BEGIN FUNCTION #3: name ----`)
_BANNER_NAME = re.compile(rf"(?i)^[-=#* ]*(?:BEGIN\s+)?(?:FUNCTION|TOOL|COMMAND|ACTION)\b[^:\n]{{0,12}}:\s*{_NAME}\s*[-=#* ]*$")
_POSITION_NUMBER = re.compile(r"(?<=#)\d{1,3}\b")  # a block's number by its position: it stays, the block moves
ENTRY_LINES = 4  # lines of a tool's block besides the one naming it (arguments, description, returns)
_SHAPE = re.compile(r"\s*(?:</?[\w:\-]+|[^\w\s]*)")
KEY_SIZE = 16
# JSON tool schemas written into a message's text (`schema_tools`): an object opening with a key,
# with a name and one of these parameter-schema keys (OpenAI, Anthropic, MCP)
_OBJECT_START = re.compile(r'\{\s*"')
SCHEMA_KEYS = frozenset({"parameters", "input_schema", "inputSchema"})
SCHEMA_SCAN_CHARS = 512 * 1024


@dataclass
class Realignment:
    prev_offset: int
    cur_offset: int
    common: int  # chars equal from there on


@dataclass
class Finding:
    """A secondary cause: where it is and, for a dynamic value, which value."""

    cause: str
    char_offset: int
    spans: list[Span] = field(default_factory=list)
    detail: str = ""


@dataclass
class Diagnosis:
    cause: str | None  # None: no break
    char_offset: int  # first divergent character in the current prompt
    spans: list[Span] = field(default_factory=list)  # the changed dynamic value(s) at the divergence
    realigned: Realignment | None = None
    detail: str = ""
    secondary: list[Finding] = field(default_factory=list)  # further causes, in prompt order
    # where one token changed that no rule judged (`ValueChange.edit_at`): the tenant's records keep it, so
    # that the same place changing again reads as a per-request value
    edit_at: str | None = None

    @property
    def is_break(self) -> bool:
        return self.cause is not None and self.cause not in NOT_A_PROBLEM


@dataclass
class TenantPast:
    """What the tenant sent before, as stable keys (shareable between pods, no text): the last user
    turn of each earlier request (a conversation's newest turn) and the system prompts seen."""

    last_turns: set[str] = field(default_factory=set)
    systems: set[str] = field(default_factory=set)
    edits: set[str] = field(default_factory=set)  # `Diagnosis.edit_at` of recent requests


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


# ---------------------------------------------------------------------- stable keys

def text_key(role: str, text: str) -> str:
    """A process-independent identity of a message: role, length and the first and last 512
    characters (O(1) per message; a full digest of a 1 MB system prompt costs ~1 ms)."""
    return span_key(role, text, 0, len(text))


def span_key(role: str, text: str, start: int, end: int, before: str | None = None) -> str:
    """`text_key(role, before + "\x01" + text[start:end])` (without `before`: of text[start:end])
    from the 512 characters at each end, never copying the span (a 1 MB turn was copied three
    times per request to be keyed)."""
    head, tail = text[start:min(end, start + 512)], text[max(start, end - 512):end]
    n = end - start
    if before is not None:
        lead = before + "\x01"
        n += len(lead)
        head, tail = (lead + head)[:512], (lead[-512:] + tail)[-512:]
    raw = f"{role}\x00{n}\x00{head}\x00{tail}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=KEY_SIZE // 2).hexdigest()


def turn_keys(sketch: RequestSketch) -> list[str]:
    """One key per user turn: the turn with the message before it (two conversations that share a
    question such as "thanks" still differ in what preceded it). Computed once per sketch."""
    memo = sketch.turn_keys_memo
    if memo is not None and memo[0] == len(sketch.regions):
        return list(memo[1])
    out: list[str] = []
    text = sketch.text
    prev = (0, 0)  # the message before, as a span
    for region in sketch.regions:
        if region.role in ("system", "developer"):
            continue
        if region.role == "user":
            before = text[max(prev[0], prev[1] - 512):prev[1]]
            out.append(span_key("user", text, region.start, region.end, before))
        prev = (region.start, region.end)
    sketch.turn_keys_memo = (len(sketch.regions), out)
    return list(out)


def last_turn_key(sketch: RequestSketch) -> str | None:
    """Key of the newest user turn: what a later request of the same conversation still contains."""
    keys = turn_keys(sketch)
    return keys[-1] if keys else None


def system_key(sketch: RequestSketch) -> str | None:
    return text_key("system", sketch.system_text) if sketch.system_text is not None else None


def past_of(sketches: Iterable[RequestSketch]) -> TenantPast:
    past = TenantPast()
    for sk in sketches:
        key = last_turn_key(sk)
        if key:
            past.last_turns.add(key)
        skey = system_key(sk)
        if skey:
            past.systems.add(skey)
    return past


def continues(cur: RequestSketch, past: TenantPast) -> bool:
    """Does `cur` carry on a conversation the tenant sent before (holds one's last user turn)?"""
    return bool(past.last_turns) and any(k in past.last_turns for k in turn_keys(cur))


# ---------------------------------------------------------------------- text helpers

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


def _similar(a: str | None, b: str | None) -> float:
    """Share of lines of `a` also in `b` (0..1); cheap similarity for edited vs replaced."""
    if not a or not b:
        return 0.0
    la = [ln for ln in a.splitlines() if ln.strip()]
    lb = {ln for ln in b.splitlines() if ln.strip()}
    if not la:
        return 0.0
    return sum(1 for ln in la if ln in lb) / len(la)


def _is_value_char(ch: str) -> bool:
    return ch.isalnum() or ch in VALUE_CHARS


_HEX = frozenset("0123456789abcdefABCDEF")


def _escape_at(text: str, i: int) -> bool:
    """Does a URL's percent escape (`%3A`) start at `i`, inside a token (a value character before it)?"""
    return (text[i] == "%" and i > 0 and _is_value_char(text[i - 1]) and i + 2 < len(text)
            and text[i + 1] in _HEX and text[i + 2] in _HEX)


def _token(text: str, at: int) -> tuple[int, int]:
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
    """The part of a URL token between the `/` before `at` and the next `/`, `?` or `#`."""
    seg_start = max(start, text.rfind("/", start, at) + 1)
    stops = [i for i in (text.find(c, at, end) for c in "/?#") if i >= 0]
    return seg_start, min(stops, default=end)


_SIGNATURE_VERSION = re.compile(r"(?<![\w,])v\d{1,2},$")
_B64_HALF_AFTER = re.compile(r":[A-Za-z0-9+/]{16,}={0,2}(?![\w+/=])")


# ---------------------------------------------------------------------- sketch geometry

def tail_start(sk: RequestSketch) -> int:
    """Where the part expected to vary begins: the last user turn (trailing system messages after it
    included); the sketch's own tail for prompts without one."""
    for region in reversed(sk.regions):
        if region.role == "user":
            return region.start
    return sk.tail_start


def reusable_end(sk: RequestSketch) -> int:
    """End of the reusable part of a previous prompt: system messages after its last turn are
    re-sent elsewhere by the next request of the conversation, so they end it."""
    if sk.kind != "chat" or not sk.regions:
        return len(sk.text)
    last = len(sk.regions) - 1
    while last >= 0 and sk.regions[last].role in ("system", "developer"):
        last -= 1
    if last < 0 or last == len(sk.regions) - 1:
        return len(sk.text)
    return sk.regions[last].end


def _tools_span(sketch: RequestSketch) -> tuple[int, int] | None:
    """Where the rendered tool definitions lie (templates render them with tojson)."""
    found = [(p, p + len(raw)) for p, raw in ((sketch.text.find(raw), raw) for raw in sketch.tools_raw) if p >= 0]
    if not found:
        return None
    return min(p for p, _ in found), max(e for _, e in found)


def _front_trimmed(prev: RequestSketch, cur: RequestSketch) -> bool:
    pm = [k for k in prev.message_keys if not k.startswith(("system:", "developer:"))]
    cm = [k for k in cur.message_keys if not k.startswith(("system:", "developer:"))]
    return trimmed(pm, cm, first_exchange([k.startswith("user:") for k in pm]))


def trimmed(pm: list[str], cm: list[str], first_exchange: int = 0) -> bool:
    """Do the history keys `cm` continue `pm` with its first turns dropped or summarised, after at
    most PINNED_MESSAGES messages that stay (a sliding window that keeps the task: the first user
    message, or the first exchange), or after the whole first exchange (`first_exchange` messages,
    when the caller knows the roles: an agent's first exchange holds its tool calls and results)?
    Not when only the first of the remaining messages differs and all the others follow in place:
    that message was edited (a value in it changed), nothing was dropped."""
    pins = list(range(min(PINNED_MESSAGES, len(pm), len(cm)) + 1))
    if PINNED_MESSAGES < first_exchange <= min(MAX_PINNED_EXCHANGE, len(pm), len(cm)):
        pins.append(first_exchange)
    for pinned in pins:
        if pm[:pinned] != cm[:pinned]:
            return False
        if _trimmed_front(pm[pinned:], cm[pinned:]):
            return True
    return False


def first_exchange(is_user: Sequence[bool]) -> int:
    """How many history messages the first exchange holds, given which history messages are the
    user's: up to the second user message; 0 when there is none within MAX_PINNED_EXCHANGE + 1
    messages."""
    users = [i for i, user in enumerate(is_user[:MAX_PINNED_EXCHANGE + 1]) if user]
    return users[1] if len(users) > 1 else 0


def _trimmed_front(pm: list[str], cm: list[str]) -> bool:
    if not pm or not cm or cm[0] == pm[0] or (len(cm) >= len(pm) and cm[1:len(pm)] == pm[1:]):
        return False
    for j in range(min(3, len(cm) - 1)):  # a summary (one turn, or a user/assistant pair) may replace the dropped ones
        for k in range(j if j >= 2 else j + 1, len(pm)):
            if cm[j] == pm[k] and (j + 1 >= len(cm) or k + 1 >= len(pm) or cm[j + 1] == pm[k + 1]
                                   or j + 1 == len(cm) - 1):
                return True
    return False


def _history(sk: RequestSketch) -> list[tuple[str, str, int]]:
    """(role, key, length) of each non-system message, in order."""
    return [(r.role, span_key(r.role, sk.text, r.start, r.end), r.end - r.start) for r in sk.history_regions()]


def compacted(prev: RequestSketch, cur: RequestSketch) -> bool:
    """Did the agent compact its context between `prev` and `cur` (module docstring)? The system
    prompt and tools unchanged, the previous history at least COMPACTED_MIN_MESSAGES long, the
    current one shrunk (`history_shrunk`), and a new message standing in for the rest
    (`summary_stands_in`)."""
    if prev.system_text != cur.system_text or prev.tools_canon != cur.tools_canon:
        return False
    pn = [r.end - r.start for r in prev.history_regions()]
    cn = [r.end - r.start for r in cur.history_regions()]
    return history_compacted((len(pn), sum(pn), len(cn), sum(cn)), lambda: (
        [(role == "user", k) for role, k, _ in _history(prev)], [(role == "user", k) for role, k, _ in _history(cur)]))


HistoryKeys = list[tuple[bool, str]]  # (a user message?, key) of each history message, in order


def history_compacted(sizes: tuple[int, int, int, int],
                      keys: Callable[[], tuple[HistoryKeys, HistoryKeys]]) -> bool:
    """The history test of a compaction, on either path (the text's and another pod's digest):
    `sizes` (messages and characters before, then now) shrunk as the summary's shape asks
    (`history_shrunk`), and a new message standing in for the rest (`summary_stands_in`). Lengths
    first: `keys` (the previous and the current history's, a hash of each message's ends) is
    called only for a pair that can be one."""
    if not history_shrunk(*sizes, users_kept=True):
        return False
    prev, cur = keys()
    shape = summary_stands_in(prev, {k for _, k in prev}, cur)
    return shape == USERS_KEPT or shape == SUMMARY_FIRST and history_shrunk(*sizes)


def history_shrunk(prev_messages: int, prev_chars: int, cur_messages: int, cur_chars: int,
                   users_kept: bool = False) -> bool:
    """A history long enough to compact, and the current one at most COMPACTED_SHARE of its text, or
    at most half of its messages in less text (a summary may be long next to short turns). With
    the earlier user messages kept before the summary (`users_kept`, Codex's shape, which no new
    conversation has), half of the messages is enough: the summary may outweigh short turns."""
    return prev_messages >= COMPACTED_MIN_MESSAGES and cur_messages > 0 and (
        cur_chars <= COMPACTED_SHARE * prev_chars
        or cur_messages * 2 <= prev_messages and (users_kept or cur_chars < prev_chars))


SUMMARY_FIRST = "summary first"  # Claude Code: the summary opens the history
USERS_KEPT = "users kept"  # Codex: the latest earlier user messages, then the summary


def summary_stands_in(prev: list[tuple[bool, str]], seen: set[str], cur: list[tuple[bool, str]]) -> str | None:
    """In which shape a new message stands in for the dropped turns, if one does. `prev` and `cur`
    are (a user message?, key) of the history messages in order (`prev` may be only its last ones:
    what is kept is at its end), `seen` every key of the previous history that is known. A new
    message before the newest user turn, a user message, with no new reply beside it
    (`SUMMARY_FIRST`), or as the newest message when what is kept is only the latest of the earlier
    user messages (`USERS_KEPT`)."""
    newest = max((i for i, (user, _) in enumerate(cur) if user), default=len(cur) - 1)
    added = [user for user, k in cur[:newest] if k not in seen]
    if added:  # only user messages are new (a conversation never seen before brings replies too)
        return SUMMARY_FIRST if all(added) else None
    kept = [k for _, k in cur[:newest]]
    earlier_users = [k for user, k in prev if user]
    if cur[newest][1] not in seen and kept and kept == earlier_users[len(earlier_users) - len(kept):]:
        return USERS_KEPT
    return None


# ---------------------------------------------------------------------- the tests

def _tool_change(prev: RequestSketch, cur: RequestSketch) -> tuple[bool, bool, str]:
    """(reordered, set changed, detail) for the tools of two requests. Reordered: the tools both
    send come in another relative order, or one of them with its keys in another order."""
    pc, cc = prev.tools_canon, cur.tools_canon
    common = Counter(pc) & Counter(cc)
    set_changed = Counter(pc) != Counter(cc)

    def kept(canon: list[str], raw: list[str]) -> list[tuple[str, str]]:
        left = Counter(common)
        out = []
        for c, r in zip(canon, raw, strict=True):
            if left[c] > 0:
                left[c] -= 1
                out.append((c, r))
        return out

    kp, kc = kept(pc, prev.tools_raw), kept(cc, cur.tools_raw)
    if [c for c, _ in kp] != [c for c, _ in kc]:
        return True, set_changed, "same tools, different order"
    if [r for _, r in kp] != [r for _, r in kc]:
        return True, set_changed, "same tools, different key order"
    return False, set_changed, "tools added, removed or edited"


def _lines_permuted(prev_text: str, cur_text: str) -> tuple[bool, bool]:
    """(permuted, tool-like): the lines that differ between two system prompts are the same lines
    in another order; tool-like when they read as tool entries (`- name(args): ...`, <tool ...>)."""
    p, c = prev_text.splitlines(), cur_text.splitlines()
    i = 0
    while i < min(len(p), len(c)) and p[i] == c[i]:
        i += 1
    s = 0
    while s < min(len(p), len(c)) - i and p[-1 - s] == c[-1 - s]:
        s += 1
    pw, cw = p[i:len(p) - s], c[i:len(c) - s]
    if len(pw) < 2 or pw == cw:
        return False, False
    if sorted(pw) == sorted(cw):
        return True, tool_entries(cw) or tool_blocks(p, c)
    # entries numbered by position (`1. name …`, `(1) name …`): the numbers stay, the entries move
    pu, cu = [_ENUMERATOR.sub("", ln, count=1) for ln in pw], [_ENUMERATOR.sub("", ln, count=1) for ln in cw]
    if pu != cu and sorted(pu) == sorted(cu) and sum(map(bool, map(_ENUMERATOR.match, cw))) >= 2:
        return True, tool_entries(cw)
    # blocks numbered by position inside their banner (`BEGIN FUNCTION #3: name`): the numbers stay
    pn, cn = [_POSITION_NUMBER.sub("#", ln) for ln in pw], [_POSITION_NUMBER.sub("#", ln) for ln in cw]
    if pn != cn and sorted(pn) == sorted(cn) and any(_BANNER_NAME.match(ln) for ln in cn):
        return True, tool_blocks(pn, cn)
    return False, False


def tool_entries(lines: list[str]) -> bool:
    """Do these reordered lines of a system text read as a list of tool entries? Each entry names
    its tool on a line of its own (`TOOL_LINE`, `NAMED_LINE`): at least half of the lines do, or,
    for entries of several lines (a tag block, a heading and its text), at least two do, all in
    one shape (same indentation and opening markup), and no other shape occurs more often than
    once per entry (plus one for a block cut at the window's edge). Prose rules reordered name
    nothing and stay a `template_change`."""
    named: list[str] = []
    rest: list[str] = []
    for ln in lines:
        (named if TOOL_LINE.match(ln) or NAMED_LINE.match(ln) or TOOL_NAME_LINE.match(ln) else rest).append(ln)
    if len(named) * 2 >= len(lines):
        return True
    if len(named) < 2 or len({_shape(ln) for ln in named}) != 1:
        return False
    # blocks whose every entry is named as a tool is (markup, a name key, a name written as code)
    # may hold a few lines of one shape each (arguments, description); others one at most
    strong = all(NAMED_LINE.match(ln) or TOOL_NAME_LINE.match(ln) or _CODE_NAME.match(ln) or _DECLARATION.match(ln)
                 for ln in named)
    per_entry = ENTRY_LINES if strong else 1
    return max(Counter(map(_shape, rest)).values(), default=0) <= per_entry * len(named) + 1


def tool_blocks(prev: list[str], cur: list[str]) -> bool:
    """Did lines that declare names move, in two texts that hold the same lines? What each tool's
    block declares (its name in a tag, `class X < RubyLLM::Tool`, `struct XTool: Tool {` with its
    `let name = "x"`) moves with the block, whatever separates the blocks. Rules moved as
    paragraphs declare nothing and stay a `template_change`."""
    dp, dc = [ln for ln in prev if declares_name(ln)], [ln for ln in cur if declares_name(ln)]
    return dp != dc and sorted(dp) == sorted(dc)


# a member of a TypeScript type whose type is a function (Cloudflare Code Mode's `declare const
# codemode: { name: (input: {...}) => Promise<unknown>; }`): a tool declared by its name
_FUNCTION_MEMBER = re.compile(r"^\s*(?:readonly\s+)?[A-Za-z_$][\w$]*\??\s*:\s*\(\s*(?:[A-Za-z_$][\w$]*\??\s*:|\))")


def declares_name(line: str) -> bool:
    """Does a line name a tool as code or markup does (a tag holding the name, a name key, a
    declaration of a function or a type, `let name = "x"`, a call given the name first)?"""
    return bool(NAMED_LINE.match(line) or TOOL_NAME_LINE.match(line) or _DECLARATION.match(line)
                or _TYPE_DECLARATION.match(line) or _NAME_ASSIGNED.match(line) or _CALL_NAMED.match(line)
                or _LONE_NAME.match(line) or _BANNER_NAME.match(line) or _FUNCTION_MEMBER.match(line))


def _shape(line: str) -> str:
    """A line's indentation and opening markup (`  <id`, `* **`, `###`): what entries share."""
    m = _SHAPE.match(line)
    return m.group(0) if m else ""


def schema_tools(text: str, start: int = 0, end: int | None = None,
                 python_literals: bool = False) -> list[tuple[str, str, int, int]]:
    """The JSON tool schemas written into `text[start:end]` (a client that serialises its tools into
    the system prompt or a message rather than `tools`), in order, each as (canonical JSON, JSON as
    written, where the object it is in starts and ends): an object with a `name` and a parameter schema, OpenAI's `{"type": "function",
    "function": {...}}` wrapper and a `{"tools": [...]}` list included. One decode per object
    start that is not inside a decoded object; nothing past SCHEMA_SCAN_CHARS. `python_literals`:
    without JSON ones, schemas printed as a Python literal (`_python_tools`; the diagnosis of a
    break reads them, not every request's digest)."""
    end = min(len(text) if end is None else end, start + SCHEMA_SCAN_CHARS)
    out: list[tuple[str, str, int, int]] = []
    decoder = json.JSONDecoder()
    pos = start
    while (m := _OBJECT_START.search(text, pos, end)) is not None:
        try:
            obj, stop = decoder.raw_decode(text, m.start())
        except ValueError:
            pos = m.start() + 1
            continue
        if stop > end:
            break
        items = _tool_list(obj)
        listed = items is not None  # under a key that lists tools: a name and a description are one
        items = items if items is not None else [obj]
        raw = text[m.start():stop]
        for item in items:
            fn = next((item[k] for k in _TOOL_WRAPPERS if isinstance(item, dict) and isinstance(item.get(k), dict)),
                      item)  # OpenAI's wrapper, Bedrock Converse's `toolSpec`, Ultravox's `temporaryTool`
            if isinstance(fn, dict) and isinstance(fn.get("name", fn.get("modelToolName")), str) and (
                    _declares_parameters(fn) or listed and isinstance(fn.get("description"), str)):
                written = raw if len(items) == 1 else json.dumps(item, ensure_ascii=False)
                out.append((json.dumps(item, sort_keys=True, ensure_ascii=False), written, m.start(), stop))
        pos = stop
    return out or (_python_tools(text, start, end) if python_literals else [])


_PYTHON_LITERAL_START = re.compile(r"\{\s*'")  # a dict's first key; a list before it is taken in


def _python_tools(text: str, start: int, end: int) -> list[tuple[str, str, int, int]]:
    """Tool schemas written as a Python literal that ends its line (ToolLLaMA's `APIs: [{'name':
    ...}, ...]`: a list of dicts printed with `repr`), as `schema_tools` gives them; parsed by
    `ast.literal_eval` (C), at most one literal per line."""
    out: list[tuple[str, str, int, int]] = []
    pos = start
    while (m := _PYTHON_LITERAL_START.search(text, pos, end)) is not None:
        first = m.start() - 1 if m.start() > start and text[m.start() - 1] == "[" else m.start()
        line_end = text.find("\n", first, end)
        line_end = end if line_end < 0 else line_end
        stop = max(text.rfind("]", first, line_end), text.rfind("}", first, line_end)) + 1
        pos = line_end + 1
        if stop <= first:
            continue
        try:
            obj = ast.literal_eval(text[first:stop])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        for item in obj if isinstance(obj, list) else (_tool_list(obj) or [obj]):
            if isinstance(item, dict) and isinstance(item.get("name"), str) and _declares_parameters(item):
                out.append((json.dumps(item, sort_keys=True, ensure_ascii=False, default=str),
                            json.dumps(item, ensure_ascii=False, default=str), first, stop))
    return out


_TOOL_WRAPPERS = ("function", "toolSpec", "temporaryTool")


def _declares_parameters(fn: dict[str, Any]) -> bool:
    """Does a named object declare a tool's parameters: a schema under a key tools use
    (`SCHEMA_KEYS`; Ultravox's `dynamicParameters`), or OpenRPC's `params`, content descriptors
    each with a name and a schema?"""
    if SCHEMA_KEYS & fn.keys() or isinstance(fn.get("dynamicParameters"), list):
        return True
    params = fn.get("params")
    return isinstance(params, list) and (bool(params) or "result" in fn) and all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and "schema" in p for p in params)


def _tool_list(obj: Any) -> list[Any] | None:
    """The tools a decoded object lists: `{"tools": [...]}` (an MCPB manifest's too), MCP's
    `tools/list` result (`{"result": {"tools": [...]}}`), Gemini's `function_declarations`, an
    OpenRPC document's `methods`; None when it lists none (it may be one tool itself)."""
    for holder in (obj, obj.get("result") if isinstance(obj, dict) else None):
        if isinstance(holder, dict):
            for key in ("tools", "function_declarations", "functionDeclarations", "methods"):
                if isinstance(holder.get(key), list):
                    return holder[key]
    return None


def _schemas_reordered(prev: RequestSketch, cur: RequestSketch, pd: int, region: Region) -> bool:
    """Do the messages where the prompts diverge (same role) carry the same JSON tool schemas in
    another order, or one of them with its keys in another order? (A reorder keeps the message's
    length: other messages are not scanned.)"""
    other = prev.region_at(pd)
    if other is None or other.role != region.role or other.end - other.start != region.end - region.start:
        return False
    ps = schema_tools(prev.text, other.start, other.end, python_literals=True)
    cs = schema_tools(cur.text, region.start, region.end, python_literals=True)
    return schemas_reordered([(c, w) for c, w, _, _ in ps], [(c, w) for c, w, _, _ in cs])


def schemas_reordered(prev: Sequence[Sequence[str]], cur: Sequence[Sequence[str]]) -> bool:
    """Two lists of JSON tool schemas as (canonical, as written) pairs, texts or keys of them: the
    same schemas (at least two) in another order, or one of them with its keys in another order."""
    return len(cur) >= 2 and sorted(c for c, _ in prev) == sorted(c for c, _ in cur) and \
        [tuple(x) for x in prev] != [tuple(x) for x in cur]


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
                  edits: set[str] | frozenset[str] = frozenset()) -> ValueChange | None:
    """The per-request value that differs at (pd, cd), as a span of `cur` (the value only, not its
    key or line), and where it ends in `prev` (`ValueChange`, its span None when one token changed
    that no rule judged); None when more than one token differs. `stop`: where the message holding
    `cd` ends (its line ends there, not in the template text after it). `earlier_turn`: `cd` is in
    a user turn before the last (`turn_value` judges a token there). `edits`: the places
    (`ValueChange.edit_at`) where a token changed in the tenant's recent requests: a value-like
    token that changes there again is a per-request value (an edit is made once)."""
    cs, ce = _token(cur, cd)
    ps, pe = _token(prev, pd)
    line0 = cur.rfind("\n", 0, cs) + 1
    line1 = cur.find("\n", cd)
    line1 = len(cur) if line1 < 0 else line1
    pline0 = prev.rfind("\n", 0, ps) + 1
    pline1 = prev.find("\n", pd)
    pline1 = len(prev) if pline1 < 0 else pline1
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
        elif kind == "time" and _ON_THE_HOUR.fullmatch(pspan.text) and _ON_THE_HOUR.fullmatch(span.text) \
                and not NOW_CUE.search(cur, line0, span.start):
            kind = None  # `held until 10:00` -> `11:00`: an hour of a rule edited; a clock read twice on the hour is rare
        if kind is not None:
            start, end, pend = span.start, span.end, pspan.end
            trim = end - sentence_end(cur, start, end)
            end, pend = end - trim, pend - trim
            if kind == "elapsed":  # the duration, not the words before it
                start, end = elapsed_value(cur, span)
                pend = elapsed_value(prev, pspan)[1]
            elif kind in KEYED_KINDS:  # the value, not the words of its key
                start = max(start, cs)
                dur, pdur = duration_around(cur, span.start, span.end, cd), duration_around(prev, pspan.start, pspan.end, pd)
                if kind == "counter" and dur is not None and pdur is not None:  # a duration, whole (`5 min 09 s`)
                    (start, end), pend = dur, pdur[1]
                elif kind == "counter":  # the number, with its decimal or thousands groups (`48,213`)
                    start = number_start(cur, start, span.start)
                    end, pend = number_end(cur, max(ce, cd + 1)), number_end(prev, max(pe, pd + 1))
            if common_prefix_len(prev, cur, pend, end) >= min(4, len(cur) - end, len(prev) - pend):
                return ValueChange(Span(start, end, kind, cur[start:end]), pend)
    (cs, ce), (ps, pe) = value_token(cur, cs, ce, cd), value_token(prev, ps, pe, pd)
    if ce <= cs or pe <= ps:
        return None
    quoted, pquoted = quoted_words(cur, cs, ce), quoted_words(prev, ps, pe)
    if quoted is not None and pquoted is not None and (quoted != (cs, ce) or pquoted != (ps, pe)):
        (cs, ce), (ps, pe) = quoted, pquoted  # `mode="STAT only"` -> `"routine"`: the quoted words
    if common_prefix_len(prev, cur, pe, ce) < min(4, len(cur) - ce, len(prev) - pe):
        # more than one token changed: an edit, not a value, unless a key line's whole value changed
        # in a shape values have (`whole_value_change`)
        return _whole_value(prev, cur, pline0, pline1, line0, line1, cs, stop)
    rest_end = min(line1 if stop is None else min(line1, stop), ce + VALUE_WINDOW)
    before = cur[max(line0, cs - VALUE_WINDOW):cs]
    whole = _whole_value(prev, cur, pline0, pline1, line0, line1, cs, stop)
    if whole is not None and whole.span is not None and whole.span.kind == "counter":
        return whole  # a list of readings, whole, though one of them changed (`2427, 109343.643` -> `2427, 110167.307`)
    kind = value_kind(before, prev[ps:pe], cur[cs:ce], cur[ce:rest_end])
    if kind is None and earlier_turn:
        kind = turn_value(prev[ps:pe], cur[cs:ce], before, cur[ce:rest_end])
    if kind is None and whole is not None:
        return whole  # a key line's whole value that changed as values do (`whole_value_change`)
    key = None
    if kind is None:
        key = span_key("edit", before, 0, len(before))
        old, new = prev[ps:pe], cur[cs:ce]
        if key not in edits or not ((reads_as_value(old, new) and any(c.isdigit() for c in old + new))
                                     or (old.isalpha() and new.isalpha())):
            return ValueChange(None, pe, key)
        kind = "value"  # changed here again: a value the client writes per request
    cs = value_start(kind, cur, cs, ce, line0)
    return ValueChange(Span(cs, ce, kind, cur[cs:ce]), pe, key)


def _whole_value(prev: str, cur: str, pline0: int, pline1: int, line0: int, line1: int, cs: int,
                 stop: int | None) -> ValueChange | None:
    """The whole value of a `key: value` line in which more than one token changed, when it changed
    as values do (`whole_value_change`: `in Betrieb` -> `aus`, `19.97, 19.09, 18.9` -> `20.0, …`,
    `DE 09 524 46487` -> `DE 09 200 33728`), from the value's start to the line's or its message's
    end (`stop`; the template text after a message is no part of it); None otherwise."""
    at = whole_value_start(cur[line0:cs])
    vend = line1 if stop is None else min(line1, stop)
    tail = cur[vend:line1]  # the same template text ends the line in both prompts
    if at is None or not prev.endswith(tail, 0, pline1):
        return None
    start, ve, pve = line0 + at, _before_space(cur, line0, vend), _before_space(prev, pline0, pline1 - len(tail))
    if start >= ve or pline0 + at >= pve or common_prefix_len(prev, cur, pline1, line1) < min(4, len(cur) - line1, len(prev) - pline1):
        return None
    kind = whole_value_change(prev[pline0 + at:pve], cur[start:ve])
    return ValueChange(Span(start, ve, kind, cur[start:ve]), pve) if kind is not None else None


def _before_space(text: str, floor: int, end: int) -> int:
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


_GLUED_KEY = re.compile(r"(?:[A-Za-z](?:[\w.-]*[A-Za-z_-])?[:=])+(?=[^\s=:/])")  # not base64's padding, not `://`


def after_glued_key(text: str, start: int, at: int) -> int:
    """Where a token's value starts when a key is glued to it before `at` (the divergence, or
    the token's end: iCalendar's `X-SMH-EINSATZSTUFE:Volleinsatz`, `mode=on`): after the key's sign."""
    m = _GLUED_KEY.match(text, start, min(len(text), at + 1))
    return m.end() if m is not None and m.end() <= at else start


_ON_THE_HOUR = re.compile(r"(?:[01]?\d|2[0-3])[:h.]00(?:[:.]00)?(?:\s?[AaPp]\.?[Mm]\.?)?")
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
    return (open_at + 1, close) if _WORDS.fullmatch(inner) else None


_WORDS = re.compile(r"[^\W\d_]+(?: [^\W\d_]+){0,2}")


@dataclass
class _Pair:
    prev: RequestSketch
    cur: RequestSketch
    material: int
    detector: DynamicDetector
    past: TenantPast

    def loses(self, pd: int, cd: int) -> tuple[bool, Realignment | None]:
        """Is the divergence at (pd, cd) a break: reusable content lost or pushed back?"""
        end = reusable_end(self.prev)
        # in the last turn (where a re-alignment is what makes the divergence a break: a question
        # put before a document) what re-aligns starts within the anchors' reach in both prompts:
        # another document is then ruled out by 64 KB scans of the previous prompt, not 1 MB ones
        prev_end = pd + LINE_WINDOW + NEAR_WINDOW + self.material if cd >= tail_start(self.cur) else None
        realign = find_realignment(self.prev.text, self.cur.text, cd, self.material, pd, prev_end)
        if realign is not None and realign.prev_offset >= end:
            realign = None  # what re-aligns was not reusable in the previous prompt (a trailing system message)
        limit = min(tail_start(self.cur) - cd, end - pd)
        return limit >= self.material or realign is not None, realign

    def classify(self, pd: int, cd: int, realign: Realignment | None, primary: bool) -> Diagnosis:
        prev, cur = self.prev, self.cur
        if primary and compacted(prev, cur):
            return Diagnosis("compaction", cd, [], realign, "the history was replaced by a summary")
        first_history = cur.first_history_start()
        system_same = prev.system_text == cur.system_text
        if (system_same or not primary) and cd >= min(first_history, prev.first_history_start()) - 64 \
                and _front_trimmed(prev, cur):  # (a secondary one follows a changed value in the system part)
            return Diagnosis("front_trim", cd, [], realign, "history was cut or summarised at the front")
        tools_at = _tools_span(cur)
        prev_tools_at = _tools_span(prev)
        reordered, set_changed, tool_detail = _tool_change(prev, cur) if (prev.tools_raw or cur.tools_raw) \
            else (False, False, "")
        in_tools = (tools_at is not None and tools_at[0] - 32 <= cd <= tools_at[1]) or \
            (prev_tools_at is not None and prev_tools_at[0] - 32 <= pd <= prev_tools_at[1])
        if in_tools and reordered:
            extra = [Finding("template_change", cd, [], "tools added or removed")] if set_changed else []
            return Diagnosis("tool_order", cd, [], realign, tool_detail, extra)
        region = cur.region_at(cd)
        in_system = region is not None and region.role in ("system", "developer")
        permuted = False
        if in_system and prev.system_text is not None and cur.system_text is not None:
            permuted, tool_like = _lines_permuted(prev.system_text, cur.system_text)
            if permuted and tool_like:  # before values: swapped entries differ in a name that may look like one
                return Diagnosis("tool_order", cd, [], realign, "tools listed in the system text, other order")
        if region is not None and _schemas_reordered(prev, cur, pd, region):
            return Diagnosis("tool_order", cd, [], realign, "tool schemas written in the prompt text, other order")
        if permuted:
            return Diagnosis("template_change", cd, [], realign, "system prompt lines reordered")
        # a user turn or a tool result before the last turn (a client that refreshes a prefetched tool
        # result, its call fixed, before every model call)
        earlier_turn = region is not None and region.role in ("user", "tool") and first_history <= cd < tail_start(cur)
        value = changed_value(self.detector, prev.text, cur.text, pd, cd, region.end if region is not None else None,
                              earlier_turn, self.past.edits)
        edit_at = value.edit_at if value is not None else None
        if value is not None and value.span is not None:
            # realigned right after the value: later findings are searched from there (also inside a
            # tool's description: a date put there per request)
            span, pend = value.span, value.prev_end
            after = Realignment(pend, span.end, common_prefix_len(prev.text, cur.text, pend, span.end))
            return Diagnosis("dynamic_head", span.start, [span], after,
                             "a per-request value precedes static content", edit_at=edit_at)
        if in_tools and set_changed:
            return Diagnosis("template_change", cd, [], realign, tool_detail)
        if reordered and tools_at is None:
            return Diagnosis("tool_order", cd, [], realign, tool_detail)
        last_turn = region is not None and region.role == "user" and region.start <= tail_start(cur) <= cd
        if last_turn and realign is not None and realign.cur_offset < region.end:  # type: ignore[union-attr]
            return Diagnosis("question_first", cd, [], realign, "variable text precedes static text in the last turn")
        if primary and cur.kind == "chat":
            new = self.new_conversation(cd, realign)
            if new is not None:
                return new
        if cur.kind != "chat" or in_system or cd < first_history or set_changed:
            return Diagnosis("template_change", cd, [], realign, "system prompt or template edited", edit_at=edit_at)
        if last_turn:
            return Diagnosis("question_first", cd, [], realign, "variable text precedes static text in the last turn")
        return Diagnosis("history_edit", cd, [], realign, "an earlier turn was re-sent with other text",
                         edit_at=edit_at)

    def new_conversation(self, cd: int, realign: Realignment | None) -> Diagnosis | None:
        """`new_session` when the current request starts a conversation (see the module docstring):
        another agent's system prompt, or a head shared with earlier requests followed by turns
        that continue none of the tenant's conversations."""
        prev, cur = self.prev, self.cur
        first_history = cur.first_history_start()
        if cd < first_history - 64 and cd < tail_start(cur):
            if realign is not None and realign.common >= self.material * 4:
                return None
            skey = system_key(cur)
            known_agent = skey is not None and skey in self.past.systems and cur.system_text != prev.system_text
            first_prev = prev.system_text if prev.system_text is not None else prev.text[:4096]
            first_cur = cur.system_text if cur.system_text is not None else cur.text[:4096]
            other = _similar(first_cur, first_prev) < 0.5 and common_prefix_len(first_cur or "", first_prev or "") < 64
            if (known_agent or other) and not (cur.system_text == prev.system_text and continues(cur, self.past)):
                return Diagnosis("new_session", cd, [], realign, "another agent's prompt: a new conversation")
            return None
        if continues(cur, self.past):
            return None
        return Diagnosis("new_session", cd, [], realign, "a new conversation over the shared head")


def diagnose(prev: RequestSketch, cur: RequestSketch, material: int = 96,
             extra_patterns: tuple[str, ...] = (), past: TenantPast | None = None,
             own_conversation: bool = True) -> Diagnosis:
    """Compare the current prompt with a previous one: is it a break, why, and what else differs.
    `past`: the tenant's earlier conversations (default: only `prev`'s). `own_conversation`
    False: `prev` is another conversation of the tenant (the current one's last request is not
    held), so only a divergence in the head is diagnosed: what follows it is another history."""
    if past is None:
        past = past_of([prev])
    pair = _Pair(prev, cur, material, get_detector(tuple(extra_patterns)), past)
    a, b = prev.text, cur.text
    d = common_prefix_len(a, b)
    if d >= len(b) or d >= len(a):
        return Diagnosis(None, d, detail="continues the previous prompt")
    if not own_conversation and d >= min(cur.first_history_start(), prev.first_history_start()) - 64:
        return Diagnosis(None, d, detail="the conversation's previous request is not held: head unchanged")
    lost, realign = pair.loses(d, d)
    if not lost and (prev.tools_raw or cur.tools_raw):
        at = _tools_span(cur)  # an unstable tool order costs more when it is earlier: always say so
        if at is not None and at[0] - 32 <= d <= at[1] and _tool_change(prev, cur)[0]:
            lost = True
    if not lost:
        if cur.kind == "chat" and compacted(prev, cur):  # a short compacted history loses little, and is one
            return Diagnosis("compaction", d, [], None, "the history was replaced by a summary")
        if cur.kind == "chat" and cur.regions and not continues(cur, past):
            return Diagnosis("new_session", d, [], None, "a new conversation over the shared head")
        return Diagnosis(None, d, detail="diverges in the part expected to vary")
    diag = pair.classify(d, d, realign, primary=True)
    if diag.cause not in NOT_A_PROBLEM:  # what follows a new start is not a finding of its own
        diag.secondary = _secondary(pair, diag)
    return diag


def _secondary(pair: _Pair, diag: Diagnosis) -> list[Finding]:
    """The next divergences after each re-alignment, diagnosed the same way (prompt order)."""
    out: list[Finding] = list(diag.secondary)
    seen = {diag.cause, *(f.cause for f in out)}
    a, b = pair.prev.text, pair.cur.text
    realign = diag.realigned
    head = pair.cur.first_history_start()
    for _ in range(16):
        if realign is None or len(out) >= MAX_SECONDARY:
            break
        pd = realign.prev_offset + common_prefix_len(a, b, realign.prev_offset, realign.cur_offset)
        cd = realign.cur_offset + (pd - realign.prev_offset)
        if cd >= len(b) or pd >= len(a):
            break
        lost, nxt = pair.loses(pd, cd)
        if not lost:
            break
        found = pair.classify(pd, cd, nxt, primary=False)
        cause = found.cause or ""
        if diag.cause == "tool_order" and cause == "template_change" and cd < head:
            cause = ""  # the rest of the reordered entries, not an edit of its own
        if cause and (cause == "dynamic_head" or cause not in seen):
            out.append(Finding(cause, found.char_offset, found.spans, found.detail))
            seen.add(cause)
        realign = found.realigned
    return out


# ---------------------------------------------------------------------- presentation

def fix_for(diag: Diagnosis, text: str | None = None, show_text: bool = True) -> str | None:
    """The advice for a diagnosis; quotes the prompt only when `show_text`."""
    if diag.cause is None:
        return None
    if diag.cause == "dynamic_head":
        span = diag.spans[0] if diag.spans else None
        if span is not None and span.kind == "billing_header":
            return "drop Claude Code's x-anthropic-billing-header block (the `rewrite` policy does)"
        label = f"the {span.kind} value" if span else "the dynamic value"
        if show_text and span is not None and text is not None:
            line_start = text.rfind("\n", 0, span.start) + 1
            key = text[line_start:span.start].strip()
            label = f"`{key} …`" if key else f"`{span.text}`"
        return f"move {label} below the static content (e.g. into the last user message)"
    return {
        "tool_order": "send tools in a stable order (sort by name) with a fixed JSON key order",
        "front_trim": "keep the head of the history stable: trim or summarise in large, rare steps",
        "template_change": "the system prompt, tools or chat template changed; if this repeats, pin it",
        "history_edit": "re-send earlier turns byte-identical (the assistant text and tool results as received)",
        "question_first": "put the variable question after the static documents in the last turn",
        "new_session": "a new conversation: only the shared head can be reused (expected, nothing to fix)",
        "compaction": "expected: one cold turn (the history was compacted into a summary; later turns "
                      "continue the new prefix)",
    }.get(diag.cause, "keep everything before the last turn byte-identical between requests")


def redact(text: str, spans: list[Span] | None = None) -> str:
    """Shape without content: dynamic values become <kind>, letters x, digits 9."""
    out: list[str] = []
    cursor = 0
    for span in spans or []:
        if span.start < cursor:
            continue
        out.append(_mask(text[cursor:span.start]))
        out.append(f"<{span.kind}>")
        cursor = span.end
    out.append(_mask(text[cursor:]))
    return "".join(out)


# ASCII's digits and letters are exactly its characters for which str.isdigit / str.isalpha hold
_ASCII_MASK = str.maketrans({**{c: "9" for c in "0123456789"},
                             **{c: "x" for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}})


def _mask(s: str) -> str:
    """Digits become 9, letters x, the rest stays (Unicode's definitions). An ASCII text, the
    common case, is mapped at C speed (a step per character in Python was ~0.1 ms a diagnosis)."""
    if s.isascii():
        return s.translate(_ASCII_MASK)
    return "".join("9" if ch.isdigit() else "x" if ch.isalpha() else ch for ch in s)


def snippet(text: str, offset: int, spans: list[Span] | None = None, show_text: bool = False,
            before: int = 40, after: int = 80) -> str:
    """The prompt around the divergence; redacted unless `show_text`."""
    lo = max(0, offset - before)
    hi = min(len(text), offset + after)
    part = text[lo:hi]
    if show_text:
        return part
    local = [Span(s.start - lo, s.end - lo, s.kind, s.text) for s in spans or [] if lo <= s.start and s.end <= hi]
    return redact(part, local)


__all__ = ["CAUSES", "Diagnosis", "compacted", "Finding", "Realignment", "Region", "TenantPast", "diagnose", "fix_for",
           "past_of", "redact", "snippet", "span_key", "text_key", "turn_keys"]
