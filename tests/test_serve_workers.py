"""`prefixgate serve --workers 2` (a real subprocess in front of the simulator): two workers behind
one port are one gateway. A conversation whose turns reach different workers still gets
prefix-affinity routing to the replica holding its prefix and one continuity history (the shared
store), a Responses chain (`previous_response_id`, `GET /v1/responses/{id}`) stays on the replica
holding it whichever worker a turn reaches, /metrics counts every worker's requests, and SIGTERM
drains every worker."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.state.base import response_owner_key
from app.state.memory import MemoryStore
from app.state.shared import SharedStore
from tests.gateway_process import GatewayProcess
from tests.test_serve_drain import Stream

SYSTEM = "You are a careful assistant who answers in full sentences and cites the manual. " * 20


def start_workers(sim: Any, **config: Any) -> GatewayProcess:
    """A `--workers 2` gateway whose two workers both serve: /readyz answers once one of them does
    (one polling client keeps one connection, so one worker), and these tests read each worker."""
    cfg = {"backends": [{"url": u} for u in sim.urls], "routing": {"health_interval_s": 0.5}, **config}
    # debug: each attempt's routing decision and costs are logged (prefixgate.route), for failures
    gw = GatewayProcess(cfg, args=["--workers", "2", "--log-level", "debug"]).start()
    deadline = time.monotonic() + 30
    for sock in worker_sockets(gw):
        while True:
            try:
                requests_served(sock)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    gw.stop()
                    raise AssertionError(f"worker socket {sock} not serving:\n{gw.log()}") from None
                time.sleep(0.05)
    return gw


def run_dir(gw: GatewayProcess) -> str:
    """The master's socket folder, from its start-up line (app/workers.py)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(r"shared store (\S+)/store\.sock", gw.log())
        if found:
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(gw.log())


def worker_sockets(gw: GatewayProcess) -> list[str]:
    """Each worker's own-metrics socket."""
    return [os.path.join(run_dir(gw), f"metrics-{i}.sock") for i in range(2)]


def shared_owner(gw: GatewayProcess, response_id: str, timeout: float = 10.0) -> str | None:
    """The replica the master's shared store holds for `response_id`, waiting for the one-way write
    of the worker that relayed it (None past `timeout`). Read as a plain binding, the key the
    stores share, through a client of the master's socket like a worker's."""
    async def poll() -> str | None:
        client = SharedStore(os.path.join(run_dir(gw), "store.sock"), MemoryStore())
        await client.start()
        try:
            deadline = time.monotonic() + timeout
            while (owner := await client.binding_get(response_owner_key(response_id))) is None:
                if time.monotonic() > deadline:
                    return None
                await asyncio.sleep(0.05)
            return owner
        finally:
            await client.close()
    return asyncio.run(poll())


def worker_metrics(sock: str) -> str:
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=5) as client:
        return client.get("http://worker/metrics").text


def worker_counts(sock: str) -> tuple[float, dict[tuple[str, str], float]]:
    """From one scrape of the worker: its requests served, and (backend, reason) -> its routing
    decisions so far (what a failure message shows)."""
    served, decisions = 0.0, {}
    for family in text_string_to_metric_families(worker_metrics(sock)):
        for s in family.samples:
            if s.name == "prefixgate_requests_total":
                served += s.value
            elif s.name == "prefixgate_route_decisions_total":
                decisions[(s.labels["backend"], s.labels["reason"])] = s.value
    return served, decisions


def requests_served(sock: str) -> float:
    return worker_counts(sock)[0]


def failure_report(history: list[str], gw: GatewayProcess) -> str:
    """Every turn so far, then the gateway's routing lines and warnings (built only on failure)."""
    log = [line for line in gw.log().splitlines() if "prefixgate.route" in line or "WARNING" in line]
    return "\n".join([*history, "--- gateway log (routing and warnings) ---", *log])


def turn(url: str, tenant: str, messages: list[dict[str, str]]) -> httpx.Response:
    # a new connection per turn: SO_REUSEPORT spreads connections, not requests, over the workers
    resp = httpx.post(url + "/v1/chat/completions", timeout=30, headers={"x-tenant-id": tenant},
                      json={"model": "sim", "max_tokens": 8, "messages": messages})
    assert resp.status_code == 200, resp.text
    return resp


def tracked(url: str, tenant: str, requests: int) -> None:
    """Wait (10 s at most) until the tenant's history holds `requests` requests. A turn is tracked
    after its response: on a loaded machine the next turn, sent at once, could reach the other
    worker before the record landed and be the tenant's first there (continuity unknown). What
    the workers share is what the test checks, not that race."""
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/hygiene/tenants/{tenant}", timeout=5).json().get("requests", 0) < requests \
            and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def gateways() -> Any:
    procs: list[GatewayProcess] = []
    yield procs
    for p in procs:
        p.stop()


