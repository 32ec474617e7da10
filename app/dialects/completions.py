"""OpenAI completions, `POST /v1/completions`: a raw prompt (no system head to scan: salt only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.dialects.base import Dialect, EngineFacts, WholeAnswer
from app.dialects.chat import openai_whole
from app.dialects.validation import bad
from app.prefix.prompt import prompt_input
from app.proxy.openai_shape import shape_for

if TYPE_CHECKING:
    from app.prefix.prompt import PromptInput
    from app.proxy.shape import StreamShape


class Completions(Dialect):
    name = "completions"
    engine_metrics = True
    continues_answers = True
    body_session_keys = frozenset({"prompt_cache_key"})
    path = "/v1/completions"
    operation = "text_completion"
    asks_usage = True

    def validate(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        if prompt is None:
            raise bad("'prompt' is a required property", "prompt", "missing_required_parameter")
        if not isinstance(prompt, (str, list)) or (isinstance(prompt, list) and not prompt):
            raise bad("'prompt' must be a string or a non-empty list", "prompt")

    def prompt_input(self, body: dict[str, Any], engine: EngineFacts) -> PromptInput | None:
        return prompt_input("completions", body, strip_billing=engine.engine_strips_billing(),
                            tool_dump=engine.engine_tool_dump())

    def stream_shape(self) -> StreamShape:
        return shape_for("completions")

    def whole_answer(self, payload: dict[str, Any]) -> WholeAnswer:
        return openai_whole(payload, "text")


COMPLETIONS = Completions()
