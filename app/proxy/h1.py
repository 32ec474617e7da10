"""A small HTTP/1.1 client for the hot path's POST requests to plain-HTTP replicas.

Why not aiohttp here (measured, docs/performance.md "The relay's per-request cost"): at 128
concurrent streams aiohttp's request building (ClientRequest, headers multidicts, payload objects,
the connector's bookkeeping) and its per-read path (a StreamReader future per read, a task wakeup
per chunk) were about a quarter of the gateway's CPU once the pipeline's stages were off. This
client does only what the relay needs:

- one keep-alive pool per replica address (LIFO, so a warm connection is reused first); a pooled
  connection the replica closed is noticed (`connection_lost`) and never handed out;
- a request is one `transport.write` of a head built from the forwarded headers plus the body;
- the response is parsed by httptools (llhttp, the C parser uvicorn uses), de-chunked there;
- body bytes are either buffered for `readany()` (first byte, non-streamed answers) or, once a
  stream is committed, pushed (`pump`) to the relay's callback from the read callback itself: no
  future and no task wakeup per upstream read. Every `data_received` is delivered as one piece
  (all the HTTP chunks that arrived together), as aiohttp's `readany()` would return them.

Failures raise aiohttp's own exception types (ClientConnectorError, ServerDisconnectedError,
ClientPayloadError, SocketTimeoutError, ConnectionTimeoutError), so the retry and error
contract (docs/relay.md) and `classify_exception` are the same whichever client served an attempt.
`limits.read_timeout_s` bounds the silence between two reads, as aiohttp's `sock_read` does; it
does not run while reading is paused because the client is slower than the replica.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp
import httptools
from yarl import URL

from app.config import Limits

HIGH_WATER = 256 * 1024  # buffered, unread body bytes before the replica is paused (readany mode)
# A pooled connection idle longer than this is closed, not reused: below the engines' own
# keep-alive (vLLM's and SGLang's uvicorn close an idle connection after 5 s), so the gateway
# never hands out a connection the replica is closing at that moment (docs/relay.md).
IDLE_S = 4.0
_Key = collections.namedtuple("_Key", "host port is_ssl ssl proxy proxy_auth proxy_headers_hash")

Sink = Callable[[bytes], None]
End = Callable[[BaseException | None], None]


class Target:
    """A replica's address: where to connect, its Host header, its key in errors."""

    __slots__ = ("host", "port", "host_header", "key")

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        name = f"[{host}]" if ":" in host else host
        self.host_header = name if port == 80 else f"{name}:{port}"
        self.key = _Key(host, port, False, True, None, None, None)


def plain_http(url: str) -> bool:
    """Whether this client can serve `url` (http://, no credentials in it)."""
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.username is None and bool(parts.hostname)


