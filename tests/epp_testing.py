"""Helpers of the Endpoint Picker tests: `prefixgate epp` started in-process on loopback ports
(`epp_factory`), driven by the test data plane (tests/epp_dataplane.py), and the workload's bodies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from app.epp import protocol
from app.epp.server import EppServer, create_epp_app
from app.server import PrefixgateApp
from app.serving import ServerThread
from tests.chat_history import growing_history, words
from tests.conftest import build_settings
from tests.epp_dataplane import DataPlane, Result

NAMES = ["r0", "r1", "r2", "r3"]


@dataclass
class EppHandle:
    app: PrefixgateApp
    epp: EppServer
    server: ServerThread

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.epp.grpc_port}"

    def run(self, coro_fn: Callable[[DataPlane], Any]) -> Any:
        """Run `coro_fn(plane)` on a fresh loop of the test's thread (the EPP has its own)."""
        async def main() -> Any:
            plane = DataPlane(self.target, self.epp.certificate)
            try:
                return await coro_fn(plane)
            finally:
                await plane.close()
        return asyncio.run(main())

    def settle(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.epp.processor.active:
            assert time.monotonic() < deadline, "ext_proc streams still open"
            time.sleep(0.005)
        services = self.app.services

        async def written() -> None:  # post-response work done, its shared-state writes sent
            if services.prefix is not None:
                await services.prefix.drain()
            flush = getattr(services.store, "flush", None)
            if flush is not None:
                await flush()

        if self.server.loop is not None:
            asyncio.run_coroutine_threadsafe(written(), self.server.loop).result(timeout)

    def sample(self, name: str, **labels: str) -> float | None:
        self.settle()
        return self.app.services.metrics.registry.get_sample_value(name, labels)


def make_epp(backends: Any, names: list[str] | None = None, **sections: Any) -> EppHandle:
    """`prefixgate epp`'s app (control plane + ext_proc + health on free loopback ports), started."""
    sections["epp"] = {"host": "127.0.0.1", "grpc_port": 0, "health_port": 0, **sections.get("epp", {})}
    app, epp = create_epp_app(build_settings(backends, names, **sections))
    return EppHandle(app, epp, ServerThread(app).start())


@pytest.fixture(name="epp_factory")
def epp_factory_fixture() -> Iterator[Callable[..., EppHandle]]:
    """`epp_factory(backends, names, **sections)` -> a started EppHandle, stopped at teardown (a
    test module imports `epp_factory_fixture` to use it)."""
    with contextlib.ExitStack() as started:
        def make(backends: Any, names: list[str] | None = None, **sections: Any) -> EppHandle:
            handle = make_epp(backends, names, **sections)
            started.callback(handle.server.stop)
            return handle
        yield make


def total(epp: EppHandle, name: str, **labels: str) -> float:
    """The sum of every sample `name` whose labels include `labels` (once settled)."""
    epp.settle()
    return sum(s.value for family in epp.app.services.metrics.registry.collect() for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def endpoint(url: str) -> str:
    return protocol.endpoint_of(url)


def conversation(seed: int, turns: int, doc_words: int = 1500) -> list[list[dict]]:
    system = {"role": "system", "content": f"tenant {seed} documents: " + words(seed, doc_words)}
    return growing_history(system, [f"turn {t}: " + words(seed * 100 + t, 60) for t in range(turns)],
                           ["ok " + words(seed + t, 20) for t in range(turns)])


def chat(messages: list[dict], stream: bool = True, **extra: Any) -> dict:
    body = {"model": "sim", "messages": messages, "max_tokens": 4, "stream": stream, **extra}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def sse_usage(result: Result) -> dict:
    usage = None
    for line in result.body.split(b"\n"):
        if line.startswith(b"data: {"):
            payload = orjson.loads(line[6:])
            usage = payload.get("usage") or usage
    assert usage is not None, result.body[-300:]
    return usage
