"""Two gateway pods on one Redis, end to end: real proxies (fingerprint hook, prefix_affinity,
tenant tracker) in front of simulated replicas, a real redis-server, turns alternating between
the pods. With `--state memory` the same run loses affinity; with Redis it keeps it, both pods
show the same /hygiene report, and a Redis killed mid-run costs no client request.

The scenario that separates the two: tenants share a long system prompt (one product, many
users) that each pod has already placed, on different replicas (its first sight of it was a
different tenant, placed by consistent hashing). A pod knows only its own placements, so with
memory state each pod sends a tenant's turns to its own home for the system prompt and the turns
ping-pong; with Redis both pods see every placement, and a tenant's own blocks decide.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from app.routing.ring import HashRing
from tests.chat_history import growing_history
from tests.chat_history import words as chat_words
from tests.redis_server import RedisServer

NAMES = ["r0", "r1", "r2", "r3"]
TENANTS = 6
TURNS = 4


def words(seed: int, n: int) -> str:
    """This file's prompts use "v" words: the text its scenario was written and checked with."""
    return chat_words(seed, n, letter="v")


SYSTEM = {"role": "system", "content": "You are the support agent of ACME. " + words(1, 600)}


def conversation(seed: int, turns: int) -> list[list[dict]]:
    """Turn t's messages extend turn t-1's, after the shared system prompt."""
    return growing_history(SYSTEM, [f"user {seed} turn {t}: " + words(seed * 100 + t, 30) for t in range(turns)],
                           ["noted " + words(seed + t, 10) for t in range(turns)])


def first_choice(tenant: str) -> str:
    """Where a pod that has never tokenised a prompt places it: the tenant on the hash ring."""
    return next(HashRing(NAMES).walk(f"tenant:{tenant}"))


WARM_A = "warm-a"
WARM_B = next(f"warm-b{i}" for i in range(100) if first_choice(f"warm-b{i}") != first_choice(WARM_A))


def warm_up(pods: list) -> tuple[str, str]:
    """Each pod sees the shared system prompt once, for a tenant of its own."""
    msgs = [SYSTEM, {"role": "user", "content": "hello"}]
    homes = []
    for pod, tenant in zip(pods, (WARM_A, WARM_B), strict=True):
        homes.append(chat(pod, tenant, msgs).headers["x-prefixgate-backend"])
        settle(pod)
    return homes[0], homes[1]


def settle(proxy) -> None:
    """Wait until the pod's after-response work and queued state writes have left it: what a
    client thinking for a few milliseconds between turns gives it anyway. First the requests
    themselves must have ended: a client reads the answer's end just before its after-response
    work is queued, and draining before that finds nothing to wait for."""
    proxy.settle()
    loop = proxy.server.loop

    async def drain() -> None:
        if proxy.services.prefix is not None:
            await proxy.services.prefix.drain()
        writes = getattr(proxy.services.router, "writes", None)
        if writes is not None:
            await writes.drain()
        flush = getattr(proxy.services.store, "flush", None)
        if flush is not None:
            await flush()

    asyncio.run_coroutine_threadsafe(drain(), loop).result(30)


def chat(proxy, tenant: str, messages: list[dict]) -> httpx.Response:
    resp = httpx.post(proxy.url + "/v1/chat/completions", headers={"x-tenant-id": tenant}, timeout=30,
                      json={"model": "sim", "messages": messages, "max_tokens": 4})
    assert resp.status_code == 200, resp.text
    return resp


def alternate(pods: list, tenants: range, turns: int) -> dict[str, list[str]]:
    """Every tenant's turn t goes to pod t % 2; returns tenant -> backend per turn."""
    homes: dict[str, list[str]] = {}
    convs = {t: conversation(t, turns) for t in tenants}
    for turn in range(turns):
        pod = pods[turn % len(pods)]
        for t in tenants:
            resp = chat(pod, f"t{t}", convs[t][turn])
            homes.setdefault(f"t{t}", []).append(resp.headers["x-prefixgate-backend"])
        settle(pod)
    return homes


def moves(homes: dict[str, list[str]]) -> int:
    return sum(a != b for seq in homes.values() for a, b in zip(seq, seq[1:], strict=False))


def two_pods(proxy_factory, sim, state: str, namespace: str = "pg") -> list:
    # blind_wait_ms 0: a pod routes a prompt it never tokenised without waiting for its chain, so
    # the warm-up can place the system prompt apart (with the default a Redis pod fingerprints it
    # first and finds the other pod's placement: tests/test_routing_restart.py).
    # One engine scrape per pod, before any traffic, and none during it: a scrape that lands while
    # the other pod's request waits in a replica's queue reports `waiting 1` there until the next
    # scrape, a backlog the cost policy rightly weighs above a few blocks of prefix (a load
    # override), which is not what these tests measure.
    pods = [proxy_factory(sim, names=NAMES, state=state, routing={"policy": "prefix_affinity"},
                          prefix={"blind_wait_ms": 0}, state_options={"namespace": namespace},
                          scrape={"interval_s": 3600.0}) for _ in range(2)]
    for pod in pods:
        pod.wait_scraped()
    return pods


