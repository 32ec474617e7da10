"""Lingering close (app/lingering.py) on real uvicorn servers on loopback, with a raw socket client.

A server that answers before it has read what the client is still sending, then closes, had the
kernel reset the connection and the client lost the response (ECONNRESET). These tests send a
large body after a request the server answers at once, in both of uvicorn's HTTP/1.1 parsers, and
through the gateway (the fuzz suite's finding: a Content-Length declaring half the body, a 413);
then that keep-alive and large answers are unaffected, and that a linger ends at the client's
close or its bound, so a SIGTERM drain still finishes.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from app.lingering import LingeringAutoProtocol, LingeringH11Protocol
from app.serving import ServerThread
from tests.gateway_process import GatewayProcess

BIG = 24 * 1024 * 1024  # more than loopback's socket buffers hold: still being sent when the server closes
LIMIT = 262_144
ERROR = json.dumps({"error": {"message": "request body too large", "type": "invalid_request_error",
                              "code": "request_too_large"}}).encode()


async def early_answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """413 without reading the body (as an app answers from the declared length); GET: 200 (BIG
    bytes on /big)."""
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        status, body = 200, (b"y" * BIG if scope["path"] == "/big" else b"ok")
    else:
        status, body = 413, ERROR
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def _read_all(sock: socket.socket) -> tuple[bytes, str]:
    """What the client reads until EOF, and the error that ended it early ('' at EOF)."""
    got = bytearray()
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except OSError as exc:
        return bytes(got), type(exc).__name__
    return bytes(got), ""


def _post(port: int, head: bytes, extra: int) -> tuple[bytes, str]:
    """Send `head` and `extra` body bytes, then read the response, as httpx and the openai SDK do;
    returns what was read until EOF and the error that ended sending or reading early ('' if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(head)
            chunk = b"x" * (1 << 20)
            for _ in range(extra >> 20):
                sock.sendall(chunk)
        except OSError as exc:  # without lingering close: the reset (EPIPE / ECONNRESET), the answer lost
            return b"", f"sending: {type(exc).__name__}"
        return _read_all(sock)


def _wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("protocol", [LingeringAutoProtocol, LingeringH11Protocol], ids=["httptools", "h11"])
def test_an_answer_sent_while_the_body_still_arrives_reaches_the_client(protocol: type) -> None:
    with ServerThread(early_answer, http=protocol) as server:
        head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % BIG)
        got, error = _post(server.port, head, BIG)
    assert error == "" and got.startswith(b"HTTP/1.1 413 "), (error, got[:200])
    assert got.endswith(b"\r\n\r\n" + ERROR)


@pytest.mark.parametrize("protocol", [LingeringAutoProtocol, LingeringH11Protocol], ids=["httptools", "h11"])
def test_the_parsers_400_reaches_a_client_still_sending(protocol: type) -> None:
    """uvicorn's parser answers a malformed header (a space in its name) with 400 and closes,
    before the app sees the request."""
    with ServerThread(early_answer, http=protocol) as server:
        head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx bad: a\r\n"
                b"content-length: %d\r\n\r\n" % BIG)
        got, error = _post(server.port, head, BIG)
    assert error == "" and got.startswith(b"HTTP/1.1 400 "), (error, got[:200])


def test_the_gateways_413_reaches_a_client_that_sends_more_than_it_declared(proxy_factory: Any, sim: Any) -> None:
    """The proxy reads the declared (over-limit) body, answers 413 and closes with `connection: close`
    while the rest is still arriving: the client must read the OpenAI-shaped 413, not a reset."""
    proxy = proxy_factory(sim, limits={"max_body_bytes": LIMIT})
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % (2 * LIMIT))
    got, error = _post(proxy.server.port, head, BIG)
    assert error == "" and got.startswith(b"HTTP/1.1 413 "), (error, got[:200])
    error_body = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
    assert error_body["code"] == "request_too_large" and str(LIMIT) in error_body["message"]


def test_keep_alive_connections_stay_open_and_serve_the_next_request() -> None:
    with ServerThread(early_answer) as server, socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"\r\n\r\nok"):
                chunk = sock.recv(65536)
                assert chunk, f"closed after {got!r}"
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 ")
        assert len(server.server.server_state.connections) == 1


def test_a_large_answer_on_a_closing_connection_arrives_whole_to_a_slow_reader() -> None:
    """The half-close waits for the response bytes still buffered (the client reads late)."""
    with ServerThread(early_answer) as server, socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        time.sleep(0.5)  # the server has closed (lingering) with most of the answer still buffered
        got, error = _read_all(sock)
    assert error == "" and got.endswith(b"\r\n\r\n" + b"y" * BIG), (error, len(got))


class _LongLinger(LingeringAutoProtocol):
    linger_s = 600.0  # longer than any wait below: only the client's close can end it


class _ShortLinger(LingeringAutoProtocol):
    linger_s = 0.2


def _answered_then_held(port: int, path: bytes = b"/") -> socket.socket:
    """A connection-close request whose client sent a few bytes past it and read the answer and
    the server's FIN (its half-close) but keeps its own side open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 1000000\r\n\r\n" % path
                 + b"x" * 1000)
    got, error = _read_all(sock)  # returns at the server's FIN: it half-closed and still reads
    assert error == "" and got.startswith(b"HTTP/1.1 413 "), (error, got[:200])
    return sock


def test_the_client_closing_ends_the_linger() -> None:
    with ServerThread(early_answer, http=_LongLinger) as server:
        connections = server.server.server_state.connections
        sock = _answered_then_held(server.port)
        assert len(connections) == 1  # lingering: still reading what the client sends
        sock.sendall(b"x" * 100_000)  # dropped, not an error
        sock.close()
        assert _wait_until(lambda: not connections), "the linger outlived the client's close"


def test_the_linger_is_bounded_when_the_client_never_closes() -> None:
    with ServerThread(early_answer, http=_ShortLinger) as server:
        connections = server.server.server_state.connections
        sock = _answered_then_held(server.port)
        try:
            assert _wait_until(lambda: not connections), "the linger did not end on its own"
        finally:
            sock.close()


def test_a_lingering_connection_does_not_hold_up_the_drain(sim: Any) -> None:
    """`prefixgate serve` (a subprocess) with a client that got its 413 and never closes: SIGTERM
    still ends in a clean exit, long before shutdown.grace_s (uvicorn waits for every open
    connection, so an unbounded linger would hold the drain until its backstop)."""
    config = {"backends": [{"url": sim.urls[0]}], "limits": {"max_body_bytes": LIMIT},
              "shutdown": {"accept_s": 0.2, "grace_s": 600}}
    with GatewayProcess(config) as gateway:
        sock = _answered_then_held(gateway.port, b"/v1/completions")
        try:
            gateway.signal(signal.SIGTERM)
            assert gateway.wait(60) == 0, gateway.log()
        finally:
            sock.close()
