"""The `rewrite` policy on a Responses API body (`POST /v1/responses`).

The findings come from the scan of the chat messages the engine renders (app/prefix/convert_responses.py),
where `instructions` is message 0. The rewrites are applied to the Responses body itself:
- move_dynamic: per-request lines of `instructions` move to the end of the last user input (a
  string input, or the last user message item's text), as on chat; with `system_end`, or when
  there is no user text to carry them, to the end of `instructions` (chat's fallback too); lines
  found anywhere else are left where they are (nothing moves then);
- sort_tools / canonical_json: the flat `tools` list, exactly as on chat (app/hygiene/rewrite.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.hygiene.findings import DynamicLine
from app.hygiene.rewrite import (
    RewriteOptions,
    RewriteResult,
    _cut_lines,
    append_lines,
    rewrites_moving_with,
)


def _append_to_last_user(items: Any, moved: str) -> Any:
    """`input` with `moved` appended to its last user text; None when there is no user text."""
    if isinstance(items, str):
        return items + ("\n" if items.endswith("\n") else "\n\n") + moved if items else moved
    if not isinstance(items, list):
        return None
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if not isinstance(item, dict) or item.get("role") != "user" or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            new = {**item, "content": content + ("\n" if content.endswith("\n") else "\n\n") + moved}
        elif isinstance(content, list):
            new = {**item, "content": [*content, {"type": "input_text", "text": moved}]}
        else:
            return None
        return [*items[:i], new, *items[i + 1:]]
    return None


def _move_instructions(body: dict[str, Any], lines: Sequence[DynamicLine], opts: RewriteOptions) -> dict[str, Any] | None:
    instructions = body.get("instructions")
    if (not isinstance(instructions, str) or not instructions or not lines
            or len(lines) > opts.max_moved_lines
            or not all(ln.message == 0 and ln.part is None and ln.movable for ln in lines)):
        return None
    ordered = sorted(lines, key=lambda ln: ln.start)
    moved = "\n".join(instructions[ln.start:ln.end] for ln in ordered)
    remaining = _cut_lines(instructions, ordered)
    items = _append_to_last_user(body.get("input"), moved) if opts.move_target == "last_user" else None
    if items is None:  # system_end, or no user text to carry them: the end of the instructions
        return {**body, "instructions": append_lines(remaining, moved)}
    return {**body, "instructions": remaining, "input": items}


def apply_responses_rewrites(body: dict[str, Any], lines: Sequence[DynamicLine], opts: RewriteOptions) -> RewriteResult:
    """Every enabled rewrite that changes the Responses body, in the chat order."""
    return rewrites_moving_with(body, lines, opts, _move_instructions)
