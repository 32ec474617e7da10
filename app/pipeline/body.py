"""The bytes a chat/completions request is forwarded with: the client's own, plus what the gateway adds.

The gateway adds at most two top-level members: the tenant's `cache_salt` (cache isolation,
app/pipeline/hygiene_stage.py sets `ctx.salt`) and `stream_options.include_usage` (so a stream
reports the usage every metric needs; the usage event is dropped again for a client that did not
ask for it), with `continuous_usage_stats` when a broken stream may be continued elsewhere (the
per-chunk usage is taken out again for a client that did not ask for it, app/proxy/migrate.py). When a member is absent from the client's body it is spliced in before the closing
brace of the top-level object: O(1) work, and the engine sees exactly the client's bytes (key
order, whitespace, number formatting, escapes). The body is re-serialised only when a hygiene
rewrite changed it, or when a member to set is already present with another value (a client's
own `cache_salt`, even `null`, or `stream_options` without `include_usage`): appending a second
copy of a key would leave the choice to the engine's JSON parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

_WHITESPACE = b" \t\r\n"
_OPEN, _CLOSE = 0x7B, 0x7D  # "{", "}"


def splice_members(raw: bytes, members: Mapping[str, Any]) -> bytes | None:
    """`raw`, one JSON object, with `members` (keys it does not have) added before its closing
    brace; None when `raw` does not end in `}` (the caller re-serialises). Bytes after the brace
    (a trailing newline) are kept."""
    if not members:
        return raw
    end = len(raw)
    while end and raw[end - 1] in _WHITESPACE:
        end -= 1
    if not end or raw[end - 1] != _CLOSE:
        return None
    close = end - 1
    before = close
    while before and raw[before - 1] in _WHITESPACE:
        before -= 1
    empty = before > 0 and raw[before - 1] == _OPEN  # "{}": no comma before the first member
    added = b",".join(orjson.dumps(key) + b":" + orjson.dumps(value) for key, value in members.items())
    view = memoryview(raw)
    return b"".join((view[:close], added if empty else b"," + added, view[close:]))


def forwarded_body(raw: bytes, body: dict[str, Any], *, changed: bool, salt: str | None,
                   include_usage: bool, chunk_usage: bool = False) -> bytes:
    """The request bytes for the engine.

    raw: the client's bytes; body: the parsed (maybe rewritten) body; changed: a rewrite changed
    `body`, so `raw` no longer says the same; salt: the `cache_salt` the engine must see (None:
    leave the client's as it is); include_usage: ask the engine for the stream's usage event;
    chunk_usage: ask it for usage on every chunk too (`continuous_usage_stats`: the exact count of
    tokens sent that a mid-stream migration needs, app/proxy/migrate.py).
    """
    add: dict[str, Any] = {}
    replace: dict[str, Any] = {}
    if salt is not None and body.get("cache_salt") != salt:
        (replace if "cache_salt" in body else add)["cache_salt"] = salt
    options: dict[str, Any] = {"include_usage": True} if include_usage or chunk_usage else {}
    if chunk_usage:
        options["continuous_usage_stats"] = True
    if options:
        current = body.get("stream_options")
        if "stream_options" not in body:
            add["stream_options"] = options
        elif not isinstance(current, dict) or any(current.get(k) is not True for k in options):
            replace["stream_options"] = {**(current if isinstance(current, dict) else {}), **options}
    if not changed and not replace:
        spliced = splice_members(raw, add)
        if spliced is not None:
            return spliced
    return orjson.dumps({**body, **replace, **add})
