"""The replica load owner (app/routing/load.py) counts, for each request, the prefill tokens of the
other requests whose wait for a first byte overlapped its own on the same replica: the batching
term of the prefill model (app/telemetry/prefill_model.py). Through the real path: the gateway
over loopback HTTP in front of a simulated vLLM reporting its per-request metrics."""

from __future__ import annotations

import threading
import time

import pytest
from openai import OpenAI

from app.routing.base import Replica, RouteDecision
from app.routing.load import ReplicaLoad
from app.telemetry.metrics import Metrics

LONG = "Clause 1: the party shall deliver the goods on time and in good order. " * 300
SHORT = "What is the capital of France?"


def decision(replica: Replica, tokens: int) -> RouteDecision:
    return RouteDecision(replica=replica, reason="least_load", prefill_tokens=tokens)


def test_each_hold_counts_the_prefill_beside_it_until_its_first_byte() -> None:
    load = ReplicaLoad(Metrics())
    r0, r1 = Replica(name="r0", url="http://r0"), Replica(name="r1", url="http://r1")
    a = load.hold(decision(r0, 1000))
    b = load.hold(decision(r0, 30))
    c = load.hold(decision(r1, 500))  # another replica: not beside them
    assert (a.shared_prefill_tokens, b.shared_prefill_tokens, c.shared_prefill_tokens) == (30, 1000, 0)
    a.prefill_done()
    d = load.hold(decision(r0, 7))  # a is past its first byte: d is beside b only
    assert (a.shared_prefill_tokens, b.shared_prefill_tokens, d.shared_prefill_tokens) == (30, 1007, 30)
    b.release()  # a failed attempt leaves the same way
    e = load.hold(decision(r0, 5))
    assert (d.shared_prefill_tokens, e.shared_prefill_tokens) == (35, 7)
    assert r0.queued_prompt_tokens == 12 and r0.inflight == 3


def _ask(client: OpenAI, content: str) -> None:
    list(client.chat.completions.create(model="sim", max_tokens=2, stream=True,
                                        messages=[{"role": "user", "content": content}]))


def test_requests_prefilled_together_reach_the_prefill_model_as_shared(proxy_factory, sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=1.0, decode_tps=1000.0, enable_per_request_metrics=True)
    proxy = proxy_factory(sim, names=["sim-0"])
    client = OpenAI(base_url=proxy.base_url, api_key="x")
    models = proxy.services.metrics.prefill_models
    replica = proxy.services.replicas.get("sim-0")
    assert replica is not None
    for i in range(2):
        _ask(client, f"{SHORT} ({i})")  # one at a time: nothing beside them
    proxy.settle()
    assert models.shared_samples("sim-0") == 0
    for i in range(2):  # a long cold prompt (~0.5 s of prefill), and a short one sent while it prefills
        long = threading.Thread(target=_ask, args=(client, f"{i} {LONG}"))
        long.start()
        deadline = time.monotonic() + 10
        while replica.queued_prompt_tokens == 0:  # routed, waiting for its first byte
            assert time.monotonic() < deadline
            time.sleep(0.001)
        _ask(client, f"{SHORT} [{i}]")
        long.join()
    proxy.settle()
    assert models.shared_samples("sim-0") == pytest.approx(4, rel=0.01)  # both of each pair (forgetting)


def test_a_request_finished_since_the_last_scrape_does_not_weigh_on_its_replica(proxy_factory, sim_factory) -> None:
    """The engine's running count is read at a scrape and counts the gateway's own requests too;
    the scorers count those live instead (Replica.engine_foreign). A scrape taken while one of
    its requests decoded on r0, read after that request finished, leaves r0 as idle as r1: the
    least-loaded pick spreads over both. Counted from the gauge, every pick went to r1 until the
    next scrape."""
    import asyncio

    sim = sim_factory(replicas=2, time_scale=1.0, decode_tps=20.0)
    proxy = proxy_factory(sim, names=["r0", "r1"], routing={"policy": "least_load"},
                          scrape={"interval_s": 3600.0})  # one scrape now, the next one forced
    proxy.wait_scraped(20.0)
    client = OpenAI(base_url=proxy.base_url, api_key="x")

    def scrape() -> None:
        loop = proxy.server.loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(proxy.services.scraper.scrape_once(), loop).result(timeout=10)

    raw = client.chat.completions.with_raw_response.create(
        model="sim", max_tokens=30, stream=True, messages=[{"role": "user", "content": SHORT}])
    busy = raw.headers["x-prefixgate-backend"]
    chunks = iter(raw.parse())
    next(chunks)  # decoding now (~1.5 s at 20 tok/s)
    scrape()
    for _ in chunks:
        pass
    replica = proxy.services.replicas.get(busy)
    assert replica is not None
    deadline = time.monotonic() + 10
    while replica.inflight:  # released once the relay has finished
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert replica.engine_running == 1  # the gauge still says what the scrape saw
    picked = set()
    for i in range(8):
        raw = client.chat.completions.with_raw_response.create(
            model="sim", max_tokens=1, messages=[{"role": "user", "content": f"{SHORT} {i}"}])
        picked.add(raw.headers["x-prefixgate-backend"])
    assert picked == {"r0", "r1"}
