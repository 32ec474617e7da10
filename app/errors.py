"""The gateway's one refusal type and the wire shapes a client parses it in.

`ProxyError` is raised by any layer (admission, hygiene, the API adapter, the relay) and becomes
an error response in the request's API shape: OpenAI's `{"error": {message, type, param, code}}`,
Anthropic's `{"type": "error", "error": {type, message}}` (app/api/dialects.py picks one per
API), or mid-stream an SSE error event. It lives at the bottom of the import layers
(docs/pipeline.md, "Layers") so that every layer can raise it without importing the one above.
"""

from __future__ import annotations

from typing import Any

import orjson


class ProxyError(Exception):
    """An error that becomes an OpenAI-shaped response: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def error_body(err: ProxyError) -> bytes:
    return orjson.dumps(err.body())


def sse_error_event(err: ProxyError | dict[str, Any]) -> bytes:
    """A mid-stream error as vLLM/SGLang send it, followed by the stream terminator."""
    body = err.body() if isinstance(err, ProxyError) else {"error": err}
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


# Anthropic's error `type` for a status (docs/agents-apis.md); other statuses: api_error
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                         429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error_body(err: ProxyError) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}`, what Anthropic clients parse."""
    kind = ANTHROPIC_ERROR_TYPES.get(err.status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})
