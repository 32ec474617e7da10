"""Fire-and-forget Store writes from the routers' sync callbacks (on_routed must not block)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from app.tasks import finish_driven, step

log = logging.getLogger(__name__)


class BackgroundWrites:
    """Runs store writes without making the caller wait: each in a task, kept until it finishes (a
    bare create_task may be garbage-collected mid-flight). Failures are logged, never raised.

    `in_place` (a store that never waits, `Store.never_waits`): a write is run to its end at once,
    with no task (two per routed request, each a task creation and a loop step). Only such a
    store's: a write that waits would run under the caller's task, where a timeout it sets would
    cancel the caller."""

    def __init__(self, in_place: bool = False) -> None:
        self.in_place = in_place
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: nothing to schedule on
            coro.close()
            return
        if not self.in_place:
            task = loop.create_task(coro)
        else:
            try:
                pending = step(coro)
            except Exception as exc:  # noqa: BLE001 - a failed write is logged, as a task's would be
                log.warning("background store write failed: %s", exc)
                return
            if pending is None:
                return
            task = loop.create_task(finish_driven(pending))  # it waited after all
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background store write failed: %s", task.exception())

    async def drain(self) -> None:
        """Wait for pending writes (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)
