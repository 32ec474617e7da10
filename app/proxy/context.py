"""The per-request context that flows through the pipeline, and the stage seam.

Three parts (docs/pipeline.md, "The request context"): the arrival facts (`Arrival`, immutable,
written at step 0), the notes each step writes (`HygieneNote`, `PrefixStageState`, `TraceNote`,
`AdmissionNote`, the fingerprint, the pick: one typed owner each, named in its comment), and the
outcome the relay writes (`Outcome`, changed only through its methods). Readers use the
`RequestContext` properties (`ctx.body`, `ctx.status`, ...), which derive from those parts; there
is no free-form dictionary. The table of steps is in app/pipeline/request.py.

`before_route` may write its own note (the hygiene stage may rewrite the body into its note), or
raise `ProxyError` to reject. It must not do work that grows with prompt
size beyond hashing. `after_response` runs once the response ended (any outcome) and must not
block: schedule anything slow (tokenisation, Redis writes) as a task or in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.errors import ProxyError
from app.proxy.shape import usage_counts

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from app.admission.gate import Ticket
    from app.dialects.base import Dialect
    from app.engines.request_metrics import EngineTiming
    from app.hygiene.findings import Finding
    from app.prefix.fingerprint import ChainTip, Fingerprint, PromptInput
    from app.prefix.tracker import Observation
    from app.proxy.upstream import UpstreamError
    from app.routing.base import RouteDecision

__all__ = ["AdmissionNote", "Arrival", "HygieneNote", "Outcome", "PrefixStageState", "ProxyError", "RequestContext",
           "RequestHook", "TraceNote", "Timings"]


@dataclass
class PrefixStageState:
    """What the prefix stage (app/pipeline/prefix_stage.py, its only writer) knows about one
    request (ctx.prefix), written in this order."""

    input: PromptInput  # the prompt as extracted from the body
    routed_blocks: int  # leading blocks the router saw (the fingerprint may have been partial)
    routed_complete: bool  # the router saw the whole prompt's chain
    pending: asyncio.Task[ChainTip | None] | None = None  # finishing the chain while in flight
    matched: int | None = None  # leading blocks resident on the chosen replica when sent
    available: int | None = None  # the most leading blocks resident on any replica (with matched)
    predicted_tokens: int | None = None  # cached tokens predicted for this request
    observation: Observation | None = None  # the tracker's continuity/diagnosis (last)


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


@dataclass(frozen=True)
class Arrival:
    """What the request arrived as (step 0, the API adapter or the EPP exchange); never changes."""

    request_id: str
    dialect: Dialect  # the client API (app/dialects/): chat, completions, responses, messages, passthrough
    path: str
    tenant: str
    headers: Mapping[str, str]  # incoming, lower-case names
    body: dict[str, Any]  # as the client sent it, parsed ({} for a passthrough)
    model: str | None
    stream: bool
    session_id: str | None = None


@dataclass
class HygieneNote:
    """Step 2's notes; written only by the hygiene stage (app/pipeline/hygiene_stage.py)."""

    salt: str | None = None  # cache_salt sent upstream (tenant isolation), if any
    findings: list[Finding] | None = None  # the scan's findings
    body: dict[str, Any] | None = None  # the body after a rewrite that changed it
    headers: dict[str, str] = field(default_factory=dict)  # x-prefixgate-hygiene / -rewrites


@dataclass
class TraceNote:
    """Step 3b's notes; written only by the tracing stage (app/pipeline/tracing_stage.py)."""

    span: Span | None  # the request's open span, until it is ended (8b)
    headers: dict[str, str]  # the span's context (traceparent), sent upstream with the request


@dataclass
class AdmissionNote:
    """Step 3c's notes; written only by admission's step (app/pipeline/request.py `_admission`)."""

    ticket: Ticket | None = None  # the tenant's limit hold (app/admission/gate.py), released at the end
    headers: dict[str, str] = field(default_factory=dict)  # the rate-limit headers
    # called once the request holds a replica (a queued request's room stays taken until then)
    placed: Callable[[], None] | None = None


