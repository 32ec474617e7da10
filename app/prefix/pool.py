"""Cold-prompt tokenisation in a process pool, with a budget (docs/engine-hashing.md, "Cold prompts").

A prompt the gateway has never seen (no memoised segment, no reusable head) costs its full
tokenisation: ~0.5 s of CPU per MB. In a thread of the serving process that work competes with
the event loop: converting 250k ids to Python objects holds the GIL, and the tokenizer's own
threads take the cores the relay needs. Here it runs in separate processes, sized to the cores the
serving processes leave spare, so the event loop never waits for it.

Only cold work of at least `min_chars` new characters goes there (smaller work is cheaper in a
worker thread). The pool is bounded: at most `workers * inflight` such tokenisations are admitted
at once (`try_reserve`). A request that finds it full is not queued behind the others: the prefix stage
routes it on the leading blocks it already knows and counts it as
`prefixgate_fingerprint_requests_total{mode="approx"}` (app/pipeline/prefix_stage.py). After its
response it waits for a slot (`prefix.cold_pool_defer_s` at most, `DEFERRED_PER_SLOT` such requests
per slot), so the chain the engine cached is still learned; `prefixgate_fingerprint_deferred_total`
counts the outcome.

Processes are spawned (never forked from a process with threads and an event loop) on the first
cold prompt, not at start-up: most deployments and every test without a cold long prompt never
pay for them. `close()` stops them with the server; each child also exits within a second of
its parent's death.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

DEFAULT_DEFER_S = 30.0  # prefix.cold_pool_defer_s
DEFERRED_PER_SLOT = 4  # refused requests that may wait for a slot after their response, per slot
DEFER_POLL_S = 0.02  # how often such a request polls for a slot
_SERVE_WORKERS = 1  # serving processes on this host: `serve --workers N` sets it before forking


def set_serve_workers(n: int) -> None:
    """Called by the `serve --workers` master before it forks (the workers inherit it)."""
    global _SERVE_WORKERS
    _SERVE_WORKERS = max(1, n)


PARENT_POLL_S = 1.0
# Below this many new characters a worker thread is cheaper than a trip to a process (~30 ms of
# tokenising, of which the GIL is held only to copy the ids out), and a pool is never spawned.
DEFAULT_MIN_CHARS = 64 * 1024
# The same with the fast BPE encoder (app/prefix/fast_bpe.py): it releases the GIL while it
# encodes and holds it to build the ids, ~1 ms per 100 KB of text (measured: a loop thread's
# longest stall beside 100 KB encodes 1.2 ms, beside 1 MB ones 11.6 ms).
FAST_MIN_CHARS = 256 * 1024


def min_chars_for(setting: int | str, fast: bool) -> int:
    """`prefix.cold_pool_min_chars`, with "auto" resolved for the encoder in use."""
    if isinstance(setting, int):
        return setting
    return FAST_MIN_CHARS if fast else DEFAULT_MIN_CHARS


def spare_cores(serve_workers: int | None = None) -> int:
    """Pool processes per serving process: the cores left after one per serving process, shared
    among them; at least one (even on a fully used machine a separate process keeps the work off
    the event loop's GIL)."""
    n = max(1, serve_workers if serve_workers is not None else _SERVE_WORKERS)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (cores - n) // n)


def batch_encode(tokenizer: Any, texts: list[str]) -> list[Any]:
    """`tokenizer.encode_batch(texts, add_special_tokens=False)` without the character offsets
    (`encode_batch_fast`, tokenizers >= 0.21): the same ids, and ~30% less CPU on a long text,
    which is most of a cold prompt's cost. Older tokenizers: `encode_batch`."""
    fast = getattr(tokenizer, "encode_batch_fast", None)
    return (fast or tokenizer.encode_batch)(texts, add_special_tokens=False)


def encode_texts(tokenizer: Any, fast: Any, texts: list[str]) -> list[array]:
    """ids of texts without added tokens, as arrays: through `fast` (a FastBPE,
    app/prefix/fast_bpe.py) when there is one, else the tokenizer's batch encode. The serving
    process's worker threads and the pool's children encode through this one choice."""
    if fast is not None:
        return fast.encode_many(texts)
    return [array("I", e.ids) for e in batch_encode(tokenizer, texts)]


# ---------------------------------------------------------------------- in the child process
_TOKENIZER: Any = None
_FAST: Any = None  # the child's FastBPE when the parent uses one (app/prefix/fast_bpe.py)


def _init_child(tokenizer_json: str, fast_split_at: list[str] | None = None) -> None:
    """Load the tokenizer once per child; one thread each (the pool is sized to the cores). With
    `fast_split_at` (the parent encodes through the fast BPE encoder), the child builds and checks
    its own; one that fails its checks leaves the child on the tokenizer's encoder (the same ids)."""
    global _TOKENIZER, _FAST
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    from tokenizers import Tokenizer
    _TOKENIZER = Tokenizer.from_file(tokenizer_json)
    if fast_split_at is not None:
        from app.prefix.fast_bpe import build
        _FAST = build(_TOKENIZER, fast_split_at)


def _exit_with_parent(parent: int) -> None:
    """A killed serving process leaves no orphan: the child's queue would never reach EOF (it
    holds a write end itself), and PR_SET_PDEATHSIG fires when the *thread* that spawned the child
    ends, which here is a worker thread, not the process."""
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(0)


def _encode_child(texts: list[str]) -> list[bytes]:
    """ids of each text (add_special_tokens=False, as engines encode chat), as raw uint32 bytes:
    the parent rebuilds the arrays with one copy, no per-id objects on either side."""
    return [ids.tobytes() for ids in encode_texts(_TOKENIZER, _FAST, texts)]


def _ping() -> int:
    return os.getpid()


# ---------------------------------------------------------------------- in the serving process
class ColdPool:
    """A budgeted process pool that encodes texts with the same `tokenizer.json` as the gateway."""

    def __init__(self, tokenizer_json: str | Path, workers: int, inflight: int = 2,
                 min_chars: int = DEFAULT_MIN_CHARS, fast_split_at: list[str] | None = None,
                 defer_s: float = DEFAULT_DEFER_S) -> None:
        self.tokenizer_json = str(tokenizer_json)
        self.fast_split_at = fast_split_at  # the children encode through the fast BPE encoder too
        self.min_chars = min_chars  # smaller cold work stays in the worker threads
        self.workers = max(1, workers)
        self.capacity = self.workers * max(1, inflight)
        # refused work waits after its response at most `defer_s` for a slot, `capacity *
        # DEFERRED_PER_SLOT` requests at a time (`reserve_deferred`)
        self.defer_s = max(0.0, defer_s)
        self.deferred_limit = self.capacity * DEFERRED_PER_SLOT
        self.deferred_waiting = 0  # only the event loop's `reserve_deferred` changes it
        self.inflight = 0  # admitted cold tokenisations not yet released
        self.admitted = 0
        self.refused = 0
        self.encoded = 0  # batches encoded in a pool process
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False

    def try_reserve(self, counted: bool = True) -> bool:
        """Admit one cold tokenisation, or refuse at once when `capacity` are in flight. `counted`:
        a request's admission (`admitted`, `refused`); a second try for refused work is not."""
        with self._lock:
            if self._closed or self.inflight >= self.capacity:
                self.refused += counted
                return False
            self.inflight += 1
            self.admitted += counted
            return True

    def release(self) -> None:
        with self._lock:
            self.inflight = max(0, self.inflight - 1)

    async def reserve_deferred(self) -> bool:
        """A slot for work refused before routing, after its response (not counted, as
        `try_reserve(counted=False)`): at once when one is free, else polling every DEFER_POLL_S
        for at most `defer_s`, behind the requests still to be routed, which take free slots
        first. False when none came in time, the pool closed, or `deferred_limit` requests
        already wait."""
        if self.try_reserve(counted=False):
            return True
        if self.deferred_waiting >= self.deferred_limit:
            return False
        self.deferred_waiting += 1
        try:
            deadline = time.monotonic() + self.defer_s
            while not self._closed and time.monotonic() + DEFER_POLL_S <= deadline:
                await asyncio.sleep(DEFER_POLL_S)
                if self.try_reserve(counted=False):
                    return True
            return False
        finally:
            self.deferred_waiting -= 1

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the cold-prompt pool is closed")
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_child, initargs=(self.tokenizer_json, self.fast_split_at))
            return self._executor

    def encode(self, texts: list[str]) -> list[array]:
        """ids of `texts`, encoded in a pool process (blocking: call from a worker thread)."""
        out = []
        executor = self._pool()
        try:
            raws = executor.submit(_encode_child, texts).result()
        except BrokenProcessPool:  # a child died (OOM-killed, signalled): the next call starts anew
            with self._lock:
                if self._executor is executor:
                    self._executor = None
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        with self._lock:
            self.encoded += 1
        for raw in raws:
            ids = array("I")
            ids.frombytes(raw)
            out.append(ids)
        return out

    def pids(self) -> list[int]:
        """The live pool processes (tests, CPU accounting)."""
        executor = self._executor
        procs = getattr(executor, "_processes", None) or {}
        return [p.pid for p in procs.values() if p.is_alive() and p.pid is not None]

    def close(self) -> None:
        """Stop the processes (server shutdown); admitted work still running is cancelled."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
