"""OffLoop: one thread running calls for the event loop (app/offloop.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.offloop import OffLoop


class _Slow:
    """A call that runs until released (at most 5 s)."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> str:
        self.started.set()
        self.release.wait(5)
        return "late"

    async def running(self) -> None:
        while not self.started.is_set():
            await asyncio.sleep(0.001)


def test_results_and_exceptions_come_back_in_order_from_one_named_thread() -> None:
    worker = OffLoop("test-offloop")
    ran: list[tuple[int, str]] = []

    def job(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        if i == 2:
            raise ValueError("two")
        return i * 10

    async def main() -> list[object]:
        return await asyncio.wait_for(
            asyncio.gather(*(worker.run(job, i) for i in range(4)), return_exceptions=True), 5)

    out = asyncio.run(main())
    assert out[0] == 0 and out[1] == 10 and out[3] == 30
    assert isinstance(out[2], ValueError) and str(out[2]) == "two"
    assert [i for i, _ in ran] == [0, 1, 2, 3]
    assert {name for _, name in ran} == {"test-offloop"}
    worker.close()


def test_a_cancelled_caller_gets_nothing_and_the_next_call_is_served() -> None:
    worker = OffLoop("test-offloop-cancel")
    slow = _Slow()

    errors: list[dict] = []

    async def main() -> str:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        task = asyncio.ensure_future(worker.run(slow))
        await slow.running()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        slow.release.set()
        return await worker.run(lambda: "next")  # queued behind the cancelled one, still served

    assert asyncio.run(main()) == "next"
    assert errors == []  # the late result was not set on the cancelled future (InvalidStateError)
    worker.close()


def test_a_call_that_ends_after_its_loop_closed_leaves_the_thread_serving() -> None:
    worker = OffLoop("test-offloop-closed")
    slow = _Slow()

    async def abandon() -> None:
        asyncio.ensure_future(worker.run(slow))  # left pending: asyncio.run cancels it, then closes
        await slow.running()

    asyncio.run(abandon())
    slow.release.set()  # the result has no loop to go to

    async def again() -> int:
        return await asyncio.wait_for(worker.run(lambda: 7), 5)  # a dead thread would never answer

    assert asyncio.run(again()) == 7
    worker.close()


def test_close_ends_the_thread_and_a_later_call_starts_another() -> None:
    worker = OffLoop("test-offloop-close")

    async def name() -> str:
        return await worker.run(lambda: threading.current_thread().name)

    assert asyncio.run(name()) == "test-offloop-close"
    first = next(t for t in threading.enumerate() if t.name == "test-offloop-close")
    worker.close()
    first.join(5)
    assert not first.is_alive()
    assert asyncio.run(name()) == "test-offloop-close"
    worker.close()


def test_a_forked_child_starts_its_own_thread() -> None:
    import os

    worker = OffLoop("test-offloop-fork")

    async def call() -> int:
        return await asyncio.wait_for(worker.run(os.getpid), 5)

    assert asyncio.run(call()) == os.getpid()  # the parent's thread is running
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here; a call must still be served
        try:
            os._exit(0 if asyncio.run(call()) == os.getpid() else 1)
        except BaseException:  # noqa: BLE001 - any failure is the child's exit status
            os._exit(2)
    import signal
    import time

    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child never answered")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    worker.close()
