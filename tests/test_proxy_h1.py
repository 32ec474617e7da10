"""The small upstream client (app/proxy/h1.py) and the relay's push path over real sockets:
keep-alive reuse, a replica's `connection: close`, and a client slower than the replica
(backpressure: the replica is paused, nothing is lost or reordered)."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import httpx
import orjson
from fake_upstream import FakeResponse, sse

import app.proxy.h1 as h1
import app.proxy.relay as relay

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}
USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def _events(n: int, size: int) -> list[bytes]:
    role = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    # the bulk rides in a field the gateway relays as is but never tokenises: as generated text, a
    # 19 MB run of "x" would keep the after-response tokeniser busy for minutes after the test
    tokens = [sse({"choices": [{"index": 0, "delta": {"content": f"{i:06d} "}}], "pad": "x" * size})
              for i in range(n)]
    return [role, *tokens, sse({"choices": [], "usage": USAGE}), sse(b"[DONE]")]


def _stream(events: list[bytes], **kw: object) -> FakeResponse:
    return FakeResponse(chunks=[(0, e) for e in events], **kw)  # type: ignore[arg-type]


def test_sequential_streams_reuse_one_upstream_connection(fake_upstream_factory, proxy_factory) -> None:
    events = _events(3, 5)
    up = fake_upstream_factory(lambda req: _stream(events))
    proxy = proxy_factory([up.url])
    for _ in range(3):
        r = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200 and r.content == b"".join(events[:-2] + events[-1:])
    assert proxy.services.upstream.h1 is not None
    assert proxy.services.upstream.pool_stats() == (0, 1)  # one keep-alive connection, idle


def test_replica_connection_close_is_not_pooled(fake_upstream_factory, proxy_factory) -> None:
    events = _events(2, 5)
    up = fake_upstream_factory(lambda req: _stream(events, headers={"content-type": "text/event-stream",
                                                                     "connection": "close"}))
    proxy = proxy_factory([up.url])
    for _ in range(2):
        r = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
    assert proxy.services.upstream.pool_stats() == (0, 0)


def test_slow_client_pauses_the_replica_and_gets_every_event_in_order(fake_upstream_factory, proxy_factory,
                                                                      monkeypatch) -> None:
    events = _events(600, 32_000)  # ~19 MB: more than the loopback sockets' buffers hold
    up = fake_upstream_factory(lambda req: _stream(events))
    proxy = proxy_factory([up.url])
    waited: list[int] = []
    finish = relay.finish_driven

    async def counting(pending: object) -> None:
        waited.append(1)
        await finish(pending)  # type: ignore[arg-type]

    monkeypatch.setattr(relay, "finish_driven", counting)
    body = orjson.dumps(CHAT)
    with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(1.5)  # the client reads nothing: the gateway's writes must wait
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            data = sock.recv(1 << 20)
            assert data, "the gateway closed the connection before the end of the stream"
            received += data
    assert waited, "the client never made the gateway wait (the test did not exercise backpressure)"
    head, _, chunked = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    payload = b""
    while chunked:
        size_line, _, rest = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        payload += rest[:size]
        chunked = rest[size + 2:]
    assert payload == b"".join(events[:-2] + events[-1:])  # every event once, in order; usage dropped
    deadline = time.monotonic() + 5
    while proxy.services.upstream.pool_stats()[0] != 0:
        assert time.monotonic() < deadline, "upstream connection still acquired after the stream"
        time.sleep(0.05)


def test_pooled_connection_the_replica_closed_is_not_reused(fake_upstream_factory, proxy_factory) -> None:
    """A replica closes idle keep-alive connections (vLLM's uvicorn after 5 s): the next request
    gets a fresh connection and succeeds, and no upstream error is counted."""
    events = _events(3, 5)
    up = fake_upstream_factory(lambda req: _stream(events))
    proxy = proxy_factory([up.url])
    expected = b"".join(events[:-2] + events[-1:])
    assert httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30).content == expected
    assert proxy.services.upstream.pool_stats() == (0, 1)
    for conn in list(up._conns):  # the replica's idle timeout: it closes every connection it holds
        conn.shutdown(socket.SHUT_RDWR)
    deadline = time.monotonic() + 5
    while proxy.services.upstream.pool_stats()[1] != 0:
        assert time.monotonic() < deadline, "the closed connection stayed in the pool"
        time.sleep(0.02)
    r = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200 and r.content == expected
    backend = proxy.services.replicas.names()[0]
    for kind in ("disconnect", "connect", "midstream", "timeout"):
        assert proxy.sample("prefixgate_upstream_errors_total", backend=backend, kind=kind) is None


def test_a_connection_idle_past_the_engines_keep_alive_is_not_reused(fake_upstream_factory, proxy_factory,
                                                                    monkeypatch) -> None:
    """vLLM's and SGLang's uvicorn close a connection idle for 5 s. Reused at that moment, the
    request would be written as the replica closes it: no answer, a disconnect counted against a
    healthy replica and the request failed over, away from its prefix. So a connection idle 4.5 s
    is not handed out: the next request opens a new one (and one idle 1 s is still reused)."""
    events = _events(3, 5)
    up = fake_upstream_factory(lambda req: _stream(events))
    proxy = proxy_factory([up.url])
    shift = [0.0]
    real = time.monotonic
    monkeypatch.setattr(h1, "time", SimpleNamespace(monotonic=lambda: real() + shift[0]))
    pool = proxy.services.upstream.h1
    assert pool is not None
    used: list[object] = []  # the connection each request left in the pool

    def post() -> None:
        r = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
        proxy.settle()
        (conn,) = [c for conns in pool.idle.values() for c in conns]
        used.append(conn)

    post()
    shift[0] += 1.0  # idle 1 s: reused
    post()
    shift[0] += 4.5  # idle 4.5 s: past the bound, closed instead
    post()
    assert used[0] is used[1] and used[2] is not used[1]
    assert used[1].closed and not used[2].closed
