"""Timed requests against an OpenAI-compatible endpoint (httpx), plus its small side endpoints.

TTFT is measured as a client sees it: from sending the request to the first SSE event that
carries generated text (content, reasoning, reasoning_content, tool_calls, or completions text).
The role-only first chunk is not text. Completion and prompt token counts come from the final
usage chunk (`stream_options.include_usage`), never from counting events: servers batch deltas.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from app.engines.request_metrics import EngineTiming, parse_metrics
from app.proxy.shape import count, usage_counts


class ProbeError(Exception):
    """A request that did not produce a complete answer. `status` is None for transport errors."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Endpoint:
    """Where the engine lives. `root` has no /v1: /metrics, /health, /tokenize hang off it."""

    root: str
    api_key: str | None = None

    @classmethod
    def from_url(cls, url: str, api_key: str | None = None) -> Endpoint:
        root = url.strip().rstrip("/")
        if "://" not in root:
            root = "http://" + root
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        return cls(root, api_key)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def v1(self, path: str) -> str:
        return f"{self.root}/v1{path}"


@dataclass(frozen=True)
class ProbeResult:
    total_s: float  # send → end of stream
    ttft_s: float | None  # send → first event with generated text
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, when the engine reports it
    text_event_times: tuple[float, ...]  # seconds since send, one per text-carrying event
    engine_timing: EngineTiming | None = None  # vLLM --enable-per-request-metrics, when it reports them


def _has_text(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(
        delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content") or delta.get("tool_calls")
    )


def chat_body(model: str, content: str, max_tokens: int, ignore_eos: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True  # forced length: the two points must produce what they ask for
    return body


async def stream_chat(
    client: httpx.AsyncClient, endpoint: Endpoint, model: str, content: str, max_tokens: int,
    ignore_eos: bool = True,
) -> ProbeResult:
    """One streamed chat completion, timed. Raises ProbeError on HTTP or in-stream errors."""
    body = chat_body(model, content, max_tokens, ignore_eos)
    t0 = time.perf_counter()
    ttft: float | None = None
    times: list[float] = []
    usage: dict[str, Any] = {}
    timing: EngineTiming | None = None
    try:
        async with client.stream("POST", endpoint.v1("/chat/completions"), json=body,
                                 headers=endpoint.headers) as response:
            if response.status_code != 200:
                raw = await response.aread()
                raise ProbeError(_error_message(raw, response.status_code), response.status_code)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if not isinstance(event, dict):  # an event that is no object carries nothing we read
                    continue
                if "error" in event:
                    raise ProbeError(_error_text(event["error"]), 500)
                now = time.perf_counter() - t0
                choices = event.get("choices")
                if isinstance(choices, list) and any(_has_text(c) for c in choices):
                    times.append(now)
                    if ttft is None:
                        ttft = now
                if isinstance(event.get("usage"), dict) and event["usage"]:
                    usage = event["usage"]
                timing = parse_metrics(event.get("metrics")) or timing
    except httpx.HTTPError as exc:
        raise ProbeError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
    total = time.perf_counter() - t0
    usage = usage_counts(usage) or {}  # a count that is no non-negative int is unknown (absent)
    return ProbeResult(
        total_s=total,
        ttft_s=ttft,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_tokens=usage.get("prompt_tokens_details", {}).get("cached_tokens"),
        text_event_times=tuple(times),
        engine_timing=timing,
    )


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _error_message(raw: bytes, status: int) -> str:
    try:
        payload = json.loads(raw)
    except ValueError:
        return f"HTTP {status}: {raw[:200].decode(errors='replace')}"
    if isinstance(payload, dict) and "error" in payload:
        return f"HTTP {status}: {_error_text(payload['error'])}"
    if isinstance(payload, dict) and "detail" in payload:
        return f"HTTP {status}: {payload['detail']}"
    return f"HTTP {status}: {str(payload)[:200]}"


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_model_len: int | None


async def list_models(client: httpx.AsyncClient, endpoint: Endpoint) -> list[ModelInfo]:
    """GET /v1/models; vLLM (and prefixgate) add max_model_len to each entry."""
    try:
        response = await client.get(endpoint.v1("/models"), headers=endpoint.headers)
    except httpx.HTTPError as exc:
        raise ProbeError(f"GET /v1/models: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise ProbeError(f"GET /v1/models: {_error_message(response.content, response.status_code)}",
                         response.status_code)
    try:
        payload = response.json()
    except ValueError:
        raise ProbeError("GET /v1/models: the answer is no JSON") from None
    data = payload.get("data") if isinstance(payload, dict) else None
    models = []
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and _model_id(entry.get("id")):
            limit = count(entry.get("max_model_len"))
            models.append(ModelInfo(entry["id"], limit or None))
    return models


def _model_id(value: Any) -> bool:
    """An id a request can name: a non-empty string that is text (a lone surrogate is not)."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def health(client: httpx.AsyncClient, endpoint: Endpoint) -> bool | None:
    """True/False from the engine's /health (prefixgate: /readyz); None when neither exists."""
    for path in ("/health", "/readyz"):
        try:
            response = await client.get(f"{endpoint.root}{path}", headers=endpoint.headers)
        except httpx.HTTPError:
            return False
        if response.status_code == 404:
            continue
        return response.status_code == 200
    return None


async def tokenize_count(client: httpx.AsyncClient, endpoint: Endpoint, model: str, content: str) -> int | None:
    """Prompt tokens of a one-message chat via the engine's POST /tokenize (vLLM, SGLang), if any."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "add_generation_prompt": True}
    try:
        response = await client.post(f"{endpoint.root}/tokenize", json=body, headers=endpoint.headers)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        payload = response.json()
    except ValueError:
        return None
    counted = count(payload.get("count")) if isinstance(payload, dict) else None
    if counted is not None:
        return counted
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    return len(tokens) if isinstance(tokens, list) else None
