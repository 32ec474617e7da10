"""Routing over a shared Redis when the gateway that serves a turn never saw the turns before it:
a restarted gateway, or the other of two gateways sharing one Redis (real redis-server, the
simulator as the engine, the real `openai` client over loopback HTTP).

The prompts are long (a ~10 KB document in the system message): past `prefix.inline_chars`, so a
gateway whose tokenisation memo has never seen the conversation cannot fingerprint it from the
memo; the residency in Redis must still route it where its prefix is resident."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tests.chat_history import growing_history, words

NAMES = ["r0", "r1", "r2", "r3"]
TENANTS = 4


def conversation(seed: int, turns: int) -> list[list[dict]]:
    system = {"role": "system", "content": f"tenant {seed} documents: " + words(seed, 1500)}
    return growing_history(system, [f"turn {t}: " + words(seed * 100 + t, 60) for t in range(turns)],
                           ["ok " + words(seed + t, 20) for t in range(turns)])


def ask(proxy: Any, tenant: int, messages: list[dict]) -> tuple[str, str, int]:
    """(backend, x-prefixgate-prefix, engine cached tokens) of one streamed turn, once the gateway
    processed it (its residency writes are queued for Redis)."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0,  # a retry would hide a 500
                           default_headers={"x-tenant-id": f"t{tenant}"})
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True})
    usage = None
    for chunk in raw.parse():
        usage = chunk.usage or usage
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return raw.headers["x-prefixgate-backend"], raw.headers["x-prefixgate-prefix"], cached or 0


def decisions(proxy: Any, reason: str) -> float:
    proxy.settle()
    return sum(s.value for family in proxy.services.metrics.registry.collect() for s in family.samples
               if s.name == "prefixgate_route_decisions_total" and s.labels.get("reason") == reason)


def drain(proxy: Any) -> None:
    """Wait for the post-response work of every finished request and send its residency writes
    to Redis (the next turn may reach the other gateway at once)."""
    async def written() -> None:
        await proxy.services.prefix.drain()
        await proxy.services.store.flush()

    proxy.settle()
    asyncio.run_coroutine_threadsafe(written(), proxy.server.loop).result(10)


@pytest.fixture
def shared(redis_server, redis_namespace) -> dict:
    # budgets for a busy test machine (the Redis lookup; a never-seen prompt's tokenisation before
    # the pick): the subject here is what Redis holds, not how fast this machine is
    return {"state": redis_server.url, "state_options": {"namespace": redis_namespace, "redis_timeout_s": 2.0},
            "prefix": {"blind_wait_ms": 10_000}}


def test_a_restarted_gateway_routes_the_next_turn_to_the_replica_holding_its_prefix(
        sim_factory, proxy_factory, shared):
    sim = sim_factory(replicas=4, time_scale=0.0)
    first = proxy_factory(sim, names=NAMES, **shared)
    convs = [conversation(t, 2) for t in range(TENANTS)]
    homes = {}
    for t in range(TENANTS):
        homes[t], _, _ = ask(first, t, convs[t][0])
        drain(first)
    first.stop()  # its queued writes are flushed to Redis on shutdown; its memory is gone

    second = proxy_factory(sim, names=NAMES, **shared)
    for t in range(TENANTS):
        backend, prefix, cached = ask(second, t, convs[t][1])
        matched, total = map(int, prefix.split("/"))
        assert backend == homes[t], (t, backend, homes[t])
        assert total > 0 and matched > 0.9 * total, prefix  # the router saw the chain and its residency
        assert cached > 1000, cached  # and the engine's cache hit it
        drain(second)
    assert decisions(second, "prefix_hit") == TENANTS
    assert decisions(second, "cold_spread") == 0


def test_two_gateways_on_one_redis_alternate_turns_as_one_gateway_would(sim_factory, proxy_factory, shared):
    sim = sim_factory(replicas=4, time_scale=0.0)
    gateways = [proxy_factory(sim, names=NAMES, **shared) for _ in range(2)]
    convs = [conversation(10 + t, 3) for t in range(TENANTS)]
    homes: dict[int, set[str]] = {}
    for turn in range(3):
        for t in range(TENANTS):
            gateway = gateways[(turn + t) % 2]  # every turn on the other gateway than the one before
            backend, prefix, cached = ask(gateway, t, convs[t][turn])
            homes.setdefault(t, set()).add(backend)
            if turn > 0:
                matched, total = map(int, prefix.split("/"))
                assert total > 0 and matched > 0.9 * total, (turn, t, prefix)
                assert cached > 1000
            drain(gateway)
    assert all(len(h) == 1 for h in homes.values()), homes
    assert sum(decisions(g, "prefix_hit") for g in gateways) == 2 * TENANTS
    assert sum(decisions(g, "cold_spread") for g in gateways) == TENANTS