def test_turns_on_different_workers_keep_affinity_and_one_continuity_history(sim, gateways) -> None:
    """What the workers share (the residency index, the tenant's history, each other's live load)
    keeps a conversation on its replica whichever worker a turn reaches. (Before the live load was
    shared, a scrape that caught the sibling's previous turn waiting moved a turn off its prefix:
    `load_override`, 2,069 against 597 tokens, in one full-suite run.)"""
    gw = start_workers(sim, routing={"health_interval_s": 0.5})
    gateways.append(gw)
    sockets = worker_sockets(gw)
    crossed = 0  # turns served by another worker than their conversation's first turn
    history: list[str] = []  # every turn's worker, replica and routing reason, for a failure's message
    for conv in range(6):
        tenant = f"conv{conv}"
        messages = [{"role": "system", "content": SYSTEM + f" Conversation {conv}."}]
        first_worker = first_backend = None
        for n in range(4):
            messages.append({"role": "user", "content": f"question {n} of conversation {conv}"})
            before = [worker_counts(s) for s in sockets]
            resp = turn(gw.url, tenant, messages)
            after = [worker_counts(s) for s in sockets]
            (worker,) = [i for i in range(2) if after[i][0] > before[i][0]]
            backend = resp.headers["x-prefixgate-backend"]
            matched, total = (int(x) for x in resp.headers["x-prefixgate-prefix"].split("/"))
            decided = before[worker][1]
            reasons = {k: v - decided.get(k, 0) for k, v in after[worker][1].items()
                       if v > decided.get(k, 0)}  # this turn's decision(s): a failover shows two
            history.append(f"conv {conv} turn {n}: worker {worker}, {backend}, prefix {matched}/{total}, {reasons}")
            if n == 0:
                first_worker, first_backend = worker, backend
            else:
                assert backend == first_backend, failure_report(history, gw)
                assert matched > 0, failure_report(history, gw)  # the other worker knew the prefix
                crossed += worker != first_worker
            messages.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
            tracked(gw.url, tenant, n + 1)
    assert crossed > 0, "no turn reached another worker than its conversation's first: the test proves nothing"

    reports = [httpx.get(f"{gw.url}/hygiene/tenants/conv{c}", timeout=5).json() for c in range(6)]  # each turn tracked
    for report in reports:
        assert report["requests"] == 4, report
        assert report["breaks"] == 0 and report["new_sessions"] == 0, report  # one conversation, not 2
        assert len(report["recent"]) == 4
        assert sum(1 for r in report["recent"] if (r["continuity"] or 0) > 0) == 3, report

    total = sum(s.value for f in text_string_to_metric_families(httpx.get(gw.url + "/metrics", timeout=5).text)
                if f.name == "prefixgate_requests" for s in f.samples if s.name == "prefixgate_requests_total")
    assert total == 24  # the scrape is the gateway's, whichever worker answered it


def _worker_of(client: httpx.Client, gw: GatewayProcess, sockets: list[str]) -> int:
    """Which worker serves `client`'s kept connection (one small request, another tenant)."""
    before = [requests_served(s) for s in sockets]
    resp = client.post(gw.url + "/v1/chat/completions", headers={"x-tenant-id": "probe"},
                       json={"model": "sim", "max_tokens": 1, "messages": [{"role": "user", "content": "probe"}]})
    assert resp.status_code == 200, resp.text
    after = [requests_served(s) for s in sockets]
    (worker,) = [i for i in range(2) if after[i] > before[i]]
    return worker


