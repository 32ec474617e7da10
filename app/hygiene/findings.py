"""Hygiene findings: what in one request body will defeat the engine's prefix cache.

The scan runs before forwarding, so its work is bounded whatever the prompt size: only the head
(the first `HEAD_SCAN_CHARS` characters) of each system/developer message is read, line by line,
plus its last `TAIL_SCAN_CHARS` when earlier turns follow it (a "Current date: …" closing a long
system prompt breaks the whole history), and only lines are handed to the dynamic-value detector (app/prefix/dynamic.py, the one the
diagnosis uses). Static lines repeat on every request, so `LineClassifier` memoises the verdict
per line text: a steady-state request pays the detector (~2.5 µs/char) only for its new lines,
typically the one holding the timestamp.

Kinds (the values of the `kind` label of `prefixgate_hygiene_findings_total`):
- `dynamic_head`: a line of a system/developer message holds a per-request value and at least
  `MIN_STATIC_AFTER` characters of reusable content follow it (the rest of the system prompt,
  later system messages, the tools when they are rendered after the first system message, and
  every turn before the last user message). Per-request means a volatile kind (timestamp, clock
  time, uuid, ulid, id, epoch, counter, long hex, email, user name, custom patterns), or a date
  with a "today / current / date:" cue on its line (the same rule as `prefixgate lint`): a fixed
  date ("refund policy of 2024-01-15") is not per-request and stays where it is. A value at the
  end of the prompt (nothing reusable after it) is not a finding.
- `tool_order`: the tenant sent the same tools (same canonical JSON) earlier in another order or
  key order (`ToolOrderMemo`, the only stateful part); with `hygiene.flag_unsorted_tools` also
  whenever tools are not sorted by name or their keys are not sorted. Decision: a stable but
  unsorted order costs nothing (the engine sees the same bytes every time), so by default only an
  order that actually varies is a finding; the rewrite (`sort_tools`) still normalises any order.

- `dynamic_head` with value kind `billing_header` (detail): Claude Code's
  `x-anthropic-billing-header: cc_version=…; cc_entrypoint=cli; cch=<5 hex>;` opening the system
  prompt (the first `system` block on /v1/messages, the first line of the first system message
  on /v1/chat/completions). Its `cch` changes on every request, so on an engine that keeps it
  (SGLang, older vLLM) nothing after it is ever reused; vLLM 0.32 drops it itself, but the
  finding stands: the client sends it either way (docs/agents-apis.md).
- `inline_system` (/v1/messages): an inline system message (`role: "system"` inside `messages`)
  that the engine merges into the leading system prompt, because the chat template requires
  system-first ordering (vLLM 0.32 probes it; app/prefix/convert_messages.py mirrors it), with at
  least `MIN_STATIC_AFTER` reusable characters after that head (the tools, which such templates
  render after the system text, and the conversation before the last user message). Each new or
  changed one changes the prompt's head, so everything after it is prefilled again; in place (a
  template that accepts it) it would change only the tail. No rewrite fixes it.

On /v1/messages every kind is found on the chat messages and tools the engine renders from the
body (`convert_messages.chat_view`), named by where they came from in the client's body
(`system line 3`, `messages[4]`): the same scan as chat, over what the engine really sees.

Findings never carry prompt text: where (message index, line number) and which kinds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.prefix.convert_messages import BILLING_PREFIX, is_billing_block
from app.prefix.dynamic import NOW_CUE, VOLATILE_KINDS, get_detector

HEAD_SCAN_CHARS = 2048  # characters of each system/developer message read line by line
TAIL_SCAN_CHARS = 512  # and the last lines, when reusable turns follow the message
MAX_LINE_CHARS = 512  # a longer "line" is a paragraph: its head is checked, it never moves
MIN_STATIC_AFTER = 96  # reusable chars that must follow a value (diagnosis' default `material`)
LINE_MEMO_ENTRIES = 8192  # memoised line verdicts (keys are <= MAX_LINE_CHARS chars: <= ~4 MB)
TOOL_MEMO_ENTRIES = 10_000  # (tenant, tool set) -> last order seen
ALWAYS_VOLATILE = VOLATILE_KINDS | {"email", "user", "custom"}
SCANNED_ROLES = ("system", "developer")

DYNAMIC_HEAD = "dynamic_head"
BILLING_HEADER = "billing_header"  # the value kind (Finding.detail) of Claude Code's billing header
TOOL_ORDER = "tool_order"
INLINE_SYSTEM = "inline_system"


@dataclass(frozen=True)
class DynamicLine:
    """A line of a system/developer message holding per-request values.

    `start`/`end` are offsets of the line (newline excluded) in the message's text: the string
    content, or the text of content part `part` when the content is a list of parts."""

    message: int
    part: int | None
    line_no: int  # 1-based
    start: int
    end: int
    kinds: tuple[str, ...]
    movable: bool  # False: a paragraph longer than MAX_LINE_CHARS (moving it would move static text)
    static_after: int  # reusable characters after the line


@dataclass(frozen=True)
class Finding:
    kind: str  # DYNAMIC_HEAD | TOOL_ORDER | INLINE_SYSTEM
    where: str  # "messages[0] line 1" | "messages[0] line -1" (the last line) | "tools" | "system line 2"
    detail: str  # value kinds ("timestamp") or "order" / "key order" / "unsorted"
    line: DynamicLine | None = None

    def label(self) -> str:
        """Compact, text-free form for the x-prefixgate-hygiene header."""
        return f"{self.kind}({self.where}: {self.detail})"


class LineClassifier:
    """Which per-request value kinds a line holds; memoised per line text (bounded LRU)."""

    def __init__(self, extra_patterns: Sequence[str] = (), memo_entries: int = LINE_MEMO_ENTRIES) -> None:
        self._detector = get_detector(tuple(extra_patterns))
        self._memo: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._cap = memo_entries
        self.misses = 0  # lines handed to the detector (tests, bench)

    def kinds(self, line: str) -> tuple[str, ...]:
        found = self._memo.get(line)
        if found is not None:
            self._memo.move_to_end(line)
            return found
        self.misses += 1
        kinds: list[str] = []
        for span in self._detector.find(line):
            if span.kind in ALWAYS_VOLATILE or NOW_CUE.search(line, 0, span.start):
                if span.kind not in kinds:
                    kinds.append(span.kind)
        verdict = tuple(kinds)
        self._memo[line] = verdict
        if len(self._memo) > self._cap:
            self._memo.popitem(last=False)
        return verdict


def message_text(message: Any) -> tuple[str, int | None] | None:
    """The text whose head is scanned: string content, or the first text part of a list."""
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content, None
    if isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                return part["text"], i
    return None


def content_chars(message: Any) -> int:
    """Characters of text a message contributes to the prompt (O(parts), never O(text))."""
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content
                   if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def last_user_index(messages: Sequence[Any]) -> int:
    """Index of the last user message (the part expected to vary), len(messages) if none."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "user":
            return i
    return len(messages)


