"""OpenAI Responses, `POST /v1/responses` (docs/agents-responses.md): read as the chat body vLLM
converts it to; a stored answer pins later turns (`previous_response_id`) to its replica."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.dialects.base import ChatScanner, Dialect, EngineFacts, WholeAnswer
from app.dialects.chat import scan_chat_body
from app.dialects.validation import bad
from app.hygiene.rewrite_responses import apply_responses_rewrites
from app.prefix.convert_responses import convert, responses_prompt_input
from app.proxy.observer import MAX_OUTPUT_CHARS
from app.proxy.responses_shape import ResponsesShape, chat_usage, output_text

if TYPE_CHECKING:
    from app.hygiene.findings import DynamicLine, Finding
    from app.hygiene.rewrite import RewriteOptions, RewriteResult
    from app.prefix.prompt import PromptInput
    from app.proxy.shape import StreamShape


def responses_view(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body as the chat body the engine renders (messages + tools), for the scan."""
    converted = convert(body)
    view: dict[str, Any] = {"messages": converted.messages}
    if converted.tools:
        view["tools"] = converted.tools
    return view


class Responses(Dialect):
    name = "responses"
    path = "/v1/responses"
    stores_responses = True
    body_session_keys = frozenset({"prompt_cache_key"})

    def validate(self, body: dict[str, Any]) -> None:
        items = body.get("input")
        if items is None:
            raise bad("'input' is a required property", "input", "missing_required_parameter")
        if not isinstance(items, (str, list)):
            raise bad("'input' must be a string or a list of input items", "input")
        for key in ("instructions", "previous_response_id"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise bad(f"'{key}' must be a string", key)

    def previous_response_id(self, body: dict[str, Any]) -> str | None:
        previous = body.get("previous_response_id")
        return previous if isinstance(previous, str) else None

    def prompt_input(self, body: dict[str, Any], engine: EngineFacts) -> PromptInput | None:
        # converted as the engine converts it (app/prefix/convert_responses.py)
        return responses_prompt_input(body, engine.response_history, engine.engine_tool_dump())

    def hygiene_scan(self, tenant: str, body: dict[str, Any],
                     scanner: ChatScanner) -> tuple[list[Finding], list[DynamicLine]]:
        return scan_chat_body(tenant, responses_view(body), scanner)

    def rewrite(self, body: dict[str, Any], lines: Sequence[DynamicLine], options: RewriteOptions) -> RewriteResult:
        return apply_responses_rewrites(body, lines, options)

    def stream_shape(self) -> StreamShape:
        return ResponsesShape()

    def whole_answer(self, payload: dict[str, Any]) -> WholeAnswer:
        text = output_text(payload)
        response_id = payload.get("id")
        return WholeAnswer(chat_usage(payload.get("usage")), text[:MAX_OUTPUT_CHARS] if text is not None else None,
                           response_id if isinstance(response_id, str) else None)


RESPONSES = Responses()
