"""Response bodies and SSE events, byte-shaped like vLLM 0.32/0.33 (or SGLang 0.5 for that flavor).

vLLM (real-vllm.md, engine-facts E.1/E.2): the first chat event is `delta: {role: "assistant",
content: ""}`; content events carry `delta.content` (`reasoning` for reasoning text; SGLang says
`reasoning_content`); the last content event carries `finish_reason` and `stop_reason`; with
`include_usage` a final event with `choices: []` and `usage` (+ `prompt_tokens_details.cached_tokens`
when enabled); then `data: [DONE]`. Completions have no role event and use `choices[].text`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Shaper:
    """Builds the events of one response."""

    def __init__(self, kind: str, model: str, flavor: str) -> None:
        self.kind = kind
        self.model = model
        self.flavor = flavor
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())
        self.object_chunk = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self.reasoning_key = "reasoning_content" if flavor == "sglang" else "reasoning"

    def usage(self, prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                               "completion_tokens": completion}
        if cached is not None:
            out["prompt_tokens_details"] = {"cached_tokens": cached}
        return out

    def _chunk(self, choice: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "object": self.object_chunk, "created": self.created,
                               "model": self.model, "choices": [choice]}
        if usage is not None:
            obj["usage"] = usage
        return sse(obj)

    def role_event(self, usage: dict[str, Any] | None = None) -> bytes:
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}, usage)

    def delta_event(self, text: str, reasoning: bool = False, finish_reason: str | None = None,
                    usage: dict[str, Any] | None = None) -> bytes:
        if self.kind == "chat":
            delta = {self.reasoning_key: text} if reasoning else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            if self.flavor == "sglang":
                choice["matched_stop"] = None
            else:
                choice["stop_reason"] = None
        return self._chunk(choice, usage)

    def finish_event(self, finish_reason: str, usage: dict[str, Any] | None = None) -> bytes:
        """An empty delta that only closes the choice (used when no text is left to send)."""
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}
        choice["matched_stop" if self.flavor == "sglang" else "stop_reason"] = None
        return self._chunk(choice, usage)

    def usage_event(self, usage: dict[str, Any]) -> bytes:
        return sse({"id": self.id, "object": self.object_chunk, "created": self.created,
                    "model": self.model, "choices": [], "usage": usage})

    def error_event(self, message: str, code: int = 500) -> bytes:
        err: dict[str, Any] = {"message": message, "type": "InternalServerError", "param": None, "code": code}
        if self.flavor == "sglang":
            err = {"object": "error", **err}
        return sse({"error": err})

    def full_response(self, content: str, reasoning: str | None, finish_reason: str,
                      usage: dict[str, Any]) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None,
                                       "annotations": None, "audio": None, "function_call": None,
                                       "tool_calls": [], self.reasoning_key: reasoning}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason,
                      "prompt_logprobs": None}
            obj = "text_completion"
        choice["matched_stop" if self.flavor == "sglang" else "stop_reason"] = None
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage, "prompt_logprobs": None, "kv_transfer_params": None}
