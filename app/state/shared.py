"""The embedded shared store of `prefixgate serve --workers N` without Redis (docs/performance.md).

The master process holds one `MemoryStore` and serves it over a UNIX socket (`StoreServer`);
every worker talks to it through `SharedStore`, a `Store` whose every call is one round trip. So
the workers see one residency index, one set of bindings and one tenant history, exactly as the
gateway pods of a Redis deployment do, and routing quality does not depend on which worker a
request reached. Why not a Redis of our own: the default deployment needs no extra binary, and the
store's semantics (LRU/TTL bounds, prefix-closed residency) stay the tested `MemoryStore`'s.

Wire format: frames of a 4-byte big-endian length and an orjson array. Request
`[id, method, args]`, reply `[id, ok, value]`; id 0 is a one-way call: every write (nothing waits
for a reply; the single connection keeps the order, so a later read sees it). The frames a worker
queues in one turn of its loop go out in one write. Block hashes are 64-bit, which orjson carries
exactly. A write in flight when the master goes away is lost, as a Redis write past its queue bound
is: the index and history are routing and reporting hints, rebuilt by the next requests.

Degrading (the Store contract): when the master is unreachable the worker answers from a local
`MemoryStore` and `up()` is False; it reconnects at most every `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from app.state.base import LIFECYCLE, Store, contract_methods
from app.state.memory import MemoryStore

log = logging.getLogger("prefixgate.state.shared")
HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a 4M-block chain is 80 MB of JSON; anything larger is a bug
RETRY_S = 1.0
CALL_TIMEOUT_S = 5.0
# the Store methods a worker may call on the master's store (nothing else is reachable): the whole
# contract but the lifecycle, derived from it so a method added to the contract is served too
METHODS = contract_methods() - LIFECYCLE


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
    if size > MAX_FRAME:
        raise ValueError(f"store frame of {size} bytes")
    return orjson.loads(await reader.readexactly(size))


def _plain(value: Any) -> Any:
    """What orjson cannot write itself: a packed chain (array('Q'), a fingerprint's block hashes)
    goes as a list of its ints."""
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a store argument")


def _frame(value: Any) -> bytes:
    body = orjson.dumps(value, default=_plain)
    return HEADER.pack(len(body)) + body


class StoreServer:
    """The master's side: one MemoryStore, served to every worker over `sock` (a bound, listening
    AF_UNIX socket created before the workers were forked)."""

    def __init__(self, store: MemoryStore, sock: socket.socket) -> None:
        self.store = store
        self.sock = sock
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        await self.store.start()
        self._server = await asyncio.start_unix_server(self._serve, sock=self.sock)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._clients):  # the workers see EOF and answer from local state
                writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        await self.store.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while True:
                call_id, method, args = await _read_frame(reader)
                try:
                    if method not in METHODS:
                        raise ValueError(f"no store method {method!r}")
                    result = getattr(self.store, method)(*args)
                    if asyncio.iscoroutine(result):
                        result = await result
                    reply = [call_id, True, result]
                except Exception as exc:  # noqa: BLE001 -- the worker gets the error, the server lives on
                    reply = [call_id, False, f"{type(exc).__name__}: {exc}"]
                if call_id:
                    writer.write(_frame(reply))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker went away
        except ValueError as exc:  # an oversized or unreadable frame: the stream cannot be trusted
            log.warning("shared store: dropped a worker's connection (%s)", exc)
        finally:
            self._clients.discard(writer)
            writer.close()


class SharedStore(Store):
    """A worker's Store: every call goes to the master's store over `path`; while the master is
    unreachable, a local MemoryStore with the same bounds answers (`up()` False)."""

    def __init__(self, path: str, local: MemoryStore, report_up: Callable[[float], None] | None = None) -> None:
        self.path = path
        self.local = local
        self.report_up = report_up or (lambda _: None)  # prefixgate_state_backend_up
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._reader_task: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._connecting: asyncio.Lock | None = None
        self._out: list[bytes] = []  # frames queued this turn of the loop (`_send`)

    async def start(self) -> None:
        await self.local.start()
        await self._connect()

    async def close(self) -> None:
        writer, self._writer = self._writer, None  # a closing store's connection is not "lost"
        if writer is not None:
            writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task
        await self.local.close()

    def up(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def _connect(self) -> bool:
        if self.up():
            return True
        if time.monotonic() < self._retry_at:
            return False
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.up():
                return True
            try:
                self._reader, self._writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.path), CALL_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                self._retry_at = time.monotonic() + RETRY_S
                self.report_up(0)
                log.warning("shared store %s unreachable (%s): answering from local state", self.path, exc)
                return False
            self.report_up(1)
            self._reader_task = asyncio.create_task(self._read_replies(self._reader))
            return True

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                call_id, ok, value = await _read_frame(reader)
                future = self._pending.pop(call_id, None)
                if future is not None and not future.done():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(RuntimeError(value))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._lost()

    def _lost(self) -> None:
        if self._writer is not None:
            log.warning("shared store %s: connection lost; local state answers until it is back", self.path)
            self._writer.close()
        self._writer = None
        self.report_up(0)
        self._retry_at = time.monotonic() + RETRY_S
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionError("shared store connection lost"))

    def _send(self, frame: bytes) -> None:
        """Queue a frame; every frame queued in one turn of the loop goes out in one write."""
        self._out.append(frame)
        if len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self._writer is not None and not self._writer.is_closing():
            self._writer.write(out[0] if len(out) == 1 else b"".join(out))

    async def _write(self, method: str, *args: Any) -> None:
        """A write: one-way (no reply awaited; the one connection keeps the order, so a later read
        sees it). While the master is unreachable it lands in the local store."""
        if await self._connect():
            self._send(_frame([0, method, list(args)]))
        else:
            await getattr(self.local, method)(*args)

    async def _call(self, method: str, *args: Any) -> Any:
        """The master's answer, or the local store's when the master cannot be reached."""
        if await self._connect() and self._writer is not None:
            self._next_id += 1
            call_id = self._next_id
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._pending[call_id] = future
            try:
                self._send(_frame([call_id, method, list(args)]))
                return await asyncio.wait_for(future, CALL_TIMEOUT_S)
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                self._pending.pop(call_id, None)
                log.warning("shared store %s: %s failed (%s): local state answers", self.path, method, exc)
        return await getattr(self.local, method)(*args)

    # ---------------------------------------------------------------- the Store protocol
    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        self.local.set_capacity(replica, capacity_blocks)
        if self.up():
            self._send(_frame([0, "set_capacity", [replica, capacity_blocks]]))

    async def residency_lookup(self, block_hashes: Sequence[int], replicas: list[str]) -> dict[str, int]:
        return dict(await self._call("residency_lookup", block_hashes, replicas))

    async def residency_add(self, replica: str, block_hashes: Sequence[int]) -> None:
        await self._write("residency_add", replica, block_hashes)

    async def residency_touch(self, replica: str, block_hashes: Sequence[int]) -> None:
        await self._write("residency_touch", replica, block_hashes)

    async def residency_remove(self, replica: str, block_hashes: list[int]) -> None:
        await self._write("residency_remove", replica, block_hashes)

    async def residency_clear(self, replica: str) -> None:
        await self._write("residency_clear", replica)

    async def recent_add(self, replica: str) -> None:
        await self._write("recent_add", replica)

    async def recent_values(self, replicas: list[str]) -> dict[str, float]:
        return dict(await self._call("recent_values", replicas))

    async def binding_get(self, key: str) -> str | None:
        return await self._call("binding_get", key)

    async def binding_set(self, key: str, replica: str) -> None:
        await self._write("binding_set", key, replica)

    async def history_append(self, tenant: str, record: dict) -> None:
        await self._write("history_append", tenant, record)

    async def history_recent(self, tenant: str, limit: int) -> list[dict]:
        return list(await self._call("history_recent", tenant, limit))

    async def counter_incr(self, tenant: str, field: str, amount: float = 1.0) -> None:
        await self._write("counter_incr", tenant, field, amount)

    async def counters(self, tenant: str) -> dict[str, float]:
        return dict(await self._call("counters", tenant))

    async def tenants(self) -> list[str]:
        return list(await self._call("tenants"))
