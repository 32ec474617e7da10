"""End to end over loopback: simulated replica + proxy + the prefix hook.

- prediction: on one replica whose pool never evicts, the proxy's predicted cached tokens equal
  the simulator's usage cached_tokens for every request of a multi-turn, multi-tenant workload;
- a tenant with `Current time: …` on top of a long system prompt shows continuity ≈ 0 and
  dynamic_head breaks in /hygiene and /metrics; a clean tenant shows continuity ≈ 1.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

SYSTEMS = {
    "acme": "You are Acme's logistics assistant. Refunds within 30 days; shipping 3 to 5 days.\n" * 40,
    "globex": "Globex research helper. Cite sources, prefer primary literature, be concise.\n" * 35,
    "initech": "Initech IT desk. Ask for the asset tag first, then the symptom, then the OS.\n" * 45,
}


def wait_processed(hook: Any, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def prompt_len(messages: list[dict]) -> int:
    from app.sim.tokens import load_tokenizer

    tok = load_tokenizer(None)
    return len(tok.encode(tok.render_chat(messages, None)))


def edge_max_tokens(messages: list[dict], sent: int) -> int | None:
    """Every other request ends exactly on a block boundary (N + out = k * 16): the engine keeps
    the blocks of N + out - 1 computed tokens, not the last one, and the prediction must agree."""
    return 16 + (-prompt_len(messages)) % 16 if sent % 2 else None


def send(client: httpx.Client, tenant: str, messages: list[dict], stream: bool,
         max_tokens: int | None = None) -> str:
    body = {"model": "sim", "messages": messages, "max_tokens": max_tokens or 24 + len(messages) % 7}
    if not stream:
        r = client.post("/v1/chat/completions", json=body, headers={"x-tenant-id": tenant})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]
    body["stream"] = True
    text = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-tenant-id": tenant}) as r:
        assert r.status_code == 200
        import json as _json
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = _json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


@pytest.mark.parametrize("policy", ["prefix_affinity", "round_robin"])
def test_prediction_equals_sim_cached_tokens(sim_factory, proxy_factory, policy: str) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000)
    proxy = proxy_factory(sim, routing={"policy": policy})
    hook = proxy.services.prefix
    convs = {t: [{"role": "system", "content": s}] for t, s in SYSTEMS.items()}
    sent = 0
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for turn in range(5):
            for tenant, msgs in convs.items():
                msgs.append({"role": "user", "content": f"Turn {turn} question from {tenant}: status of ticket?"})
                edge = edge_max_tokens(msgs, sent)
                reply = send(client, tenant, msgs, stream=(turn + sent) % 2 == 0, max_tokens=edge)
                msgs.append({"role": "assistant", "content": reply})
                sent += 1
                wait_processed(hook, sent)
    rows = list(hook.predictions)
    assert len(rows) == sent == 15
    mismatched = [(t, p, d) for _, t, p, d in rows if p != d]
    assert not mismatched, mismatched
    assert sum(p for _, _, p, _ in rows) > 10_000  # the history really was reused
    assert proxy.sample("prefixgate_cached_tokens_total", route="chat", model="sim", tenant="acme", source="predicted") == \
        proxy.sample("prefixgate_cached_tokens_total", route="chat", model="sim", tenant="acme", source="engine")
    assert proxy.sample("prefixgate_fingerprint_mode", mode="exact") == 1.0
    assert proxy.sample("prefixgate_prefix_reuse_tokens_total", stage="delivered") > 0
    assert proxy.sample("prefixgate_prefix_reuse_tokens_total", stage="captured") > 0


def test_dynamic_head_tenant_vs_clean_tenant(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim)
    hook = proxy.services.prefix
    static = SYSTEMS["acme"]
    n = 0
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        clean = [{"role": "system", "content": SYSTEMS["globex"]}]
        for i in range(5):
            now = f"2026-04-14T09:{10 + i:02d}:{(7 * i) % 60:02d}Z"
            send(client, "clock", [{"role": "system", "content": f"Current time: {now}\n{static}"},
                                   {"role": "user", "content": f"Where is parcel {i}?"}], stream=False)
            clean.append({"role": "user", "content": f"question {i}"})
            clean.append({"role": "assistant", "content": send(client, "clean", clean, stream=i % 2 == 1)})
            n += 2
            wait_processed(hook, n)
        tenants = client.get("/hygiene/tenants").json()
        clock = client.get("/hygiene/tenants/clock").json()
        clean_report = client.get("/hygiene/tenants/clean").json()
        missing = client.get("/hygiene/tenants/nobody")
        ui = client.get("/ui")
        metrics = client.get("/metrics").text
    assert tenants["fingerprint_mode"] == "exact"
    assert {t["tenant"] for t in tenants["tenants"]} == {"clock", "clean"}
    assert clock["continuity"] < 0.05
    assert clock["breaks_by_cause"] == {"dynamic_head": 4}
    last = clock["last_breaks"][0]
    assert last["cause"] == "dynamic_head" and last["block_index"] <= 1 and last["token_offset"] <= 16
    assert last["span_kinds"] == ["timestamp"]
    assert "2026" not in last["snippet"] and "Acme" not in last["snippet"]  # show_text is off
    assert "below the static content" in last["fix"]
    assert clean_report["continuity"] > 0.75 and clean_report["breaks"] == 0
    assert missing.status_code == 404
    # /ui is the explorer app reading this JSON (its DOM is tested in a browser: tests/test_ui_browser.py)
    assert ui.status_code == 200 and "/ui/app.js" in ui.text
    row = next(t for t in tenants["tenants"] if t["tenant"] == "clock")
    assert row["last_break"]["cause"] == "dynamic_head" and row["breaks_by_cause"] == {"dynamic_head": 4}
    assert 'prefixgate_prefix_breaks_total{cause="dynamic_head",route="chat",tenant="clock"} 4.0' in metrics
    gauge = [ln for ln in metrics.splitlines() if ln.startswith('prefixgate_prefix_continuity_ratio{tenant="clock"}')]
    assert gauge and float(gauge[0].split()[-1]) < 0.05
    clean_gauge = [ln for ln in metrics.splitlines()
                   if ln.startswith('prefixgate_prefix_continuity_ratio{tenant="clean"}')]
    assert clean_gauge and float(clean_gauge[0].split()[-1]) > 0.9


def test_engine_mode_uses_replica_tokenize(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, prefix={"mode": "engine"})
    hook = proxy.services.prefix
    assert hook.mode == "engine"
    convs = {t: [{"role": "system", "content": SYSTEMS[t]}] for t in ("acme", "globex")}
    sent = 0
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for turn in range(3):
            for tenant, msgs in convs.items():
                msgs.append({"role": "user", "content": f"turn {turn}: and now?"})
                edge = edge_max_tokens(msgs, sent)
                msgs.append({"role": "assistant", "content": send(client, tenant, msgs, False, edge)})
                sent += 1
                wait_processed(hook, sent)
        modes = client.get("/hygiene/tenants").json()["fingerprint_mode"]
    rows = list(hook.predictions)
    assert [(p, d) for _, _, p, d in rows if p != d] == []
    assert sum(p for _, _, p, _ in rows) > 2_000
    assert modes == "engine"
    assert proxy.sample("prefixgate_fingerprint_mode", mode="engine") == 1.0
    assert proxy.sample("prefixgate_fingerprint_mode", mode="exact") == 0.0
    # /tokenize rode the proxy's one upstream aiohttp session (no second HTTP stack)
    assert hook.fingerprinter.engine.session() is proxy.services.upstream.session
    assert not [n for n in vars(hook.fingerprinter.engine) if "client" in n]


@pytest.mark.parametrize("answer", [
    (404, b'{"detail": "Not Found"}'), (200, b'{"tokens": [1, -5, 2]}'), (200, b'{"tokens": [1, 2.5]}'),
    (200, b'{"tokens": [true, 2]}'), (200, b'{"tokens": [1, 4294967296]}'), (200, b'{"count": 3}'), (200, b"[1, 2"),
])
def test_engine_mode_without_the_engine_s_ids_serves_and_counts_the_loss(fake_upstream_factory, proxy_factory,
                                                                          caplog, answer) -> None:
    """`prefix.mode: engine` and a /tokenize that fails or answers something that is no list of
    token ids (a negative, a float, a bool, an id past 32 bits): every request is served, each
    is counted in prefixgate_engine_tokenize_failures_total, none as an observation error (it is
    the engine's fault, not a bug), and one warning is logged, not a traceback a request."""
    from fake_upstream import FakeResponse

    from tests.test_fuzz_upstream import ANSWERS

    status, body = answer

    def script(req):
        if req.path == "/tokenize":
            return FakeResponse(status=status, headers={"content-type": "application/json"}, chunks=[(0.0, body)])
        return FakeResponse(headers={"content-type": "application/json"}, chunks=[(0.0, ANSWERS[("chat", False)])])

    proxy = proxy_factory(fake_upstream_factory(script).url, prefix={"mode": "engine"})
    for i in range(3):
        got = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=10, json={
            "model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": f"Hello {i}"}]})
        assert got.status_code == 200
    proxy.drain()
    assert proxy.sample("prefixgate_engine_tokenize_failures_total") == 3
    assert proxy.sample("prefixgate_observation_errors_total", stage="prefix") in (None, 0)
    lost = [r for r in caplog.records if r.name == "prefixgate.prefix"]
    assert len(lost) == 1 and lost[0].levelname == "WARNING" and lost[0].exc_info is None


