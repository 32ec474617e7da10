"""A rolling update loses nothing: two `prefixgate serve` processes sharing a real Redis, behind a
tiny round-robin client that routes only to gateways whose /readyz says 200 (what a Service's
endpoints do), replaced one after the other while a closed-loop client keeps 64 streams open, the
way a Deployment rolls (its default surge): a new pod, ready on its own address, joins the
endpoints, then an old one gets SIGTERM, turns unready, drains and exits. Every stream must end
with all its tokens and [DONE]: 0 failed, 0 truncated."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.serving import consecutive_free_ports, stop_process
from tests.gateway_process import ROOT, GatewayProcess, started

STREAMS = 64
TOKENS = 16
POLL_S = 0.1  # the client's readiness poll: the Service's endpoint propagation, compressed
ACCEPT_S = 2.0  # shutdown.accept_s: over 10x the slowest readiness poll seen under this load (0.08-0.14 s)


@dataclass
class Counts:
    requests: int = 0
    ok: int = 0
    failed: int = 0
    truncated: int = 0
    examples: list[str] = field(default_factory=list)
    served: set[str] = field(default_factory=set)  # the gateways that completed a stream

    def bad(self, kind: str, detail: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {detail}")


class RoundRobin:
    """Sends each request to the next gateway that answered its last /readyz with 200. Readiness is
    polled from a thread of its own (like kube-proxy, it does not wait on the client's event loop).
    `join`/`leave` change the endpoints (a list replaced whole, so the poller reads one or the other)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.ready = dict.fromkeys(urls, False)
        self._turn = itertools.count()
        self.slowest_poll_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="readiness-poll")

    def __enter__(self) -> RoundRobin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def join(self, url: str) -> None:
        self.urls = [*self.urls, url]

    def leave(self, url: str) -> None:
        self.urls = [u for u in self.urls if u != url]

    def _poll(self) -> None:
        with httpx.Client(timeout=0.5) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                for url in self.urls:
                    try:
                        self.ready[url] = client.get(url + "/readyz").status_code == 200
                    except httpx.HTTPError:
                        self.ready[url] = False
                self.slowest_poll_s = max(self.slowest_poll_s, time.monotonic() - t0)
                self._stop.wait(POLL_S)

    async def pick(self) -> str:
        while True:
            urls = self.urls
            for _ in urls:
                url = urls[next(self._turn) % len(urls)]
                if self.ready.get(url):
                    return url
            await asyncio.sleep(0.01)


