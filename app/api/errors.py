"""The one place that maps exceptions to OpenAI-shaped error responses.

Every error the proxy itself produces has the body `{"error": {"message", "type", "param",
"code"}}` and a meaningful status: 400 bad input, 401 bad key, 404 unknown model, 413 body too
large, 502 upstream failed, 503 no healthy replica, 500 a bug (message without internals).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from app.proxy.context import ProxyError
from app.proxy.upstream import UpstreamError
from app.routing.base import NoReplicaAvailable

log = logging.getLogger("prefixgate.errors")

JSON_CT = (b"content-type", b"application/json")
_TOO_DEEP = "Recursion limit reached"  # orjson.dumps beyond 254 nested levels (its loads allows 1024)


def to_proxy_error(exc: BaseException) -> ProxyError:
    """Exception -> ProxyError (status, message, type, code). Never leaks prompt text."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, NoReplicaAvailable):
        return ProxyError(503, f"no healthy upstream replica available: {exc}", type="server_error",
                          code="no_healthy_upstream")
    if isinstance(exc, UpstreamError):
        return ProxyError(502, str(exc), type="server_error", code=f"upstream_{exc.kind}")
    if isinstance(exc, orjson.JSONDecodeError):
        return ProxyError(400, f"request body is not valid JSON: {exc.msg}", code="invalid_json")
    if isinstance(exc, TypeError) and str(exc) == _TOO_DEEP:  # parsed (<= 1024 levels), not re-serialisable
        return ProxyError(400, "request body is nested too deeply (more than 254 levels)", code="invalid_json")
    log.exception("unhandled error on the request path", exc_info=exc)
    return ProxyError(500, f"internal proxy error ({type(exc).__name__})", type="server_error",
                      code="internal_error")


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


def error_bytes(err: ProxyError, anthropic: bool = False) -> bytes:
    """The error body a client of the route parses: Anthropic's shape on the Messages paths."""
    return anthropic_error_body(err) if anthropic else error_body(err)


async def send_error(send: Any, exc: BaseException, headers: list[tuple[bytes, bytes]] | None = None,
                     anthropic: bool = False) -> ProxyError:
    """Send a complete error response on a raw ASGI `send` (OpenAI-shaped, or Anthropic-shaped
    for the Messages paths); returns the error."""
    err = to_proxy_error(exc)
    body = error_bytes(err, anthropic)
    out = [JSON_CT, (b"content-length", str(len(body)).encode())]
    out += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    if headers:
        out += headers
    await send({"type": "http.response.start", "status": err.status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return err