def test_cold_big_prompt_is_known_by_the_next_turn(sim_factory, proxy_factory) -> None:
    """A system prompt too big to encode inline is tokenised while the first request is in
    flight, and its blocks are in the index before the next turn is routed. The next turn waits
    for that tokenisation (`prefix.pending_wait_ms`): at the default 50 ms a loaded box can take
    longer, and the turn is then routed cold, away from the replica the first one went to."""
    sim = sim_factory(replicas=3, time_scale=0.0)
    proxy = proxy_factory(sim, prefix={"pending_wait_ms": 5000.0})
    system = "Reference manual, chapter on returns and refunds, paragraph. " * 400  # ~25 KB
    msgs = [{"role": "system", "content": system}]
    homes, headers = set(), []
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for turn in range(3):
            msgs.append({"role": "user", "content": f"question {turn}"})
            r = client.post("/v1/chat/completions", json={"model": "sim", "messages": msgs, "max_tokens": 8},
                            headers={"x-tenant-id": "big"})
            assert r.status_code == 200
            homes.add(r.headers["x-prefixgate-backend"])
            headers.append(r.headers["x-prefixgate-prefix"])
            if turn:
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 3000, (turn, homes, headers)
            msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    assert len(homes) == 1, homes
    assert headers[0].startswith("0/")  # cold: nothing known on the hot path
    matched, total = (int(x) for x in headers[2].split("/"))
    assert total > 300 and matched >= total - 2


