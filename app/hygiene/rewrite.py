"""Hygiene rewrites: pure, deterministic transformations of a chat request body.

Each returns a new body (the input is never mutated) or None when it has nothing to change, so
the caller re-serialises the body only when something changed. The same input always gives the
same output, hence the same bytes upstream: a rewrite must never introduce variation itself.

- `move_dynamic`: whole lines holding per-request values (findings.DynamicLine) leave the head
  of their system/developer message and are appended, in their original order, to the last user
  message after a blank line (`last_user`, default: everything before the question becomes
  reusable) or to the end of their own message (`system_end`: the system prompt before them
  stays reusable, the history after it does not). Nothing is deleted or edited: every original
  line is still in the prompt. When more lines qualify than `max_lines`, or one of them is a
  paragraph (not movable), nothing moves: a partial move would change the prompt without making
  its head stable.
- `strip_billing_header`: Claude Code's billing header leaves the prompt: the whole first `system`
  block on /v1/messages (`strip_billing_block`; what vLLM 0.32 drops itself), the first line of
  the first system message on chat (`strip_billing_header`); each dialect says which applies
  (`Dialect.strip_billing`). It carries no meaning for the model, and its per-request `cch=`
  hash would otherwise break the prefix at position 0 on every engine that keeps it.
- `sort_tools`: tools by function name; Python's sort is stable, so tools with equal names keep
  their relative order.
- `canonical_json`: every key of every tool (wrapper and JSON schema) sorted, recursively. A
  separate switch because property order can steer what some models generate first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from app.hygiene.findings import DynamicLine, last_user_index, message_text, tool_name
from app.prefix.convert_messages import BILLING_PREFIX, is_billing_block

MoveTarget = Literal["last_user", "system_end"]
MOVE_DYNAMIC = "move_dynamic"
SORT_TOOLS = "sort_tools"
CANONICAL_JSON = "canonical_json"
STRIP_BILLING = "strip_billing_header"


@dataclass(frozen=True)
class RewriteOptions:
    move_dynamic: bool = True
    sort_tools: bool = True
    canonical_json: bool = False
    move_target: MoveTarget = "last_user"
    max_moved_lines: int = 8


@dataclass(frozen=True)
class RewriteResult:
    body: dict[str, Any]
    kinds: tuple[str, ...]  # rewrites applied, in order
    moved_lines: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.kinds)


def _cut_lines(text: str, lines: Sequence[DynamicLine]) -> str:
    """`text` without the given lines and their line breaks (lines sorted by start)."""
    out: list[str] = []
    cursor = 0
    for ln in lines:
        start, end = ln.start, ln.end
        if end < len(text) and text[end] == "\n":
            end += 1  # the line and its newline
        elif start > 0 and text[start - 1] == "\n" and start - 1 >= cursor:
            start -= 1  # the last line: drop the newline before it instead
        out.append(text[cursor:start])
        cursor = end
    out.append(text[cursor:])
    return "".join(out)


def append_lines(text: str, moved: str) -> str:
    """`moved` as the last lines of `text` (the `system_end` target)."""
    return text + ("" if not text or text.endswith("\n") else "\n") + moved


def _append_text(message: dict[str, Any], moved: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": moved}]}
    text = content if isinstance(content, str) else ""
    if not text:
        return {**message, "content": moved}
    sep = "\n" if text.endswith("\n") else "\n\n"
    return {**message, "content": text + sep + moved}


def _with_text(message: dict[str, Any], part: int | None, text: str) -> dict[str, Any]:
    if part is None:
        return {**message, "content": text}
    parts = list(message["content"])
    parts[part] = {**parts[part], "text": text}
    return {**message, "content": parts}


def _text_of(message: dict[str, Any], part: int | None) -> str:
    return message["content"] if part is None else message["content"][part]["text"]


def move_dynamic(body: dict[str, Any], lines: Sequence[DynamicLine], target: MoveTarget = "last_user",
                 max_lines: int = 8) -> tuple[dict[str, Any], int] | None:
    """(new body, lines moved), or None when nothing can move (see the module docstring)."""
    if not lines or len(lines) > max_lines or not all(ln.movable for ln in lines):
        return None
    messages = list(body["messages"])
    groups: dict[tuple[int, int | None], list[DynamicLine]] = {}
    for ln in sorted(lines, key=lambda x: (x.message, -1 if x.part is None else x.part, x.start)):
        groups.setdefault((ln.message, ln.part), []).append(ln)
    last_user = last_user_index(messages)
    to_user: list[str] = []
    for (index, part), group in groups.items():
        original = messages[index]
        text = _text_of(original, part)
        moved = "\n".join(text[ln.start:ln.end] for ln in group)
        remaining = _cut_lines(text, group)
        if target == "last_user" and last_user < len(messages):
            messages[index] = _with_text(original, part, remaining)
            to_user.append(moved)
        else:
            messages[index] = _with_text(original, part, append_lines(remaining, moved))
    if to_user:
        messages[last_user] = _append_text(messages[last_user], "\n".join(to_user))
    return {**body, "messages": messages}, len(lines)


def sort_tools(body: dict[str, Any]) -> dict[str, Any] | None:
    """Tools sorted by function name (stable), or None when already in that order."""
    tools = body.get("tools")
    if not isinstance(tools, list) or len(tools) < 2:
        return None
    ordered = sorted(tools, key=tool_name)
    if all(a is b for a, b in zip(ordered, tools, strict=True)):
        return None
    return {**body, "tools": ordered}


def canonical_json(body: dict[str, Any]) -> dict[str, Any] | None:
    """Every tool with its keys sorted recursively, or None when they already are."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    sorted_bytes = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
    if sorted_bytes == orjson.dumps(tools):
        return None
    return {**body, "tools": orjson.loads(sorted_bytes)}


