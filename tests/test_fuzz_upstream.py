"""Fuzzing what a replica answers: recorded vLLM answers, bent, through the real proxy on loopback.

tests/test_fuzz_proxy.py bends what clients send; this bends what the engine sends back, on every
route that reads it (chat and completions, stream and not; the Messages and Responses APIs, whose
streams carry the usage in their own events). Each case takes a recorded answer of real vLLM
(tests/fixtures/real_vllm*, see their READMEs) and applies one to three of: any JSON value in an
event replaced by any other (counts as strings, negatives, 2**64, NaN, lists, objects where a count
was), a key deleted, an event's data replaced by bytes that are not JSON (or not UTF-8), an event
dropped, repeated or moved, `[DONE]` or the last event cut, the connection closed mid-answer, the
status or content type changed; then the bytes are written in chunks cut at random offsets.

What must hold, per case: an answer within the timeout (no hang), never a 500 the proxy made
itself, and an error the proxy made (a 502 for a replica that failed) shaped as the route's API
shapes its errors. Over the run: the after-response work failed on no request
(`prefixgate_observation_errors_total`), every metric sample is a finite number and every counter
non-negative (a count the engine sent as -1 or "12" or 1e308 is not counted as tokens), no request
is left active, and the proxy still answers a plain request. `PREFIXGATE_UPSTREAM_FUZZ_CASES`
(default 2,000, ~3 s) cases, seeded: a failure reproduces with its case number. Bugs it found: a
`prompt_tokens_details` that was not an object dropped the request's metrics and tracking, and a
Messages or Responses event whose `type` was not a string answered the client a 500 or cut its
stream (both pinned below); with `routing.migrate_midstream`, a continuation whose `choices`
was not a list cut the client's stream when it broke in turn (the migration case, 1 in 4).
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from bend import bend_json, bend_stream, sse_events
from fake_upstream import FakeResponse, SeenRequest
from prometheus_client.parser import text_string_to_metric_families

CASES = int(os.environ.get("PREFIXGATE_UPSTREAM_FUZZ_CASES", "2000"))
TIMEOUT_S = 15.0
FIXTURES = Path(__file__).parent / "fixtures"

COMPLETIONS_JSON = json.dumps({
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "fake",
    "choices": [{"index": 0, "text": " ident overridden", "logprobs": None, "finish_reason": "length",
                 "stop_reason": None}],
    "usage": {"prompt_tokens": 1793, "total_tokens": 1801, "completion_tokens": 8,
              "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
ANSWERS: dict[tuple[str, bool], bytes] = {  # (route, stream) -> a recorded answer of real vLLM
    ("chat", True): (FIXTURES / "real_vllm" / "chat_stream_cold.sse").read_bytes(),
    ("chat", False): (FIXTURES / "real_vllm" / "chat_nonstream.json").read_bytes().strip(),
    ("completions", True): (FIXTURES / "real_vllm" / "completions_stream.sse").read_bytes(),
    ("completions", False): COMPLETIONS_JSON,
    ("messages", True): (FIXTURES / "real_vllm_agents" / "messages_stream.sse").read_bytes(),
    ("messages", False): (FIXTURES / "real_vllm_agents" / "messages.json").read_bytes().strip(),
    ("responses", True): (FIXTURES / "real_vllm_agents" / "responses_stream.sse").read_bytes(),
    ("responses", False): (FIXTURES / "real_vllm_agents" / "responses.json").read_bytes().strip(),
}
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}),
    "completions": ("/v1/completions", {"prompt": "Hello", "max_tokens": 8}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}),
    "responses": ("/v1/responses", {"input": "Hello", "max_output_tokens": 8}),
}
def _pieces(raw: bytes, r: random.Random) -> list[tuple[float, bytes]]:
    cuts = sorted(r.sample(range(1, len(raw)), min(len(raw) - 1, r.randint(0, 6)))) if len(raw) > 1 else []
    bounds = [0, *cuts, len(raw)]
    return [(0.0, raw[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def make_case(i: int) -> tuple[str, bool, FakeResponse, list[str]]:
    r = random.Random(i)
    route, stream = r.choice(sorted(ANSWERS))
    answer = ANSWERS[(route, stream)]
    raw, how = bend_stream(answer, r) if stream else bend_json(answer, r)
    headers = {"content-type": "text/event-stream" if stream else "application/json"}
    status = 200
    if r.random() < 0.1:
        status = r.choice([400, 404, 429, 500, 503])
        how.append(f"status {status}")
    if r.random() < 0.1:
        headers["content-type"] = r.choice(["text/plain", "application/json", "text/event-stream", "", "x/y; q=1"])
        how.append(f"content-type {headers['content-type']!r}")
    chunks = _pieces(raw, r) or [(0.0, b"")]
    die_after = None
    if r.random() < 0.1 and len(chunks) > 1:
        die_after = r.randrange(1, len(chunks))
        how.append(f"closed after chunk {die_after}")
    return route, stream, FakeResponse(status=status, headers=headers, chunks=chunks, die_after=die_after), how


def _error_shaped(route: str, body: bytes) -> bool:
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    if route == "messages":
        return obj.get("type") == "error" and isinstance(obj.get("error"), dict) and "message" in obj["error"]
    return isinstance(obj.get("error"), dict) and "message" in obj["error"]


def test_bent_answers_of_a_replica(fake_upstream_factory, proxy_factory) -> None:
    cases = {str(i): make_case(i) for i in range(CASES)}

    def script(req: SeenRequest) -> FakeResponse:
        case = req.headers.get("x-fuzz-case")
        if case is None:  # a plain request after the run
            route = "chat" if req.path.endswith("/chat/completions") else "completions"
            return FakeResponse(headers={"content-type": "application/json"},
                                chunks=[(0.0, ANSWERS[(route, False)])])
        return cases[case][2]

    upstream = fake_upstream_factory(script)
    proxy = proxy_factory(upstream.url, limits={"first_byte_timeout_s": 2.0, "read_timeout_s": 2.0})
    failures: list[str] = []
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        for key, (route, stream, response, how) in cases.items():
            path, body = REQUESTS[route]
            body = {**body, "model": "fake", "stream": stream}
            try:
                got = client.post(path, json=body, headers={"x-fuzz-case": key})
            except httpx.HTTPError as exc:
                failures.append(f"case {key} {route} stream={stream} {how}: {type(exc).__name__} {exc}")
                continue
            statuses[got.status_code] = statuses.get(got.status_code, 0) + 1
            mine = got.status_code != response.status  # not the replica's status relayed
            if got.status_code >= 500 and mine and got.status_code != 502:
                failures.append(f"case {key} {route} stream={stream} {how}: {got.status_code} {got.content[:200]!r}")
            elif mine and got.status_code >= 400 and not _error_shaped(route, got.content):
                failures.append(f"case {key} {route} stream={stream} {how}: unshaped {got.status_code} "
                                f"{got.content[:200]!r}")
        proxy.drain()
        plain = client.post("/v1/chat/completions", json={"model": "fake", "max_tokens": 8,
                                                          "messages": [{"role": "user", "content": "Hi"}]})
    proxy.drain()
    print(f"\nupstream fuzz: {CASES} cases, client statuses {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(failures[:20])
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"]
    assert proxy.app.openai.active == 0
    bad, errors = metric_problems(proxy)
    assert not bad, bad[:20]
    assert errors == 0, [ln for ln in proxy.metrics_text().splitlines() if "observation_errors" in ln]


def metric_problems(proxy) -> tuple[list[str], float]:
    """(Samples that are no finite number, or a negative counter; the observation errors counted)."""
    bad: list[str] = []
    errors = 0.0
    for family in text_string_to_metric_families(proxy.metrics_text()):
        for s in family.samples:
            if not math.isfinite(s.value) and not (s.name.endswith("_bucket") and s.labels.get("le") == "+Inf"):
                bad.append(f"{s.name}{s.labels} = {s.value}")
            elif family.type == "counter" and s.value < 0:
                bad.append(f"{s.name}{s.labels} = {s.value}")
            if s.name == "prefixgate_observation_errors_total":
                errors += s.value
    return bad, errors


def test_bent_continuations_of_a_migrated_stream(fake_upstream_factory, proxy_factory) -> None:
    """`routing.migrate_midstream`: the first replica dies after k chunks of a recorded stream (a
    bent one, some of the time) and the replica that continues it answers a bent stream (or a
    bent status). The same invariants
    hold: an answer in time, no 500 of the gateway's own, no failed after-response work, finite
    metrics, nothing left active."""
    cases = {}
    for i in range(CASES // 4):
        r = random.Random(10_000 + i)
        route = r.choice(["chat", "completions"])
        events = sse_events(bend_stream(ANSWERS[(route, True)], r)[0] if r.random() < 0.3 else ANSWERS[(route, True)])
        first = FakeResponse(chunks=[(0.0, e) for e in events], die_after=r.randrange(1, max(2, len(events))))
        raw, how = bend_stream(ANSWERS[(route, True)], r)
        status = r.choice([200, 200, 200, 500, 400])
        cases[str(i)] = (route, first, FakeResponse(status=status, chunks=_pieces(raw, r) or [(0.0, b"")]),
                         [*how, f"status {status}", f"died after {first.die_after}"])

    def script(req: SeenRequest) -> FakeResponse:
        route, first, continuation, _ = cases[req.headers["x-fuzz-case"]]
        body = json.loads(req.body)
        continued = body.get("continue_final_message") or (route == "completions" and body.get("prompt") != "Hello")
        return continuation if continued else first

    upstreams = [fake_upstream_factory(script), fake_upstream_factory(script)]
    proxy = proxy_factory([u.url for u in upstreams], names=["a", "b"], limits={
        "first_byte_timeout_s": 2.0, "read_timeout_s": 2.0}, routing={
        "policy": "round_robin", "health_interval_s": 3600, "migrate_midstream": {"enabled": True}})
    failures = []
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        for key, (route, _, _, how) in cases.items():
            path, body = REQUESTS[route]
            try:
                got = client.post(path, json={**body, "model": "fake", "stream": True}, headers={"x-fuzz-case": key})
            except httpx.HTTPError as exc:
                failures.append(f"case {key} {route} {how}: {type(exc).__name__} {exc}")
                continue
            if got.status_code != 200:
                failures.append(f"case {key} {route} {how}: {got.status_code} {got.content[:200]!r}")
    proxy.drain()
    assert not failures, "\n".join(failures[:20])
    assert proxy.app.openai.active == 0
    assert proxy.sample("prefixgate_observation_errors_total", stage="metrics") in (None, 0)
    assert proxy.sample("prefixgate_observation_errors_total", stage="prefix") in (None, 0)
    bad, errors = metric_problems(proxy)
    assert not bad and errors == 0, bad[:20]


@pytest.mark.parametrize("i", range(3))
def test_the_cases_are_bent_and_reproducible(i: int) -> None:
    """The same number makes the same case, and cases do differ from the recorded answers."""
    a, b = make_case(i), make_case(i)
    assert a[0] == b[0] and a[1] == b[1] and a[2].chunks == b[2].chunks and a[3] == b[3]
    bent = b"".join(c for _, c in a[2].chunks)
    assert bent != ANSWERS[(a[0], a[1])] or a[2].status != 200 or a[2].die_after is not None


def _stream_of(events: list[Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake"}


@pytest.mark.parametrize("details", [7, 1.5, "12", [3], True])
def test_a_malformed_cached_count_is_unknown_and_the_request_still_counted(details, fake_upstream_factory,
                                                                           proxy_factory) -> None:
    """usage.prompt_tokens_details that is not an object: the prompt tokens are counted, the
    cached ones are absent (not a number), and the after-response work does not fail."""
    answer = _stream_of([
        {**CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**CHUNK, "choices": [{"index": 0, "delta": {"content": "Hi there"}, "finish_reason": "stop"}]},
        {**CHUNK, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
                                           "prompt_tokens_details": details}}])
    upstream = fake_upstream_factory(lambda req: FakeResponse(chunks=[(0.0, answer)]))
    proxy = proxy_factory(upstream.url)
    got = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=10, json={
        "model": "fake", "stream": True, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    assert got.status_code == 200 and b"Hi there" in got.content
    proxy.drain()
    labels = {"route": "chat", "model": "fake", "tenant": "default"}
    assert proxy.sample("prefixgate_prompt_tokens_total", **labels) == 9
    assert proxy.sample("prefixgate_cached_tokens_total", **labels, source="engine") is None
    assert proxy.sample("prefixgate_observation_errors_total", stage="metrics") in (None, 0)
    assert proxy.sample("prefixgate_observation_errors_total", stage="prefix") in (None, 0)


@pytest.mark.parametrize(("route", "event"), [
    ("messages", {"type": "content_block_delta", "index": 0, "delta": {"type": {"x": 1}, "text": "a"}}),
    ("messages", {"type": ["content_block_delta"], "index": 0, "delta": {"type": "text_delta", "text": "a"}}),
    ("responses", {"type": {"t": "response.output_text.delta"}, "delta": "a", "sequence_number": 3}),
])
def test_an_event_whose_type_is_not_a_string_is_relayed(route, event, fake_upstream_factory, proxy_factory) -> None:
    """A Messages or Responses event whose `type` (or its delta's) is an object or a list is
    relayed as it came: the stream reaches the client whole, no 500."""
    answer = ANSWERS[(route, True)]
    events = sse_events(answer)
    name = b"event: content_block_delta\n" if route == "messages" else b"event: response.output_text.delta\n"
    bent = b"".join([*events[:2], name + b"data: " + json.dumps(event).encode() + b"\n\n", *events[2:]])
    upstream = fake_upstream_factory(lambda req: FakeResponse(chunks=[(0.0, bent)]))
    proxy = proxy_factory(upstream.url)
    path, body = REQUESTS[route]
    got = httpx.post(f"{proxy.url}{path}", timeout=10, json={**body, "model": "fake", "stream": True})
    assert got.status_code == 200
    assert got.content == bent
