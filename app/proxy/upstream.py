"""The upstream side of the hot path: two clients behind one `open`.

POSTs to plain-HTTP replicas (every chat, completions, Messages and Responses call) go through the
small HTTP/1.1 client in app/proxy/h1.py: at 128 streams aiohttp's per-request and per-read Python
work was about a quarter of the gateway's relay CPU (docs/performance.md, "The relay's
per-request cost"). Everything else (other methods, https replicas, URLs with credentials) uses
one pooled aiohttp session. aiohttp, not httpx, because httpx's pool scans every connection for
every waiting request and its reads cost ~3x more (docs/relay.md): `TCPConnector(limit=0)` keeps
unbounded keep-alive connections per replica, aiohttp sets TCP_NODELAY on them, and responses are
read with `readany()` so bytes are relayed as they arrive. Both raise aiohttp's exception types,
so failures become the same `UpstreamError` whichever client served the attempt, with a `kind`
that the metrics and the retry logic share: connect, timeout, disconnect, status_5xx, empty,
midstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import aiohttp
from yarl import URL

from app.config import Limits
from app.proxy.h1 import IDLE_S, H1Pool, H1Response, plain_http
from app.routing.base import Replica

# Request headers never forwarded upstream: hop-by-hop ones, those aiohttp sets itself, and
# accept-encoding (the relay must see identity-encoded SSE to observe it).
_DROP_REQUEST = frozenset({
    "host", "content-length", "connection", "keep-alive", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "accept-encoding", "expect",
})
# Response headers never copied to the client (the ASGI server frames the body itself).
DROP_RESPONSE = frozenset({
    "content-length", "transfer-encoding", "connection", "keep-alive", "date", "server",
})


T = TypeVar("T")
URL_CACHE_CAP = 1024  # passthrough paths carry client query strings: bound the cache


class UpstreamError(Exception):
    """A failed attempt at one replica. `kind` labels prefixgate_upstream_errors_total."""

    def __init__(self, kind: str, backend: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.backend = backend
        self.status = status


def upstream_headers(incoming: Mapping[str, str], request_id: str, api_key: str | None,
                     content_type: str = "application/json") -> dict[str, str]:
    """Headers for the upstream request: the client's, minus hop-by-hop, with the request id;
    the client's Authorization is replaced when the proxy has its own upstream key."""
    out = {k: v for k, v in incoming.items() if k not in _DROP_REQUEST}
    out["x-request-id"] = request_id
    out["accept-encoding"] = "identity"
    out.setdefault("content-type", content_type)
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def let_go(resp: Any, reusable: bool) -> None:
    """Hand an upstream response's connection back: to the pool when the answer was read to its
    end (`reusable`), else closed (a half-read stream must never serve another request)."""
    if reusable:
        resp.release()
    else:
        resp.close()


def classify_exception(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return "disconnect"
    return "error"


class Upstream:
    """Owns the aiohttp session (created on the serving loop in `start`)."""

    def __init__(self, limits: Limits, h1: bool = True) -> None:
        self.limits = limits
        self.session: aiohttp.ClientSession | None = None
        self.h1: H1Pool | None = None
        self._use_h1 = h1
        self._urls: dict[str, URL] = {}
        self._plain: dict[str, bool] = {}

    async def start(self) -> None:
        # idle connections go before the engines' 5 s keep-alive closes them (app/proxy/h1.py, IDLE_S)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=IDLE_S,
                                         enable_cleanup_closed=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.limits.connect_timeout_s,
                                        sock_read=self.limits.read_timeout_s)
        # DummyCookieJar: one session serves every client, so a cookie an upstream (or an ingress in
        # front of it) sets must never ride along on other clients' requests; it also skips the jar's
        # per-request filtering. The client's own Cookie header is forwarded like any other header.
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                             skip_auto_headers=("User-Agent",),
                                             cookie_jar=aiohttp.DummyCookieJar())
        if self._use_h1:
            self.h1 = H1Pool(self.limits, asyncio.get_running_loop())

    async def stop(self) -> None:
        if self.h1 is not None:
            self.h1.close()
            self.h1 = None
        if self.session is not None:
            await self.session.close()
            self.session = None

    def _url(self, url: str) -> URL:
        """Parsed once per distinct URL (aiohttp would parse the string on every request)."""
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= URL_CACHE_CAP:
                self._urls.clear()
            parsed = self._urls[url] = URL(url)
        return parsed

    @property
    def connector(self) -> aiohttp.BaseConnector | None:
        return self.session.connector if self.session else None

    def pool_stats(self) -> tuple[int, int]:
        """(upstream connections in use, idle ones) over both clients; (-1, -1) when aiohttp's
        private fields cannot be read, so a leak check fails rather than passing on zeros."""
        acquired, idle = self.h1.stats() if self.h1 is not None else (0, 0)
        connector = self.connector
        if connector is None:
            return acquired, idle
        if not hasattr(connector, "_acquired") or not hasattr(connector, "_conns"):
            return -1, -1
        return (acquired + len(connector._acquired),
                idle + sum(len(v) for v in list(connector._conns.values())))

    def _h1_serves(self, method: str, url: str) -> bool:
        """POSTs to plain-HTTP replicas go through the small client (app/proxy/h1.py)."""
        if self.h1 is None or method != "POST":
            return False
        plain = self._plain.get(url)
        if plain is None:
            if len(self._plain) >= URL_CACHE_CAP:
                self._plain.clear()
            plain = self._plain[url] = plain_http(url)
        return plain

    async def _before_first_byte(self, replica: Replica, call: Awaitable[T], waiting_for: str,
                                 show_error: bool) -> T:
        """Await `call` within limits.first_byte_timeout_s. Nothing has reached the client yet, so a
        client error or the timeout becomes an UpstreamError the caller may retry elsewhere."""
        try:
            async with asyncio.timeout(self.limits.first_byte_timeout_s):
                return await call
        except aiohttp.ClientError as exc:
            detail = f": {exc}" if show_error else f" before the {waiting_for}"
            raise UpstreamError(classify_exception(exc), replica.name,
                                f"{replica.name}: {type(exc).__name__}{detail}") from exc
        except TimeoutError as exc:
            raise UpstreamError("timeout", replica.name,
                                f"{replica.name}: no {waiting_for} within {self.limits.first_byte_timeout_s}s") from exc

    async def open(self, replica: Replica, method: str, path: str, body: bytes,
                   headers: Mapping[str, str]) -> aiohttp.ClientResponse | H1Response:
        """Send the request; returns once the response headers arrived (any status).

        Bounded by limits.first_byte_timeout_s; raises UpstreamError on failure.
        """
        assert self.session is not None, "Upstream.start() was not awaited"
        if self._h1_serves(method, replica.url):
            assert self.h1 is not None
            call = self.h1.request(self._url(replica.url + path), method, body, headers)
            return await self._before_first_byte(replica, call, "response", show_error=True)
        request = self.session.request(method, self._url(replica.url + path), data=body or None,
                                       headers=dict(headers), allow_redirects=False)
        return await self._before_first_byte(replica, request, "response", show_error=True)

    async def first_chunk(self, replica: Replica, resp: aiohttp.ClientResponse | H1Response) -> bytes:
        """The first body bytes (the role chunk, or the first token), bounded by the first-byte
        timeout. Nothing has reached the client yet, so a failure here is still retryable."""
        data = await self._before_first_byte(replica, resp.content.readany(), "first byte", show_error=False)
        if not data:
            raise UpstreamError("empty", replica.name, f"{replica.name}: closed the stream before the first byte")
        return data
