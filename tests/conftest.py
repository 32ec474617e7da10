"""Shared fixtures: simulated replicas and a proxy in front of them, over real loopback HTTP.

- `sim_factory(replicas=2, **SimOptions)` -> a started `app.sim.testing.SimCluster` (stopped at
  teardown); `sim` is a 2-replica cluster at time_scale 0 (no simulated delays).
- `proxy_factory(backends, **settings)` -> `ProxyHandle`: `create_app(Settings)` in a ServerThread.
  `backends` is a SimCluster, anything with `.urls`/`.url`, or a list of URLs; keyword arguments are
  Settings sections deep-merged over the defaults (e.g. `routing={"policy": "round_robin"}`,
  `limits={"max_body_bytes": 1024}`, `names=["a", "b"]` names the backends).
- `proxy` is a proxy in front of `sim`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings

from app.config import Settings, deep_merge
from app.server import PrefixgateApp, create_app
from app.services import Services
from app.serving import ServerThread

# redis_server (session), redis_proc (per test, killable), redis_namespace: a real redis-server;
# tests.parallel: the `exclusive` mark (a timing test runs alone under pytest-xdist)
pytest_plugins = ["tests.redis_server", "tests.parallel"]

# Hypothesis' default 200 ms deadline per example is a timing assertion: a loaded machine (or a
# neighbouring xdist worker) fails a correct test with it. Property tests assert behaviour only.
settings.register_profile("prefixgate", deadline=None)
settings.load_profile("prefixgate")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Collection imports every test module, app/ and the clients: ~300k objects that live for the
    whole run. While they are made, the cyclic GC ran full collections over the growing heap (8
    per worker, 50-400 ms each), and afterwards every full collection walked them again (0.7-0.9 s
    each late in a run: ~28 s of CPU a run, and a stalled in-process gateway during each, which a
    test's 50 ms budget does not survive). So: no collections while collecting, then one, and what
    is left is frozen (`gc.freeze`: never scanned again, never freed; the tests' own objects are
    collected as usual)."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def _one_default_tls_context() -> None:
    """Every httpx client (the engine scraper of each in-process proxy, `httpx.get`) and every
    openai and anthropic client (clients of `httpx2`, the fork those SDKs ship with) builds a TLS
    context for its default `verify=True`, loading the CA bundle: ~30 ms of CPU each, over a
    thousand times a run (a client per request or per poll), for connections that are plain HTTP
    on loopback. A test process builds that default context once per library; any other
    `verify`/`cert` still gets its own. Child processes are not affected."""
    import functools
    import importlib

    for name in ("httpx._transports.default", "httpx2._transports.default"):
        try:
            transports = importlib.import_module(name)
        except ImportError:
            continue
        build = transports.create_ssl_context
        default = functools.cache(lambda build=build: build())

        def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True,
                               build: Any = build, default: Any = default) -> Any:
            if verify is True and cert is None and trust_env:
                return default()
            return build(verify=verify, cert=cert, trust_env=trust_env)

        transports.create_ssl_context = create_ssl_context


_one_default_tls_context()


@dataclass
class ProxyHandle:
    app: PrefixgateApp
    server: ServerThread
    settings: Settings

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        """For the openai client: `OpenAI(base_url=proxy.base_url, api_key="x")`."""
        return self.server.url + "/v1"

    @property
    def services(self) -> Services:
        return self.app.services

    def metrics_text(self) -> str:
        return self.services.metrics.render()[0].decode()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every request the proxy accepted has finished (after_response hooks and
        metrics included): a client can see the end of a response just before that."""
        deadline = time.monotonic() + timeout
        while self.app.openai.active:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.app.openai.active} request(s) still active after {timeout}s")
            time.sleep(0.005)

    def drain(self, timeout: float = 20.0) -> None:
        """settle(), then wait for the prefix stage's after-response work (residency learned,
        continuity tracked): the next turn is routed on what this one left, however loaded the CPU."""
        self.settle(timeout)
        if self.services.prefix is not None:
            asyncio.run_coroutine_threadsafe(self.services.prefix.drain(), self.server.loop).result(timeout)

    def wait_scraped(self, timeout: float = 10.0) -> None:
        """Wait for the engine scraper's first pass over every replica (which sets its engine,
        capacity and load gauges together)."""
        deadline = time.monotonic() + timeout
        while any(r.kv_blocks is None or r.engine_running is None for r in self.services.replicas.all()):
            assert time.monotonic() < deadline, "no engine scrape"
            time.sleep(0.02)

    def wait_models(self, timeout: float = 10.0) -> None:
        """Wait until the health checker has read every replica's model list: until then a replica
        whose list is unknown does not serve the model (the `serves_model` filter)."""
        deadline = time.monotonic() + timeout
        while any(r.models is None for r in self.services.replicas.all()):
            assert time.monotonic() < deadline, "a replica's model list is still unknown"
            time.sleep(0.01)

    def sample(self, name: str, **labels: str) -> float | None:
        """The value of one sample in the proxy's registry (None when absent), once settled."""
        self.settle()
        return self.services.metrics.registry.get_sample_value(name, labels)

    def stop(self) -> None:
        self.server.stop()


