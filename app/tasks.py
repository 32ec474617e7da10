"""Stopping background tasks: cancel, then wait until each has really finished.

The health checker, DNS discovery, the KV-event subscriber and the simulated engine each own
long-running asyncio tasks; they stop them the same way, so one helper serves all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
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
