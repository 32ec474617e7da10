"""Task helpers: stopping background tasks, and stepping a coroutine without a task.

The health checker, DNS discovery, the KV-event subscriber and the simulated engine each own
long-running asyncio tasks; they stop them the same way (`cancel_and_wait`). The relay's client
writes and the routers' store writes usually complete without waiting: `drive` runs such a
coroutine at once, and `finish_driven` finishes one that had to wait, so the common case costs no
task and no loop iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel every task given (None is skipped), then await each one so that its `finally` blocks
    have run before the caller closes what the task uses. Only the cancellation itself is swallowed:
    another exception a task ends with still propagates."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def drive(call: Callable[[Any], Any], message: Any) -> Any:
    """Run `call(message)` (an ASGI send) to completion now when it does not wait; returns None
    then, else the still-running coroutine and what it waits on, for `finish_driven`."""
    return step(call(message))


def step(coro: Coroutine[Any, Any, Any]) -> tuple[Any, Any] | None:
    """Run `coro` until it first waits: None when it finished, else it and what it waits on, for
    `finish_driven`. Its exception, if it raises, propagates."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return coro, waiting


async def finish_driven(pending: tuple[Any, Any]) -> None:
    """Finish a coroutine `drive` started, in the caller's task: wait for what it waits on, then
    resume it (it reads that future's result itself, as under a task)."""
    coro, waiting = pending
    try:
        while True:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait([waiting])
            waiting = coro.send(None)
    except StopIteration:
        return
    finally:
        coro.close()
