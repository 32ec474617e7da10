"""Endpoint URL handling, request bodies and error decoding of the doctor's HTTP probe."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.doctor.probe import Endpoint, ProbeError, chat_body, health, list_models, stream_chat, tokenize_count


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/", "h:8000"])
def test_endpoint_root_with_or_without_v1(url: str) -> None:
    endpoint = Endpoint.from_url(url, api_key="k")
    assert endpoint.root == "http://h:8000"
    assert endpoint.v1("/models") == "http://h:8000/v1/models"
    assert endpoint.headers == {"Authorization": "Bearer k"}
    assert Endpoint.from_url(url).headers == {}


def test_chat_body_forces_length_and_asks_for_usage() -> None:
    body = chat_body("m", "doc", 64)
    assert body["ignore_eos"] is True and body["max_tokens"] == 64
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in chat_body("m", "doc", 64, ignore_eos=False)


def _client(handler: httpx.MockTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=handler)


async def test_errors_are_decoded_and_usage_read() -> None:
    sse = (
        'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{"reasoning":"x"}}]}\n\n'
        'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,'
        '"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
        "data: [DONE]\n\n"
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            if b'"bad"' in request.content:
                return httpx.Response(400, json={"error": {"message": "too long", "type": "BadRequestError"}})
            if b'"midstream"' in request.content:
                return httpx.Response(200, text='data: {"error": {"message": "engine died"}}\n\ndata: [DONE]\n\n')
            assert request.headers["authorization"] == "Bearer k"
            return httpx.Response(200, text=sse)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}, {"id": "n"}]})
        if request.url.path == "/health":
            return httpx.Response(404)
        if request.url.path == "/readyz":
            return httpx.Response(503)
        return httpx.Response(404)

    endpoint = Endpoint.from_url("http://e/v1", api_key="k")
    async with _client(httpx.MockTransport(handler)) as client:
        result = await stream_chat(client, endpoint, "m", "doc", 2)
        assert result.prompt_tokens == 10 and result.completion_tokens == 2 and result.cached_tokens == 0
        assert result.ttft_s is not None and len(result.text_event_times) == 2  # the role chunk is not text
        with pytest.raises(ProbeError) as bad:
            await stream_chat(client, endpoint, "bad", "doc", 2)
        assert bad.value.status == 400 and "too long" in bad.value.message
        with pytest.raises(ProbeError) as died:
            await stream_chat(client, endpoint, "midstream", "doc", 2)
        assert "engine died" in died.value.message
        models = await list_models(client, endpoint)
        assert [(m.id, m.max_model_len) for m in models] == [("m", 4096), ("n", None)]
        assert await health(client, endpoint) is False  # no /health, /readyz says 503


# ---- contract: a real vLLM 0.32 stream and /tokenize answer (tests/fixtures/real_vllm) -------

REAL = Path(__file__).parent / "fixtures" / "real_vllm"


async def test_real_vllm_streams_and_tokenize() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(200, content=(REAL / "tokenize_chat.json").read_bytes())
        name = "chat_stream_warm.sse" if b"warm" in request.content else "chat_stream_cold.sse"
        return httpx.Response(200, content=(REAL / name).read_bytes(),
                              headers={"content-type": "text/event-stream"})

    endpoint = Endpoint.from_url("http://vllm:8000")
    async with _client(httpx.MockTransport(handler)) as client:
        cold = await stream_chat(client, endpoint, "tiny", "cold", 12)
        warm = await stream_chat(client, endpoint, "tiny", "warm", 12)
        assert await tokenize_count(client, endpoint, "tiny", "x") == 22
    assert (cold.prompt_tokens, cold.completion_tokens, cold.cached_tokens) == (1814, 12, 0)
    assert (warm.prompt_tokens, warm.completion_tokens, warm.cached_tokens) == (1814, 12, 1792)
    assert cold.ttft_s is not None and 1 <= len(cold.text_event_times) <= 12


# ---- contract: a real SGLang 0.5.23 stream (tests/fixtures/real_sglang) ----------------------

REAL_SGLANG = Path(__file__).parent / "fixtures" / "real_sglang"


async def test_real_sglang_streams() -> None:
    """SGLang's first event is role + `content: ""` + `reasoning_content: null`: no text, so the
    probe's TTFT starts at the next event; the usage event carries cached_tokens."""
    def handler(request: httpx.Request) -> httpx.Response:
        name = "chat_stream_warm.sse" if b"warm" in request.content else "chat_stream_cold.sse"
        return httpx.Response(200, content=(REAL_SGLANG / name).read_bytes(),
                              headers={"content-type": "text/event-stream"})

    endpoint = Endpoint.from_url("http://sglang:30000")
    async with _client(httpx.MockTransport(handler)) as client:
        cold = await stream_chat(client, endpoint, "tiny", "cold", 8)
        warm = await stream_chat(client, endpoint, "tiny", "warm", 8)
    assert (cold.prompt_tokens, cold.completion_tokens, cold.cached_tokens) == (904, 8, 0)
    assert (warm.prompt_tokens, warm.completion_tokens, warm.cached_tokens) == (904, 8, 903)
    assert cold.ttft_s is not None and 1 <= len(cold.text_event_times) <= 8



async def test_bent_answers_are_read_around_not_raised() -> None:
    """Found by tests/test_doctor_fuzz.py: events, choices, deltas and usages that are no objects
    raised in the probe, a `/v1/models` that is no JSON (or no object) raised, and a count sent as
    a string reached the sizing's arithmetic; a model id that is no text could not be sent."""
    sse = ('data: 5\n\ndata: [1]\n\ndata: null\n\ndata: {"choices": [5, {"delta": "x"}]}\n\n'
           'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\ndata: {"choices": [], "usage": "u"}\n\n'
           'data: {"choices": [], "usage": {"prompt_tokens": "12", "completion_tokens": -1,'
           ' "prompt_tokens_details": {"cached_tokens": true}}}\n\ndata: [DONE]\n\n')
    answer = {"models": b""}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, text=sse)
        return httpx.Response(200, content=answer["models"])

    endpoint = Endpoint.from_url("http://e")
    async with _client(httpx.MockTransport(handler)) as client:
        result = await stream_chat(client, endpoint, "m", "doc", 8)
        assert len(result.text_event_times) == 1 and result.ttft_s is not None
        assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (None, None, None)
        answer["models"] = b"not json"
        with pytest.raises(ProbeError, match="no JSON"):
            await list_models(client, endpoint)
        answer["models"] = b'[{"id": "m"}]'
        assert await list_models(client, endpoint) == []
        answer["models"] = b'{"data": [{"id": "\\ud800"}, {"id": "ok", "max_model_len": Infinity}, 7]}'
        assert [(m.id, m.max_model_len) for m in await list_models(client, endpoint)] == [("ok", None)]
