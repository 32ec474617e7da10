"""Anthropic Messages, `POST /v1/messages` (docs/agents-apis.md): read as the chat body the
engine converts it to, streamed in Anthropic's events, refused in Anthropic's error shape; its
`/v1/messages/count_tokens` is a passthrough routed by the body's model, in the same error shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.dialects.base import ChatScanner, Dialect, EngineFacts, Passthrough, WholeAnswer
from app.dialects.validation import bad, check_messages
from app.errors import ProxyError, anthropic_error_body
from app.hygiene.findings import billing_block_finding, inline_system_findings, reusable_after_head
from app.hygiene.rewrite import strip_billing_block
from app.hygiene.rewrite_messages import apply_messages_rewrites
from app.prefix.convert_messages import chat_view, inline_system_indexes, system_sources
from app.prefix.prompt import messages_prompt_input
from app.proxy.anthropic_shape import AnthropicShape, openai_usage, output_text
from app.proxy.observer import MAX_OUTPUT_CHARS

if TYPE_CHECKING:
    from app.hygiene.findings import DynamicLine, Finding
    from app.hygiene.rewrite import RewriteOptions, RewriteResult
    from app.prefix.prompt import PromptInput
    from app.proxy.shape import StreamShape


class Messages(Dialect):
    name = "messages"
    path = "/v1/messages"
    anthropic = True
    sglang_salts = False  # SGLang's Messages request model has neither field and drops them
    body_session_keys = frozenset({"metadata_user_id"})

    def validate(self, body: dict[str, Any]) -> None:
        check_messages(body)
        system = body.get("system")
        if system is not None and not isinstance(system, (str, list)):
            raise bad("'system' must be a string or a list of content blocks", "system")

    def prompt_input(self, body: dict[str, Any], engine: EngineFacts) -> PromptInput | None:
        return messages_prompt_input(body, strip_billing=engine.engine_strips_billing(),
                                     merge_inline_system=engine.system_first(), tool_dump=engine.engine_tool_dump())

    def hygiene_scan(self, tenant: str, body: dict[str, Any],
                     scanner: ChatScanner) -> tuple[list[Finding], list[DynamicLine]]:
        """Findings and dynamic lines on the chat body the engine renders from it (billing blocks
        dropped: that header is its own finding), named by their place in `body`; the lines'
        offsets are the rendered system text's, which app/hygiene/rewrite_messages.py maps back
        onto the blocks."""
        billing = billing_block_finding(body)
        merge = scanner.system_first()
        view = chat_view(body, strip_billing=True, merge_inline_system=merge)
        system_at = [i for i, m in enumerate(view["messages"]) if m.get("role") == "system"]
        places = dict(zip(system_at, system_sources(body, True, merge), strict=False))
        findings, lines, sig = scanner.scan_chat(tenant, view, places=places)
        if merge:
            findings += inline_system_findings(inline_system_indexes(body),
                                               reusable_after_head(view, sig.chars if sig else 0))
        return ([billing] if billing else []) + findings, lines

    def rewrite(self, body: dict[str, Any], lines: Sequence[DynamicLine], options: RewriteOptions) -> RewriteResult:
        return apply_messages_rewrites(body, lines, options)

    def strip_billing(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return strip_billing_block(body)

    def stream_shape(self) -> StreamShape:
        return AnthropicShape()

    def whole_answer(self, payload: dict[str, Any]) -> WholeAnswer:
        text = output_text(payload)  # Anthropic's usage meaning, mapped to the chat names
        return WholeAnswer(openai_usage(payload.get("usage")), text[:MAX_OUTPUT_CHARS] if text is not None else None)

    def error_body(self, err: ProxyError) -> bytes:
        return anthropic_error_body(err)


class CountTokens(Passthrough):
    """`POST /v1/messages/count_tokens`: relayed as bytes to a replica serving its model."""

    path = "/v1/messages/count_tokens"
    anthropic = True
    routed_by_model = True

    def error_body(self, err: ProxyError) -> bytes:
        return anthropic_error_body(err)


MESSAGES = Messages()
COUNT_TOKENS = CountTokens()