def _urls(backends: Any) -> list[str]:
    if isinstance(backends, str):
        return [backends]
    urls = getattr(backends, "urls", None)
    if urls is not None:
        return list(urls)
    url = getattr(backends, "url", None)
    if isinstance(url, str):
        return [url]
    return [u if isinstance(u, str) else u.url for u in backends]


def build_settings(backends: Any, names: list[str] | None = None, **sections: Any) -> Settings:
    urls = _urls(backends)
    entries = [{"url": u, **({"name": names[i]} if names else {})} for i, u in enumerate(urls)]
    return Settings(**deep_merge({"backends": entries}, sections))


def begin_shutdown(servers: list[ServerThread]) -> None:
    """Tell every server to exit at once: each then takes its ~0.1 s of uvicorn shutdown in parallel
    with the others, and the `stop()` calls that follow only join them."""
    for server in servers:
        server.request_stop()


# The in-process servers the running test's factories started (proxies and simulated replicas):
# all are told to stop when its tear-down begins, so the proxies' and the replicas' shutdowns
# overlap instead of running one fixture after the other (~0.1 s each, a thousand tests).
_TEST_SERVERS: list[ServerThread] = []


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    servers = list(_TEST_SERVERS)
    _TEST_SERVERS.clear()
    begin_shutdown(servers)
    yield


@pytest.fixture
def proxy_factory() -> Iterator[Callable[..., ProxyHandle]]:
    """Started proxies; told to stop when the test's tear-down begins (`pytest_runtest_teardown`),
    joined in reverse order."""
    with contextlib.ExitStack() as started:

        def make(backends: Any, names: list[str] | None = None, **sections: Any) -> ProxyHandle:
            settings = build_settings(backends, names, **sections)
            app = create_app(settings)
            handle = ProxyHandle(app, ServerThread(app).start(), settings)
            _TEST_SERVERS.append(handle.server)
            started.callback(handle.stop)
            return handle

        yield make


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., Any]]:
    from app.sim.testing import SimCluster

    with contextlib.ExitStack() as started:  # told to stop as proxy_factory's are, joined in reverse order

        def make(replicas: int = 2, **options: Any) -> Any:
            cluster = SimCluster(replicas=replicas, **options)
            cluster.start()
            _TEST_SERVERS.extend(cluster.servers)
            started.callback(cluster.stop)
            return cluster

        yield make


@pytest.fixture
def sim(sim_factory: Callable[..., Any]) -> Any:
    return sim_factory(replicas=2, time_scale=0.0)


@pytest.fixture
def proxy(proxy_factory: Callable[..., ProxyHandle], sim: Any) -> ProxyHandle:
    return proxy_factory(sim)


@pytest.fixture
def fake_upstream_factory() -> Iterator[Callable[..., Any]]:
    """`fake_upstream_factory(script)` -> a started fake_upstream.FakeUpstream (tests/)."""
    from fake_upstream import FakeUpstream

    servers: list[FakeUpstream] = []

    def make(script: Any, model: str = "fake", **options: Any) -> FakeUpstream:
        server = FakeUpstream(script, model, **options).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
