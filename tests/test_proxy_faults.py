"""Bad input and upstream faults through the proxy, with the simulator's fault injection."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

CHAT_URL = "/v1/chat/completions"
BODY = {"model": "sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def fault(url: str, **spec: object) -> None:
    r = httpx.post(url + "/sim/faults", json=spec, timeout=10)
    assert r.status_code == 200, r.text


def error_of(r: httpx.Response) -> dict:
    payload = r.json()
    assert set(payload) == {"error"} and {"message", "type", "param", "code"} <= set(payload["error"])
    return payload["error"]


@pytest.mark.parametrize("content,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), "model"),
    (orjson.dumps({"model": "sim"}), "messages"),
    (orjson.dumps({"model": "sim", "messages": "hello"}), "messages"),
    (orjson.dumps({**BODY, "stream": "yes"}), "stream"),
    (orjson.dumps({**BODY, "max_tokens": "4"}), "max_tokens"),
    (orjson.dumps({**BODY, "n": True}), "n"),
])
def test_bad_input_is_an_openai_400(proxy, content, param) -> None:
    r = httpx.post(proxy.url + CHAT_URL, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert error_of(r)["param"] == param
    assert r.headers["x-request-id"]


def test_completions_requires_prompt(proxy) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json={"model": "sim"})
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"


def test_body_over_limit_is_413(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, limits={"max_body_bytes": 4096})
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 8000}]}
    r = httpx.post(proxy.url + CHAT_URL, json=big)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"

    def chunks():  # no content-length: the limit must hold while reading
        yield orjson.dumps(big)[:3000]
        yield orjson.dumps(big)[3000:]

    r = httpx.post(proxy.url + CHAT_URL, content=chunks())
    assert r.status_code == 413
    assert httpx.post(proxy.url + CHAT_URL, json=BODY).status_code == 200


def test_unknown_model_is_404(proxy) -> None:
    deadline = time.monotonic() + 10
    while proxy.services.health.known_models() is None:  # first health pass reads /v1/models
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = httpx.post(proxy.url + CHAT_URL, json={**BODY, "model": "gpt-nope"})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


@pytest.mark.parametrize("mode", ["error", "drop"])
def test_failing_replica_is_retried_on_the_other(sim, proxy_factory, mode) -> None:
    proxy = proxy_factory(sim, names=["a", "b"], routing={"policy": "round_robin", "health_interval_s": 3600})
    fault(sim.urls[0], mode=mode, count=10, status=500)
    for stream in (False, True):
        r = httpx.post(proxy.url + CHAT_URL, json={**BODY, "stream": stream}, timeout=30)
        assert r.status_code == 200
        assert r.headers["x-prefixgate-backend"] == "b"
    kinds = {"error": "status_5xx", "drop": "disconnect"}
    assert proxy.sample("prefixgate_upstream_errors_total", backend="a", kind=kinds[mode]) >= 1


def test_all_replicas_failing_is_502_with_a_message(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, routing={"health_interval_s": 3600})
    for url in sim.urls:
        fault(url, mode="error", count=5, status=503)
    r = httpx.post(proxy.url + CHAT_URL, json=BODY, timeout=30)
    assert r.status_code == 502
    err = error_of(r)
    assert err["code"] == "upstream_status_5xx" and "503" in err["message"]


def test_midstream_death_error_event_then_done(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, names=["a", "b"], routing={"policy": "round_robin", "health_interval_s": 3600})
    fault(sim.urls[0], mode="die_midstream", after_chunks=2, count=1)
    body = {**BODY, "stream": True, "max_tokens": 16, "ignore_eos": True}
    with httpx.stream("POST", proxy.url + CHAT_URL, json=body, timeout=30) as r:
        text = r.read()
    assert r.headers["x-prefixgate-backend"] == "a"
    events = [e for e in text.split(b"\n\n") if e.strip()]
    assert events[-1].strip() == b"data: [DONE]"
    assert b'"error"' in events[-2]
    assert proxy.sample("prefixgate_upstream_errors_total", backend="a", kind="midstream") == 1


def test_stalled_replica_times_out_and_is_retried(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, names=["a", "b"], limits={"first_byte_timeout_s": 0.5},
                          routing={"policy": "round_robin", "health_interval_s": 3600})
    fault(sim.urls[0], mode="stall", delay_s=5, count=1)
    t0 = time.perf_counter()
    r = httpx.post(proxy.url + CHAT_URL, json={**BODY, "stream": True}, timeout=30)
    assert r.status_code == 200 and r.headers["x-prefixgate-backend"] == "b"
    assert time.perf_counter() - t0 < 4
    assert proxy.sample("prefixgate_upstream_errors_total", backend="a", kind="timeout") == 1


def test_client_disconnect_cancels_the_upstream_request(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, decode_tps=20, time_scale=1.0)
    proxy = proxy_factory(sim)
    body = {**BODY, "stream": True, "max_tokens": 2000, "ignore_eos": True}
    with httpx.stream("POST", proxy.url + CHAT_URL, json=body, timeout=30) as r:
        chunks = r.iter_raw()
        next(chunks)
        next(chunks)
        assert httpx.get(sim.urls[0] + "/sim/state").json()["running"] == 1
    deadline = time.monotonic() + 10
    while httpx.get(sim.urls[0] + "/sim/state").json()["running"] != 0:
        assert time.monotonic() < deadline, "upstream request still running after the client left"
        time.sleep(0.05)
    assert proxy.sample("prefixgate_requests_total", route="chat", status="499") == 1
    assert proxy.services.upstream.pool_stats()[0] == 0  # no leaked upstream connection (either client)


def test_client_disconnect_non_stream(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, decode_tps=20, time_scale=1.0)
    proxy = proxy_factory(sim)
    body = {**BODY, "max_tokens": 2000, "ignore_eos": True}
    t = threading.Thread(target=lambda: _post_and_give_up(proxy.url + CHAT_URL, body), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while httpx.get(sim.urls[0] + "/sim/state").json()["running"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t.join(10)
    deadline = time.monotonic() + 10
    while httpx.get(sim.urls[0] + "/sim/state").json()["running"] != 0:
        assert time.monotonic() < deadline, "upstream request still running after the client left"
        time.sleep(0.05)


def _post_and_give_up(url: str, body: dict) -> None:
    try:
        httpx.post(url, json=body, timeout=2.0)
    except httpx.TimeoutException:
        pass
