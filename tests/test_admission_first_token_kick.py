"""The first-token kick, through the real gateway: a queued request leaves when a running
request's first byte arrives (its prefill is done, so the replica's prefill backlog drops), not at
the queue's next poll and not at the running request's end.

The replica is saturated by its prefill backlog only (`saturated_prefill_tokens`; the in-flight
bound is far away), so the first byte of the long request is what frees it. The queue's poll is
set to a minute, and the long request keeps streaming for seconds after its first byte: only the
proxy's kick at the first byte (app/proxy/forward.py) can release the queued request while that
stream is still running.
"""

from __future__ import annotations

import threading
import time

import httpx


def test_a_real_streams_first_byte_releases_the_queued_request_before_the_next_poll(
        proxy_factory, sim_factory, monkeypatch):
    monkeypatch.setattr("app.admission.gate.POLL_S", 60.0)  # the fallback poll never comes in time
    # ~1,200 prompt tokens at 400 tok/s: ~3 s of prefill; then 40 tokens at 10 tok/s: ~4 s of decode
    one = sim_factory(replicas=1, time_scale=1.0, prefill_tps=400.0, decode_tps=10.0)
    proxy = proxy_factory(one, admission={"queue": {"max_depth": 4, "ttl_s": 30},
                                          "saturated_inflight": 16, "saturated_prefill_tokens": 100})
    long_prompt = " ".join(f"word{i}" for i in range(600))
    long_body = {"model": "sim", "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 40,
                 "ignore_eos": True, "stream": True}
    short_body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                  "ignore_eos": True, "stream": True}
    seen: dict[str, float] = {}
    queue = proxy.services.admission.queue

    def long_request() -> None:
        with httpx.Client(base_url=proxy.url, timeout=60) as http, \
                http.stream("POST", "/v1/chat/completions", json=long_body) as resp:
            assert resp.status_code == 200
            for _ in resp.iter_bytes():
                seen.setdefault("long_first_byte", time.monotonic())
        seen["long_end"] = time.monotonic()

    def short_request() -> None:
        with httpx.Client(base_url=proxy.url, timeout=60) as http, \
                http.stream("POST", "/v1/chat/completions", json=short_body) as resp:
            seen["short_status"] = resp.status_code
            seen["short_headers"] = time.monotonic()  # the gateway answers at the replica's first byte
            resp.read()

    first = threading.Thread(target=long_request)
    first.start()
    deadline = time.monotonic() + 20
    replica = proxy.services.replicas.all()[0]
    while replica.queued_prompt_tokens <= 100:  # the long prompt is placed and its prefill not done
        assert time.monotonic() < deadline and "long_first_byte" not in seen, "the long prefill never queued"
        time.sleep(0.005)
    second = threading.Thread(target=short_request)
    second.start()
    while queue.depth < 1:  # the short request waits in the gateway queue behind the backlog
        assert time.monotonic() < deadline and "long_first_byte" not in seen, "the short request never queued"
        time.sleep(0.005)
    first.join(60)
    second.join(60)

    assert seen["short_status"] == 200
    assert seen["long_first_byte"] <= seen["short_headers"] < seen["long_end"], seen
    assert proxy.sample("prefixgate_admission_wait_seconds_count") == 1  # it did wait in the queue
    assert proxy.services.admission.unplaced == 0 and queue.depth == 0
