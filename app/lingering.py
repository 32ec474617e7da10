"""Lingering close for uvicorn's HTTP/1.1 protocols (what nginx calls `lingering_close`).

When the server closes a connection whose client is still sending (a 413 answered before the rest
of an over-limit body, a `Content-Length` that declared less than the client sends, a parser 400),
the kernel answers those unread bytes with a reset, and a reset discards what the client had not
yet read: the response is lost and the client sees ECONNRESET. So a close right after a response
first shuts down our write side (the response is flushed, then FIN), then reads and drops what
still arrives, and closes when the client closes (EOF), after `LINGER_S`, or after
`LINGER_MAX_BYTES`, whichever comes first. Idle closes (keep-alive timeout, shutdown of an idle
connection) close at once: nothing is arriving, and a pooled client may hold its socket for long.
Used by every server the gateway runs (app/serving.py `uvicorn_config`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_S = 2.0  # bounds a linger in time: a drain's shutdown waits at most this long for one
LINGER_MAX_BYTES = 64 * 1024 * 1024  # ... and in bytes read and dropped (none are kept)


def _nothing(*_: Any) -> None:
    return None


def _yes() -> bool:
    return True


class LingeringTransport:
    """The connection's transport as uvicorn's protocol sees it: `close()` lingers (see the module
    docstring); everything else goes to the real transport. The calls uvicorn makes per response
    (`write`, `is_closing`, flow control) are the real transport's bound methods, set on the
    instance, so the hot path costs no Python frame; a linger swaps them for its own."""

    def __init__(self, transport: asyncio.Transport, seconds: float, max_bytes: int) -> None:
        self._transport = transport
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.get_extra_info = transport.get_extra_info
        self._seconds = seconds
        self._max_bytes = max_bytes
        self._timer: asyncio.TimerHandle | None = None
        self._dropped = 0
        self._plain = False  # set while closing an idle connection, and for good once upgraded
        self.peer_done = False  # the client sent EOF, or the connection is gone: nothing to wait for
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if self.lingering:
            return
        real = self._transport
        if self._plain or self.peer_done or real.is_closing() or not real.can_write_eof():
            real.close()  # (TLS cannot half-close: it closes as before)
            return
        self.lingering = True
        self.is_closing = _yes
        self.write = _nothing  # after write_eof the real transport would raise; a closed one drops
        self.pause_reading = _nothing  # what arrives while lingering is dropped, never buffered
        real.write_eof()  # FIN once the response bytes are out; reading goes on
        real.resume_reading()  # uvicorn may have paused it while a request body was buffered
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self.finish)

    def drop(self, data: bytes) -> None:
        """Bytes that arrived while lingering: counted, never kept."""
        self._dropped += len(data)
        if self._dropped > self._max_bytes:
            self.finish()

    def finish(self) -> None:
        """End the linger (or the connection): close for real."""
        self.peer_done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._plain = True  # a WebSocket upgrade: its protocol reads the connection from now on
        self._transport.set_protocol(protocol)

    @contextlib.contextmanager
    def closing_idle(self) -> Iterator[None]:
        """Within this block a close is plain (no linger)."""
        plain, self._plain = self._plain, True
        try:
            yield
        finally:
            self._plain = plain


class LingeringClose:
    """Mixin for a uvicorn HTTP/1.1 protocol (httptools or h11): wraps its transport in a
    `LingeringTransport` and drops what arrives while that lingers."""

    transport: LingeringTransport
    linger_s = LINGER_S
    linger_max_bytes = LINGER_MAX_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(LingeringTransport(transport, self.linger_s, self.linger_max_bytes))  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            self.transport.drop(data)
            return
        super().data_received(data)  # type: ignore[misc]

    def eof_received(self) -> bool | None:
        self.transport.peer_done = True
        if self.transport.lingering:
            self.transport.finish()
        return super().eof_received()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.transport.finish()  # cancels the timer; closing a lost transport is a no-op
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        with self.transport.closing_idle():  # an idle connection closes at once; a busy one lingers after its response
            super().shutdown()  # type: ignore[misc]

    def timeout_keep_alive_handler(self) -> None:
        with self.transport.closing_idle():
            super().timeout_keep_alive_handler()  # type: ignore[misc]


class LingeringAutoProtocol(LingeringClose, AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's `http="auto"` protocol (httptools when installed, else h11) with lingering close."""


class LingeringH11Protocol(LingeringClose, H11Protocol):
    """The h11 protocol with lingering close (the fallback when httptools is not installed)."""
