"""The client APIs the gateway speaks, one `Dialect` each (app/dialects/base.py), by path.

A new API is one module in this package and one line in `DIALECTS` below.
"""

from __future__ import annotations

from app.dialects.base import PASSTHROUGH, Dialect
from app.dialects.chat import CHAT
from app.dialects.completions import COMPLETIONS
from app.dialects.messages import COUNT_TOKENS, MESSAGES
from app.dialects.responses import RESPONSES

DIALECTS: tuple[Dialect, ...] = (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    MESSAGES,
    COUNT_TOKENS,
)
BY_PATH: dict[str, Dialect] = {d.path: d for d in DIALECTS if d.path is not None}
BY_NAME: dict[str, Dialect] = {d.name: d for d in DIALECTS if d.parses} | {PASSTHROUGH.name: PASSTHROUGH}


def dialect_of(path: str) -> Dialect:
    """The dialect of a /v1 path (its query string removed); PASSTHROUGH for any other."""
    return BY_PATH.get(path, PASSTHROUGH)


__all__ = ["BY_NAME", "BY_PATH", "CHAT", "COMPLETIONS", "COUNT_TOKENS", "DIALECTS", "MESSAGES", "PASSTHROUGH",
           "RESPONSES", "Dialect", "dialect_of"]
