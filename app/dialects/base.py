"""What one client API is to the gateway: a `Dialect` (the request side; the answer side's SSE
vocabulary is its `StreamShape`, app/proxy/shape.py).

A dialect answers every question the request path used to ask with `route == "..."`: how its body
is parsed and checked, what prompt the engine renders from it (the fingerprint's input), what the
hygiene scan reads and how a rewrite is applied, the shape of its stream and of its errors, and
the few facts that change a step (a stream that reports usage only when asked, a stored response
that pins later turns, Anthropic's header names). The registry (app/dialects/__init__.py) maps
paths to dialects; a new API is one module here and one line there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from app.dialects.validation import check_common, parse_object
from app.errors import ProxyError, error_body

if TYPE_CHECKING:
    from app.config import SessionKeySource
    from app.hygiene.findings import DynamicLine, Finding, ToolsSignature
    from app.hygiene.rewrite import RewriteOptions, RewriteResult
    from app.prefix.convert_responses import ResponseHistory
    from app.prefix.prompt import PromptInput
    from app.prefix.tool_dump import ToolDump
    from app.proxy.shape import StreamShape


def strips_billing_header(engine: ToolDump) -> bool:
    """Whether `engine` drops Claude Code's billing header before tokenising (the block on
    /v1/messages, a system text's first line on every route): vLLM 0.32 does, SGLang does not
    (docs/agents-apis.md). The prefix stage (for its fleet) and `prefixgate lint` (for `--engine`)
    both ask here."""
    return engine == "vllm"


class EngineFacts(Protocol):
    """What the fingerprint needs to know of the engine to render a body as it does (the prefix
    stage answers, app/pipeline/prefix_stage.py); each is asked only by the dialects it matters to."""

    response_history: ResponseHistory

    def engine_strips_billing(self) -> bool: ...
    def system_first(self) -> bool: ...
    def engine_tool_dump(self) -> ToolDump: ...


class ChatScanner(Protocol):
    """The hygiene stage's scan of a chat body (app/pipeline/hygiene_stage.py), which a dialect
    calls on the chat body the engine renders from its own."""

    def system_first(self) -> bool: ...
    def scan_chat(self, tenant: str, body: dict[str, Any], skip_billing_line: bool = False,
                  places: dict[int, str] | None = None) -> tuple[list[Finding], list[DynamicLine],
                                                                 ToolsSignature | None]: ...


@dataclass(frozen=True)
class WholeAnswer:
    """What a whole (non-streamed) 200 answer tells the gateway, in the chat names."""

    usage: dict[str, Any] | None
    text: str | None = None  # choice 0's generated text, untruncated
    response_id: str | None = None  # Responses API: the id the engine gave it


class Dialect:
    """One client API. Subclasses set the attributes and override what differs."""

    name: str = "passthrough"  # the `route` label of metrics and spans
    path: str | None = None  # the POST path it serves (None: any other /v1 path)
    operation: str | None = None  # GenAI `gen_ai.operation.name` (None: the name)
    parses: bool = True  # the body is parsed, checked and taken through every step
    anthropic: bool = False  # Anthropic's error body and rate-limit header names
    asks_usage: bool = False  # a stream reports usage only when the client asks (stream_options)
    stores_responses: bool = False  # the engine may store the answer; later turns name it by id
    engine_metrics: bool = False  # vLLM may add its per-request `metrics` to the answer (docs/ttft-ledger.md)
    continues_answers: bool = False  # the engine can continue a broken answer (app/proxy/migrate.py)
    routed_by_model: bool = False  # a passthrough routed to a replica serving the body's `model`
    # its OpenAI choices are chat messages (`delta`/`message`: a role chunk, tool calls, reasoning),
    # not completion `text`: what migration reads back and continues (app/proxy/migrate.py)
    chat_choices: bool = False
    # SGLang's request model for it keeps `cache_salt` and `extra_key` (app/prefix/namespace.py)
    sglang_salts: bool = True
    # the `routing.session_keys` body sources its bodies carry (app/routing/session_keys.py)
    body_session_keys: frozenset[SessionKeySource] = frozenset()

    # ------------------------------------------------------------------ request
    def parse(self, raw: bytes) -> dict[str, Any]:
        """The body as a JSON object, checked; ProxyError(400) saying what is wrong."""
        body = parse_object(raw)
        check_common(body, self.validate)
        return body

    def validate(self, body: dict[str, Any]) -> None:
        """The API's own required members (after `model`, before the common typed fields)."""

    def previous_response_id(self, body: dict[str, Any]) -> str | None:
        """The stored response this request continues (Responses API), else None."""
        return None

    def prompt_input(self, body: dict[str, Any], engine: EngineFacts) -> PromptInput | None:
        """The prompt the engine renders from `body`, for the fingerprint; None: nothing to hash."""
        return None

    def hygiene_scan(self, tenant: str, body: dict[str, Any],
                     scanner: ChatScanner) -> tuple[list[Finding], list[DynamicLine]] | None:
        """Findings and the dynamic lines a rewrite may move; None: no scan (cache salt only)."""
        return None

    def rewrite(self, body: dict[str, Any], lines: Sequence[DynamicLine], options: RewriteOptions) -> RewriteResult:
        raise NotImplementedError(f"{self.name} has no hygiene rewrite")

    def strip_billing(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """`body` without Claude Code's billing header where its body carries it; None: unchanged."""
        return None

    # ------------------------------------------------------------------ answer
    def stream_shape(self) -> StreamShape:
        """The SSE vocabulary of its streamed answer (one per stream)."""
        raise NotImplementedError(f"{self.name} is relayed as bytes")

    def whole_answer(self, payload: dict[str, Any]) -> WholeAnswer:
        """Usage, text (and id) of a whole 200 JSON answer."""
        return WholeAnswer(None)

    def error_body(self, err: ProxyError) -> bytes:
        """The error body its clients parse (OpenAI's shape unless the dialect says otherwise)."""
        return error_body(err)

    def model_of(self, raw: bytes) -> str | None:
        """The `model` a passthrough body names, when it is routed by it; else None."""
        if not self.routed_by_model:
            return None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) and model else None

    def __repr__(self) -> str:
        return f"<dialect {self.name} {self.path or '*'}>"


class Passthrough(Dialect):
    """Any other /v1 path: bytes in, bytes out, routed without a prompt."""

    parses = False


PASSTHROUGH = Passthrough()
