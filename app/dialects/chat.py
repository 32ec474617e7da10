"""OpenAI chat completions, `POST /v1/chat/completions`: the dialect every other one is read as."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.dialects.base import ChatScanner, Dialect, EngineFacts, WholeAnswer
from app.dialects.validation import check_messages
from app.hygiene.findings import billing_header_finding
from app.hygiene.rewrite import apply_rewrites, strip_billing_header
from app.prefix.prompt import prompt_input
from app.proxy.observer import MAX_OUTPUT_CHARS
from app.proxy.openai_shape import shape_for

if TYPE_CHECKING:
    from app.hygiene.findings import DynamicLine, Finding
    from app.hygiene.rewrite import RewriteOptions, RewriteResult
    from app.prefix.prompt import PromptInput
    from app.proxy.shape import StreamShape


def scan_chat_body(tenant: str, body: dict[str, Any], scanner: ChatScanner) -> tuple[list[Finding], list[DynamicLine]]:
    """The billing header, dynamic head lines and tool order of a chat body."""
    billing = billing_header_finding(body)
    findings, lines, _ = scanner.scan_chat(tenant, body, skip_billing_line=billing is not None)
    return ([billing] if billing else []) + findings, lines


def choice_text(payload: dict[str, Any], member: str) -> str | None:
    """Choice 0's generated text of a whole OpenAI answer (`member`: "message" or "text"),
    bounded; None unless there is exactly one choice."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if member == "message":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    return text[:MAX_OUTPUT_CHARS] if isinstance(text, str) else None


def openai_whole(payload: dict[str, Any], member: str) -> WholeAnswer:
    usage = payload.get("usage")
    return WholeAnswer(usage if isinstance(usage, dict) else None, choice_text(payload, member))


class Chat(Dialect):
    name = "chat"
    engine_metrics = True
    continues_answers = True
    chat_choices = True
    body_session_keys = frozenset({"prompt_cache_key"})
    path = "/v1/chat/completions"
    operation = "chat"
    asks_usage = True

    def validate(self, body: dict[str, Any]) -> None:
        check_messages(body)

    def prompt_input(self, body: dict[str, Any], engine: EngineFacts) -> PromptInput | None:
        return prompt_input("chat", body, strip_billing=engine.engine_strips_billing(),
                            tool_dump=engine.engine_tool_dump())

    def hygiene_scan(self, tenant: str, body: dict[str, Any],
                     scanner: ChatScanner) -> tuple[list[Finding], list[DynamicLine]]:
        return scan_chat_body(tenant, body, scanner)

    def rewrite(self, body: dict[str, Any], lines: Sequence[DynamicLine], options: RewriteOptions) -> RewriteResult:
        return apply_rewrites(body, lines, options)

    def strip_billing(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return strip_billing_header(body)

    def stream_shape(self) -> StreamShape:
        return shape_for("chat")

    def whole_answer(self, payload: dict[str, Any]) -> WholeAnswer:
        return openai_whole(payload, "message")


CHAT = Chat()
