"""`POST /v1/responses` end to end: the real `openai` client, the proxy, simulated vLLM replicas
over loopback HTTP (app/sim/responses.py serves vLLM's event shapes)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import redis as redis_lib
from openai.types.responses import ResponseErrorEvent

from app.telemetry.metrics import PROMPT_BUCKET_MAX, PROMPT_BUCKETS
from tests.chat_history import codex_items, words

NAMES = ["r0", "r1"]
BUCKETS = [label for label, _ in PROMPT_BUCKETS] + [PROMPT_BUCKET_MAX]
SECRET_ENV = "PREFIXGATE_TEST_RESPONSES_SECRET"
SALT = {"tenants": {"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}}}
INSTRUCTIONS = "You are a coding agent. Repository notes: " + words(11, 400)
TOOLS = [{"type": "function", "name": name, "description": f"{name} a path in the repository",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for name in ("read_file", "shell", "write_file")]


def client_for(proxy, tenant: str = "acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0,
                         default_headers={"x-tenant-id": tenant})


def wait_processed(hook, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hook.processed >= n, f"{hook.processed} of {n} requests processed"


def codex_turns(turns: int) -> list[list[dict]]:
    """Growing input items of a Codex-shaped session: user text, a function call + its output."""
    return codex_items(turns, 100, 40, 200, 80, "read_file")


def stream_once(client: openai.OpenAI, **kwargs) -> tuple[list, object]:
    events = []
    with client.responses.create(model="sim", stream=True, **kwargs) as stream:
        for event in stream:
            events.append(event)
    return events, events[-1]


def test_stream_ttft_usage_and_prediction_equal_the_engine(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, names=NAMES)
    client = client_for(proxy)
    hook = proxy.services.prefix
    for n, items in enumerate(codex_turns(4), start=1):
        events, last = stream_once(client, instructions=INSTRUCTIONS, tools=TOOLS, input=items,
                                   max_output_tokens=8, store=False)
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
        wait_processed(hook, n)
    rows = list(hook.predictions)
    assert len(rows) == 4
    assert all(p == d for _, _, p, d in rows), rows
    assert sum(p for _, _, p, _ in rows) > 1000  # the history really was reused
    prompt = proxy.sample("prefixgate_prompt_tokens_total", route="responses", model="sim", tenant="acme")
    engine = proxy.sample("prefixgate_cached_tokens_total", route="responses", model="sim", tenant="acme", source="engine")
    predicted = proxy.sample("prefixgate_cached_tokens_total", route="responses", model="sim", tenant="acme", source="predicted")
    assert prompt and engine == predicted == sum(d for _, _, _, d in rows)
    assert proxy.sample("prefixgate_requests_total", route="responses", status="200") == 4
    ttft = sum(proxy.sample("prefixgate_ttft_seconds_count", route="responses", model="sim", backend=b, prompt_bucket=k) or 0
               for b in NAMES for k in BUCKETS)
    assert ttft == 4


def test_ttft_stops_at_the_first_text_delta_not_at_response_created(sim_factory, proxy_factory) -> None:
    # prefill is slow (200 tokens/s): created/in_progress arrive at once, the first delta ~0.3 s later
    sim = sim_factory(replicas=1, time_scale=1.0, prefill_tps=200.0, cached_tps=0)
    proxy = proxy_factory(sim, names=["r0"])
    client = client_for(proxy)
    stamps: list[tuple[str, float]] = []
    start = time.perf_counter()
    with client.responses.create(model="sim", stream=True, input=words(1, 50), max_output_tokens=3,
                                 store=False) as stream:
        for event in stream:
            stamps.append((event.type, time.perf_counter() - start))
    first_delta = next(t for k, t in stamps if k == "response.output_text.delta")
    created = next(t for k, t in stamps if k == "response.created")
    assert first_delta - created > 0.15
    proxy.settle()
    total = proxy.sample("prefixgate_ttft_seconds_sum", route="responses", model="sim", backend="r0", prompt_bucket="0-1k")
    assert total is not None and total > 0.15  # stamped at the delta: it includes the prefill wait


def test_previous_response_id_lands_on_the_producing_replica(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, names=NAMES, routing={"policy": "round_robin"})
    client = client_for(proxy)
    hook = proxy.services.prefix
    first = client.responses.with_raw_response.create(model="sim", instructions=INSTRUCTIONS,
                                                      input="first question " + words(3, 50), max_output_tokens=6)
    home = first.headers["x-prefixgate-backend"]
    previous = first.parse().id
    for n in range(2, 6):  # round robin would alternate; the id pins every turn to its producer
        events, last = stream_once(client, previous_response_id=previous, input=f"follow-up {n}",
                                   max_output_tokens=6)
        previous = last.response.id
        wait_processed(hook, n)
    rows = list(hook.predictions)
    assert len(rows) == 5 and all(p == d for _, _, p, d in rows), rows
    assert sum(d or 0 for _, _, _, d in rows[1:]) > 300  # the prepended history hit the cache
    retrieved = client.responses.with_raw_response.retrieve(previous)
    assert retrieved.headers["x-prefixgate-backend"] == home and retrieved.parse().id == previous
    state = httpx.get(sim.urls[NAMES.index(home)] + "/sim/state", timeout=10).json()
    other = httpx.get(sim.urls[1 - NAMES.index(home)] + "/sim/state", timeout=10).json()
    assert len(state["recent_requests"]) == 5 and not other["recent_requests"]


def test_unknown_history_makes_no_prediction(sim_factory, proxy_factory) -> None:
    """A previous_response_id the proxy did not relay: the engine prepends history the proxy
    never saw, so no prediction is made (never a guess)."""
    sim = sim_factory(replicas=1, time_scale=0.0)
    direct = openai.OpenAI(base_url=sim.urls[0] + "/v1", api_key="x", max_retries=0)
    previous = direct.responses.create(model="sim", input="asked directly " + words(5, 80), max_output_tokens=4).id
    proxy = proxy_factory(sim)
    client = client_for(proxy)
    client.responses.create(model="sim", previous_response_id=previous, input="next", max_output_tokens=4)
    proxy.settle()
    assert proxy.services.prefix.processed == 0 and not proxy.services.prefix.predictions
    assert proxy.sample("prefixgate_cached_tokens_total", route="responses", model="sim", tenant="acme", source="engine") > 0


def test_dead_producing_replica_answers_the_engines_404(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0)
    proxy = proxy_factory(sim, names=NAMES)
    client = client_for(proxy)
    first = client.responses.with_raw_response.create(model="sim", input="hello", max_output_tokens=4)
    home, rid = first.headers["x-prefixgate-backend"], first.parse().id
    proxy.settle()
    sim.servers[NAMES.index(home)].stop()  # the replica and its in-memory store are gone
    for call in (lambda: client.responses.create(model="sim", previous_response_id=rid, input="more"),
                 lambda: client.responses.retrieve(rid), lambda: client.responses.cancel(rid)):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body == {"message": f"Response with id '{rid}' not found.",
                                     "type": "invalid_request_error", "param": "response_id", "code": 404}


def test_midstream_death_ends_with_the_responses_error_event(sim_factory, proxy_factory) -> None:
    """The error event continues the stream's numbering and is the openai SDK's
    `ResponseErrorEvent` exactly (strict validation: `sequence_number` is required there)."""
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim)
    httpx.post(sim.urls[0] + "/sim/faults", json={"mode": "die_midstream", "after_chunks": 4})
    resp = httpx.post(proxy.url + "/v1/responses", timeout=30,
                      json={"model": "sim", "input": "hello", "stream": True, "max_output_tokens": 8})
    body = resp.text
    assert "[DONE]" not in body and '"choices"' not in body
    events = body.rstrip("\n").split("\n\n")
    assert events[-1].startswith("event: error\ndata: ")
    error = json.loads(events[-1].split("data: ", 1)[1])
    before = json.loads(events[-2].split("data: ", 1)[1])
    assert error == {"code": "upstream_midstream", "message": error["message"], "param": None,
                     "sequence_number": before["sequence_number"] + 1, "type": "error"}
    assert list(error) == ["code", "message", "param", "sequence_number", "type"]  # the SDK model's field order
    ResponseErrorEvent.model_validate(error, strict=True)
    client = client_for(proxy)
    httpx.post(sim.urls[0] + "/sim/faults", json={"mode": "die_midstream", "after_chunks": 4})
    events, last = stream_once(client, input="hello", max_output_tokens=8)  # the iteration ends cleanly
    assert isinstance(last, ResponseErrorEvent) and last.code == "upstream_midstream"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert proxy.sample("prefixgate_requests_total", route="responses", status="200") == 2


def test_cache_isolation_on_the_responses_route(sim_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-length")
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, **SALT)
    prompt = dict(model="sim", instructions=INSTRUCTIONS, input="same question", max_output_tokens=4, store=False)
    a1 = client_for(proxy, "alice").responses.create(**prompt)
    b1 = client_for(proxy, "bob").responses.create(**prompt)
    a2 = client_for(proxy, "alice").responses.create(**prompt)
    assert a1.usage.input_tokens_details.cached_tokens == 0
    assert b1.usage.input_tokens_details.cached_tokens == 0, "another tenant's identical prompt must not hit"
    assert a2.usage.input_tokens_details.cached_tokens >= a2.usage.input_tokens - 16


def test_previous_response_id_across_two_gateways_sharing_redis(sim_factory, proxy_factory, redis_server,
                                                                redis_namespace) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0)
    state = {"state": redis_server.url, "state_options": {"namespace": redis_namespace}}
    one = proxy_factory(sim, names=NAMES, routing={"policy": "round_robin"}, **state)
    two = proxy_factory(sim, names=NAMES, routing={"policy": "round_robin"}, **state)
    first = client_for(one).responses.with_raw_response.create(model="sim", input="hi", max_output_tokens=4)
    home, rid = first.headers["x-prefixgate-backend"], first.parse().id
    one.settle()
    raw = redis_lib.Redis.from_url(redis_server.url)
    deadline = time.monotonic() + 10
    while not any(raw.scan_iter(match=f"{redis_namespace}*{rid}*")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the owner write reaches redis through the batched flusher
    for _ in range(3):
        resp = client_for(two).responses.with_raw_response.create(model="sim", previous_response_id=rid,
                                                                  input="again", max_output_tokens=4)
        assert resp.headers["x-prefixgate-backend"] == home


@pytest.mark.parametrize("policy", ["observe", "rewrite"])
def test_rewrite_moves_the_instructions_timestamp_and_the_cache_hits(sim_factory, proxy_factory, policy) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, tenants={"default": {"policy": policy}})
    client = client_for(proxy)
    usages = []
    for second in range(3):
        resp = client.responses.with_raw_response.create(
            model="sim", instructions=f"Current time: 2026-12-01 18:00:0{second} UTC\n" + INSTRUCTIONS,
            input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}],
            max_output_tokens=4, store=False)
        usages.append(resp.parse().usage)
    warm = usages[1:]
    ratio = sum(u.input_tokens_details.cached_tokens for u in warm) / sum(u.input_tokens for u in warm)
    if policy == "observe":
        assert ratio < 0.1
        assert proxy.sample("prefixgate_hygiene_findings_total", route="responses", tenant="acme", kind="dynamic_head") == 3
    else:
        assert ratio > 0.9
        assert resp.headers["x-prefixgate-rewrites"].startswith("move_dynamic(1)")
