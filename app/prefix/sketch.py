"""A request's shape, as diagnosis needs it: the rendered prompt plus where its parts are.

Diagnosis (app/prefix/diagnose.py) compares two requests of a tenant. Text alone says *where*
they diverge; the structure says *what* diverged: the tools (same set, other order?), the history
(early turns dropped?), the system message, or the final user turn (expected to differ). A sketch
is built once per request off the hot path and kept only for a tenant's last few requests.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.prefix.prompt import PromptInput

FIND_PROBE_CHARS = 64


@dataclass(frozen=True)
class Region:
    """Where a message's content sits in the rendered prompt."""

    role: str
    index: int  # position in the messages list
    start: int
    end: int


@dataclass
class RequestSketch:
    text: str
    kind: str = "chat"  # chat | completions
    regions: list[Region] = field(default_factory=list)
    # per message, in order: (role, start, end, tool calls' digest) where its content sits in
    # `text`, or its key already computed (content not found in `text`); `message_keys` keys them
    # when diagnosis first asks (hashing every message's content on every request cost ~0.2 ms
    # per 900 KB prompt, and only a break's diagnosis reads the keys)
    message_parts: list[tuple[str, int, int, str] | str] = field(default_factory=list)
    system_text: str | None = None
    tools_raw: list[str] = field(default_factory=list)  # each tool as sent (key order kept)
    tools_canon: list[str] = field(default_factory=list)  # each tool with sorted keys
    tail_start: int = 0  # where the content that is expected to vary (the last turn) begins
    # conversation.turn_keys of this sketch, kept once computed (it is read several times per request
    # and again for each kept sketch by later requests); with the region count it was computed at
    turn_keys_memo: tuple[int, list[str]] | None = field(default=None, repr=False, compare=False)
    _message_keys: list[str] | None = field(default=None, repr=False, compare=False)

    @property
    def message_keys(self) -> list[str]:
        """role + content digest per message, in order (`message_key`), computed once."""
        keys = self._message_keys
        if keys is None:
            text = self.text
            keys = self._message_keys = [part if isinstance(part, str) else
                                         keyed(part[0], text[part[1]:part[2]], part[3]) for part in self.message_parts]
        return keys

    def region_at(self, offset: int) -> Region | None:
        for region in self.regions:
            if region.start <= offset < region.end:
                return region
        return None

    def history_regions(self) -> list[Region]:
        """The regions of the history: every message but the system and developer ones, in order."""
        return [r for r in self.regions if r.role not in ("system", "developer")]

    def first_history_start(self) -> int:
        """Start of the first message's content that is no system or developer message (len(text)
        when none): where the history begins, as `history_regions` has it."""
        for region in self.regions:
            if region.role not in ("system", "developer"):
                return region.start
        return len(self.text)


REGION_BYTES = 120  # a frozen Region (4 slots + GC header) and its list slot
TURN_KEY_BYTES = 90  # a kept turn key (32 hex chars) and its list slot; at most one per region
# a message's part (a 4-tuple, its list slot) and room for its key (~30 chars) once computed
MESSAGE_BYTES = 200


def sketch_bytes(sketch: RequestSketch) -> int:
    """Bytes a kept sketch holds: its strings as stored (sys.getsizeof: 1-4 bytes a character plus
    a header) and its regions, each with room for its turn key (`turn_keys_memo`, counted whether
    or not it was computed yet, so the count does not change while the sketch is kept). The text is
    usually the only big part."""
    strings = (sketch.text, sketch.system_text or "", *sketch.tools_raw, *sketch.tools_canon)
    return (sum(map(sys.getsizeof, strings)) + (REGION_BYTES + TURN_KEY_BYTES) * len(sketch.regions)
            + MESSAGE_BYTES * len(sketch.message_parts) + 200)


def content_text(content: Any) -> str:
    """A message's text: the string, or its text parts joined with newlines (vLLM 'string' format)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def _digest(value: Any) -> str:
    raw = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def message_key(role: str, body: str, tool_calls: Any) -> str:
    """Identity of a message for comparing two requests of one tenant *in this process* (sketches
    are never shared): the content's length and str hash (cached on the string, ~0.2 ms per MB,
    where a JSON dump + digest of a 1 MB system prompt took ~4 ms on the event loop)."""
    return keyed(role, body, _digest(tool_calls) if tool_calls else "-")


def keyed(role: str, body: str, calls: str) -> str:
    """`message_key` with the tool calls already digested."""
    return f"{role}:{len(body):x}.{hash(body) & 0xFFFFFFFFFFFFFFFF:016x}.{calls}"


def find_content(text: str, body: str, cursor: int) -> int:
    """Where `body` occurs in `text` from `cursor` (-1: nowhere). A short probe finds the
    candidates and one memcmp confirms each: a plain find of a 1 MB needle costs ~0.6 ms of
    preprocessing, the probe costs microseconds when the content follows its role header."""
    if len(body) <= FIND_PROBE_CHARS:
        return text.find(body, cursor)
    probe = body[:FIND_PROBE_CHARS]
    pos = text.find(probe, cursor)
    while pos >= 0 and not text.startswith(body, pos):
        pos = text.find(probe, pos + 1)
    return pos


def build_sketch(inp: PromptInput | None, text: str) -> RequestSketch:
    """Locate each message's content in `text` (in order) and record tools and the tail start.
    Cost: O(number of messages + tools), plus one memcmp per message: never a pass of
    Python code over the prompt's characters (it runs on the event loop)."""
    if inp is None or inp.kind != "chat":
        cut = text.rfind("\n\n")
        if cut < 0:
            cut = text.rfind("\n")
        return RequestSketch(text, kind="completions", tail_start=cut + 1 if cut >= 0 else 0)
    sketch = RequestSketch(text)
    cursor = 0
    for index, message in enumerate(inp.messages):
        role = str(message.get("role", ""))
        body = content_text(message.get("content"))
        calls = message.get("tool_calls")
        digest = _digest(calls) if calls else "-"
        if role in ("system", "developer") and index == 0:
            sketch.system_text = body
        pos = find_content(text, body, cursor) if body else -1
        if pos < 0:
            sketch.message_parts.append(keyed(role, body, digest))
            continue
        sketch.message_parts.append((role, pos, pos + len(body), digest))
        sketch.regions.append(Region(role, index, pos, pos + len(body)))
        cursor = pos + len(body)
    for tool in inp.tools or []:
        sketch.tools_raw.append(json.dumps(tool, ensure_ascii=False, default=str))
        sketch.tools_canon.append(json.dumps(tool, ensure_ascii=False, sort_keys=True, default=str))
    last = sketch.regions[-1] if sketch.regions else None
    if last is not None and last.index == len(inp.messages) - 1 and last.role != "system":
        sketch.tail_start = last.start
    else:
        sketch.tail_start = len(text)
    return sketch
