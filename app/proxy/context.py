"""The per-request context that flows through the pipeline, and the stage seam.

The steps and the fields each one writes are the table in app/pipeline/request.py (and
docs/pipeline.md). Every note one stage leaves for another is a typed field here, owned by the
stage named in its comment; there is no free-form dictionary.

`before_route` may rewrite `ctx.body` (set `ctx.body_changed`), add response headers, set
`ctx.fingerprint`, or raise `ProxyError` to reject. It must not do work that grows with prompt
size beyond hashing. `after_response` runs once the response ended (any outcome) and must not
block: schedule anything slow (tokenisation, Redis writes) as a task or in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.prefix.fingerprint import Fingerprint
from app.routing.base import RouteDecision

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from app.admission.gate import Ticket
    from app.hygiene.findings import Finding
    from app.pipeline.prefix_stage import PrefixStageState  # the stage imports this module
    from app.proxy.upstream import UpstreamError


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
    upstream_sent: float | None = None  # the latest attempt's request handed to the upstream client
    failed_attempts: float = 0.0  # seconds spent in attempts that failed and were retried (send -> failure)
    first_byte: float | None = None  # first body byte of a < 400 answer (stream: role chunk ~ engine first token)
    first_token: float | None = None  # first chunk carrying generated text: the client-side TTFT
    last_token: float | None = None
    end: float | None = None


@dataclass
class RequestContext:
    request_id: str
    route: str  # "chat" | "completions" | "messages" (Anthropic) | "passthrough"
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
    admission: Ticket | None = None  # admission's hold (app/admission/gate.py), released at the end
    # admission: called once the request holds a replica (a queued request's room stays taken until)
    placed: Callable[[], None] | None = None
    attempts: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)  # x-prefixgate-* additions
    status: int | None = None
    outcome: str = "ok"  # ok | client_error | upstream_error | midstream_error | client_disconnect
    usage: dict[str, Any] | None = None
    content_chunks: int = 0
    # --- per-stage notes (app/pipeline/request.py lists who writes and who reads each) ---
    hygiene_findings: list[Finding] | None = None  # hygiene stage: the scan's findings (chat, messages)
    prefix: PrefixStageState | None = None  # prefix stage: its notes, once the request was fingerprinted
    span: Span | None = None  # tracing stage: the request's open span, until it is ended
    # set by the relay (app/proxy/relay.py)
    upstream_failure: UpstreamError | None = None  # the stream broke after its first byte
    delivered_before_disconnect: bool = False  # the client left after it had the whole response
    output_text: str | None = None  # choice 0's generated text (n == 1), bounded
    response_id: str | None = None  # Responses API: the id the engine gave this response
    pinned_replica: str | None = None  # Responses API: the replica holding previous_response_id
    ttft_parts: dict[str, float] | None = None  # where a stream's TTFT went (app/proxy/ledger.py)

    def mark_placed(self) -> None:
        """The request holds a replica now (or never will): tell admission, once."""
        placed, self.placed = self.placed, None
        if placed is not None:
            placed()

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
