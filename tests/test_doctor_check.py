"""The check procedure against a scripted endpoint (httpx.MockTransport): paths the simulator
cannot produce — no /metrics, no /tokenize, a tokenizer whose cost per word grows with length."""

from __future__ import annotations

import json
from typing import Any

import httpx

from app.doctor.check import CheckOptions, run_check

MAX_MODEL_LEN = 4000


def _tokens(content: str) -> int:
    # Convex in the word count: a calibration line fitted on short documents undershoots long
    # ones, so the ladder's top rung overshoots the context limit on its first try.
    words = len(content.split())
    return 10 + words + words * words // 60_000


def _sse(prompt_tokens: int, max_tokens: int) -> str:
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    events += [{"choices": [{"index": 0, "delta": {"content": " tok"}}]} for _ in range(max_tokens)]
    events.append({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


class FakeEngine:
    """An OpenAI-compatible endpoint with /v1/models and /health only: no /metrics, no /tokenize."""

    def __init__(self) -> None:
        self.prompts: list[int] = []
        self.rejected: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake", "max_model_len": MAX_MODEL_LEN}]})
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/chat/completions":
            body: dict[str, Any] = json.loads(request.content)
            n = _tokens(body["messages"][0]["content"])
            if n + body["max_tokens"] > MAX_MODEL_LEN:
                self.rejected.append(n)
                return httpx.Response(400, json={"error": {"message": f"context length is {MAX_MODEL_LEN}"}})
            self.prompts.append(n)
            return httpx.Response(200, text=_sse(n, body["max_tokens"]))
        return httpx.Response(404)


async def test_top_rung_retries_lower_without_tokenize() -> None:
    engine = FakeEngine()
    opts = CheckOptions(url="http://fake/v1", prompt_tokens=500, two_point=False, ladder=True)
    result = await run_check(opts, transport=httpx.MockTransport(engine))
    assert result.measured and result.engine == "unknown"
    assert any("no /metrics" in w for w in result.warnings)
    assert result.counters is None  # no counters, no cached_tokens: timing alone decides
    assert engine.rejected, "the scripted tokenizer should make the first top-rung try overshoot"
    assert result.ladder is not None and not result.ladder.problem
    last = result.ladder_steps[-1]
    assert last.outcome == "ok" and "retried lower" in last.detail
    assert result.ladder.ceiling_tokens is not None
    assert 0.9 * MAX_MODEL_LEN < result.ladder.ceiling_tokens < MAX_MODEL_LEN


async def test_a_failing_two_point_keeps_the_cache_verdict() -> None:
    engine = FakeEngine()

    def flaky(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions" and json.loads(request.content)["max_tokens"] == 320:
            return httpx.Response(503, text="overloaded")
        return engine(request)

    opts = CheckOptions(url="http://fake", prompt_tokens=500, warmups=0, measurements=1)
    result = await run_check(opts, transport=httpx.MockTransport(flaky))
    assert result.measured and result.cache is not None
    assert result.decode is None
    assert any("two-point measurement failed: HTTP 503" in p for p in result.problems)
    assert result.exit_code == 1


async def test_a_tokenize_that_disagrees_with_usage_is_dropped() -> None:
    engine = FakeEngine()
    calls: list[int] = []

    def with_tokenize(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            calls.append(1)
            content = json.loads(request.content)["messages"][0]["content"]
            return httpx.Response(200, json={"count": int(_tokens(content) * 1.1)})  # another tokenizer
        return engine(request)

    opts = CheckOptions(url="http://fake", prompt_tokens=1000, two_point=False, ladder=True)
    result = await run_check(opts, transport=httpx.MockTransport(with_tokenize))
    assert any("/tokenize disagrees" in w for w in result.warnings)
    asked_before_ladder = len(calls)
    assert asked_before_ladder >= 3  # calibration + probe sizing used it
    assert result.ladder is not None and result.ladder.ceiling_tokens is not None
    assert len(calls) == asked_before_ladder  # the ladder no longer asks
