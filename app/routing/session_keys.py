"""Where a request's session id comes from: `routing.session_keys`, an ordered list of sources,
first found wins (docs/routing.md lists the clients that send each).

A pure function of the request's headers (lower-cased names), its parsed JSON body and the body
sources its API carries (its dialect's `body_session_keys`); it never reads prompt text. The id
it returns is the client's own; the router scopes it to the tenant (app/routing/session.py), so
two tenants' equal ids never share a binding.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson

from app.config import DEFAULT_SESSION_KEYS, SessionKeySource  # noqa: F401 (the config's names)

SESSION_ID_HEADERS = ("session_id", "session-id")  # Codex-style clients (underscore, then hyphen)
CLAUDE_CODE_HEADER = "x-claude-code-session-id"  # Claude Code since v2.1.86
LEGACY_SESSION_MARK = "_session_"  # user_<hash>_account_<uuid or empty>_session_<uuid>
MAX_KEY_CHARS = 256  # a longer value is no session id a client sends; not bound


def find_session_key(sources: Sequence[SessionKeySource], session_header: str, headers: Mapping[str, str],
                     body: Mapping[str, Any], body_sources: Collection[SessionKeySource]) -> str | None:
    """The first session id found in `sources`' order, or None. `session_header`: the configured
    header (`header` source); `body_sources`: the body sources the request's API carries
    (`Dialect.body_session_keys`: OpenAI's `prompt_cache_key`, Anthropic's `metadata_user_id`)."""
    for source in sources:
        key = _from_source(source, session_header, headers, body, body_sources)
        if key:
            return key
    return None


def _from_source(source: SessionKeySource, session_header: str, headers: Mapping[str, str],
                 body: Mapping[str, Any], body_sources: Collection[SessionKeySource]) -> str | None:
    if source == "header":
        return _usable(headers.get(session_header.lower()))
    if source == "prompt_cache_key":
        return _usable(body.get("prompt_cache_key")) if source in body_sources else None
    if source == "session_id_header":
        return next((v for v in (_usable(headers.get(h)) for h in SESSION_ID_HEADERS) if v), None)
    if source == "claude_code_header":
        return _usable(headers.get(CLAUDE_CODE_HEADER))
    if source == "metadata_user_id":
        return metadata_session(body) if source in body_sources else None
    return None


def metadata_session(body: Mapping[str, Any]) -> str | None:
    """The session part of a Messages body's `metadata.user_id`, in either shape Claude Code
    sends: a JSON object in the string (`{"device_id": ..., "account_uuid": ..., "session_id":
    ...}`, v2.1.78 on) or `user_<hash>_account_<uuid>_session_<uuid>` (earlier). Any other
    user_id names a user, not a session: None."""
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        return _usable(parsed.get("session_id")) if isinstance(parsed, dict) else None
    head, mark, session = user_id.rpartition(LEGACY_SESSION_MARK)
    return _usable(session) if mark and head.startswith("user_") else None


def _usable(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_KEY_CHARS and value.strip():
        return value
    return None
