"""Running the suite in parallel processes (pytest-xdist, as `make test` does) without timing flakes.

A test marked `@pytest.mark.exclusive` runs its body while no other worker runs any part of a test:
it asserts on wall-clock time (a 50 ms budget, a rate over a second, a TTFT ratio) that a busy
neighbour on a 2-core machine would stretch. Every other test runs side by side with the other
workers' tests.

How: one readers-writer lock across the workers, two `flock`ed files in the run's shared temp dir.
Every test holds the lock shared for its whole run protocol (its fixtures' set-up and tear-down
included); an exclusive test trades it for the exclusive lock between its set-up and its tear-down
(around the timed call), so its own set-up and tear-down (starting and stopping servers) overlap
the other workers' tests instead of adding to the serial part of the run. A turnstile, taken
before every shared or exclusive acquisition (never for an exclusive test's return to shared,
which would deadlock with a waiting one), keeps a waiting exclusive test from being overtaken
forever. Without xdist (a plain `pytest tests/test_x.py`) nothing is locked. In both, the cyclic GC
is off during an exclusive test's body (see `pytest_runtest_setup`).

A worker ends without the interpreter's finalisation (`_exit_unfinalized`), once its results are in.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

MARK = "exclusive"

# The files that take longest (10-50 s each under a 4-worker run on the 2-core box, longest first):
# handed out to the workers first, so that none of them starts last while the other workers sit
# idle. Among them the ones that mostly wait (the stores' expiry, the tracing exporter's flushes: 20-25
# s each) go early too: handed out in order they reached the exclusive tests at the end, whose turnstile
# then waited for them while the other workers sat idle. Files with an exclusive test go last whatever their length: an exclusive test handed out
# early waits at the turnstile for the other workers' running tests (a 40 s one, at the start)
# while the workers behind it idle; at the end the others have only short files left.
LONG_FILES = ("test_proxy_whole_events.py", "test_fuzz_proxy.py", "test_ui_browser.py",
              "test_routing_session_keys.py", "test_store_conformance.py", "test_tracing.py",
              "test_prefix_integration.py", "test_sim_oracle_render.py",
              "test_sim_oracle_kv_events.py", "test_serve_workers.py", "test_diagnosis_pods.py",
              "test_proxy_faults.py", "test_api_messages.py", "test_epp_agents.py", "test_proxy_migrate.py",
              "test_api_responses.py", "test_prefix_pool.py", "test_state_proxies.py", "test_proxy_openai.py",
              "test_ui_funnel.py", "test_deploy_prometheus.py", "test_admission_routes.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}: asserts on wall-clock timing: runs while no other xdist worker runs a test "
                   "(tests/parallel.py)")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        atexit.register(_exit_unfinalized)  # registered first, so it runs after every other exit handler


def _exit_unfinalized() -> None:
    """End a worker process without the interpreter's finalisation. By the time the exit handlers
    run, the worker has reported every result and torn down its fixtures, and every other exit
    handler has run (this one was registered first); what is left is freeing the objects of a few
    hundred tests (dozens of in-process gateways, each with its event-loop thread), which took the
    workers 3-4 s at the end of every run while the controller waited for them to exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


TURNSTILE = "prefixgate-turnstile.lock"
TESTS = "prefixgate-tests.lock"
HELD = pytest.StashKey[int]()  # the descriptor holding this test's lock on TESTS
ALONE = pytest.StashKey[contextlib.ExitStack]()  # an exclusive test's exclusive hold, set-up to tear-down


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


def _through_turnstile(shared_dir: Path, fd: int, mode: int) -> None:
    with _flock(shared_dir / TURNSTILE, fcntl.LOCK_EX):
        fcntl.flock(fd, mode)


@contextlib.contextmanager
def turn(shared_dir: Path) -> Iterator[int]:
    """Hold the run's readers-writer lock shared (for one test's whole protocol); yields the descriptor."""
    fd = os.open(shared_dir / TESTS, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _through_turnstile(shared_dir, fd, fcntl.LOCK_SH)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def alone(shared_dir: Path, fd: int) -> Iterator[None]:
    """Trade the shared hold on `fd` for the exclusive one, and back. The shared hold is let go
    before queueing at the turnstile: two exclusive tests each waiting for the other's shared hold
    would wait forever. The way back takes no turnstile: a waiting exclusive test holds it."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    _through_turnstile(shared_dir, fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_SH)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist: long files first, files with an exclusive test last (the same order in every
    worker, as xdist requires); a plain run keeps the collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    alone = {item.path for item in items if item.get_closest_marker(MARK) is not None}

    def rank(item: pytest.Item) -> int:
        if item.path in alone:
            return len(LONG_FILES) + 1
        if item.path.name in LONG_FILES:
            return LONG_FILES.index(item.path.name)
        return len(LONG_FILES)

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
    with turn(shared) as fd:
        item.stash[HELD] = fd
        try:
            yield
        finally:
            del item.stash[HELD]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """An exclusive test's set-up done, wait to be alone (the wait counts as set-up time in
    --durations, not as the test's), and keep the cyclic GC off until its tear-down: a full
    collection walks everything the earlier tests of this process left alive, a pause of up to
    ~0.5 s in the middle of a timed body (a 50 ms budget's, say) that a gateway process of its
    own would not have."""
    outcome = yield
    if item.get_closest_marker(MARK) is None or outcome.exception is not None:
        return
    held = contextlib.ExitStack()
    shared = _shared_dir(item.config)
    if shared is not None:
        held.enter_context(alone(shared, item.stash[HELD]))
    if gc.isenabled():
        gc.disable()
        held.callback(gc.enable)
    item.stash[ALONE] = held


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    held = item.stash.get(ALONE, None)
    if held is not None:
        del item.stash[ALONE]
        held.close()  # GC on, and back to shared before the tear-down, which runs beside the others' tests
    yield