@dataclass
class Outcome:
    """How the request ended, as the relay saw it (app/proxy/relay.py; the EPP exchange is the
    relay of EPP mode). Every change goes through a method here, so the rules that turn a status,
    a broken stream or a departed client into `outcome` live in one place."""

    status: int | None = None
    outcome: str = "ok"  # ok | client_error | upstream_error | midstream_error | client_disconnect
    usage: dict[str, Any] | None = None  # in the chat names
    output_text: str | None = None  # choice 0's generated text (n == 1), bounded
    response_id: str | None = None  # Responses API: the id the engine gave this response
    upstream_failure: UpstreamError | None = None  # the stream broke after its first byte
    delivered_before_disconnect: bool = False  # the client left after it had the whole response
    content_chunks: int = 0  # chunks that carried generated text (the clock's count, step 9)
    ttft_parts: dict[str, float] | None = None  # where a stream's TTFT went (app/proxy/ledger.py)
    engine_prefill_s: float | None = None  # the engine's own prefill time (vLLM per-request metrics), streamed or not
    shared_prefill_tokens: int | None = None  # others' predicted prefill beside this one's (app/routing/load.py)

    def answered(self, status: int) -> None:
        """The upstream's status line (or the data plane's response headers) arrived."""
        self.status = status

    def observed(self, usage: dict[str, Any] | None, text: str | None = None, response_id: str | None = None) -> None:
        """What the whole answer said (a stream's observer, or a buffered JSON body); a count
        the engine sent malformed is left out of the usage every metric reads."""
        self.usage = usage_counts(usage)
        if text is not None:
            self.output_text = text
        if response_id is not None:
            self.response_id = response_id

    def settled(self) -> None:
        """The answer ended: a 4xx the engine gave is the client's error."""
        if self.status is not None and 400 <= self.status < 500 and self.outcome == "ok":
            self.outcome = "client_error"

    def broke(self, failure: UpstreamError | None = None) -> None:
        """The stream stopped before its end, or said it failed (`failure`: why, when known)."""
        self.outcome = "midstream_error"
        if failure is not None:
            self.upstream_failure = failure

    def upstream_failed(self) -> None:
        """The replica failed after the response was committed (nothing can be retried)."""
        self.outcome = "upstream_error"

    def refused(self, status: int) -> None:
        """The gateway answered with its own error of `status` (nothing came from a replica)."""
        self.status = status
        self.outcome = "client_error" if status < 500 else "upstream_error"

    def client_left(self) -> None:
        """The client went away before the answer was whole (499 unless a status was sent)."""
        self.outcome = "client_disconnect"
        self.status = self.status or 499

    def ledgered(self, parts: dict[str, float] | None) -> None:
        """The stream's TTFT split into its measured parts (absent parts were not measured)."""
        self.ttft_parts = parts

    def prefilled_beside(self, tokens: int) -> None:
        """The first byte came; `tokens`: the other requests' predicted prefill tokens on the same
        replica whose wait for a first byte overlapped this one's."""
        self.shared_prefill_tokens = tokens

    def engine_timed(self, timing: EngineTiming | None) -> None:
        """The engine's own report of this request (None: it sent none)."""
        self.engine_prefill_s = timing.prefill_s if timing is not None else None

    def delivered_then_left(self) -> None:
        """The client went away after it had the whole answer: still delivered."""
        self.delivered_before_disconnect = True


@dataclass
class RequestContext:
    """One request: its arrival facts, the notes each step writes (one owner each, listed in
    app/pipeline/request.py), and its outcome. Readers use the properties; writers their note."""

    arrival: Arrival
    timings: Timings  # stamped by the stream clock (app/proxy/clock.py)
    pinned_replica: str | None = None  # step 1b: the replica holding previous_response_id (Responses)
    hygiene: HygieneNote = field(default_factory=HygieneNote)  # step 2
    fingerprint: Fingerprint | None = None  # step 3, the prefix stage: what the router reads
    prefix: PrefixStageState | None = None  # step 3 and 8, the prefix stage's own notes
    trace: TraceNote | None = None  # step 3b
    admission: AdmissionNote = field(default_factory=AdmissionNote)  # step 3c
    decision: RouteDecision | None = None  # steps 5-7, the attempt loop: the latest attempt's pick
    attempts: int = 0  # steps 5-7, the attempt loop
    result: Outcome = field(default_factory=Outcome)  # step 7, the relay

    # ------------------------------------------------------------------ arrival facts
    @property
    def request_id(self) -> str:
        return self.arrival.request_id

    @property
    def dialect(self) -> Dialect:
        return self.arrival.dialect

    @property
    def route(self) -> str:
        """The `route` label of metrics and spans: the dialect's name."""
        return self.arrival.dialect.name

    @property
    def path(self) -> str:
        return self.arrival.path

    @property
    def tenant(self) -> str:
        return self.arrival.tenant

    @property
    def headers(self) -> Mapping[str, str]:
        """The client's headers."""
        return self.arrival.headers

    @property
    def model(self) -> str | None:
        return self.arrival.model

    @property
    def stream(self) -> bool:
        return self.arrival.stream

    @property
    def session_id(self) -> str | None:
        return self.arrival.session_id

    # ------------------------------------------------------------------ derived from the notes
    @property
    def body(self) -> dict[str, Any]:
        """The body as it is forwarded: the client's, or the hygiene rewrite's."""
        rewritten = self.hygiene.body
        return rewritten if rewritten is not None else self.arrival.body

    @property
    def body_changed(self) -> bool:
        return self.hygiene.body is not None

    @property
    def salt(self) -> str | None:
        return self.hygiene.salt

    @property
    def upstream_headers(self) -> Mapping[str, str]:
        """The client's headers plus the trace context sent upstream."""
        if self.trace is None or not self.trace.headers:
            return self.arrival.headers
        return {**self.arrival.headers, **self.trace.headers}

    @property
    def response_headers(self) -> dict[str, str]:
        """The gateway's own response headers: hygiene's, then admission's."""
        return {**self.hygiene.headers, **self.admission.headers}

    def mark_placed(self) -> None:
        """The request holds a replica now (or never will): tell admission, once."""
        placed, self.admission.placed = self.admission.placed, None
        if placed is not None:
            placed()

    # ------------------------------------------------------------------ the outcome
    @property
    def status(self) -> int | None:
        return self.result.status

    @property
    def outcome(self) -> str:
        return self.result.outcome

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.result.usage

    @property
    def output_text(self) -> str | None:
        return self.result.output_text

    @property
    def response_id(self) -> str | None:
        return self.result.response_id

    @property
    def upstream_failure(self) -> UpstreamError | None:
        return self.result.upstream_failure

    @property
    def delivered_before_disconnect(self) -> bool:
        return self.result.delivered_before_disconnect

    @property
    def content_chunks(self) -> int:
        return self.result.content_chunks

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
