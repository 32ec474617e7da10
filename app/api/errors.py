"""The one place that maps exceptions to OpenAI-shaped error responses.

Every error the proxy itself produces has the body `{"error": {"message", "type", "param",
"code"}}` and a meaningful status: 400 bad input, 401 bad key, 404 unknown model, 413 body too
large, 502 upstream failed, 503 no healthy replica, 500 a bug (message without internals).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from app.dialects import PASSTHROUGH, Dialect
from app.errors import ANTHROPIC_ERROR_TYPES, ProxyError, anthropic_error_body, error_body, sse_error_event
from app.proxy.upstream import UpstreamError
from app.routing.base import NoReplicaAvailable

__all__ = ["ANTHROPIC_ERROR_TYPES", "ProxyError", "anthropic_error_body", "error_body",
           "send_error", "sse_error_event", "to_proxy_error"]
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


async def send_error(send: Any, exc: BaseException, headers: list[tuple[bytes, bytes]] | None = None,
                     dialect: Dialect = PASSTHROUGH) -> ProxyError:
    """Send a complete error response on a raw ASGI `send`, in the shape `dialect`'s clients parse
    (OpenAI's; Anthropic's for the Messages paths); returns the error."""
    err = to_proxy_error(exc)
    body = dialect.error_body(err)
    out = [JSON_CT, (b"content-length", str(len(body)).encode())]
    out += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    if headers:
        out += headers
    await send({"type": "http.response.start", "status": err.status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return err