def test_a_request_after_anothers_response_finds_its_blocks_while_that_chain_is_late(sim_factory, proxy_factory) -> None:
    """Tenant A's cold prompt over a shared system prompt gets its response before its chain
    reaches the index (the worker thread is held back after filling the memos, as a stalled loop
    or a busy core does). Tenant B's first request over the same system prompt, sent as A's
    response ends, is predicted exactly what the engine serves from A's blocks: it waits for A's
    chain (A was served, so the engine holds those blocks). Found on real vLLM under load:
    predicted 0 where the engine served 1408."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, prefix={"pending_wait_ms": 5000.0})
    hook = proxy.services.prefix
    rest_sync = hook.fingerprinter.rest_sync
    memoised = threading.Event()

    def late(fp: Any) -> Any:
        tip = rest_sync(fp)  # ids and chain memoised: B's walk finds them, the index does not yet
        memoised.set()
        time.sleep(0.5)
        return tip

    hook.fingerprinter.rest_sync = late
    system = "Shared policy handbook, section on escalations and refunds. " * 250  # ~15 KB: cold
    served = {}
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for tenant in ("a", "b"):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"{tenant}: a question"}]
            r = client.post("/v1/chat/completions", json={"model": "sim", "messages": messages, "max_tokens": 4},
                            headers={"x-tenant-id": tenant, "x-request-id": tenant})
            assert r.status_code == 200
            served[tenant] = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert memoised.wait(10)
    wait_processed(hook, 2)
    assert served["a"] == 0 and served["b"] > 2000, served
    # (without the wait both were wrong: B was routed before A's chain was in the index, and A's
    # own lookup, run when its chain was done, then found B's copy of the shared blocks)
    assert {rid: p for rid, _, p, _ in hook.predictions} == served


def test_long_token_id_prompts_predict_exactly(sim_factory, proxy_factory) -> None:
    """Token-id prompts past the inline hash budget are finished off the loop (not hashed in full
    before forwarding) and still predict exactly what the engine serves from cache."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, prefix={"inline_hash_tokens": 1024})
    hook = proxy.services.prefix
    head = [(i * 7919) % 30_000 + 100 for i in range(20_000)]
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        for i in range(3):
            body = {"model": "sim", "max_tokens": 2, "prompt": head + [200 + i] * (i + 17)}
            r = client.post("/v1/completions", json=body)
            r.raise_for_status()
            wait_processed(hook, i + 1)
    rows = list(hook.predictions)
    assert [(p, d) for _, _, p, d in rows if p != d] == []
    assert [p for _, _, p, _ in rows][1:] == [len(head) // 16 * 16] * 2


TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}}, "required": ["path"]}}},  # no description: the engine renders null
    {"type": "function", "function": {"parameters": {"type": "object"}, "description": "List a directory.",
                                      "name": "list_dir"}},  # members not in the engine model's order
]


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_chat_tools_predict_exactly_as_the_engine_dumps_them(sim_factory, proxy_factory, flavor: str) -> None:
    """The engine renders each tool as its request model dumps it (app/prefix/tool_dump.py); the
    proxy renders the same dump for the fleet's engine kind, so its predictions stay exact for
    tools without a description or with their members reordered, turn after turn."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000, flavor=flavor)
    proxy = proxy_factory(sim)
    hook = proxy.services.prefix
    deadline = time.monotonic() + 20
    while {r.engine for r in proxy.services.replicas.all()} != {flavor}:  # the kind the dump follows
        assert time.monotonic() < deadline, "the replica's engine kind was never scraped"
        time.sleep(0.05)
    msgs: list[dict] = [{"role": "system", "content": SYSTEMS["acme"]}]
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for turn in range(4):
            msgs.append({"role": "user", "content": f"Turn {turn}: which files changed?"})
            body = {"model": "sim", "messages": msgs, "tools": TOOLS, "max_tokens": 20}
            r = client.post("/v1/chat/completions", json=body, headers={"x-tenant-id": "acme"})
            assert r.status_code == 200, r.text
            msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            wait_processed(hook, turn + 1)
    rows = list(hook.predictions)
    assert len(rows) == 4
    assert [(p, d) for _, _, p, d in rows if p != d] == []
    assert sum(d for _, _, _, d in rows) > 1000  # the engine really served the head from cache


def _scraped_64_block_replica(sim_factory: Any, proxy_factory: Any) -> Any:
    """A gateway in front of one simulated vLLM replica that can cache 64 blocks, once its first
    scrape has told the gateway so."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=65)  # less vLLM's null block
    proxy = proxy_factory(sim)
    proxy.wait_scraped()
    replica = proxy.services.replicas.get(proxy.services.replicas.names()[0])
    assert replica is not None and replica.engine == "vllm" and replica.kv_blocks == 64
    return proxy


