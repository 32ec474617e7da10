"""Raw ASGI helpers for the simulator: body reading, JSON replies, and cutting a connection.

Faults that must cut the TCP connection (drop, die mid-stream) reach the transport through
uvicorn's request cycle (`send.__self__.transport`), which both its httptools and h11 protocols
expose; elsewhere an exception makes the server close the connection itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
JSON_HEADERS = [(b"content-type", b"application/json")]


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


async def read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_bytes(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any) -> None:
    await send_bytes(send, status, obj if isinstance(obj, bytes) else orjson.dumps(obj), JSON_HEADERS)


async def cut_connection(send: Send, receive: Receive) -> None:
    """Abort the TCP connection (RST, no more bytes) and wait until uvicorn has noticed, so it
    does not try to answer with a 500 of its own."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise RuntimeError("simulated connection drop")  # the server closes the connection itself
    transport.abort()
    try:
        await asyncio.wait_for(receive(), 2.0)
    except Exception:  # noqa: BLE001 - a timeout or any error: the connection is gone
        pass


class StreamDied(Exception):
    """The die_midstream fault fired: the stream ends here with a cut connection."""


class EventSender:
    """Sends SSE events as body chunks, raising StreamDied instead of the event after the first
    `die_after` (the die_midstream fault), the same count on every route's stream."""

    __slots__ = ("send", "die_after", "sent")

    def __init__(self, send: Send, die_after: int | None) -> None:
        self.send = send
        self.die_after = die_after
        self.sent = 0

    async def __call__(self, data: bytes) -> None:
        if self.die_after is not None and self.sent >= self.die_after:
            raise StreamDied
        await self.send({"type": "http.response.body", "body": data, "more_body": True})
        self.sent += 1