def request_head(method: str, target: Target, path: str, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers. `path`: the URL's encoded path and query (yarl's, as aiohttp
    sends it). Header names and values come from the client's request as the ASGI server parsed
    it (no CR/LF can be in them) or from the proxy itself."""
    lines = [f"{method} {path} HTTP/1.1\r\nhost: {target.host_header}\r\ncontent-length: {length}\r\n"]
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1", "replace")


class H1Response:
    """One response: `status`, `raw_headers` (lower-cased names as sent), and the body through
    `content.readany()` / `read()` or `pump()`. `release()` returns a fully read keep-alive
    connection to the pool; `close()` closes it."""

    __slots__ = ("status", "raw_headers", "_conn", "_buf", "_size", "_eof", "_exc", "_waiter", "_sink", "_end",
                 "_delimited")

    def __init__(self, conn: _Conn, status: int, raw_headers: tuple[tuple[bytes, bytes], ...]) -> None:
        self.status = status
        self.raw_headers = raw_headers
        self._conn: _Conn | None = conn
        self._buf: list[bytes] = []
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._end: End | None = None
        # a body that ends when the connection does (no content-length, not chunked)
        self._delimited = not any(n in (b"content-length", b"transfer-encoding") for n, _ in raw_headers)

    @property
    def content(self) -> H1Response:
        return self  # aiohttp's `resp.content.readany()` spelling

    # ---------------------------------------------------------------- fed by the connection
    def _feed(self, data: bytes) -> None:
        sink = self._sink
        if sink is not None:
            sink(data)
            return
        self._buf.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _finish(self, exc: BaseException | None) -> None:
        if self._eof or self._exc is not None:
            return
        if exc is None:
            self._eof = True
        else:
            self._exc = exc
        end = self._end
        if end is not None:
            self._end = self._sink = None
            end(exc)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # ---------------------------------------------------------------- read by the relay
    async def readany(self) -> bytes:
        """Every body byte buffered now (waiting for some when none is); b"" at the end."""
        while not self._buf:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf.clear()
        self._size = 0
        if self._conn is not None:
            self._conn.resume()
        return data

    async def read(self) -> bytes:
        parts = []
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            parts.append(data)

    def pump(self, sink: Sink, end: End) -> None:
        """From now on hand every body read to `sink` as it arrives, then call `end(None)` at the
        end of the body or `end(exc)` when it broke. What was buffered before is delivered first.
        `sink` may pause the connection (`pause`); it stays paused until `resume`."""
        data = b""
        if self._buf:
            data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
            self._buf.clear()
            self._size = 0
        ended = self._exc is not None or self._eof
        if not ended:
            self._sink, self._end = sink, end
            if self._conn is not None:
                self._conn.resume()  # reading may have been paused at HIGH_WATER while buffering
        if data:
            sink(data)
        if ended:
            end(self._exc)

    def pause(self) -> None:
        if self._conn is not None:
            self._conn.pause()

    def resume(self) -> None:
        if self._conn is not None:
            self._conn.resume()

    def release(self) -> None:
        conn, self._conn = self._conn, None
        self._sink = self._end = None
        if conn is not None:
            conn.done(reusable=self._eof and not self._buf)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._sink = self._end = None
        if conn is not None:
            conn.done(reusable=False)


class _Conn(asyncio.Protocol):
    """One upstream connection and the response being read on it."""

    def __init__(self, pool: H1Pool, target: Target) -> None:
        self.pool = pool
        self.target = target
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.paused = False
        self.keep_alive = True
        self.idle_since = 0.0
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[H1Response] | None = None
        self.resp: H1Response | None = None
        self.complete = False
        self._parts: list[bytes] = []  # body pieces parsed from the current read

    # ---------------------------------------------------------------- exchange
    def send(self, head: bytes, body: bytes) -> asyncio.Future[H1Response]:
        """Write one request: its head and body as two buffers of one write (uvloop's writev), so
        a 1 MB body is not copied behind its head first."""
        loop = self.pool.loop
        self.headers = []
        self.resp = None
        self.complete = False
        self.head = loop.create_future()
        assert self.transport is not None
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)
        self.last_read = loop.time()
        self._arm()
        return self.head

    def done(self, reusable: bool) -> None:
        """The response's owner is done with it."""
        self._disarm()
        self.resp = None
        if reusable and self.complete and self.keep_alive and not self.closed and not self.paused:
            self.pool.put_back(self)
        else:
            self.pool.forget(self)
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def pause(self) -> None:
        if not self.paused and not self.closed and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and not self.closed and self.transport is not None:
            self.paused = False
            self.last_read = self.pool.loop.time()
            self.transport.resume_reading()

    # ---------------------------------------------------------------- read timeout
    def _arm(self) -> None:
        timeout = self.pool.limits.read_timeout_s
        if self.timer is None and timeout and timeout > 0:
            self.timer = self.pool.loop.call_at(self.last_read + timeout, self._check_timeout)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check_timeout(self) -> None:
        self.timer = None
        if self.closed or self.complete:
            return
        now = self.pool.loop.time()
        if self.paused:
            self.last_read = now
        elif now - self.last_read >= self.pool.limits.read_timeout_s:
            self._fail(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
            return
        self._arm()

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self.last_read = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._deliver()
            self._fail(aiohttp.ClientPayloadError(f"invalid HTTP response from the replica: {exc}"))
            return
        self._deliver()

    def _deliver(self) -> None:
        parts = self._parts
        resp = self.resp
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            if resp is not None:
                resp._feed(data)
        if self.complete and resp is not None:
            self._disarm()
            resp._finish(None)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        self._disarm()
        if self.head is not None and not self.head.done():
            self.head.set_exception(aiohttp.ServerDisconnectedError())
        resp = self.resp
        if resp is not None and not self.complete:
            if resp._delimited and exc is None:
                self.complete = True
                resp._finish(None)
            else:
                resp._finish(aiohttp.ClientPayloadError("Response payload is not completed"))

    def _fail(self, exc: BaseException) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        if self.resp is not None:
            self.resp._finish(exc)
        self.close()

    # ---------------------------------------------------------------- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        resp = self.resp = H1Response(self, self.parser.get_status_code(), tuple(self.headers))
        if self.head is not None and not self.head.done():
            self.head.set_result(resp)

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.keep_alive and self.parser.should_keep_alive()


class H1Pool:
    """Keep-alive connections per replica address, created on the serving loop."""

    def __init__(self, limits: Limits, loop: asyncio.AbstractEventLoop) -> None:
        self.limits = limits
        self.loop = loop
        self.idle: dict[tuple[str, int], list[_Conn]] = {}
        self.acquired: set[_Conn] = set()
        self._targets: dict[tuple[str, int], Target] = {}

    def target(self, host: str, port: int) -> Target:
        found = self._targets.get((host, port))
        if found is None:
            if len(self._targets) >= 1024:
                self._targets.clear()
            found = self._targets[(host, port)] = Target(host, port)
        return found

    async def request(self, url: URL, method: str, body: bytes, headers: Mapping[str, str]) -> H1Response:
        """Send one request to `url` (plain http); returns once the response headers arrived."""
        target = self.target(url.raw_host or "127.0.0.1", url.port or 80)
        conn = self._take(target) or await self._connect(target)
        self.acquired.add(conn)
        try:
            head = conn.send(request_head(method, target, url.raw_path_qs, headers, len(body)), body)
            return await head
        except BaseException:
            conn.done(reusable=False)
            raise

    def _take(self, target: Target) -> _Conn | None:
        idle = self.idle.get((target.host, target.port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > IDLE_S:
                conn.close()
                continue
            return conn
        return None

    async def _connect(self, target: Target) -> _Conn:
        conn = _Conn(self, target)
        try:
            async with asyncio.timeout(self.limits.connect_timeout_s):
                await self.loop.create_connection(lambda: conn, target.host, target.port)
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to host http://{target.host_header}") from exc
        except OSError as exc:
            raise aiohttp.ClientConnectorError(target.key, exc) from exc
        return conn

    def put_back(self, conn: _Conn) -> None:
        self.acquired.discard(conn)
        conn.idle_since = time.monotonic()
        self.idle.setdefault((conn.target.host, conn.target.port), []).append(conn)

    def forget(self, conn: _Conn) -> None:
        self.acquired.discard(conn)
        idle = self.idle.get((conn.target.host, conn.target.port))
        if idle and conn in idle:
            idle.remove(conn)

    def stats(self) -> tuple[int, int]:
        """(connections in use, idle connections)."""
        return len(self.acquired), sum(len(v) for v in self.idle.values())

    def close(self) -> None:
        for conns in list(self.idle.values()):
            for conn in conns:
                conn.close()
        self.idle.clear()
        for conn in list(self.acquired):
            conn.close()
        self.acquired.clear()
