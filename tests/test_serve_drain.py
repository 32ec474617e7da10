"""SIGTERM drains `prefixgate serve` (a real subprocess in front of the simulator): readiness drops
at once while the listener still accepts, in-flight streams end with [DONE], a stream longer than
shutdown.grace_s gets the error event, a second signal exits at once."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess

DECODE_TPS = 20.0  # one sequence: 20 tokens/s


@pytest.fixture
def slow_sim(sim_factory) -> Any:
    return sim_factory(replicas=1, decode_tps=DECODE_TPS)


def gateway(sim: Any, accept_s: float, grace_s: float, **extra: Any) -> GatewayProcess:
    config = {"backends": [{"url": sim.urls[0]}], "routing": {"health_interval_s": 0.5},
              "shutdown": {"accept_s": accept_s, "grace_s": grace_s}, **extra}
    return GatewayProcess(config)


def body(tokens: int) -> dict[str, Any]:
    return {"model": "sim", "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "count slowly"}]}


class Stream(threading.Thread):
    """One streaming request in a thread: its SSE data lines, and when the first one arrived."""

    def __init__(self, url: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens = url, tokens
        self.data: list[str] = []
        self.first = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body(self.tokens), timeout=120) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.data.append(line[6:])
                        self.first.set()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc
        finally:
            self.first.set()

    def errors(self) -> list[dict[str, Any]]:
        return [json.loads(d)["error"] for d in self.data if d != "[DONE]" and "error" in json.loads(d)]


@pytest.fixture
def started() -> Iterator[list[GatewayProcess]]:
    procs: list[GatewayProcess] = []
    yield procs
    for p in procs:
        p.stop()


@pytest.fixture
def accepting_gateway(slow_sim, started) -> GatewayProcess:
    """A gateway that keeps accepting for 1.5 s after SIGTERM, started in the set-up: it runs beside
    other workers' tests, only the timed body runs alone (tests/parallel.py)."""
    gw = gateway(slow_sim, accept_s=1.5, grace_s=60).start()
    started.append(gw)
    return gw


@pytest.mark.exclusive  # three requests inside a 1.5 s accept window
def test_stream_in_flight_survives_sigterm_and_readiness_drops_first(accepting_gateway: GatewayProcess) -> None:
    gw = accepting_gateway
    stream = Stream(gw.url, tokens=60)  # ~3 s of decode
    stream.start()
    assert stream.first.wait(30) and stream.error is None
    gw.signal(signal.SIGTERM)
    time.sleep(0.2)
    ready = httpx.get(gw.url + "/readyz", timeout=5)  # answered (not refused): 503 at once
    assert ready.status_code == 503 and ready.json()["draining"] is True
    assert httpx.get(gw.url + "/healthz", timeout=5).status_code == 200  # still alive
    # a request that a peer still routes here during endpoint propagation is served, not reset
    late = httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                      json={**body(3), "stream": False})
    assert late.status_code == 200 and late.json()["choices"][0]["message"]["content"]
    stream.join(60)
    assert stream.error is None, stream.error
    assert stream.data[-1] == "[DONE]" and not stream.errors()
    content = [json.loads(d) for d in stream.data[:-1]]
    assert sum(1 for c in content if c.get("choices") and c["choices"][0]["delta"].get("content")) == 60
    assert gw.wait(30) == 0, gw.log()
    with pytest.raises(httpx.ConnectError):  # after the accept window the listener is gone
        httpx.get(gw.url + "/readyz", timeout=2)


def test_stream_longer_than_the_grace_gets_the_error_event_and_done(slow_sim, started) -> None:
    gw = gateway(slow_sim, accept_s=0.3, grace_s=2.0).start()
    started.append(gw)
    stream = Stream(gw.url, tokens=400)  # ~20 s of decode
    stream.start()
    assert stream.first.wait(30) and stream.error is None
    t0 = time.monotonic()
    gw.signal(signal.SIGTERM)
    stream.join(30)
    assert stream.error is None, stream.error
    assert stream.data[-1] == "[DONE]"
    (err,) = stream.errors()
    assert err["type"] == "server_error" and err["code"] == "gateway_shutdown"
    assert gw.wait(30) == 0, gw.log()
    assert time.monotonic() - t0 < 15
    assert "ended 1 open request(s)" in gw.log()


def test_second_signal_exits_at_once(slow_sim, started) -> None:
    gw = gateway(slow_sim, accept_s=0.2, grace_s=120).start()
    started.append(gw)
    stream = Stream(gw.url, tokens=400)
    stream.start()
    assert stream.first.wait(30)
    gw.signal(signal.SIGTERM)
    time.sleep(1.0)
    assert gw.proc is not None and gw.proc.poll() is None  # draining: waits for the stream
    t0 = time.monotonic()
    gw.signal(signal.SIGINT)
    assert gw.wait(10) == 1
    assert time.monotonic() - t0 < 5