def test_predictions_stay_exact_when_the_replica_evicts(sim_factory, proxy_factory) -> None:
    """A replica short of KV blocks evicts; the index, bounded at what the engine can cache (vLLM's
    num_gpu_blocks less its null block, learned from the scrape), evicts the same blocks. The
    prompts are whole blocks and generate one token, so no request leaves a partial block in the
    engine's free queue (the next test has those)."""
    proxy = _scraped_64_block_replica(sim_factory, proxy_factory)
    hook = proxy.services.prefix

    def ids(seed: int, blocks: int) -> list[int]:
        return [(seed * 7919 + i * 31) % 30_000 + 100 for i in range(16 * blocks)]

    a, b = ids(1, 40), ids(2, 30)
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        for n, prompt in enumerate((a, b, a, b, a), 1):  # 40 + 30 blocks > 64: each turn evicts
            r = client.post("/v1/completions", json={"model": "sim", "max_tokens": 1, "prompt": prompt})
            r.raise_for_status()
            wait_processed(hook, n)
    rows = list(hook.predictions)
    assert [d for _, _, _, d in rows][2:] != [0, 0, 0]  # some blocks survived each eviction
    assert [(p, d) for _, _, p, d in rows if p != d] == []


def test_predictions_stay_exact_when_requests_leave_partial_blocks_and_the_replica_evicts(
        sim_factory, proxy_factory) -> None:
    """Prompts that end inside a block: each finished request leaves its partial last block
    uncached in vLLM's free queue (the simulator keeps that queue), where it takes a slot until
    an allocation pops it. The index holds such a block as an anonymous one of its own
    (ReplicaIndex.learn_completed); without it, with two sessions taking turns on a replica that
    evicts, it predicted one block more than the engine read on every turn that evicted."""
    proxy = _scraped_64_block_replica(sim_factory, proxy_factory)
    hook = proxy.services.prefix

    def ids(seed: int, tokens: int) -> list[int]:
        return [(seed * 7919 + i * 31) % 30_000 + 100 for i in range(tokens)]

    a, b = ids(1, 16 * 39 + 5), ids(2, 16 * 29 + 9)  # 40 + 30 blocks, the last of each partial
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        for n, prompt in enumerate((a, b, a, b, a, b), 1):  # 40 + 30 blocks > 64: each turn evicts
            r = client.post("/v1/completions", json={"model": "sim", "max_tokens": 1, "prompt": prompt})
            r.raise_for_status()
            wait_processed(hook, n)
    rows = list(hook.predictions)
    assert all(0 < d < len(p) for (_, _, _, d), p in zip(rows[2:], (a, b, a, b), strict=True))  # evicted, not all
    assert [(p, d) for _, _, p, d in rows if p != d] == []


