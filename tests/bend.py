"""Bending what the other side sends: recorded answers with values replaced, keys dropped, events
garbled, dropped, repeated or moved (tests/test_fuzz_upstream.py bends a replica's answers to the
proxy, tests/test_doctor_fuzz.py an endpoint's answers to `prefixgate check`). Seeded by the
caller's `random.Random`, so a case reproduces by its number."""

from __future__ import annotations

import functools
import json
import operator
import random
from collections.abc import Iterator
from typing import Any

VALUES: list[Any] = [None, True, False, 0, -1, -(2**63), 2**64 + 1, 10**30, 1.5, -0.0, 1e308, float("nan"),
                     float("inf"), "", "x", "12", "NaN", "\u0000", "\ud800", [], [0], ["a", 1], {}, {"cached_tokens": -3},
                     {"a": {"b": None}}]
GARBAGE = [b"{", b"not json", b"\xff\xfe\xfd", b"[]", b"null", b"5", b'"text"', b'{"choices": 5}',
           b'{"type": 7}', b"{}" * 3, b"data: data: {}"]


def nodes(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from nodes(v, (*path, i))


def bend_value(obj: Any, r: random.Random) -> Any:
    """One value replaced (half the time one under a `usage`, where the counts are) or one key
    or item deleted."""
    paths = [p for p in nodes(obj) if p]
    if not paths:
        return r.choice(VALUES)
    counts = [p for p in paths if "usage" in p]
    path = r.choice(counts if counts and r.random() < 0.5 else paths)
    parent = functools.reduce(operator.getitem, path[:-1], obj)
    if r.random() < 0.25:
        del parent[path[-1]]
    else:
        parent[path[-1]] = r.choice(VALUES)
    return obj


def dump(obj: Any, r: random.Random) -> bytes:
    return json.dumps(obj, ensure_ascii=r.random() < 0.5, separators=(",", ":")).encode("utf-8", "surrogatepass")


def sse_events(answer: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in answer.split(b"\n\n") if e.strip()]


def bend_event(event: bytes, r: random.Random) -> bytes:
    """An SSE event with its JSON bent, or its data replaced by garbage."""
    head, sep, data = event.rstrip(b"\n").rpartition(b"data: ")
    if not sep:
        return event
    try:
        obj = json.loads(data)
    except ValueError:  # [DONE], or an event an earlier bend cut
        obj = None
    if obj is None or r.random() < 0.3:
        return head + b"data: " + r.choice(GARBAGE) + b"\n\n"
    return head + b"data: " + dump(bend_value(obj, r), r) + b"\n\n"


def bend_stream(answer: bytes, r: random.Random) -> tuple[bytes, list[str]]:
    events, done = sse_events(answer), []
    for _ in range(r.randint(1, 3)):
        how = r.choice(["event", "event", "event", "drop", "repeat", "move", "cut_last", "garbage_line"])
        i = r.randrange(len(events)) if events else 0
        if not events:
            break
        if how == "event":
            events[i] = bend_event(events[i], r)
        elif how == "drop":
            del events[i]
        elif how == "repeat":
            events.insert(i, events[i])
        elif how == "move":
            moved = events.pop(i)
            events.insert(r.randrange(len(events) + 1), moved)
        elif how == "cut_last":
            events[-1] = events[-1][:r.randrange(len(events[-1]) + 1)]
        else:  # a line that is no SSE field, or a comment
            events.insert(i, r.choice([b": keep-alive\n\n", b"garbage\n\n", b"id: 7\nretry: x\n\n", b"\n"]))
        done.append(how)
    return b"".join(events), done


def bend_json(answer: bytes, r: random.Random) -> tuple[bytes, list[str]]:
    if r.random() < 0.2:
        return r.choice(GARBAGE), ["garbage"]
    obj = json.loads(answer)
    for _ in range(r.randint(1, 3)):
        obj = bend_value(obj, r)
    return dump(obj, r), ["json"]
