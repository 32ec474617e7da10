"""Request-body checks every dialect shares: pure, so they are unit-tested without a server.

Only what the proxy relies on is checked (and what an engine would reject anyway, but earlier
and with a clear message): the body is a JSON object, `model` is a string, the API's own required
members (each dialect's `validate`), and the few typed fields the proxy reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from app.errors import ProxyError

_NUMBER = (int, float)

# field -> (accepted types, description); None is accepted for every optional field
_OPTIONAL_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "stream": ((bool,), "a boolean"),
    "stream_options": ((dict,), "an object"),
    "n": ((int,), "an integer"),
    "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"),
    "temperature": (_NUMBER, "a number"),
    "top_p": (_NUMBER, "a number"),
    "user": ((str,), "a string"),
    "stop": ((str, list), "a string or a list of strings"),
    "tools": ((list,), "a list"),
    "cache_salt": ((str,), "a string"),
}


def bad(message: str, param: str | None = None, code: str = "invalid_type") -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def parse_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object; ProxyError(400) otherwise."""
    if not raw:
        raise bad("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad(f"request body is not valid JSON: {exc.msg}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad("request body must be a JSON object")
    return body


def check_common(body: dict[str, Any], own: Callable[[dict[str, Any]], None]) -> None:
    """`model`, then the API's own members (`own`), then the typed optional fields."""
    model = body.get("model")
    if model is None:
        raise bad("you must provide a model parameter", "model", "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise bad("'model' must be a non-empty string", "model")
    own(body)
    for name, (types, described) in _OPTIONAL_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise bad(f"'{name}' must be {described}", name)
    n = body.get("n")
    if isinstance(n, int) and n < 1:
        raise bad("'n' must be at least 1", "n")


def check_messages(body: dict[str, Any]) -> None:
    """A non-empty `messages` list of objects with a string `role` (chat, Messages)."""
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is a required property", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
