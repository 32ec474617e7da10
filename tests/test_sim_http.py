"""A replica over loopback HTTP, driven by the real `openai` client (and raw httpx for shapes)."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from app.sim.testing import SimCluster

SYSTEM = "You are a careful assistant who answers questions about caching. " * 130  # ~3k tokens


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
                found = True
    assert found, f"{name} {labels} not exposed"
    return total


def chat_stream(client: openai.OpenAI, messages, **kw) -> tuple[float, str, object]:
    t0 = time.perf_counter()
    ttft = None
    text = []
    usage = None
    stream = client.chat.completions.create(model="sim", messages=messages, stream=True,
                                            stream_options={"include_usage": True}, **kw)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(choice.delta.content)
    assert ttft is not None
    return ttft, "".join(text), usage


@pytest.fixture(scope="module")
def sim():
    with SimCluster(replicas=1, time_scale=1.0) as cluster:
        yield cluster


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_same_prompt_twice_hits_cache_and_lowers_ttft(sim):
    url = sim.urls[0]
    client = client_for(url)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a block?"}]
    n = httpx.post(url + "/tokenize", json={"messages": messages}).json()["count"]
    assert 2500 < n < 4000
    before = httpx.get(url + "/metrics").text
    cold_ttft, _, cold_usage = chat_stream(client, messages, max_tokens=4)
    warm_ttft, text, warm_usage = chat_stream(client, messages, max_tokens=4)
    after = httpx.get(url + "/metrics").text
    assert cold_usage.prompt_tokens == warm_usage.prompt_tokens == n
    assert cold_usage.prompt_tokens_details.cached_tokens == 0
    assert warm_usage.prompt_tokens_details.cached_tokens == 16 * ((n - 1) // 16)
    assert warm_usage.completion_tokens == 4 and text
    # cold prefill is n/8000 s (~0.4 s); warm recomputes < 1 block: orders of magnitude apart
    assert cold_ttft > 0.25
    assert warm_ttft < cold_ttft / 3
    delta = {m: metric(after, m) - metric(before, m) for m in (
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total")}
    assert delta == {"vllm:prefix_cache_queries_total": 2 * n,
                     "vllm:prefix_cache_hits_total": 16 * ((n - 1) // 16),
                     "vllm:prompt_tokens_total": 2 * n, "vllm:generation_tokens_total": 8}
    assert metric(after, "vllm:time_to_first_token_seconds_count") - \
        metric(before, "vllm:time_to_first_token_seconds_count") == 2
    assert 'block_size="16"' in after and 'num_gpu_blocks="4096"' in after
    assert metric(after, "vllm:cache_config_info", enable_prefix_caching="True") == 1


def test_non_stream_and_completions(sim):
    client = client_for(sim.urls[0])
    resp = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3
    comp = client.completions.create(model="sim", prompt="The cache", max_tokens=2)
    assert comp.choices[0].text and comp.usage.completion_tokens == 2
    ids = httpx.post(sim.urls[0] + "/tokenize", json={"prompt": "The cache"}).json()["tokens"]
    by_ids = client.completions.create(model="sim", prompt=ids, max_tokens=2)
    assert by_ids.usage.prompt_tokens == len(ids)
    models = client.models.list()
    assert [m.id for m in models.data] == ["sim"]


def raw_events(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = "".join(r.iter_text())
    return [e[len("data: "):] for e in data.split("\n\n") if e.startswith("data: ")]


def test_sse_shape_matches_vllm(sim):
    events = raw_events(sim.urls[0], {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                      "max_tokens": 3, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [p["choices"][0]["delta"].keys() == {"content"} for p in parsed[1:4]] == [True] * 3
    assert parsed[3]["choices"][0]["finish_reason"] == "length"
    assert parsed[4]["choices"] == [] and parsed[4]["usage"]["completion_tokens"] == 3
    assert "cached_tokens" in parsed[4]["usage"]["prompt_tokens_details"]


def test_usage_only_when_asked(sim):
    events = raw_events(sim.urls[0], {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                      "max_tokens": 2})
    assert all('"usage"' not in e for e in events)


@pytest.mark.parametrize("body,status,param", [
    ({"model": "sim"}, 400, "messages"),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": [{"content": "no role"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "cache_salt": "a/b"}, 400, "cache_salt"),
    ({"messages": [{"role": "user", "content": "x"}], "cache_salt": "s" * 129}, 400, "cache_salt"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
])
def test_bad_input_is_an_openai_shaped_error(sim, body, status, param):
    r = httpx.post(sim.urls[0] + "/v1/chat/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == status and err["message"]


def test_invalid_json_is_400(sim):
    r = httpx.post(sim.urls[0] + "/v1/chat/completions", content=b"{nope",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def test_prompt_longer_than_max_model_len():
    with SimCluster(time_scale=0, max_model_len=64) as sim:
        r = httpx.post(sim.urls[0] + "/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "word " * 200}]})
        assert r.status_code == 400
        assert re.search(r"maximum context length is 64 tokens", r.json()["error"]["message"])
        r = httpx.post(sim.urls[0] + "/v1/completions", json={"prompt": "a b", "max_tokens": 100})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def test_no_prefix_caching_keeps_queries_at_zero():
    with SimCluster(time_scale=0, prefix_caching=False) as sim:
        client = client_for(sim.urls[0])
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}]
        for _ in range(2):
            _, _, usage = chat_stream(client, messages, max_tokens=2)
            assert usage.prompt_tokens_details.cached_tokens == 0
        text = httpx.get(sim.urls[0] + "/metrics").text
        assert metric(text, "vllm:prefix_cache_queries_total") == 0
        assert metric(text, "vllm:prefix_cache_hits_total") == 0
        assert metric(text, "vllm:prompt_tokens_total") == 2 * usage.prompt_tokens
        assert 'enable_prefix_caching="False"' in text


def test_cache_salt_over_http():
    with SimCluster(time_scale=0) as sim:
        client = client_for(sim.urls[0])
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}]
        _, _, a = chat_stream(client, messages, max_tokens=1, extra_body={"cache_salt": "tenant-a"})
        _, _, b = chat_stream(client, messages, max_tokens=1, extra_body={"cache_salt": "tenant-b"})
        _, _, a2 = chat_stream(client, messages, max_tokens=1, extra_body={"cache_salt": "tenant-a"})
        assert a.prompt_tokens_details.cached_tokens == b.prompt_tokens_details.cached_tokens == 0
        assert a2.prompt_tokens_details.cached_tokens == 16 * ((a2.prompt_tokens - 1) // 16)


def test_continuous_usage_stats_and_kv_capacity():
    with SimCluster(time_scale=0, kv_blocks=9, include_usage_always=True) as sim:  # 8 usable blocks
        url = sim.urls[0]
        events = raw_events(url, {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3,
                                  "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        parsed = [json.loads(e) for e in events[:-1]]
        assert [p["usage"]["completion_tokens"] for p in parsed] == [0, 1, 2, 3, 3]
        forced = raw_events(url, {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 1})
        assert json.loads(forced[-2])["choices"] == []  # --enable-force-include-usage
        r = httpx.post(url + "/v1/completions", json={"prompt": list(range(200)), "max_tokens": 1})
        assert r.status_code == 400 and "KV cache" in r.json()["error"]["message"]


def test_prompt_logprobs_request_skips_the_prefix_cache():
    with SimCluster(time_scale=0) as sim:
        url = sim.urls[0]
        body = {"prompt": list(range(100, 200)), "max_tokens": 1}
        httpx.post(url + "/v1/completions", json=body)
        r = httpx.post(url + "/v1/completions", json={**body, "prompt_logprobs": 1}).json()
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(httpx.get(url + "/metrics").text, "vllm:prefix_cache_queries_total") == 100