def _json_answering_proxy(fake_upstream_factory: Any, proxy_factory: Any, **settings: Any) -> Any:
    """The gateway in front of a fake replica that answers every chat request with one JSON body."""
    from fake_upstream import FakeResponse

    from tests.test_fuzz_upstream import ANSWERS

    upstream = fake_upstream_factory(lambda req: FakeResponse(headers={"content-type": "application/json"},
                                                              chunks=[(0.0, ANSWERS[("chat", False)])]))
    return proxy_factory(upstream.url, **settings)


def _edition_break(proxy: Any, repeat: int) -> None:
    """Two requests of tenant acme whose system prompts differ in their first line: a break."""
    policy = "".join(f"Rule {i}: answer from the handbook and cite the section.\n" for i in range(20)) * repeat
    for head in ("Edition 1.", "Edition 2."):
        got = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=10, headers={"x-tenant-id": "acme"}, json={
            "model": "fake", "max_tokens": 4, "messages": [{"role": "system", "content": head + "\n" + policy},
                                                           {"role": "user", "content": "Where is my order?"}]})
        assert got.status_code == 200
    proxy.drain()


def _acme_recorded_undiagnosed(proxy: Any) -> bool:
    """Both of acme's requests are recorded, the second `diagnosed: false`."""
    records = asyncio.run_coroutine_threadsafe(proxy.services.store.history_recent("acme", 8), proxy.server.loop).result()
    return len(records) == 2 and records[-1].get("diagnosed") is False


