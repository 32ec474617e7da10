"""Routing end to end: the proxy (real fingerprint hook, real index) in front of simulated replicas
over loopback HTTP."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from app.prefix.blocks import proxy_chain
from app.prefix.namespace import cache_namespace
from tests.chat_history import growing_history, words

NAMES = ["r0", "r1", "r2", "r3"]


def chat(client: httpx.Client, tenant: str, messages: list[dict]) -> httpx.Response:
    resp = client.post("/v1/chat/completions", headers={"x-tenant-id": tenant},
                       json={"model": "sim", "messages": messages, "max_tokens": 4})
    assert resp.status_code == 200, resp.text
    return resp


def conversation(seed: int, turns: int, doc_words: int = 1500) -> list[list[dict]]:
    system = {"role": "system", "content": f"tenant {seed} documents: " + words(seed, doc_words)}
    return growing_history(system, [f"turn {t}: " + words(seed * 100 + t, 60) for t in range(turns)],
                           ["ok " + words(seed + t, 20) for t in range(turns)])


def decisions(proxy, reason: str) -> float:
    return sum(proxy.sample("prefixgate_route_decisions_total", backend=n, reason=reason) or 0.0 for n in NAMES)


def test_consecutive_turns_of_a_tenant_land_on_the_same_replica(sim_factory, proxy_factory):
    sim = sim_factory(replicas=4, time_scale=0.0)
    proxy = proxy_factory(sim, names=NAMES)
    homes = {}
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for turn in range(3):
            for tenant in range(6):
                resp = chat(client, f"t{tenant}", conversation(tenant, 3)[turn])
                backend = resp.headers["x-prefixgate-backend"]
                assert homes.setdefault(tenant, backend) == backend, f"tenant {tenant} moved at turn {turn}"
                if turn > 0:  # the engine really served the history from its cache
                    assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1000
    assert len(set(homes.values())) >= 2  # cold tenants were spread
    assert decisions(proxy, "prefix_hit") == 12
    assert decisions(proxy, "cold_spread") == 6


def test_killed_replica_is_skipped_and_retried_before_the_first_byte(sim_factory, proxy_factory):
    sim = sim_factory(replicas=3, time_scale=0.0)
    proxy = proxy_factory(sim, names=NAMES[:3])
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        # a replica that drops the connection without answering: retried elsewhere
        turns = conversation(7, 2)
        home = chat(client, "t7", turns[0]).headers["x-prefixgate-backend"]
        httpx.post(sim.urls[NAMES.index(home)] + "/sim/faults", json={"mode": "drop"})
        assert chat(client, "t7", turns[1]).headers["x-prefixgate-backend"] != home
        assert decisions(proxy, "failover") == 1
        # a killed replica: connection refused, retried, then left out of rotation
        turns = conversation(8, 2)
        home = chat(client, "t8", turns[0]).headers["x-prefixgate-backend"]
        sim.servers[NAMES.index(home)].stop()
        assert chat(client, "t8", turns[1]).headers["x-prefixgate-backend"] != home
        assert proxy.sample("prefixgate_upstream_errors_total", backend=home, kind="connect") == 1
        assert proxy.services.replicas.get(home).healthy is False
        assert decisions(proxy, "failover") == 2
        for t in range(5):
            assert chat(client, f"other{t}", conversation(20 + t, 1)[0]).headers["x-prefixgate-backend"] != home
        assert decisions(proxy, "failover") == 2


def test_load_overrides_affinity_when_the_replica_is_saturated(sim_factory, proxy_factory):
    sim = sim_factory(replicas=2, time_scale=0.0)
    proxy = proxy_factory(sim, names=NAMES[:2])
    turns = conversation(3, 3)
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        home = chat(client, "t3", turns[0]).headers["x-prefixgate-backend"]
        proxy.drain()  # turn 1's prefix is resident on home before turn 2 is routed
        replica = proxy.services.replicas.get(home)
        replica.queued_prompt_tokens += 1_000_000  # a deep prefill queue, as a flood would leave it
        try:
            resp = chat(client, "t3", turns[1])
        finally:
            replica.queued_prompt_tokens -= 1_000_000
        proxy.drain()
        other = resp.headers["x-prefixgate-backend"]
        assert other != home
        assert proxy.sample("prefixgate_route_decisions_total", backend=other, reason="load_override") == 1
        # once the queue is gone the prefix wins again: turn 3 goes where the longest resident
        # prefix is, which is turn 2's replica (it holds turns 1 and 2; home holds only turn 1)
        assert chat(client, "t3", turns[2]).headers["x-prefixgate-backend"] == other
        assert proxy.sample("prefixgate_route_decisions_total", backend=other, reason="prefix_hit") == 1
        assert decisions(proxy, "prefix_hit") == 1


def test_kv_event_mode_keeps_the_index_equal_to_the_engine(sim_factory, proxy_factory):
    sim = sim_factory(replicas=2, time_scale=0.0, kv_events=True, kv_blocks=160, block_size=16)
    endpoints = dict(zip(NAMES[:2], sim.kv_event_endpoints, strict=True))
    proxy = proxy_factory(sim, names=NAMES[:2],
                          routing={"kv_events": True, "kv_events_endpoints": endpoints, "kv_blocks": 160})
    from app.engines.kv_events import KVEventSubscriber

    sub = next(c for c in proxy.services.background if isinstance(c, KVEventSubscriber))
    store = proxy.services.store
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        # PUB/SUB drops what is sent before the subscription lands: warm up, then start clean
        deadline = time.monotonic() + 10
        while sum(s.batches for s in sub.streams.values()) < 2 and time.monotonic() < deadline:
            for url in sim.urls:
                httpx.post(url + "/v1/completions", json={"model": "sim", "prompt": words(1, 40), "max_tokens": 1})
            time.sleep(0.05)
        for url in sim.urls:
            assert httpx.post(url + "/reset_prefix_cache").json()["success"]
        for turn in range(3):  # enough traffic to evict: 9 tenants x ~1k tokens > 2 x 160 blocks
            for tenant in range(9):
                chat(client, f"k{tenant}", conversation(40 + tenant, 3, doc_words=200)[turn])

        def resident(state: dict) -> set[int]:  # the simulator's resident blocks, keyed with the gateway's chain
            return {proxy_chain(c["token_ids"], state["block_size"], salt=cache_namespace(c["cache_salt"],
                                                                                          c["extra_key"]))[j]
                    for c in state["resident_chains"] for j in c["blocks"]}

        def engine_sets() -> dict[str, set[int]]:
            return {n: resident(httpx.get(u + "/sim/state").json()) for n, u in zip(NAMES[:2], sim.urls, strict=True)}

        deadline = time.monotonic() + 10
        while True:
            engine = engine_sets()
            index = {n: store.residency_hashes(n) for n in NAMES[:2]}
            if index == engine or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert all(engine.values())
    assert index == engine
    assert sum(s.gaps for s in sub.streams.values()) == 0
    assert (proxy.sample("prefixgate_kv_events_total", backend="r0", kind="removed") or 0) > 0


def test_a_session_keeps_its_replica_with_concurrent_requests_in_flight(sim_factory, proxy_factory):
    """Session affinity under concurrency: one session's overlapping requests are one key of the
    bounded-load hashing, so none of them is moved off its replica in an idle fleet."""
    sim = sim_factory(replicas=4, time_scale=1.0, decode_tps=100.0)
    proxy = proxy_factory(sim, names=NAMES, routing={"policy": "session"})
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)

    def ask(i: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="sim", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=40,
            extra_headers={"x-session-id": "conv-1"}, extra_body={"ignore_eos": True})
        return raw.headers["x-prefixgate-backend"]

    home = ask(0)  # binds the session
    with ThreadPoolExecutor(6) as pool:
        backends = list(pool.map(ask, range(1, 7)))  # ~0.4 s each: all in flight together
    assert backends == [home] * 6
    assert proxy.sample("prefixgate_route_decisions_total", backend=home, reason="session") == 7
    assert decisions(proxy, "load_override") == 0


def test_requests_go_only_to_replicas_that_serve_their_model(sim_factory, proxy_factory):
    """A fleet of two models: each request lands on a replica whose own /v1/models lists it, a
    retry too; 404 only for a model no replica serves; 503 when its replicas are all down."""
    alpha = sim_factory(replicas=2, time_scale=0.0, model="alpha")
    beta = sim_factory(replicas=1, time_scale=0.0, model="beta")
    names = ["a0", "a1", "b0"]
    proxy = proxy_factory([*alpha.urls, *beta.urls], names=names, routing={"policy": "round_robin"})
    deadline = time.monotonic() + 10
    while len(proxy.services.health.models) < len(names):  # the first health pass read every list
        assert time.monotonic() < deadline, "no /v1/models from every replica"
        time.sleep(0.02)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)

    def backend(model: str) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        return raw.headers["x-prefixgate-backend"]

    assert {backend("alpha") for _ in range(6)} == {"a0", "a1"}
    assert {backend("beta") for _ in range(6)} == {"b0"}
    assert sorted(m["id"] for m in client.models.list().model_dump()["data"]) == ["alpha", "beta"]
    with pytest.raises(openai.NotFoundError):
        backend("gamma")
    # a replica of alpha drops the connection: the retry goes to the other alpha, never to beta
    httpx.post(alpha.urls[0] + "/sim/faults", json={"mode": "drop", "count": 100})
    assert {backend("alpha") for _ in range(4)} == {"a1"}
    assert proxy.sample("prefixgate_route_decisions_total", backend="a1", reason="failover") >= 1
    assert (proxy.sample("prefixgate_route_decisions_total", backend="b0", reason="failover") or 0) == 0
    # beta's only replica is gone: beta still exists (503, retryable), alpha is unaffected
    beta.servers[0].stop()
    with pytest.raises(openai.APIStatusError) as err:  # refused, and no other replica serves beta
        backend("beta")
    assert err.value.status_code == 502 and "b0" in str(err.value)
    with pytest.raises(openai.APIStatusError) as err:
        backend("beta")  # now out of rotation: no replica serving it is left
    assert err.value.status_code == 503
    assert backend("alpha") == "a1"
