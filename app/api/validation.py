"""Request-body validation for the OpenAI surface: pure, so it is unit-tested without a server.

Only what the proxy relies on is checked (and what an engine would reject anyway, but earlier
and with a clear message): the body is a JSON object, `model` is a string, chat has a non-empty
`messages` list of objects, completions a `prompt`, and the few typed fields the proxy reads.
"""

from __future__ import annotations

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


def _bad(message: str, param: str | None = None, code: str = "invalid_type") -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def parse_body(raw: bytes, route: str) -> dict[str, Any]:
    """Parse and check a chat (`route="chat"`) or completions body; raises ProxyError(400)."""
    if not raw:
        raise _bad("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"request body is not valid JSON: {exc.msg}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    validate_body(body, route)
    return body


def validate_body(body: dict[str, Any], route: str) -> None:
    model = body.get("model")
    if model is None:
        raise _bad("you must provide a model parameter", "model", "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise _bad("'model' must be a non-empty string", "model")
    if route in ("chat", "messages"):
        messages = body.get("messages")
        if messages is None:
            raise _bad("'messages' is a required property", "messages", "missing_required_parameter")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list", "messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _bad(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
    elif route == "responses":
        items = body.get("input")
        if items is None:
            raise _bad("'input' is a required property", "input", "missing_required_parameter")
        if not isinstance(items, (str, list)):
            raise _bad("'input' must be a string or a list of input items", "input")
        for key in ("instructions", "previous_response_id"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise _bad(f"'{key}' must be a string", key)
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise _bad("'prompt' is a required property", "prompt", "missing_required_parameter")
        if not isinstance(prompt, (str, list)) or (isinstance(prompt, list) and not prompt):
            raise _bad("'prompt' must be a string or a non-empty list", "prompt")
    if route == "messages":
        system = body.get("system")
        if system is not None and not isinstance(system, (str, list)):
            raise _bad("'system' must be a string or a list of content blocks", "system")
    for name, (types, described) in _OPTIONAL_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise _bad(f"'{name}' must be {described}", name)
    n = body.get("n")
    if isinstance(n, int) and n < 1:
        raise _bad("'n' must be at least 1", "n")