def test_a_diagnosis_that_raises_is_counted_apart_and_the_request_still_tracked(fake_upstream_factory, proxy_factory,
                                                                              monkeypatch) -> None:
    """Through the gateway: a break whose diagnosis raises (a bug of ours) is served, counted in
    prefixgate_observation_errors_total{stage="diagnosis"} (not as a lost `prefix` observation:
    the request is recorded, undiagnosed), and the tenant keeps both requests."""
    from app.prefix import tracker as tracker_module

    def broken(*args, **kwargs):
        raise ValueError("a diagnosis bug")

    monkeypatch.setattr(tracker_module, "diagnose", broken)
    proxy = _json_answering_proxy(fake_upstream_factory, proxy_factory)
    _edition_break(proxy, 1)
    assert proxy.sample("prefixgate_observation_errors_total", stage="diagnosis") == 1
    assert proxy.sample("prefixgate_observation_errors_total", stage="prefix") in (None, 0)
    assert _acme_recorded_undiagnosed(proxy)


@pytest.mark.parametrize(("repeat", "where"), [(1, "event_loop"), (60, "diagnosis_thread")])
def test_a_diagnosed_break_is_counted_with_its_cpu_where_it_ran(fake_upstream_factory, proxy_factory,
                                                               repeat: int, where: str) -> None:
    """Through the gateway: the break is counted in prefixgate_diagnoses_total{outcome="diagnosed"}
    and its diagnosis's CPU in prefixgate_diagnosis_cpu_seconds_total under where it ran (a small
    prompt pair inline on the event loop; ~190 KB in the diagnosis thread), nothing under the other."""
    proxy = _json_answering_proxy(fake_upstream_factory, proxy_factory)
    _edition_break(proxy, repeat)
    assert proxy.sample("prefixgate_diagnoses_total", outcome="diagnosed") == 1
    assert proxy.sample("prefixgate_diagnoses_total", outcome="skipped") in (None, 0)
    spent = proxy.sample("prefixgate_diagnosis_cpu_seconds_total", where=where)
    assert spent is not None and 0 < spent < 5
    other = "event_loop" if where == "diagnosis_thread" else "diagnosis_thread"
    assert proxy.sample("prefixgate_diagnosis_cpu_seconds_total", where=other) in (None, 0)


def test_a_break_past_a_full_diagnosis_queue_is_counted_skipped(fake_upstream_factory, proxy_factory,
                                                                monkeypatch) -> None:
    """Through the gateway, with no room in the diagnosis queue: a large prompt pair's break is
    recorded undiagnosed and counted in prefixgate_diagnoses_total{outcome="skipped"}, with no
    diagnosis CPU."""
    from app.prefix import tracker as tracker_module

    monkeypatch.setattr(tracker_module, "DIAGNOSE_QUEUE", 0)
    proxy = _json_answering_proxy(fake_upstream_factory, proxy_factory)
    _edition_break(proxy, 60)
    assert proxy.sample("prefixgate_diagnoses_total", outcome="skipped") == 1
    assert proxy.sample("prefixgate_diagnoses_total", outcome="diagnosed") in (None, 0)
    assert proxy.sample("prefixgate_diagnosis_cpu_seconds_total", where="diagnosis_thread") in (None, 0)
    assert _acme_recorded_undiagnosed(proxy)


def test_with_no_cpu_share_for_diagnoses_a_break_is_recorded_undiagnosed(fake_upstream_factory,
                                                                         proxy_factory) -> None:
    """Through the gateway with `prefix.diagnosis_cpu_share: 0`: the break is served and recorded
    (both requests, the second `diagnosed: false`), counted in
    prefixgate_diagnoses_total{outcome="over_budget"}, and no diagnosis runs."""
    proxy = _json_answering_proxy(fake_upstream_factory, proxy_factory, prefix={"diagnosis_cpu_share": 0})
    _edition_break(proxy, 1)
    assert proxy.sample("prefixgate_diagnoses_total", outcome="over_budget") == 1
    assert proxy.sample("prefixgate_diagnoses_total", outcome="diagnosed") in (None, 0)
    assert proxy.sample("prefixgate_diagnosis_cpu_seconds_total", where="event_loop") in (None, 0)
    assert proxy.services.prefix.tracker.diagnoses == 0
    assert _acme_recorded_undiagnosed(proxy)