Line = tuple[int, int, int, tuple[str, ...], bool]  # (line_no, start, end, kinds, movable)


def scan_text(text: str, classifier: LineClassifier, limit: int = HEAD_SCAN_CHARS, tail: int = 0) -> list[Line]:
    """The dynamic lines of the head of `text` (line numbers from 1) and, with `tail`, of its
    last `tail` characters (line numbers from -1, the last line, backwards)."""
    out: list[Line] = []
    pos, line_no, size = 0, 0, len(text)
    stop = min(size, limit)
    while pos < stop:
        line_no += 1
        nl = text.find("\n", pos, pos + MAX_LINE_CHARS + 1)
        if nl >= 0:
            end, movable = nl, True
        elif size - pos <= MAX_LINE_CHARS:
            end, movable = size, True
        else:  # a long paragraph: its head is checked, and it ends the scan
            end, movable = pos + MAX_LINE_CHARS, False
        _classify(text, pos, end, line_no, movable, classifier, out)
        if not movable:
            break
        pos = end + 1
    if tail and pos < size:
        out.extend(_scan_tail(text, classifier, pos, min(tail, MAX_LINE_CHARS)))
    return out


def _scan_tail(text: str, classifier: LineClassifier, floor: int, tail: int) -> list[Line]:
    lo = max(floor, len(text) - tail)
    if lo > floor:  # start at the first whole line inside the window
        nl = text.find("\n", lo - 1)
        if nl < 0:
            return []
        lo = nl + 1
    bounds: list[tuple[int, int]] = []
    while lo < len(text):
        nl = text.find("\n", lo)
        end = len(text) if nl < 0 else nl
        bounds.append((lo, end))
        lo = end + 1
    found: list[Line] = []
    for k, (start, end) in enumerate(bounds):
        _classify(text, start, end, k - len(bounds), True, classifier, found)
    return found


def _classify(text: str, start: int, end: int, line_no: int, movable: bool, classifier: LineClassifier,
              out: list[Line]) -> None:
    line = text[start:end]
    if line.strip():
        kinds = classifier.kinds(line)
        if kinds:
            out.append((line_no, start, end, kinds, movable))


