"""The per-request context that flows through the hot path, and the hook seam.

Order on the hot path (app/api/openai.py drives it):
  parse + size limit + tenant  ->  hooks.before_route (hygiene, then fingerprint)  ->  router
  ->  upstream (aiohttp)  ->  relay bytes  ->  observer (SSE clock)  ->  hooks.after_response

`before_route` may rewrite `ctx.body` (set `ctx.body_changed`), add response headers, set
`ctx.fingerprint`, or raise `ProxyError` to reject. It must not do work that grows with prompt
size beyond hashing. `after_response` runs once the response ended (any outcome) and must not
block: schedule anything slow (tokenisation, Redis writes) as a task or in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.prefix.fingerprint import Fingerprint
from app.routing.base import RouteDecision

if TYPE_CHECKING:  # the stage imports this module
    from app.pipeline.prefix_stage import PrefixStageState


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


@dataclass
class Timings:
    """perf_counter stamps; None until the event happened."""

    arrival: float
    upstream_sent: float | None = None
    first_byte: float | None = None  # first upstream byte (role chunk ~ engine first token)
    first_token: float | None = None  # first chunk carrying generated text: the client-side TTFT
    last_token: float | None = None
    end: float | None = None


@dataclass
class RequestContext:
    request_id: str
    route: str  # "chat" | "completions"
    path: str
    tenant: str
    headers: dict[str, str]  # incoming, lower-case names
    body: dict[str, Any]
    model: str | None
    stream: bool
    timings: Timings
    session_id: str | None = None
    body_changed: bool = False
    salt: str | None = None  # cache_salt sent upstream (tenant isolation), if any
    fingerprint: Fingerprint | None = None
    prefix: PrefixStageState | None = None  # the prefix stage's notes (app/pipeline/prefix_stage.py)
    decision: RouteDecision | None = None
    attempts: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)  # x-prefixgate-* additions
    status: int | None = None
    outcome: str = "ok"  # ok | client_error | upstream_error | midstream_error | client_disconnect
    usage: dict[str, Any] | None = None
    content_chunks: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)  # free-form notes between hooks

    @property
    def prompt_tokens(self) -> int | None:
        return (self.usage or {}).get("prompt_tokens")

    @property
    def engine_cached_tokens(self) -> int | None:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return details.get("cached_tokens")


class RequestHook(Protocol):
    async def before_route(self, ctx: RequestContext) -> None: ...
    def after_response(self, ctx: RequestContext) -> None: ...
