"""`move_dynamic` on an Anthropic Messages body (`POST /v1/messages`).

The findings come from the scan of the chat messages the engine renders (app/prefix/convert_messages.py
`chat_view`): the leading system message there is the text of the top-level `system` (a string, or
its non-empty, non-billing text blocks joined with no separator), and a `DynamicLine`'s offsets
are offsets in that joined text. This module maps them back onto the client's `system` and moves
the lines as chat's `move_dynamic` does (app/hygiene/rewrite.py), in the Messages body's own shape:
- `last_user` (default): the lines leave their block and are appended, in order, to the last
  `user` message (after a blank line to a string content, as a new text block to a list), so
  the system text, the tools and every earlier turn render the same bytes on every turn; with no
  user message they go to the end of the system text instead, as on chat;
- `system_end`: appended to the end of the last system text block (the head of the system
  prompt stays reusable, what follows it does not).
A block left empty is dropped (vLLM skips empty blocks; Anthropic refuses them). Nothing moves
when a line lies outside the top-level `system` (an inline system message, merged or in place),
spans two blocks, is a paragraph, or more than `max_moved_lines` qualify: a partial move would
change the prompt without making its head stable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from app.hygiene.findings import DynamicLine
from app.hygiene.rewrite import (
    RewriteOptions,
    RewriteResult,
    _append_text,
    _cut_lines,
    append_lines,
    rewrites_moving_with,
)
from app.prefix.convert_messages import BILLING_PREFIX, system_blocks


def _spans(system: Any) -> list[tuple[int | None, int, str]]:
    """(block index, offset of the block's text in the rendered system text, text): a string
    that opens with the billing header loses that line when rendered, so its offset is negative."""
    spans: list[tuple[int | None, int, str]] = []
    pos = 0
    for index, text in system_blocks(system, strip_billing=True):
        if index is None and text.startswith(BILLING_PREFIX):  # the renderer's strip_billing_lines
            nl = text.find("\n")
            pos = -(nl + 1) if nl >= 0 else -len(text)
        spans.append((index, pos, text))
        pos += len(text)
    return spans


def _locate(spans: Sequence[tuple[int | None, int, str]], line: DynamicLine) -> int | None:
    """The span holding the whole line, or None (outside the top-level system, or across blocks)."""
    for k, (_, start, text) in enumerate(spans):
        if start <= line.start and line.end <= start + len(text):
            return k
    return None


def _last_user(messages: Sequence[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "user":
            return i
    return None


def move_system_lines(body: dict[str, Any], lines: Sequence[DynamicLine],
                      opts: RewriteOptions) -> dict[str, Any] | None:
    """The body with the dynamic lines of its `system` moved (see the module docstring), or None."""
    if not lines or len(lines) > opts.max_moved_lines \
            or not all(ln.message == 0 and ln.part is None and ln.movable for ln in lines):
        return None
    system = body.get("system")
    spans = _spans(system)
    groups: dict[int, list[DynamicLine]] = {}
    moved: list[str] = []
    for ln in sorted(lines, key=lambda x: x.start):
        k = _locate(spans, ln)
        if k is None:
            return None
        _, start, text = spans[k]
        local = replace(ln, start=ln.start - start, end=ln.end - start)
        groups.setdefault(k, []).append(local)
        moved.append(text[local.start:local.end])
    texts = [_cut_lines(text, groups[k]) if k in groups else text for k, (_, _, text) in enumerate(spans)]
    messages = body.get("messages")
    messages = list(messages) if isinstance(messages, list) else []
    user = _last_user(messages) if opts.move_target == "last_user" else None
    if user is not None:
        messages[user] = _append_text(messages[user], "\n".join(moved))
    else:
        joined = "".join(texts)  # the separator depends on how the whole system text ends
        texts[-1] = append_lines(joined, "\n".join(moved))[len(joined) - len(texts[-1]):]
    if isinstance(system, str):
        new_system: Any = texts[0]
    else:
        blocks: list[Any] = list(system)
        emptied: set[int] = set()
        for (index, _, _), text in zip(spans, texts, strict=True):
            if index is not None:
                blocks[index] = {**blocks[index], "text": text}
                if not text:
                    emptied.add(index)
        new_system = [b for i, b in enumerate(blocks) if i not in emptied]
    return {**body, "system": new_system, "messages": messages}


def apply_messages_rewrites(body: dict[str, Any], lines: Sequence[DynamicLine], opts: RewriteOptions) -> RewriteResult:
    """Every enabled rewrite that changes the Messages body, in the chat order (the billing
    header is stripped before, by the hygiene stage)."""
    return rewrites_moving_with(body, lines, opts, move_system_lines)