def dynamic_lines(body: dict[str, Any], classifier: LineClassifier, tools_chars: int = 0) -> list[DynamicLine]:
    """Dynamic lines of system/developer messages before the last user message that have at
    least MIN_STATIC_AFTER reusable characters after them. `tools_chars`: the size of the tools
    as rendered after the first system message (0 when unknown or none)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    last_user = last_user_index(messages)
    # reusable characters from message i on (up to the last user message), right to left
    after = [0] * (last_user + 1)
    for i in range(last_user - 1, -1, -1):
        after[i] = after[i + 1] + content_chars(messages[i])
    out: list[DynamicLine] = []
    for i in range(last_user):
        msg = messages[i]
        if not isinstance(msg, dict) or msg.get("role") not in SCANNED_ROLES:
            continue
        found = message_text(msg)
        if found is None:
            continue
        text, part = found
        later = after[i + 1] + (tools_chars if i == 0 else 0)
        tail = TAIL_SCAN_CHARS if later >= MIN_STATIC_AFTER else 0  # else only the question follows
        for line_no, start, end, kinds, movable in scan_text(text, classifier, tail=tail):
            static_after = len(text) - end + later
            if static_after >= MIN_STATIC_AFTER:
                out.append(DynamicLine(i, part, line_no, start, end, kinds, movable, static_after))
    return out


def billing_block_finding(body: dict[str, Any]) -> Finding | None:
    """The billing-header finding of a Messages body (its `system[0]` block), if any."""
    system = body.get("system")
    if isinstance(system, list) and system and is_billing_block(system[0]):
        return Finding(DYNAMIC_HEAD, "system[0]", BILLING_HEADER)
    return None


def billing_header_finding(body: dict[str, Any]) -> Finding | None:
    """The billing-header finding of a chat body (the first line of `messages[0]`), if any."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict) \
            and messages[0].get("role") in SCANNED_ROLES:
        found = message_text(messages[0])
        if found is not None and found[0].startswith(BILLING_PREFIX):
            return Finding(DYNAMIC_HEAD, "messages[0] line 1", BILLING_HEADER)
    return None


def dynamic_findings(lines: Sequence[DynamicLine], places: Mapping[int, str] | None = None) -> list[Finding]:
    """One finding per dynamic line; `places` names a message index otherwise than
    `messages[i]` (Messages: the client's body, not the converted messages)."""
    return [Finding(DYNAMIC_HEAD, f"{(places or {}).get(ln.message, f'messages[{ln.message}]')} line {ln.line_no}",
                    ",".join(ln.kinds), ln)
            for ln in lines]


def reusable_after_head(view: Mapping[str, Any], tools_chars: int) -> int:
    """Reusable characters after the leading system message of a chat body: the tools (rendered
    after the system text) and the turns before the last user message."""
    messages = view.get("messages")
    if not isinstance(messages, list):
        return tools_chars
    return tools_chars + sum(content_chars(m) for m in messages[1:last_user_index(messages)])


def inline_system_findings(merged: Sequence[int], reusable_after: int) -> list[Finding]:
    """The `inline_system` findings of a Messages body whose inline system messages (`merged`,
    their indexes) the engine merges into the head; none when nothing reusable follows it."""
    if reusable_after < MIN_STATIC_AFTER:
        return []
    return [Finding(INLINE_SYSTEM, f"messages[{i}]", "merged into system") for i in merged]


# ---------------------------------------------------------------------------- tools
def tool_name(tool: Any) -> str:
    """The sort key of `sort_tools`: function.name (OpenAI shape), else name, else ""."""
    if isinstance(tool, dict):
        fn = tool.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        if isinstance(tool.get("name"), str):
            return tool["name"]
    return ""


@dataclass(frozen=True)
class ToolsSignature:
    """What identifies a tools list: the set (canonical JSON, order-free), the order of its
    items, and the exact bytes sent (order and key order)."""

    set_key: bytes
    order_key: bytes
    sent_key: bytes
    names_sorted: bool
    keys_sorted: bool
    chars: int  # size of the serialised tools (a proxy for what the template renders)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def tools_signature(tools: list[Any]) -> ToolsSignature:
    sent = orjson.dumps(tools)
    canon = [orjson.dumps(t, option=orjson.OPT_SORT_KEYS) for t in tools]
    names = [tool_name(t) for t in tools]
    return ToolsSignature(
        set_key=_digest(b"\n".join(sorted(canon))), order_key=_digest(b"\n".join(canon)),
        sent_key=_digest(sent), names_sorted=names == sorted(names),
        keys_sorted=b"[" + b",".join(canon) + b"]" == sent, chars=len(sent))


class ToolOrderMemo:
    """Per tenant and tool set, the order last sent: a different order of the same set is a
    `tool_order` finding. Bounded LRU; local to this gateway (a varying order shows up on any
    gateway that sees two requests of the tenant)."""

    def __init__(self, entries: int = TOOL_MEMO_ENTRIES) -> None:
        self._seen: OrderedDict[tuple[str, bytes], tuple[bytes, bytes]] = OrderedDict()
        self._cap = entries

    def observe(self, tenant: str, sig: ToolsSignature) -> str | None:
        """Record this request's order; "order" / "key order" when it differs from the last."""
        key = (tenant, sig.set_key)
        previous = self._seen.get(key)
        self._seen[key] = (sig.order_key, sig.sent_key)
        self._seen.move_to_end(key)
        if len(self._seen) > self._cap:
            self._seen.popitem(last=False)
        if previous is None or previous[1] == sig.sent_key:
            return None
        return "order" if previous[0] != sig.order_key else "key order"


def tool_findings(tenant: str, sig: ToolsSignature, memo: ToolOrderMemo, flag_unsorted: bool) -> list[Finding]:
    varied = memo.observe(tenant, sig)
    if varied is not None:
        return [Finding(TOOL_ORDER, "tools", varied)]
    if flag_unsorted and not (sig.names_sorted and sig.keys_sorted):
        return [Finding(TOOL_ORDER, "tools", "unsorted")]
    return []
