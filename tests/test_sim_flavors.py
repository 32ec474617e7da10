"""Stream quirks and flavors: deltas per chunk, early role chunk, reasoning, spec decode, SGLang."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from app.sim.testing import SimCluster
from tests.test_sim_http import metric, raw_events

CHAT = {"messages": [{"role": "user", "content": "hello there"}], "stream": True, "max_tokens": 9,
        "stream_options": {"include_usage": True}}


def deltas(events: list[str]) -> list[dict]:
    return [json.loads(e)["choices"][0]["delta"] for e in events[:-1] if json.loads(e)["choices"]]


def test_deltas_per_chunk_batches_tokens():
    with SimCluster(time_scale=0, deltas_per_chunk=4) as sim:
        events = raw_events(sim.urls[0], CHAT)
        parsed = [json.loads(e) for e in events[:-1]]
        content = [p for p in parsed if p["choices"] and "content" in p["choices"][0]["delta"]
                   and p["choices"][0]["delta"].get("role") is None]
        assert len(content) == 3  # 9 tokens -> 4 + 4 + 1
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        assert parsed[-1]["usage"]["completion_tokens"] == 9


@pytest.mark.exclusive  # a ratio of wall-clock arrival times
def test_role_chunk_early_arrives_before_prefill_ends():
    with SimCluster(time_scale=1.0, role_chunk_early=True, prefill_tps=2000.0) as sim:
        body = {**CHAT, "messages": [{"role": "user", "content": "word " * 1600}], "max_tokens": 1}
        t0 = time.perf_counter()
        stamps = []
        with httpx.stream("POST", sim.urls[0] + "/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    stamps.append((time.perf_counter() - t0, json.loads(line[6:])))
        role_t, role = stamps[0]
        content_t = next(t for t, p in stamps if p["choices"] and p["choices"][0]["delta"].get("content"))
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert content_t > 0.5  # ~1600 tokens at 2000 tokens/s
        assert role_t < content_t / 3


def test_reasoning_tokens_stream_first():
    with SimCluster(time_scale=0, reasoning_tokens=3) as sim:
        d = deltas(raw_events(sim.urls[0], CHAT))
        assert [("reasoning" in x) for x in d[1:]] == [True] * 3 + [False] * 6
        r = httpx.post(sim.urls[0] + "/v1/chat/completions", json={**CHAT, "stream": False,
                                                                    "stream_options": None}).json()
        assert r["choices"][0]["message"]["reasoning"] and r["choices"][0]["message"]["content"]


def test_spec_decode_counters():
    with SimCluster(time_scale=0, spec_decode=2.0, spec_tokens=2) as sim:
        httpx.post(sim.urls[0] + "/v1/chat/completions",
                   json={**CHAT, "max_tokens": 400, "ignore_eos": True, "stream": False, "stream_options": None})
        text = httpx.get(sim.urls[0] + "/metrics").text
        drafts = metric(text, "vllm:spec_decode_num_drafts_total")
        accepted = metric(text, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and abs(1 + accepted / drafts - 2.0) < 0.15
        assert metric(text, "vllm:spec_decode_num_draft_tokens_total") == 2 * drafts
        assert metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0
    with SimCluster(time_scale=0) as plain:
        assert "spec_decode" not in httpx.get(plain.urls[0] + "/metrics").text


def test_sglang_flavor_names_and_token_granular_hits():
    with SimCluster(time_scale=0, flavor="sglang", reasoning_tokens=1) as sim:
        url = sim.urls[0]
        body = {**CHAT, "messages": [{"role": "user", "content": "alpha beta gamma " * 40}], "max_tokens": 2}
        events = raw_events(url, body)
        first = [json.loads(e) for e in events[:-1]]
        assert "reasoning_content" in first[1]["choices"][0]["delta"]
        second = [json.loads(e) for e in raw_events(url, body)[:-1]]
        usage = second[-1]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1  # page size 1
        text = httpx.get(url + "/metrics").text
        assert metric(text, "sglang:page_size") == 1
        hit = metric(text, "sglang:prefill_effective_tokens_total", mode="device_hit")
        assert hit == usage["prompt_tokens"] - 1
        assert "vllm:" not in text and "sglang:num_running_reqs" in text
        assert httpx.get(url + "/server_info").json()["page_size"] == 1
