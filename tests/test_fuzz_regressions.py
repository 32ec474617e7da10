"""Bugs the fuzz suite (test_fuzz_proxy.py) found, in the proxy and in the simulator it runs
against, each kept as a plain example."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.fuzz_client import RawRequest, send


def _nested(depth: int) -> bytes:
    return b"[" * depth + b'"x"' + b"]" * depth


@pytest.mark.parametrize("case", ["include_usage", "rewrite", "tools"])
def test_body_nested_deeper_than_the_proxy_can_reserialise_is_a_400(proxy_factory: Any, sim: Any, case: str) -> None:
    """orjson parses up to 1024 levels but serialises only up to 254: a body between the two got
    through validation, then every re-serialisation (splicing include_usage into a body that has
    stream_options, a hygiene rewrite, the tools signature) raised TypeError -> 500 internal_error."""
    tenants = {"default": {"policy": "rewrite"}} if case != "include_usage" else {}
    proxy = proxy_factory(sim, tenants=tenants)
    deep = _nested(300)
    extra = {
        "include_usage": b'"stream": true, "stream_options": {"continuous_usage_stats": false}, "metadata": ' + deep,
        "rewrite": (b'"tools": [{"type": "function", "function": {"name": "g"}}, {"type": "function", "function": '
                    b'{"name": "f"}}], "metadata": ' + deep),  # sort_tools rewrites the body
        "tools": b'"tools": [{"type": "function", "function": {"name": "f", "parameters": ' + deep + b"}}]",
    }[case]
    body = b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, ' + extra + b"}"
    resp = httpx.post(proxy.url + "/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_json" and "nested" in err["message"]


async def _upload_slowly(port: int, body: bytes) -> str:
    """POST `body` in 64 KiB pieces (a client on a slower link than loopback), then read the
    status line; returns it, or the error that prevented reading it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    try:
        writer.write(head)
        for i in range(0, len(body), 65536):
            writer.write(body[i:i + 65536])
            await writer.drain()
            await asyncio.sleep(0.002)
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 20)
        return line.decode().strip()
    except OSError as exc:
        return type(exc).__name__
    finally:
        writer.close()


def test_body_over_the_limit_gets_its_413_not_a_connection_reset(proxy_factory: Any, sim: Any) -> None:
    """The proxy answered 413 from the declared Content-Length without reading the body and closed
    the connection while the body was still arriving: the kernel then resets it, and the client
    (the openai SDK too) sees a broken pipe / ECONNRESET instead of the error. The rest of the body
    is now read and dropped (bounded in bytes and time) before the 413 goes out."""
    proxy = proxy_factory(sim, limits={"max_body_bytes": 262_144})
    body = b'{"model": "sim", "prompt": "' + b"lorem ipsum " * 100_000 + b'", "max_tokens": 1}'

    async def many() -> list[str]:
        return await asyncio.gather(*(_upload_slowly(proxy.server.port, body) for _ in range(5)))

    assert asyncio.run(many()) == ["HTTP/1.1 413 Request Entity Too Large"] * 5
    req = RawRequest("POST", "/v1/completions", [(b"content-type", b"application/json")], body, framing="chunked")
    out = asyncio.run(send(req, "127.0.0.1", proxy.server.port, 20))  # no declared length: found while reading
    assert (out.kind, out.status) == ("response", 413), out.error
    assert json.loads(out.body)["error"]["code"] == "request_too_large"


def test_messages_the_chat_template_cannot_render_are_a_400_from_the_simulator(proxy_factory: Any, sim: Any) -> None:
    """A message the template cannot iterate (`tool_calls: true`) raised TypeError inside the
    simulator (a 500, relayed as 502, and the replica marked failed); vLLM answers such a request
    with a 400, and so does the simulator now."""
    proxy = proxy_factory(sim)
    body = {"model": "sim", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [], "tool_calls": True}]}
    resp = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"]


def test_responses_tools_that_are_not_tool_objects_are_a_400_from_the_simulator(proxy_factory: Any, sim: Any) -> None:
    """A Responses body whose `tools` nests lists ~250 deep passed the proxy (orjson serialises
    254 levels) but the simulator echoed it inside the response object, deeper than that: a 500
    (relayed as 502). vLLM's request model takes a list of tool objects and answers anything else
    with a validation 400, and so does the simulator now (found at PREFIXGATE_FUZZ_EXAMPLES=1000)."""
    proxy = proxy_factory(sim)
    body = b'{"model": "sim", "input": "hi", "max_output_tokens": 2, "tools": ' + _nested(250) + b"}"
    resp = httpx.post(proxy.url + "/v1/responses", content=body, headers={"content-type": "application/json"},
                      timeout=30)
    assert resp.status_code == 400, resp.text
    assert "tools" in resp.json()["error"]["message"]


@pytest.mark.parametrize("prompt", [
    [-1, 5, 7],    # shorter than a block: hashed only once generated tokens filled the block, inside the engine loop
    [-3] * 20,     # a full block: hashed while the request was prepared
    [5, 2**32, 7],  # past uint32: the same OverflowError
])
def test_token_ids_outside_the_vocabulary_are_a_400_and_the_replica_keeps_serving(sim_factory: Any,
                                                                                  prompt: list[int]) -> None:
    """A completions prompt of token ids with a negative id reached the block hasher
    (`array("I", ...)`: OverflowError): in the engine loop's task it killed the loop, silently, so
    every later request to that replica waited forever (the fuzz run's "hangs", 20 s each, and its
    slow runs); at prepare time it was a 500. vLLM checks ids against the vocabulary first and
    answers 400 `Token id N is out of vocabulary`; so does the simulator now (for ids no uint32
    holds: it accepts made-up ids beyond its small vocabulary)."""
    sim = sim_factory(replicas=1, time_scale=0.0)
    url = sim.urls[0] + "/v1/completions"
    resp = httpx.post(url, json={"model": "sim", "prompt": prompt, "max_tokens": 16}, timeout=10)
    assert resp.status_code == 400, resp.text
    assert "out of vocabulary" in resp.json()["error"]["message"]
    ok = httpx.post(url, json={"model": "sim", "prompt": [5, 6, 7], "max_tokens": 16}, timeout=10)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 16


def test_a_crash_in_the_engine_loop_fails_its_requests_and_health_instead_of_hanging(
        sim_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in the simulator's engine loop ended its task with nobody told: requests
    already waiting, and every one after, hung until the client gave up. Like vLLM's EngineCore
    dying, the replica now fails what it holds with a 500 and reports itself dead on /health, so a
    simulator bug is a visible 5xx (that the fuzz suite counts), not a hang."""
    from app.sim.engine import SimEngine

    def broken(self: SimEngine, *args: Any) -> None:
        raise RuntimeError("a bug in the simulator")

    sim = sim_factory(replicas=1, time_scale=0.0)
    monkeypatch.setattr(SimEngine, "_emit", broken)
    resp = httpx.post(sim.urls[0] + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 4},
                      timeout=10)
    assert resp.status_code == 500, resp.text
    assert httpx.get(sim.urls[0] + "/health", timeout=10).status_code == 500
    assert sim.engine(0).state()["dead"] is True