async def one_stream(client: httpx.AsyncClient, url: str, counts: Counts, n: int) -> None:
    body = {"model": "sim", "stream": True, "max_tokens": TOKENS, "ignore_eos": True,
            "messages": [{"role": "system", "content": "You are a patient counter. " * 20},
                         {"role": "user", "content": f"count {n}"}]}
    counts.requests += 1
    tokens, done = 0, False
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            if r.status_code != 200:
                counts.bad("failed", f"{url} status {r.status_code}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    counts.bad("failed", f"{url} error event {chunk['error']}")
                    return
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    tokens += 1
    except httpx.HTTPError as exc:
        counts.bad("failed" if tokens == 0 else "truncated", f"{url} {type(exc).__name__}: {exc}")
        return
    if not done or tokens != TOKENS:
        counts.bad("truncated", f"{url} done={done} tokens={tokens}")
    else:
        counts.ok += 1
        counts.served.add(url)


async def closed_loop(rr: RoundRobin, clients: dict[str, httpx.AsyncClient], counts: Counts,
                      stop: asyncio.Event, worker: int) -> None:
    for n in itertools.count():
        if stop.is_set():
            return
        url = await rr.pick()
        await one_stream(clients[url], url, counts, worker * 100_000 + n)


def terminate(gw: GatewayProcess) -> None:
    """What the kubelet does to an old pod: SIGTERM, then wait for it to drain and exit."""
    gw.signal(signal.SIGTERM)
    assert gw.wait(60) == 0, gw.log()


@pytest.fixture
def sim_process() -> Iterator[list[str]]:
    """Two simulated replicas in their own process, so the client's event loop here is not slowed
    by the simulator's threads (a slow client would see readiness late, as a slow kube-proxy would)."""
    # Free ports are picked before the simulator binds them, and another test's process may take one in
    # between (seen once under `make test`'s four workers: the simulator exited 1): new ports, twice at most.
    for attempt in range(3):
        port = consecutive_free_ports(2)
        proc = subprocess.Popen([sys.executable, "-m", "app", "sim", "--replicas", "2", "--host", "127.0.0.1",
                                 "--port", str(port), "--decode-tps", "40"], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        urls = [f"http://127.0.0.1:{port + i}" for i in range(2)]
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=1) as client:  # one client for the whole wait (a new one costs ~30 ms of CPU)
            while not all(_answers(client, u + "/health") for u in urls) and proc.poll() is None:
                if time.monotonic() > deadline:
                    stop_process(proc)
                    raise AssertionError("simulator did not start")
                time.sleep(0.1)
        if proc.poll() is None:
            break
        assert attempt < 2, f"simulator exited {proc.returncode} three times"
    try:
        yield urls
    finally:
        stop_process(proc)


def _answers(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Rollout:
    old: list[GatewayProcess]  # serving when the update starts
    new: list[GatewayProcess]  # their replacements, ready on addresses of their own


@pytest.fixture
def rollout(sim_process, redis_server, redis_namespace) -> Iterator[Rollout]:
    """Four gateways on one Redis, all started and ready in the set-up, which runs beside other
    workers' tests (only the test's body runs alone, tests/parallel.py): a new pod's start-up is not
    what this test times, its drain and hand-over are. Whatever is still running at the end is stopped."""
    config: dict[str, Any] = {
        "backends": [{"url": u} for u in sim_process], "routing": {"health_interval_s": 0.5},
        "state": redis_server.url, "state_options": {"namespace": redis_namespace},
        "shutdown": {"accept_s": ACCEPT_S, "grace_s": 60}}
    with started(*(GatewayProcess(config) for _ in range(4))) as gateways:  # their imports overlap
        yield Rollout(old=list(gateways[:2]), new=list(gateways[2:]))


@pytest.mark.exclusive  # a client that must see /readyz turn 503 within the 2 s accept window
def test_rolling_update_under_load_loses_nothing(rollout: Rollout) -> None:
    counts = Counts()
    urls = [g.url for g in rollout.old + rollout.new]

    async def scenario(rr: RoundRobin) -> None:
        # a pool per gateway, each large enough for every stream: a request never queues for a
        # connection slot (it would then connect seconds after it picked a gateway that was ready)
        limits = httpx.Limits(max_connections=STREAMS + 8, max_keepalive_connections=STREAMS + 8)
        async with contextlib.AsyncExitStack() as stack:
            clients = {url: await stack.enter_async_context(httpx.AsyncClient(limits=limits)) for url in urls}
            stop = asyncio.Event()
            await asyncio.sleep(3 * POLL_S)
            workers = [asyncio.create_task(closed_loop(rr, clients, counts, stop, w)) for w in range(STREAMS)]
            await asyncio.sleep(1.0)
            for old, new in zip(rollout.old, rollout.new, strict=True):
                rr.join(new.url)
                before = counts.requests
                await asyncio.to_thread(terminate, old)
                rr.leave(old.url)
                assert counts.requests > before  # load kept flowing while the old pod drained
                await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*workers)

    t0 = time.monotonic()
    with RoundRobin([g.url for g in rollout.old]) as rr:
        asyncio.run(scenario(rr))
    print(f"\nslowest readiness poll {rr.slowest_poll_s:.2f}s")
    print(f"rolling update of 2 gateways under {STREAMS} closed-loop streams in "
          f"{time.monotonic() - t0:.1f}s: requests={counts.requests} ok={counts.ok} "
          f"failed={counts.failed} truncated={counts.truncated}")
    assert counts.failed == 0 and counts.truncated == 0, counts.examples
    assert counts.ok == counts.requests > STREAMS
    assert counts.served == set(urls), f"every gateway, old and new, completes streams: {counts.served}"