def strip_billing_block(body: dict[str, Any]) -> dict[str, Any] | None:
    """A Messages body without its billing-header `system[0]` block (see the module docstring);
    None when its system does not open with one."""
    system = body.get("system")
    if not (isinstance(system, list) and system and is_billing_block(system[0])):
        return None
    return {**body, "system": system[1:]}


def strip_billing_header(body: dict[str, Any]) -> dict[str, Any] | None:
    """A chat body without the billing header line opening `messages[0]` (see the module
    docstring); None when the body does not open with one."""
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages and isinstance(messages[0], dict)):
        return None
    first = messages[0]
    found = message_text(first)
    if found is None or not found[0].startswith(BILLING_PREFIX):
        return None
    text, part = found
    nl = text.find("\n")
    rest = "" if nl < 0 else text[nl + 1:]
    return {**body, "messages": [_with_text(first, part, rest), *messages[1:]]}


Mover = Callable[[dict[str, Any], Sequence[DynamicLine], RewriteOptions], dict[str, Any] | None]


def rewrites_moving_with(body: dict[str, Any], lines: Sequence[DynamicLine], opts: RewriteOptions,
                         move: Mover) -> RewriteResult:
    """`move_dynamic` by a route's own mover (None: nothing moved), then the tool rewrites: the
    order chat applies, for the routes whose bodies place the lines differently (Messages, Responses)."""
    kinds: list[str] = []
    moved = 0
    if opts.move_dynamic and lines:
        changed = move(body, lines, opts)
        if changed is not None:
            body, moved = changed, len(lines)
            kinds.append(MOVE_DYNAMIC)
    body, tool_kinds = tool_rewrites(body, opts)
    return RewriteResult(body, (*kinds, *tool_kinds), moved)


def apply_rewrites(body: dict[str, Any], lines: Sequence[DynamicLine], opts: RewriteOptions) -> RewriteResult:
    """Every enabled rewrite that changes something, in a fixed order."""
    kinds: list[str] = []
    moved = 0
    if opts.move_dynamic and lines:
        result = move_dynamic(body, lines, opts.move_target, opts.max_moved_lines)
        if result is not None:
            body, moved = result
            kinds.append(MOVE_DYNAMIC)
    body, tool_kinds = tool_rewrites(body, opts)
    return RewriteResult(body, (*kinds, *tool_kinds), moved)


def tool_rewrites(body: dict[str, Any], opts: RewriteOptions) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The enabled tool rewrites (`canonical_json`, then `sort_tools`) of any body with a
    top-level `tools` list (chat, Responses, Messages: `tool_name` reads each one's name)."""
    kinds: list[str] = []
    for enabled, rewrite, kind in ((opts.canonical_json, canonical_json, CANONICAL_JSON),
                                   (opts.sort_tools, sort_tools, SORT_TOOLS)):
        if enabled:
            result = rewrite(body)
            if result is not None:
                body = result
                kinds.append(kind)
    return body, tuple(kinds)