def test_alternating_turns_keep_affinity_with_redis_and_lose_it_with_memory(
        sim_factory, proxy_factory, redis_server: RedisServer, redis_namespace: str) -> None:
    memory_pods = two_pods(proxy_factory, sim_factory(replicas=4, time_scale=0.0), "memory")
    redis_pods = two_pods(proxy_factory, sim_factory(replicas=4, time_scale=0.0), redis_server.url,
                          redis_namespace)
    for pods in (memory_pods, redis_pods):
        home_a, home_b = warm_up(pods)
        assert home_a != home_b  # the precondition: the pods placed the system prompt apart

    with_memory = alternate(memory_pods, range(TENANTS), TURNS)
    with_redis = alternate(redis_pods, range(TENANTS), TURNS)

    assert moves(with_memory) == TENANTS * (TURNS - 1), with_memory  # every turn ping-pongs
    assert moves(with_redis) == 0, with_redis
    assert all(p.sample("prefixgate_state_backend_up") == 1 for p in redis_pods)

    # both pods show the same hygiene report, covering every turn from either pod
    reports = [httpx.get(p.url + "/hygiene/tenants", timeout=10).json()["tenants"] for p in redis_pods]
    assert reports[0] == reports[1]
    mine = {r["tenant"]: r for r in reports[0] if not r["tenant"].startswith("warm")}
    assert sorted(mine) == [f"t{t}" for t in range(TENANTS)]
    assert all(r["requests"] == TURNS for r in mine.values())
    one = [httpx.get(p.url + "/hygiene/tenants/t0", timeout=10).json() for p in redis_pods]
    assert one[0] == one[1] and one[0]["window"] == TURNS
    # memory pods each see half the story
    halves = [httpx.get(p.url + "/hygiene/tenants", timeout=10).json()["tenants"] for p in memory_pods]
    assert all(r["requests"] == TURNS // 2 for h in halves for r in h if not r["tenant"].startswith("warm"))


def test_redis_killed_mid_run_fails_no_request_and_sharing_resumes(
        sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    sim = sim_factory(replicas=4, time_scale=0.0)
    pods = [proxy_factory(sim, names=NAMES, state=redis_proc.url, routing={"policy": "prefix_affinity"},
                          state_options={"reconnect_backoff_s": 0.05, "reconnect_backoff_max_s": 0.2})
            for _ in range(2)]
    assert moves(alternate(pods, range(2), 2)) == 0

    redis_proc.kill()
    failed = 0
    convs = {t: conversation(t, 4) for t in range(10, 14)}
    for turn in range(4):  # keeps serving on each pod's local state; every request answered
        for t, conv in convs.items():
            resp = httpx.post(pods[turn % 2].url + "/v1/chat/completions", timeout=30,
                              headers={"x-tenant-id": f"t{t}"},
                              json={"model": "sim", "messages": conv[turn], "max_tokens": 4})
            failed += resp.status_code != 200
    assert failed == 0
    assert all(p.sample("prefixgate_state_backend_up") == 0 for p in pods)
    for p in pods:
        assert httpx.get(p.url + "/hygiene/tenants", timeout=10).status_code == 200

    redis_proc.start()  # same port, empty
    deadline = time.monotonic() + 15
    while not all(p.sample("prefixgate_state_backend_up") == 1 for p in pods):
        assert time.monotonic() < deadline, "pods did not reconnect"
        time.sleep(0.05)
    for p in pods:
        settle(p)  # the outage's queued writes are replayed
    assert moves(alternate(pods, range(20, 23), 3)) == 0  # sharing resumed
    reports = [httpx.get(p.url + "/hygiene/tenants", timeout=10).json()["tenants"] for p in pods]
    assert reports[0] == reports[1]
    requests = {r["tenant"]: r["requests"] for r in reports[0]}
    assert requests["t20"] == 3
    assert requests["t10"] == 4  # made during the outage on both pods, replayed into Redis


def test_paused_redis_never_stalls_requests(sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0)
    pod = proxy_factory(sim, names=NAMES[:2], state=redis_proc.url, routing={"policy": "prefix_affinity"},
                        state_options={"redis_timeout_s": 0.05, "control_timeout_s": 0.3})
    conv = conversation(30, 6)
    chat(pod, "t30", conv[0])
    settle(pod)
    redis_proc.pause()
    try:
        waits = []
        for turn in range(1, 6):
            t0 = time.monotonic()
            chat(pod, "t30", conv[turn])
            waits.append(time.monotonic() - t0)
        assert max(waits) < 2.0, waits  # the budget is 50 ms; a stalled Redis call would hang
        # the first over-budget call starts a PING that declares Redis down after `stall_s`
        # (0.5 s): the turns above may all finish before that, so wait for the verdict (bounded)
        deadline = time.monotonic() + 5.0
        while pod.sample("prefixgate_state_backend_up") != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pod.sample("prefixgate_state_backend_up") == 0
    finally:
        redis_proc.resume()
