"""One thread that runs functions for the event loop: `await worker.run(fn, *args)`.

What `loop.run_in_executor` on a one-thread pool does, for half the CPU of a round trip: the pool
takes two locks and a Python semaphore per call, builds a concurrent Future (with its Condition)
and chains it to an asyncio future. Here a call is one `SimpleQueue.put` (C) and one
`call_soon_threadsafe` that settles the caller's future. Idle, one uvloop round trip of a function
that does nothing: 92 µs of process CPU through a one-thread pool, 46 µs here. The tenant tracker's
diagnoses of large prompts go through it: every break of a 100 KB prompt pays one round trip.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any


class OffLoop:
    """A daemon thread, started on the first call, that runs calls in order. A caller cancelled
    while its call waits or runs gets no result; the call itself is not interrupted. A forked
    child starts its own thread on its first call (the parent's is not in it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        _instances.add(self)

    def _forget_thread(self) -> None:
        """In a forked child: the parent's thread and what it had queued are not here."""
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            self._start()
        self._queue.put((loop, future, fn, args))
        return await future

    def close(self) -> None:
        """Let the thread end once the calls already queued have run."""
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread = None

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, future, fn, args = item
            if future.cancelled():  # a flag read across threads: at worst the call runs for nothing
                continue
            try:
                settle = partial(_set_result, future, fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
                settle = partial(_set_exception, future, exc)
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


_instances: weakref.WeakSet[OffLoop] = weakref.WeakSet()


def _after_fork() -> None:
    for worker in list(_instances):
        worker._forget_thread()


os.register_at_fork(after_in_child=_after_fork)


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
