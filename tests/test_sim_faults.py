"""Fault injection on a replica: error, drop, die mid-stream, stall, slow, crash, clear."""

from __future__ import annotations

import time

import httpx
import pytest

from app.sim.testing import SimCluster

BODY = {"messages": [{"role": "user", "content": "hello there"}], "stream": True, "max_tokens": 6}


@pytest.fixture
def sim():
    with SimCluster(time_scale=0) as cluster:
        yield cluster


def fault(url: str, **body) -> dict:
    r = httpx.post(url + "/sim/faults", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stream_text(url: str, body: dict = BODY, timeout: float = 10) -> tuple[int, str]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as r:
        return r.status_code, "".join(r.iter_text())


def test_error_fault_applies_to_the_next_n_requests_only(sim):
    url = sim.urls[0]
    fault(url, mode="error", status=503, count=2)
    for _ in range(2):
        r = httpx.post(url + "/v1/chat/completions", json=BODY)
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
    status, text = stream_text(url)
    assert status == 200 and text.endswith("data: [DONE]\n\n")


def test_drop_closes_the_connection_without_a_response(sim):
    url = sim.urls[0]
    fault(url, mode="drop")
    with pytest.raises(httpx.TransportError):
        httpx.post(url + "/v1/chat/completions", json=BODY)
    assert stream_text(url)[0] == 200


def test_die_midstream_after_k_events(sim):
    url = sim.urls[0]
    fault(url, mode="die_midstream", after_chunks=2)
    received = []
    with pytest.raises(httpx.TransportError):
        with httpx.stream("POST", url + "/v1/chat/completions", json=BODY, timeout=10) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    received.append(line)
    assert len(received) == 2 and "[DONE]" not in received[-1]
    assert sim.engine(0).state()["running"] == 0  # the aborted request freed its blocks
    assert stream_text(url)[0] == 200


def test_stall_sends_nothing_for_delay(sim):
    url = sim.urls[0]
    fault(url, mode="stall", delay_s=1.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", json=BODY, timeout=0.3)


def test_slow_multiplies_step_time_until_clear():
    with SimCluster(time_scale=0.01) as sim:  # 6 decode steps ~ 6 * 0.01/60 s: fast
        url = sim.urls[0]
        t0 = time.perf_counter()
        stream_text(url)
        fast = time.perf_counter() - t0
        fault(url, mode="slow", factor=2000)  # 5 decode steps of 1/60 s * 0.01 * 2000 = 1.7 s
        t0 = time.perf_counter()
        stream_text(url)
        slow = time.perf_counter() - t0
        assert slow > 1.0 and slow > 3 * fast
        state = fault(url, mode="clear")
        assert state["slow_factor"] == 1.0 and state["pending"] == []


def test_crash_above_tokens_kills_health():
    with SimCluster(time_scale=0, crash_above_tokens=100) as sim:
        url = sim.urls[0]
        assert httpx.get(url + "/health").status_code == 200
        assert stream_text(url)[0] == 200
        long = {**BODY, "messages": [{"role": "user", "content": "word " * 300}]}
        r = httpx.post(url + "/v1/chat/completions", json=long)
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert httpx.get(url + "/health").status_code == 500
        assert httpx.post(url + "/v1/chat/completions", json=BODY).status_code == 500
        fault(url, mode="clear")
        assert httpx.get(url + "/health").status_code == 200


def test_bad_fault_body_is_400(sim):
    r = httpx.post(sim.urls[0] + "/sim/faults", json={"mode": "explode"})
    assert r.status_code == 400 and "mode" in r.json()["error"]["message"]
