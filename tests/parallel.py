"""Running the suite in parallel processes (pytest-xdist, as `make test` does) without timing flakes.

A test marked `@pytest.mark.exclusive` runs while no other worker runs a test: it asserts on wall-clock
time (a 50 ms budget, a rate over a second, a TTFT ratio) that a busy neighbour on a 2-core machine
would stretch. Every other test runs side by side with the other workers' tests.

How: one readers-writer lock across the workers, two `flock`ed files in the run's shared temp dir.
An ordinary test holds the lock shared, an exclusive one holds it exclusively; a turnstile taken
first by both keeps a waiting exclusive test from being overtaken forever by the others. The lock
covers the whole run protocol of a test (its fixtures' set-up and tear-down included). Without
xdist (a plain `pytest tests/test_x.py`) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

MARK = "exclusive"

# The files that take longest (10-40 s each, serially on the 2-core box): handed out to the workers
# first, so that none of them starts last while the other workers sit idle (longest first). Files
# with an exclusive test go last: they run alone anyway, in the time the others would idle.
LONG_FILES = ("test_ui_browser.py", "test_fuzz_proxy.py", "test_doctor_decode.py", "test_proxy_whole_events.py",
              "test_prefix_integration.py", "test_proxy_faults.py", "test_prefix_pool.py",
              "test_serve_workers.py", "test_state_proxies.py", "test_admission_routes.py",
              "test_diagnosis_pods.py", "test_epp_agents.py", "test_api_responses.py", "test_api_messages.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}: asserts on wall-clock timing: runs while no other xdist worker runs a test "
                   "(tests/parallel.py)")


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def turn(shared_dir: Path, exclusive: bool) -> Iterator[None]:
    """Hold the run's readers-writer lock: shared for an ordinary test, exclusive for a marked one."""
    with _flock(shared_dir / "prefixgate-turnstile.lock", fcntl.LOCK_EX):
        held = contextlib.ExitStack()
        held.enter_context(_flock(shared_dir / "prefixgate-tests.lock",
                                  fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH))
    with held:
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist: long files first, files with an exclusive test last (the same order in every
    worker, as xdist requires); a plain run keeps the collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    alone = {item.path for item in items if item.get_closest_marker(MARK) is not None}

    def rank(item: pytest.Item) -> int:
        if item.path.name in LONG_FILES:
            return LONG_FILES.index(item.path.name)
        return len(LONG_FILES) + (1 if item.path in alone else 0)

    items.sort(key=rank)  # stable: a file's tests keep their order


def _shared_dir(config: pytest.Config) -> Path | None:
    """The run's temp dir that every worker shares (each worker's basetemp is a child of it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    shared = _shared_dir(item.config)
    if shared is None:
        yield
        return
    with turn(shared, item.get_closest_marker(MARK) is not None):
        yield
