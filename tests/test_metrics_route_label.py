"""The `route` label on every per-request metric: one streamed request through each API route
(the real `openai` client for chat, completions and responses, the real `anthropic` client for
messages) against the proxy in front of the simulator, and each metric's samples are filed under
the route the request came through, with that request's own numbers."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import anthropic
import openai

from tests.chat_history import words

ROUTES = {"chat", "completions", "responses", "messages"}
SYSTEM = "You are a careful assistant. " + words(3, 120)
# histograms observed once per request on every route (inter-token gaps and the decode rate
# depend on the stream's chunking and are checked for their label only)
ONCE = ("prefixgate_ttft_seconds_count", "prefixgate_upstream_first_byte_seconds_count",
        "prefixgate_request_duration_seconds_count", "prefixgate_proxy_overhead_seconds_count",
        "prefixgate_prefill_tokens_count")
SOME = ("prefixgate_inter_token_seconds_count", "prefixgate_decode_tokens_per_second_count")


def by_route(proxy: Any, name: str, **labels: str) -> dict[str, float]:
    """{route: sum of the samples `name` whose labels include `labels`}."""
    proxy.settle()
    out: dict[str, float] = defaultdict(float)
    for family in proxy.services.metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out[s.labels["route"]] += s.value
    return dict(out)


def one_request_per_route(proxy: Any) -> dict[str, int]:
    """Stream one request through each route; the prompt tokens each one's usage reported."""
    oai = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    prompts: dict[str, int] = {}
    chunks = list(oai.chat.completions.create(
        model="sim", max_tokens=8, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "chat question"}]))
    prompts["chat"] = chunks[-1].usage.prompt_tokens
    chunks = list(oai.completions.create(model="sim", prompt=SYSTEM + " completion", max_tokens=8, stream=True,
                                         stream_options={"include_usage": True}))
    prompts["completions"] = chunks[-1].usage.prompt_tokens
    with oai.responses.create(model="sim", instructions=SYSTEM, input="responses question", max_output_tokens=8,
                              stream=True) as stream:
        events = list(stream)
    prompts["responses"] = events[-1].response.usage.input_tokens
    ant = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    with ant.messages.stream(model="sim", max_tokens=8, system=SYSTEM,
                             messages=[{"role": "user", "content": "messages question"}]) as s:
        "".join(s.text_stream)
        u = s.get_final_message().usage
    prompts["messages"] = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
    return prompts


def test_every_per_request_metric_is_filed_under_its_route(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim)
    prompts = one_request_per_route(proxy)
    assert by_route(proxy, "prefixgate_requests_total", status="200") == dict.fromkeys(ROUTES, 1.0)
    for name in ONCE:
        assert by_route(proxy, name) == dict.fromkeys(ROUTES, 1.0), name
    for name in SOME:
        assert set(by_route(proxy, name)) <= ROUTES, name
    assert set(by_route(proxy, "prefixgate_inter_token_seconds_count")) == ROUTES
    # the token counters carry each request's own numbers under its own route
    assert by_route(proxy, "prefixgate_prompt_tokens_total") == {r: float(n) for r, n in prompts.items()}
    for source in ("engine", "predicted"):
        assert set(by_route(proxy, "prefixgate_cached_tokens_total", source=source)) == ROUTES, source


def wait_processed(hook: Any, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def test_hygiene_and_break_counters_carry_the_route(sim_factory, proxy_factory) -> None:
    """A per-request timestamp on top of the system prompt: the finding, the rewrite and the
    diagnosed break are each counted under the route that carried them."""
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, tenants={"overrides": {"fixer": {"policy": "rewrite"}}})
    oai = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    for turn, minute in enumerate((10, 11)):  # the same tenants, the clock changing at the head
        system = f"Current time: 2026-01-05T09:{minute}:00Z\n{SYSTEM}"
        oai.chat.completions.create(model="sim", max_tokens=4, extra_headers={"x-tenant-id": "clock"},
                                    messages=[{"role": "system", "content": system},
                                              {"role": "user", "content": "question"}])
        oai.responses.create(model="sim", instructions=system, input="question", max_output_tokens=4,
                             extra_headers={"x-tenant-id": "fixer"})
        wait_processed(proxy.services.prefix, 2 * (turn + 1))
    assert by_route(proxy, "prefixgate_hygiene_findings_total", kind="dynamic_head") == \
        {"chat": 2.0, "responses": 2.0}
    assert by_route(proxy, "prefixgate_rewrites_total", kind="move_dynamic") == {"responses": 2.0}
    assert by_route(proxy, "prefixgate_prefix_breaks_total", cause="dynamic_head") == {"chat": 1.0}
