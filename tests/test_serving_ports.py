"""A server thread that chose its own port and lost it before binding (another process drew the
same port between the check and the bind, as parallel test workers do) draws another; a port it
was given is never changed. The thread whose start-up failed ends quietly (no unhandled exception
in it: the warning pytest gives for one is an error here)."""

from __future__ import annotations

import socket

import httpx
import pytest

import app.serving as serving
from app.serving import ServerThread


async def _ok(scope, receive, send) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _taken() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_chosen_port_taken_before_the_bind_is_drawn_again(monkeypatch) -> None:
    sock, busy = _taken()
    real, draws = serving.free_port, []

    def first_the_busy_one(host: str = "127.0.0.1") -> int:
        draws.append(host)
        return busy if len(draws) == 1 else real(host)

    monkeypatch.setattr(serving, "free_port", first_the_busy_one)
    try:
        server = ServerThread(_ok).start()
        try:
            assert server.port != busy and len(draws) == 2
            assert httpx.get(server.url, timeout=5).text == "ok"
        finally:
            server.stop()
    finally:
        sock.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_given_port_that_is_taken_fails_the_start() -> None:
    sock, busy = _taken()
    try:
        with pytest.raises(RuntimeError, match="exited during start-up"):
            ServerThread(_ok, port=busy).start()
    finally:
        sock.close()