def test_a_siblings_ended_request_does_not_weigh_on_its_replica_as_a_scrape_saw_it(sim_factory, gateways) -> None:
    """A request of one worker that the other worker's engine scrape caught running, and that has
    ended since, is not priced as another gateway's request (the workers' live load table,
    app/routing/siblings.py): the conversation's next turn, on the other worker, stays on the
    replica holding its prefix. One running request is made decisive here
    (`decode_tokens_per_running` 4,096 against a ~400-token prefix); counted from that scrape
    (up to `scrape.interval_s` old) as foreign load, it moved the turn off its prefix."""
    sim = sim_factory(replicas=2, time_scale=1.0, decode_tps=25.0)
    gw = start_workers(sim, routing={"health_interval_s": 0.5, "weights": {"decode_tokens_per_running": 4096}},
                       scrape={"interval_s": 1.0, "jitter": 0.0})
    gateways.append(gw)
    sockets = worker_sockets(gw)
    clients: dict[int, httpx.Client] = {}
    try:
        for _ in range(64):  # one kept connection per worker (SO_REUSEPORT spreads connections)
            client = httpx.Client(timeout=30)
            worker = _worker_of(client, gw, sockets)
            if worker in clients:
                client.close()
            else:
                clients[worker] = client
            if len(clients) == 2:
                break
        assert len(clients) == 2, "every connection reached one worker"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first question"}]
        history: list[str] = []
        for n, worker in enumerate((0, 0, 1)):  # turn 2 decodes ~1.3 s on worker 0; turn 3 follows it on worker 1
            time.sleep(0.1 if n == 2 else 0.0)  # worker 0 has released turn 2's load
            resp = clients[worker].post(gw.url + "/v1/chat/completions", headers={"x-tenant-id": "conv"},
                                        json={"model": "sim", "max_tokens": 40, "messages": messages})
            assert resp.status_code == 200, resp.text
            history.append(f"turn {n + 1}: worker {worker}, {resp.headers['x-prefixgate-backend']}, "
                           f"prefix {resp.headers.get('x-prefixgate-prefix')}")
            messages += [{"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": f"question {n + 2}"}]
        home = history[0].split(", ")[1]
        assert all(h.split(", ")[1] == home for h in history), failure_report(history, gw)
    finally:
        for client in clients.values():
            client.close()


def fresh_client(gw: GatewayProcess) -> openai.OpenAI:
    """A client of its own, so a new connection: SO_REUSEPORT then picks a worker afresh."""
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_a_responses_chain_stays_on_its_replica_whichever_worker_a_turn_reaches(sim, gateways) -> None:
    """vLLM keeps a stored response on the replica that made it: `previous_response_id` and
    `GET /v1/responses/{id}` must reach that replica although round robin alternates and the turn
    reached another worker than the one that relayed the response (the shared store's owner pins)."""
    gw = start_workers(sim, routing={"policy": "round_robin", "health_interval_s": 0.5})
    gateways.append(gw)
    sockets = worker_sockets(gw)
    first = fresh_client(gw).responses.with_raw_response.create(
        model="sim", input="first question " + SYSTEM[:400], max_output_tokens=4)
    home, previous = first.headers["x-prefixgate-backend"], first.parse().id
    workers: set[int] = set()
    for n in range(24):  # 6 turns, then more until both workers had one (all on one: 1 in 32 at 6)
        if n >= 6 and workers == {0, 1}:
            break
        owner = shared_owner(gw, previous)
        before = [requests_served(s) for s in sockets]
        turn = fresh_client(gw).responses.with_raw_response.create(
            model="sim", previous_response_id=previous, input=f"follow-up {n}", max_output_tokens=4)
        after = [requests_served(s) for s in sockets]
        workers.update(i for i in range(2) if after[i] > before[i])
        assert turn.status_code == 200 and turn.headers["x-prefixgate-backend"] == home, (n, turn.headers)
        assert owner == home, (n, owner)
        got = fresh_client(gw).responses.with_raw_response.retrieve(previous)
        assert got.status_code == 200 and got.headers["x-prefixgate-backend"] == home
        assert got.parse().id == previous
        previous = turn.parse().id
    assert workers == {0, 1}, f"every turn reached one worker {workers}: the test proves nothing"


def test_sigterm_drains_every_worker(sim_factory, gateways) -> None:
    slow = sim_factory(replicas=1, decode_tps=20.0)
    gw = start_workers(slow, shutdown={"accept_s": 0.5, "grace_s": 60})
    gateways.append(gw)
    sockets = worker_sockets(gw)
    streams: list[Stream] = []
    busy = [0.0, 0.0]
    for _ in range(16):  # until both workers hold a stream in flight
        stream = Stream(gw.url, tokens=40)  # ~2 s of decode
        stream.start()
        streams.append(stream)
        assert stream.first.wait(30) and stream.error is None
        busy = [_inflight(s) for s in sockets]
        if all(b > 0 for b in busy):
            break
    assert all(b > 0 for b in busy), busy
    workers = _children(gw)
    assert len(workers) == 2
    gw.signal(signal.SIGTERM)
    for stream in streams:
        stream.join(60)
        assert stream.error is None, stream.error
        assert stream.data[-1] == "[DONE]" and not stream.errors()
        content = [json.loads(d) for d in stream.data[:-1]]
        assert sum(1 for c in content if c.get("choices") and c["choices"][0]["delta"].get("content")) == 40
    assert gw.wait(30) == 0, gw.log()
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    assert gw.log().count("SIGTERM: draining") == 2


def _inflight(sock: str) -> float:
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=5) as client:
        text = client.get("http://worker/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == "prefixgate_backend_inflight_requests" for s in f.samples)


def _children(gw: GatewayProcess) -> list[int]:
    assert gw.proc is not None
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == gw.proc.pid:
                pids.append(int(entry))
    return pids
