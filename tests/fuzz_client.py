"""A raw HTTP/1.1 client for the fuzz suite: it sends exactly the bytes a case asks for.

Why not httpx/aiohttp: they refuse or normalise what the fuzzer must send (a Content-Length that
lies, duplicate headers, header bytes that are not UTF-8, a request cut off mid-body) and they
cannot drop a connection after exactly k bytes of a response. One connection per request, with
`Connection: close`, so a response ends at EOF when it has neither length nor chunked framing.

`Outcome.kind`:
- "response": a complete response was read (status, headers, body);
- "closed": the server closed without a response (expected when the body was cut short);
- "dropped": the client hung up on purpose after `drop_after` response bytes;
- "hang": nothing decisive within the per-request timeout (always a failure);
- "refused": the connection could not be opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field


@dataclass
class RawRequest:
    method: str
    target: str  # path + query
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    # how the body goes out: "length" (a true Content-Length), "chunked", "short" (the header
    # says more than is sent; then the client half-closes), "long" (the header says less than is
    # sent), "none" (no framing header at all)
    framing: str = "length"
    drop_after: int | None = None  # hang up after this many response bytes (mid-stream disconnect)
    route: str = ""  # the label the figures are counted under
    stream: bool = False


@dataclass
class Outcome:
    kind: str
    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    error: str = ""
    elapsed_s: float = 0.0  # from connecting to the outcome


def encode(req: RawRequest, host: str) -> bytes:
    head = [f"{req.method} {req.target} HTTP/1.1".encode("latin-1"), b"host: " + host.encode(), b"connection: close"]
    head += [k + b": " + v for k, v in req.headers]
    body = req.body
    if req.framing == "length":
        head.append(b"content-length: %d" % len(body))
    elif req.framing == "short":
        head.append(b"content-length: %d" % (len(body) + 17))
    elif req.framing == "long":
        head.append(b"content-length: %d" % max(0, len(body) // 2))
    elif req.framing == "chunked":
        head.append(b"transfer-encoding: chunked")
        parts = [body[i:i + 4096] for i in range(0, len(body), 4096)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def _read_response(reader: asyncio.StreamReader, method: str, drop_after: int | None) -> Outcome:
    status = 100
    while 100 <= status < 200:  # skip interim responses (100 Continue)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            return Outcome("closed", error=f"closed after {len(exc.partial)} header bytes")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            headers[k.strip().lower()] = v.strip()
    if method == "HEAD" or status in (204, 304):
        return Outcome("response", status, headers, b"")
    if drop_after is not None:
        got = b""
        with contextlib.suppress(asyncio.IncompleteReadError):
            got = await reader.readexactly(drop_after)
        return Outcome("dropped", status, headers, got)
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(chunks)
    elif b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    else:
        body = await reader.read()
    return Outcome("response", status, headers, body)


async def send(req: RawRequest, host: str, port: int, timeout: float) -> Outcome:
    """Send one request on a fresh connection; never raises."""
    started = time.monotonic()
    out = await _send(req, host, port, timeout)
    out.elapsed_s = time.monotonic() - started
    return out


async def _send(req: RawRequest, host: str, port: int, timeout: float) -> Outcome:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        return Outcome("refused", error=repr(exc))
    try:
        writer.write(encode(req, f"{host}:{port}"))
        if req.framing == "short":
            await writer.drain()
            writer.write_eof()  # the promised bytes never come: the server must notice and stop
        return await asyncio.wait_for(_read_response(reader, req.method, req.drop_after), timeout)
    except TimeoutError:
        return Outcome("hang")
    except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError) as exc:
        return Outcome("closed", error=repr(exc))
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
