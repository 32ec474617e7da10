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


SYSTEM_FINGERPRINT = "vllm-0.33.0-sim"


class Shaper:
    """Builds the events of one response. Key order and null fields follow real vLLM 0.32
    captures (tests/fixtures/real_vllm); the SGLang flavor drops vLLM's extras and says
    `matched_stop` / `reasoning_content`."""

    def __init__(self, kind: str, model: str, flavor: str) -> None:
        self.kind = kind
        self.model = model
        self.flavor = flavor
        self.vllm = flavor != "sglang"
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        # SGLang's ids are its request id: 32 hex digits, no OpenAI-style prefix
        self.id = prefix + uuid.uuid4().hex[:16] if self.vllm else uuid.uuid4().hex
        self.created = int(time.time())
        self.object_chunk = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self.reasoning_key = "reasoning" if self.vllm else "reasoning_content"

    def usage(self, prompt: int, completion: int, cached: int | None, created: int | None = None,
              final_response: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                               "completion_tokens": completion}
        if cached is not None:
            details: dict[str, Any] = {"cached_tokens": cached}
            if self.vllm and self.kind == "chat" and created is not None:
                details["created_cache_tokens"] = created
                if final_response:
                    details["multimodal_tokens"] = None
            out["prompt_tokens_details"] = details
        if final_response and self.vllm:
            out["completion_tokens_details"] = None
        if not self.vllm and self.kind == "chat" and not final_response:
            out["reasoning_tokens"] = 0
            out["completion_tokens_details"] = None
        return out

    def _chunk(self, choice: dict[str, Any], usage: dict[str, Any] | None = None,
               top: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "object": self.object_chunk, "created": self.created,
                               "model": self.model, "choices": [choice]}
        if usage is not None:
            obj["usage"] = usage
        if top:
            obj.update(top)
        return sse(obj)

    def role_event(self, usage: dict[str, Any] | None = None) -> bytes:
        if self.vllm:
            return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}, usage, {"prompt_token_ids": None, "prompt_text": None})
        return self._chunk({"index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None, "matched_stop": None}, usage)

    def _choice(self, text: str, reasoning: bool, finish_reason: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = ({self.reasoning_key: text} if reasoning else {"content": text}) \
                if text or finish_reason is None else {}
            if not self.vllm and not reasoning:  # SGLang: every chat delta says reasoning_content null
                delta = {"reasoning_content": None, **delta}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason}
            if finish_reason is not None or not self.vllm:
                choice["stop_reason" if self.vllm else "matched_stop"] = None
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            if self.vllm:
                choice["stop_reason"] = None
                choice["prompt_token_ids"] = None
            elif finish_reason is not None:
                choice["matched_stop"] = None
        if self.vllm:
            choice["token_ids"] = None
        return choice

    def delta_event(self, text: str, reasoning: bool = False, finish_reason: str | None = None,
                    usage: dict[str, Any] | None = None) -> bytes:
        return self._chunk(self._choice(text, reasoning, finish_reason), usage)

    def finish_event(self, finish_reason: str, usage: dict[str, Any] | None = None) -> bytes:
        """An empty delta that only closes the choice (used when no text is left to send)."""
        return self._chunk(self._choice("", False, finish_reason), usage)

    def usage_event(self, usage: dict[str, Any], metrics: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "object": self.object_chunk, "created": self.created,
                               "model": self.model, "choices": [], "usage": usage}
        if self.vllm:
            obj["system_fingerprint"] = SYSTEM_FINGERPRINT
        if metrics is not None:
            obj["metrics"] = metrics  # vLLM --enable-per-request-metrics: the last member
        return sse(obj)

    def error_event(self, message: str, code: int = 500) -> bytes:
        err: dict[str, Any] = {"message": message, "type": "InternalServerError", "param": None, "code": code}
        if not self.vllm:
            err = {"object": "error", **err}
        return sse({"error": err})

    def full_response(self, content: str, reasoning: str | None, finish_reason: str,
                      usage: dict[str, Any], metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None,
                                       "annotations": None, "audio": None, "function_call": None,
                                       self.reasoning_key: reasoning}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        if not self.vllm:
            choice["matched_stop"] = None
            return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                    "choices": [choice], "usage": usage}
        choice["stop_reason"] = None
        if self.kind != "chat":
            choice["prompt_logprobs"] = None
            choice["prompt_token_ids"] = None
        choice["token_ids"] = None
        choice["routed_experts"] = None
        out: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                               "choices": [choice], "service_tier": None,
                               "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage}
        if self.kind == "chat":
            out.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        out.update(kv_transfer_params=None, ec_transfer_params=None, metrics=metrics)
        return out
