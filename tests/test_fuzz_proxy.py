"""Fuzzing the whole surface of a real proxy on loopback, in front of simulated replicas.

Hypothesis generates whole HTTP requests (tests/fuzz_cases.py) to every route: chat and completions
(stream and not, valid and bent bodies), passthrough /v1/* paths, /v1/models, /healthz, /health,
/readyz, /metrics, /hygiene/*, /ui and unknown paths, with odd headers and framing (tests/fuzz_client.py
sends the exact bytes). Two proxies share the load: one with the defaults, one with hygiene
rewrites, per-tenant reject/warn policies, cache salting, the session router and a small body
limit, so each request path is walked with and without its optional stages.

What must hold over the whole run (the figures are printed, then asserted):
- no response >= 500 that the proxy produced itself. An engine 5xx relayed (or wrapped as 502
  upstream_status_5xx) is the engine's: the simulators record every 5xx they send by request id,
  and a client 5xx counts as relayed only when its x-request-id is in that record;
- no hang: each request gets a response (or, for a body the client cut short, a closed connection)
  within REQUEST_TIMEOUT_S, and no connection is closed without a response otherwise: not even
  an error answered while the client is still sending (a 413 before the rest of the body, a
  Content-Length that declared less than is sent, a 400 of uvicorn's parser), which the servers'
  lingering close (app/lingering.py) delivers instead of a kernel reset;
- every error the proxy answers on /v1/* is OpenAI-shaped JSON, every complete 200 stream ends
  with `data: [DONE]` and every event in it is JSON (the agents' APIs: `event:` framing, ending
  with their own last event);
- nothing leaks: afterwards no request is active in the proxies, no request is running or waiting
  in the simulators (GET /sim/state), the upstream pool holds no acquired connection, and every
  open socket to a simulator is held by a pool (the upstream pool's idle keep-alive connections,
  the health checker's and the engine scraper's), and no client connection is left open;
- the simulators (no faults configured) answer no 5xx and their engine loops stay alive: a dead
  loop used to leave every later request to that replica waiting (the "hangs" of slow runs).

`PREFIXGATE_FUZZ_EXAMPLES` (default 400) hypothesis examples x BATCH (25) requests per run,
derandomized: the same cases every run and in every process (their sha256 is printed; a second
test checks it), so a failure reproduces. tests/fuzz_cases.py says how a batch is built and why
it is drawn in a process of its own. The figures also give the client-side latency and the
slowest requests, so a slow run shows where its time went; to see inside the servers while it
runs: `py-spy dump --pid $(pgrep -f tests.fuzz_server)` (or `py-spy record`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fuzz_cases import case_key
from tests.fuzz_cases import cases as fuzz_cases
from tests.fuzz_client import Outcome, RawRequest, send

EXAMPLES = int(os.environ.get("PREFIXGATE_FUZZ_EXAMPLES", "400"))
BATCH = 25
REQUEST_TIMEOUT_S = 20.0
IN_FLIGHT_BATCHES = 4  # batches in flight while the generator process draws the next ones
pytestmark = pytest.mark.timeout(600)


@dataclass
class Fleet:
    """The servers process (tests/fuzz_server.py) and where it listens."""

    proc: subprocess.Popen[str]
    proxies: list[int]
    sims: list[int]
    report: int

    def snapshot(self) -> dict[str, Any]:
        return httpx.get(f"http://127.0.0.1:{self.report}/report", timeout=10).json()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz_server"], cwd=root, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ports = json.loads(proc.stdout.readline() or "{}")
        assert ports, f"tests/fuzz_server.py did not start (exit {proc.poll()})"
        # anything it prints later must not fill the pipe and block it
        threading.Thread(target=proc.stdout.read, daemon=True, name="fuzz-server-stdout").start()
        yield Fleet(proc, ports["proxies"], ports["sims"], ports["report"])
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[str]) -> None:
    """Close its stdin (it then stops its servers), SIGKILL by PID if it does not exit."""
    with contextlib.suppress(Exception):
        assert proc.stdin is not None
        proc.stdin.close()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@dataclass
class Figures:
    sent: collections.Counter[str] = field(default_factory=collections.Counter)
    distinct: set[bytes] = field(default_factory=set)  # sha256 of each case's bytes (whichever proxy)
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    proxy_5xx: list[str] = field(default_factory=list)
    relayed_5xx: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)  # closed without a response, body not cut short
    hangs: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)
    bad_streams: list[str] = field(default_factory=list)
    streams_ok: int = 0
    dropped: int = 0
    elapsed_s: float = 0.0


def _describe(req: RawRequest, out: Outcome) -> str:
    return (f"{req.method} {req.target[:80]} framing={req.framing} headers={req.headers!r:.200} "
            f"body={req.body[:200]!r} -> {out.kind} {out.status} {out.body[:300]!r} {out.error}")


def _check(req: RawRequest, out: Outcome, five_xx: set[str], fig: Figures) -> None:
    fig.sent[req.route] += 1
    fig.distinct.add(hashlib.sha256(case_key(-1, req)).digest())
    fig.statuses[str(out.status) if out.kind in ("response", "dropped") else out.kind] += 1
    if out.kind == "hang" or out.kind == "refused":
        fig.hangs.append(_describe(req, out))
        return
    if out.kind == "dropped":
        fig.dropped += 1
    if out.kind == "closed" and req.framing != "short":  # a 400 of uvicorn's parser too (lingering close)
        fig.unanswered.append(_describe(req, out))
    if out.status is None:
        return
    rid = out.headers.get(b"x-request-id", b"").decode("latin-1")
    if out.status >= 500:
        if rid and rid in five_xx:
            fig.relayed_5xx.append(_describe(req, out))
        else:
            fig.proxy_5xx.append(_describe(req, out))
    if (out.kind != "response" or not rid or req.method == "HEAD" or not req.target.startswith("/v1/")
            or req.target.startswith("/v1/models")):
        return
    if out.status >= 400:  # the proxy's own errors and the engine's are both OpenAI-shaped
        try:
            err = json.loads(out.body)["error"]
            assert isinstance(err, dict) and isinstance(err["message"], str)
        except Exception:  # noqa: BLE001 - any shape problem is the finding
            fig.bad_errors.append(_describe(req, out))
    elif req.stream and out.status == 200 and out.headers.get(b"content-type", b"").startswith(b"text/event-stream"):
        try:
            _check_stream(req.route, out.body)
            fig.streams_ok += 1
        except Exception:  # noqa: BLE001
            fig.bad_streams.append(_describe(req, out))


# the event an agents' API stream ends with (they send no [DONE]): normal ends and the error event
LAST_EVENTS = {"/v1/messages": {"message_stop", "error"},
               "/v1/responses": {"response.completed", "response.failed", "response.incomplete", "error"}}


def _check_stream(route: str, body: bytes) -> None:
    """A whole stream in its API's own framing: chat/completions end with `data: [DONE]` after
    JSON events; the Messages and Responses APIs frame each event as `event:` + one JSON `data:`
    line and end with one of LAST_EVENTS."""
    events = [e for e in body.split(b"\n\n") if e.strip()]
    assert events and body.endswith(b"\n\n")
    if route not in LAST_EVENTS:
        assert events[-1] == b"data: [DONE]"
        for e in events[:-1]:
            assert e.startswith(b"data: ")
            json.loads(e[6:])
        return
    names = []
    for e in events:
        name, data = e.split(b"\n", 1)
        assert name.startswith(b"event: ") and data.startswith(b"data: ") and b"\n" not in data
        assert json.loads(data[6:])["type"] == name[7:].decode()
        names.append(name[7:].decode())
    assert names[-1] in LAST_EVENTS[route], names[-1]


def _sockets(pid: int) -> collections.Counter[tuple[int, int, str]]:
    """(local port, remote port, TCP state) of every IPv4 TCP socket process `pid` holds open (its
    /proc/<pid>/fd links matched by inode against /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    states = {"01": "ESTABLISHED", "08": "CLOSE_WAIT", "0A": "LISTEN"}
    out: collections.Counter[tuple[int, int, str]] = collections.Counter()
    with open(f"/proc/{pid}/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if parts[9] in inodes:
                local, remote = (int(parts[i].split(":")[1], 16) for i in (1, 2))
                out[(local, remote, states.get(parts[3], parts[3]))] += 1
    return out


def _held(snap: dict[str, Any]) -> int:
    """Connections to the simulators that a client in the proxies holds: the upstream pool's idle
    keep-alive ones (none may stay acquired), and the health checker's and engine scraper's own
    (tests/fuzz_server.py reads them)."""
    counts = [n for p in snap["proxies"] for n in (p["pool"][1], *p["health"], p["scraper"])]
    assert min(counts) >= 0, f"a connection pool could not be read: {snap['proxies']}"
    return sum(counts)


def _observation_errors(ports: list[int]) -> dict[str, float]:
    """`prefixgate_observation_errors_total` by stage, summed over the proxies, where not zero."""
    out: collections.Counter[str] = collections.Counter()
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert "# TYPE prefixgate_observation_errors_total counter" in text  # read where it is exported
        for line in text.splitlines():
            if line.startswith("prefixgate_observation_errors_total{"):
                labels, _, value = line.rpartition(" ")
                out[labels.split('stage="', 1)[1].split('"', 1)[0]] += float(value)
    return {k: v for k, v in out.items() if v}


def test_fuzz_every_route(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fig = Figures()
    five_xx: set[str] = set()
    loop = asyncio.new_event_loop()
    client = threading.Thread(target=loop.run_forever, daemon=True, name="fuzz-client")
    client.start()
    pending: collections.deque[Any] = collections.deque()

    async def send_all(cases: list[tuple[int, RawRequest]]) -> list[tuple[RawRequest, Outcome]]:
        outs = await asyncio.gather(*(send(req, "127.0.0.1", fleet.proxies[i], REQUEST_TIMEOUT_S)
                                      for i, req in cases))
        return [(req, out) for (_, req), out in zip(cases, outs, strict=True)]

    results: list[tuple[RawRequest, Outcome]] = []
    cases_digest = hashlib.sha256()

    def each(cases: list[tuple[int, RawRequest]]) -> None:
        for i, req in cases:
            cases_digest.update(case_key(i, req))
        pending.append(asyncio.run_coroutine_threadsafe(send_all(cases), loop))
        while len(pending) > IN_FLIGHT_BATCHES:
            results.extend(pending.popleft().result())

    started = time.monotonic()
    try:
        for cases in fuzz_cases(EXAMPLES, BATCH, len(fleet.proxies)):
            each(cases)
        while pending:
            results.extend(pending.popleft().result())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        client.join(10)
    fig.elapsed_s = time.monotonic() - started

    deadline = time.monotonic() + 15
    while True:  # the proxies finish their after-response work, the simulators abort what dropped clients left
        snap = fleet.snapshot()
        active = sum(p["active"] for p in snap["proxies"])
        states = [httpx.get(f"http://127.0.0.1:{port}/sim/state", timeout=10).json() for port in fleet.sims]
        busy = sum(s["running"] + s["waiting"] for s in states)
        dead = sum(bool(s["dead"]) for s in states)
        acquired = sum(p["pool"][0] for p in snap["proxies"])
        if not (active or busy or acquired) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    five_xx.update(snap["five_xx"])
    for req, out in results:
        _check(req, out, five_xx, fig)
    by_time = sorted(results, key=lambda r: r[1].elapsed_s)
    times = [out.elapsed_s for _, out in by_time]
    idle = sum(p["pool"][1] for p in snap["proxies"])
    for _ in range(50):  # a probe may open or close a connection between the two readings: read again
        sockets = _sockets(fleet.proc.pid)
        to_sims = sum(n for (_, remote, _), n in sockets.items() if remote in fleet.sims)
        held = _held(fleet.snapshot())
        if to_sims <= held:
            break
        time.sleep(0.1)
    from_clients = sum(n for (local, _, state), n in sockets.items() if local in fleet.proxies and state != "LISTEN")
    observation_errors = _observation_errors(fleet.proxies)
    with capsys.disabled():
        print(f"\nfuzz: {sum(fig.sent.values())} requests ({len(fig.distinct)} distinct, cases sha256 "
              f"{cases_digest.hexdigest()[:16]}) in {fig.elapsed_s:.1f}s ({EXAMPLES} examples x {BATCH}, derandomized)")
        print("  by route: " + ", ".join(f"{k} {v}" for k, v in sorted(fig.sent.items())))
        print("  statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(fig.statuses.items())))
        print(f"  latency: p50 {times[len(times) // 2]:.3f}s, p99 {times[len(times) * 99 // 100]:.3f}s, "
              f"max {times[-1]:.3f}s (client-side, {BATCH * (IN_FLIGHT_BATCHES + 1)} requests in flight at most)")
        print(f"  proxy 5xx {len(fig.proxy_5xx)}, relayed engine 5xx {len(fig.relayed_5xx)}, hangs {len(fig.hangs)}, "
              f"unanswered {len(fig.unanswered)}, "
              f"non-OpenAI errors {len(fig.bad_errors)}, malformed streams {len(fig.bad_streams)} "
              f"(complete streams {fig.streams_ok}, client disconnects mid-stream {fig.dropped})")
        print(f"  after: proxy active {active}, sim running+waiting {busy}, sims dead {dead}, upstream pool acquired {acquired} "
              f"idle {idle}, proxy process sockets to sims {to_sims} (pools hold {held}), "
              f"client connections still open {from_clients}, observation errors {observation_errors or 'none'}")
        for req, out in by_time[:-4:-1]:
            print(f"  slowest {out.elapsed_s:.2f}s: {_describe(req, out)}")
        for title, items in (("proxy 5xx", fig.proxy_5xx), ("hang", fig.hangs), ("bad error", fig.bad_errors),
                             ("bad stream", fig.bad_streams), ("unanswered", fig.unanswered),
                             ("relayed engine 5xx", fig.relayed_5xx)):
            for line in items[:5]:
                print(f"  {title}: {line}")
    assert sum(fig.sent.values()) == EXAMPLES * BATCH
    assert not fig.proxy_5xx and not fig.hangs and not fig.unanswered
    assert not fig.bad_errors and not fig.bad_streams
    assert active == 0 and busy == 0 and acquired == 0
    # the simulators run without faults: a 5xx from one, or its engine loop dying (which used to
    # leave every later request to it waiting: the "hangs"), is a simulator bug the run must show
    assert dead == 0 and not fig.relayed_5xx
    assert to_sims <= held, "an open socket to a simulator that no client of the proxy holds"
    assert from_clients == 0
    # the after-response work (tracking, tracing, hooks, metrics) failed on no request: such a
    # failure is logged and counted, never answered, so only the counter shows it
    assert not observation_errors, observation_errors


def test_the_cases_are_the_same_in_every_process() -> None:
    """A failure must reproduce: the cases depend on tests/fuzz_*.py only, not on PYTHONHASHSEED
    (which reseeds `hash()` of str and bytes) nor on what the test process imported: hypothesis
    draws literals from the project modules loaded at draw time (tests/fuzz_cases.py
    `_no_project_modules`), and this pytest process has app/ loaded, a bare one has not."""
    streamed = hashlib.sha256()
    for batch in fuzz_cases(12, 25, 2, env={"PYTHONHASHSEED": "1"}):
        for i, req in batch:
            streamed.update(case_key(i, req))
    code = ("import hashlib; from tests.fuzz_cases import case_key, generate; h = hashlib.sha256(); "
            "generate(12, 25, 2, lambda b: [h.update(case_key(i, r)) for i, r in b]); print(h.hexdigest())")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": "2", "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    bare = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()
    assert streamed.hexdigest() == bare
