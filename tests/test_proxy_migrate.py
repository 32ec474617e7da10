"""Mid-stream migration (docs/relay.md, "Migration"): a replica that breaks a streamed answer
after some events is replaced by another that continues the answer, through the real proxy over
loopback HTTP, against the simulator (its `die_midstream` / `stall_midstream` faults; a
continuation request resumes the simulator's canned answer where the partial answer ends, as a
greedy engine continues its own answer). The client (the real `openai` package) gets one stream:
one role chunk, one finish, `[DONE]`, the text and usage of an uninterrupted stream."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from app.dialects import CHAT, COMPLETIONS
from app.proxy.migrate import Partial, Splicer, continuation_body, read_partial
from app.proxy.sse import SSEParser

OUTPUT_TOKENS = 8  # the simulator's natural answer length (short: one request per cut point)
MIGRATE = {"policy": "round_robin", "health_interval_s": 3600, "migrate_midstream": {"enabled": True}}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def fault(url: str, **spec: object) -> None:
    r = httpx.post(url + "/sim/faults", json=spec, timeout=10)
    assert r.status_code == 200, r.text


def body_for(route: str) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "sim", "stream": True, "max_tokens": 64,
                            "stream_options": {"include_usage": True}}
    if route == "chat":
        return {**base, "messages": [{"role": "user", "content": "Tell me about caches."}]}
    return {**base, "prompt": "Tell me about caches."}


def raw_stream(proxy, route: str, body: dict[str, Any]) -> tuple[bytes, str]:
    with httpx.stream("POST", proxy.url + PATHS[route], json=body, timeout=30) as r:
        assert r.status_code == 200
        return r.read(), r.headers["x-prefixgate-backend"]


def events_of(blob: bytes) -> list[bytes]:
    return [ev.data for ev in SSEParser().feed(blob) if ev.data is not None]


def view(route: str, blob: bytes) -> dict[str, Any]:
    """What a client makes of a stream: text, role chunks, finishes, usage, ids, [DONE], errors."""
    out: dict[str, Any] = {"text": "", "roles": 0, "finishes": 0, "usage": None, "ids": set(), "done": False,
                           "errors": 0}
    for data in events_of(blob):
        if data == b"[DONE]":
            out["done"] = True
            continue
        obj = orjson.loads(data)  # every event whole and JSON
        if "error" in obj:
            out["errors"] += 1
            continue
        out["ids"].add((obj["id"], obj["created"], obj["model"]))
        if obj.get("usage"):
            out["usage"] = {k: obj["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        for choice in obj["choices"]:
            if route == "chat":
                out["roles"] += "role" in choice["delta"]
                out["text"] += choice["delta"].get("content") or ""
            else:
                out["text"] += choice.get("text") or ""
            out["finishes"] += choice.get("finish_reason") is not None
    return out


def faulted_request(sim, proxy, route: str, **spec: object) -> tuple[bytes, str]:
    """One request whose first attempt lands on replica "a" carrying the fault `spec`."""
    for _ in range(4):
        for url in sim.urls:
            fault(url, mode="clear")
        fault(sim.urls[0], **spec)
        blob, first = raw_stream(proxy, route, body_for(route))
        if first == "a":
            return blob, first
    raise AssertionError("round robin never started a request on replica a")


def finish_index(route: str, blob: bytes) -> int:
    """1-based index of the event carrying the finish reason."""
    for i, data in enumerate(events_of(blob), 1):
        if data != b"[DONE]" and any(c.get("finish_reason") for c in orjson.loads(data).get("choices", [])):
            return i
    raise AssertionError("no finish")


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_stream_broken_after_any_event_is_continued_on_another_replica(sim_factory, proxy_factory, route) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, output_tokens=OUTPUT_TOKENS)
    proxy = proxy_factory(sim, names=["a", "b"], routing=MIGRATE)
    whole, _ = raw_stream(proxy, route, body_for(route))
    expected = view(route, whole)
    assert expected["finishes"] == 1 and expected["usage"]["completion_tokens"] == OUTPUT_TOKENS
    last = finish_index(route, whole)
    continued = 0
    for k in range(1, len(events_of(whole))):  # dying after the last event ([DONE]) breaks nothing
        blob, _ = faulted_request(sim, proxy, route, mode="die_midstream", after_chunks=k)
        got = view(route, blob)
        if k >= last:  # the finish reason reached the client: nothing to continue, today's ending
            assert got["errors"] == 1 and got["done"], k
            continue
        continued += 1
        assert got["errors"] == 0, (k, blob)
        assert got["done"] and got["finishes"] == 1 and got["roles"] == (1 if route == "chat" else 0), k
        assert got["text"] == expected["text"], k
        assert got["usage"] == expected["usage"], k
        assert len(got["ids"]) == 1, k
    assert continued == last - 1
    assert proxy.sample("prefixgate_migrations_total", route=route, reason="midstream",
                        outcome="continued") == continued
    assert proxy.sample("prefixgate_migrations_total", route=route, reason="finished", outcome="skipped") >= 1
    assert proxy.sample("prefixgate_migration_pause_seconds_count", route=route) == continued


def test_the_openai_client_reads_a_continued_stream_as_one_answer(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, output_tokens=OUTPUT_TOKENS)
    proxy = proxy_factory(sim, names=["a", "b"], routing=MIGRATE)

    def run(base_url: str) -> tuple[str, list[Any], Any]:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="x")
        chunks = list(client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "Tell me about caches."}], stream=True,
            max_tokens=64, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks, chunks[-1].usage

    text, _, usage = run(sim.urls[1])  # the uninterrupted answer, straight from a replica
    for k in (2, 4):
        # round robin on a fresh proxy: each request starts on "a" (its continuation takes "b")
        fault(sim.urls[0], mode="die_midstream", after_chunks=k)
        got, chunks, got_usage = run(proxy.url)
        assert got == text
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
        assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1
        assert len({(c.id, c.created, c.model) for c in chunks}) == 1
        assert (got_usage.prompt_tokens, got_usage.completion_tokens, got_usage.total_tokens) == \
            (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


@pytest.mark.parametrize("asks_usage", [True, False])
def test_tokens_merged_into_one_event_are_counted_and_the_budget_holds(sim_factory, proxy_factory,
                                                                      asks_usage: bool) -> None:
    """An engine that puts several tokens in one event (vLLM when its output outruns the stream,
    speculative decoding): the continuation gets exactly the budget left, so an answer cut by
    `max_tokens` ends where the uninterrupted one does; the per-chunk usage the gateway asked for
    to count them never reaches a client that did not ask for it."""
    sim = sim_factory(replicas=2, time_scale=0.0, output_tokens=32, deltas_per_chunk=3)
    proxy = proxy_factory(sim, names=["a", "b"], routing=MIGRATE)
    body = {**body_for("chat"), "max_tokens": 10}
    if not asks_usage:
        del body["stream_options"]
    with httpx.stream("POST", sim.urls[1] + PATHS["chat"], json=body, timeout=30) as r:
        expected = view("chat", r.read())  # the uninterrupted answer: 10 tokens in events of 3, 3, 3, 1
    last = 0
    for k in range(2, 5):  # after the role chunk and 1-3 content events
        for url in sim.urls:
            fault(url, mode="clear")
        fault(sim.urls[0], mode="die_midstream", after_chunks=k)
        with httpx.stream("POST", proxy.url + PATHS["chat"], json=body, timeout=30) as r:
            assert r.headers["x-prefixgate-backend"] == "a"
            blob = r.read()
        got = view("chat", blob)
        assert got["errors"] == 0 and got["done"] and got["finishes"] == 1 and got["roles"] == 1, k
        assert got["text"] == expected["text"], k
        assert got["usage"] == expected["usage"], k
        with_usage = [orjson.loads(d) for d in events_of(blob) if d != b"[DONE]" and b'"usage"' in d]
        assert all(not obj["choices"] for obj in with_usage), k  # only the usage-only chunk
        assert len(with_usage) == (1 if asks_usage else 0), k
        last = k
    assert last == 4
    assert proxy.sample("prefixgate_migrations_total", route="chat", reason="midstream", outcome="continued") == 3
    if asks_usage:
        assert expected["usage"]["completion_tokens"] == 10


def test_a_stall_past_the_read_timeout_is_continued(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, output_tokens=OUTPUT_TOKENS)
    proxy = proxy_factory(sim, names=["a", "b"], routing=MIGRATE, limits={"read_timeout_s": 0.5})
    whole, _ = raw_stream(proxy, "chat", body_for("chat"))
    blob, _ = faulted_request(sim, proxy, "chat", mode="stall_midstream", after_chunks=3, delay_s=3)
    got, expected = view("chat", blob), view("chat", whole)
    assert got["errors"] == 0 and got["done"] and got["text"] == expected["text"]
    assert got["usage"] == expected["usage"]
    assert proxy.sample("prefixgate_migrations_total", route="chat", reason="timeout", outcome="continued") == 1


def test_without_another_replica_the_stream_ends_as_today(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, output_tokens=OUTPUT_TOKENS)
    proxy = proxy_factory(sim, names=["a"], routing=MIGRATE)
    fault(sim.urls[0], mode="die_midstream", after_chunks=3)
    blob, _ = raw_stream(proxy, "chat", body_for("chat"))
    got = view("chat", blob)
    assert got["errors"] == 1 and got["done"] and got["finishes"] == 0
    assert events_of(blob)[-2].startswith(b'{"error"')
    assert proxy.sample("prefixgate_migrations_total", route="chat", reason="no_replica", outcome="skipped") == 1
    assert proxy.sample("prefixgate_upstream_errors_total", backend="a", kind="midstream") == 1


def test_a_stream_that_migrates_twice_has_whole_events_only(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=3, time_scale=0.0, output_tokens=OUTPUT_TOKENS)
    proxy = proxy_factory(sim, names=["a", "b", "c"], routing=MIGRATE)
    with httpx.stream("POST", sim.urls[1] + PATHS["chat"], json=body_for("chat"), timeout=30) as r:
        whole = r.read()  # the uninterrupted answer, straight from a replica
    # round robin on a fresh proxy: a first, then c (a excluded: [b, c], turn 1), then b
    fault(sim.urls[0], mode="die_midstream", after_chunks=3)
    fault(sim.urls[2], mode="die_midstream", after_chunks=3)
    blob, first = raw_stream(proxy, "chat", body_for("chat"))
    assert first == "a"
    got, expected = view("chat", blob), view("chat", whole)  # view() parses every event as JSON
    assert blob.endswith(b"data: [DONE]\n\n") and blob.count(b"\n\n") == len(events_of(blob))
    assert got["errors"] == 0 and got["text"] == expected["text"] and got["usage"] == expected["usage"]
    assert got["roles"] == 1 and got["finishes"] == 1
    assert proxy.sample("prefixgate_migrations_total", route="chat", reason="midstream", outcome="continued") == 1
    assert proxy.sample("prefixgate_migrations_total", route="chat", reason="midstream", outcome="failed") == 1
    assert proxy.sample("prefixgate_upstream_errors_total", backend="a", kind="midstream") == 1
    assert proxy.sample("prefixgate_upstream_errors_total", backend="c", kind="midstream") == 1


def test_a_client_leaving_during_the_continuation_cancels_it(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, decode_tps=20, time_scale=1.0)
    proxy = proxy_factory(sim, names=["a", "b"], routing=MIGRATE)
    fault(sim.urls[0], mode="die_midstream", after_chunks=3)  # round robin: the first request starts on a
    body = {**body_for("chat"), "max_tokens": 2000, "ignore_eos": True}
    with httpx.stream("POST", proxy.url + PATHS["chat"], json=body, timeout=30) as r:
        assert r.headers["x-prefixgate-backend"] == "a"
        chunks = r.iter_raw()
        got = b""
        while got.count(b"\n\n") < 5:  # past the break: the continuation is streaming from b
            got += next(chunks)
        assert httpx.get(sim.urls[1] + "/sim/state").json()["running"] == 1
    deadline = time.monotonic() + 10
    while httpx.get(sim.urls[1] + "/sim/state").json()["running"] != 0:
        assert time.monotonic() < deadline, "the continuation still runs after the client left"
        time.sleep(0.05)
    assert proxy.sample("prefixgate_requests_total", route="chat", status="499") == 1
    assert proxy.sample("prefixgate_backend_inflight_requests", backend="b") == 0
    assert proxy.services.upstream.pool_stats()[0] == 0  # no leaked upstream connection


def test_off_by_default(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0, output_tokens=OUTPUT_TOKENS)
    proxy = proxy_factory(sim, names=["a", "b"], routing={"policy": "round_robin", "health_interval_s": 3600})
    for url in sim.urls:
        fault(url, mode="die_midstream", after_chunks=3)
    blob, _ = raw_stream(proxy, "chat", body_for("chat"))
    assert view("chat", blob)["errors"] == 1


# ---------------------------------------------------------------- the pure parts


def sse(*objs: Any) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n\n" for o in objs)


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "created": 7, "model": "m", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def test_read_partial_counts_what_the_client_got_and_says_what_blocks() -> None:
    p = read_partial(CHAT, sse(chat_chunk({"role": "assistant", "content": ""}), chat_chunk({"content": "Hel"}),
                                 chat_chunk({"content": "lo"})))
    assert (p.text, p.tokens, p.blocker, p.ids["id"]) == ("Hello", 2, None, "chatcmpl-1")
    with_usage = chat_chunk({"content": "Hi"}, usage={"prompt_tokens": 5, "completion_tokens": 3})
    assert read_partial(CHAT, sse(with_usage)).tokens == 3  # the engine's count wins
    tool = chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]})
    assert read_partial(CHAT, sse(tool)).blocker == "tool_calls"
    assert read_partial(CHAT, sse(chat_chunk({"reasoning": "hmm"}))).blocker == "reasoning"
    assert read_partial(CHAT, sse(chat_chunk({"content": "x"}, "stop"))).blocker == "finished"


def test_continuation_body_per_route() -> None:
    partial = Partial(text="Hello", tokens=2)
    chat, _ = continuation_body(CHAT, {"messages": [{"role": "user", "content": "q"}], "max_tokens": 10,
                                         "max_completion_tokens": 5}, partial)
    assert chat["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
    assert (chat["max_tokens"], chat["max_completion_tokens"]) == (8, 3)
    comp, _ = continuation_body(COMPLETIONS, {"prompt": "Say", "max_tokens": 3}, partial)
    assert comp == {"prompt": "SayHello", "max_tokens": 1}
    assert continuation_body(COMPLETIONS, {"prompt": "Say", "max_tokens": 2}, partial) == (None, "budget")
    assert continuation_body(COMPLETIONS, {"prompt": [1, 2]}, partial) == (None, "prompt_shape")


def test_splicer_drops_the_role_keeps_the_ids_and_sums_usage() -> None:
    splicer = Splicer(CHAT, Partial(text="Hello", tokens=2, ids={"id": "chatcmpl-1", "created": 7, "model": "m"}))
    other = {"id": "chatcmpl-2", "created": 9, "model": "m"}
    out = splicer.feed(sse({**chat_chunk({"role": "assistant", "content": ""}), **other},
                           {**chat_chunk({"content": " you"}, "stop"), **other},
                           {**other, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1,
                                                              "total_tokens": 13,
                                                              "prompt_tokens_details": {"cached_tokens": 8}}},
                           b"[DONE]"))
    events = events_of(out)
    assert len(events) == 3 and events[-1] == b"[DONE]"
    first, usage = orjson.loads(events[0]), orjson.loads(events[1])
    assert (first["id"], first["created"], first["choices"][0]["delta"]) == ("chatcmpl-1", 7, {"content": " you"})
    assert usage["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def test_splicer_keeps_an_empty_text_event_that_carries_token_ids() -> None:
    """vLLM sends a token whose bytes do not end a character as `"content": ""` with its
    `token_ids`; dropped, the client's ids would miss it (real vLLM: 294 of 300, tests/e2e)."""
    splicer = Splicer(CHAT, Partial(text="Hello", tokens=2, ids={"id": "chatcmpl-1", "created": 7, "model": "m"}))
    role = chat_chunk({"role": "assistant", "content": ""})
    byte_token = {**chat_chunk({"content": ""}), "id": "chatcmpl-2"}
    byte_token["choices"][0]["token_ids"] = [246]
    out = splicer.feed(sse(role, byte_token, b"[DONE]"))
    events = events_of(out)
    assert len(events) == 2 and events[-1] == b"[DONE]"
    kept = orjson.loads(events[0])["choices"][0]
    assert (kept["delta"], kept["token_ids"]) == ({"content": ""}, [246])
