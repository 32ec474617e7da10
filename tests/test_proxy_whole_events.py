"""The whole-event contract (docs/relay.md): whatever byte offset the upstream dies at, the client
gets every whole event the upstream sent, then one well-formed error event, then `data: [DONE]`,
as decoded by the `openai` client's own SSE decoder. Real HTTP: a recorded vLLM stream replayed by
tests/fake_upstream.py (one HTTP chunk per event, as vLLM writes them), cut after k bytes."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from fake_upstream import FakeResponse
from openai._streaming import SSEDecoder

from app.proxy.sse import SSEParser

FIXTURES = Path(__file__).parent / "fixtures" / "real_vllm"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}  # the client asked: every event is relayed as is
COMPLETIONS = {"model": "fake", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}


def events_of(stream: bytes) -> list[bytes]:
    return [ev.raw for ev in SSEParser(emit_all=True).feed(stream)]


def decoded(chunks: list[bytes]) -> list[str]:
    """The data of each event, as the openai SDK decodes the bytes it reads."""
    return [sse.data for sse in SSEDecoder().iter_bytes(iter(chunks))]


def cut_stream(stream: bytes, k: int) -> list[tuple[float, bytes]]:
    """The recorded stream's first k bytes, one HTTP chunk per event (the last one partial)."""
    chunks, pos = [], 0
    for raw in events_of(stream):
        if pos >= k:
            break
        chunks.append((0.0, raw[:k - pos]))
        pos += len(raw)
    return chunks


def check_cut(client: httpx.Client, url: str, body: dict, stream: bytes, k: int) -> None:
    with client.stream("POST", url, json=body) as resp:
        chunks = list(resp.iter_raw())
    assert resp.status_code == 200, k
    whole = decoded([b"".join(events_of(stream[:k]))])  # the events complete within the first k bytes
    got = decoded(chunks)
    if k == len(stream):  # everything arrived, then the connection died: the response is whole
        assert got == whole and got[-1] == "[DONE]", k
        return
    assert got[:len(whole)] == whole, k
    assert len(got) == len(whole) + 2, (k, got[len(whole):])
    for data in got[:-1]:
        orjson.loads(data)  # every event is valid JSON: never a partial event glued to the error
    error = orjson.loads(got[-2])["error"]
    assert error["code"] == "upstream_midstream" and error["type"] == "server_error", k
    assert got[-1] == "[DONE]", k


@pytest.mark.parametrize("fixture,path,body", [
    ("chat_stream_cold.sse", "/v1/chat/completions", CHAT),
    ("completions_stream.sse", "/v1/completions", COMPLETIONS),
])
def test_death_at_any_byte_offset_gives_whole_events_then_error_then_done(
        fake_upstream_factory, proxy_factory, fixture: str, path: str, body: dict) -> None:
    stream = (FIXTURES / fixture).read_bytes()
    assert stream.endswith(b"data: [DONE]\n\n")
    cut = {"k": 0}
    up = fake_upstream_factory(lambda req: FakeResponse(chunks=cut_stream(stream, cut["k"]), die_after=10**6))
    proxy = proxy_factory([up.url], routing={"health_interval_s": 3600})
    with httpx.Client(timeout=30) as client:
        for k in range(1, len(stream) + 1):  # every byte offset (k = 0 is a retry/502: test_proxy_fault_matrix)
            cut["k"] = k
            check_cut(client, proxy.url + path, body, stream, k)
