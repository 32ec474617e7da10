"""The TTFT ledger (docs/ttft-ledger.md): vLLM's per-request metrics read from a response and kept
from the client unless it asked; a streamed request's client TTFT split into the gateway's part,
the engine's queue and prefill, and the rest, each only where measured; exported as
`prefixgate_ttft_part_seconds` and on the request's span. Through the real path: the openai
client, the gateway over loopback HTTP, a simulated vLLM with `enable_per_request_metrics`."""

from __future__ import annotations

import httpx
import orjson
import pytest
from openai import OpenAI

from app.engines.request_metrics import EngineTiming, parse_metrics, take_from_body, take_from_events
from app.proxy.context import Timings
from app.proxy.ledger import ttft_parts
from app.telemetry.prefill_model import DEFAULT_FORGET

# a vLLM 0.32 stream's final usage chunk with --enable-per-request-metrics (member order as vLLM dumps it)
USAGE_CHUNK = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
               b'"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3},'
               b'"metrics":{"time_to_first_token_ms":40.0,"generation_time_ms":20.0,"queue_time_ms":5.5,'
               b'"mean_itl_ms":10.0,"tokens_per_second":50.0}}\n\n')
PLAIN_USAGE = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
               b'"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3}}\n\n')
CONTENT = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"\\"metrics\\":{"}}]}\n\n'


def test_parse_reads_vllm_milliseconds_as_seconds_and_absent_as_none() -> None:
    timing = parse_metrics({"time_to_first_token_ms": 40.0, "queue_time_ms": 5.5})
    assert timing == EngineTiming(queue_s=0.0055, prefill_s=0.04)
    assert parse_metrics(None) is None and parse_metrics({"speculative_decoding": {}}) is None
    assert parse_metrics({"queue_time_ms": None, "time_to_first_token_ms": -1}) is None


def test_events_strip_only_the_metrics_member_byte_exact() -> None:
    events = CONTENT + USAGE_CHUNK + b"data: [DONE]\n\n"
    out, timing = take_from_events(events, strip=True)
    assert out == CONTENT + PLAIN_USAGE + b"data: [DONE]\n\n"  # generated text that looks like the key is kept
    assert timing is not None and timing.prefill_s == 0.04
    kept, again = take_from_events(events, strip=False)
    assert kept == events and again == timing


def test_body_strip_keeps_a_null_metrics_and_reserialises_a_member_not_last() -> None:
    null = b'{"id":"x","usage":{"prompt_tokens":3},"metrics":null}'
    assert take_from_body(null, strip=True) == (null, None)
    middle = orjson.dumps({"id": "x", "metrics": {"queue_time_ms": 1.0, "time_to_first_token_ms": 2.0}, "z": 1})
    out, timing = take_from_body(middle, strip=True)
    assert orjson.loads(out) == {"id": "x", "z": 1} and timing == EngineTiming(0.001, 0.002)


def test_ledger_parts_only_where_measured() -> None:
    t = Timings(arrival=10.0, upstream_sent=10.002, first_token=10.100)
    assert ttft_parts(t, None) == {"gateway": pytest.approx(0.002)}  # no engine report: no queue, prefill, rest
    parts = ttft_parts(t, EngineTiming(queue_s=0.010, prefill_s=0.060))
    assert parts == pytest.approx({"gateway": 0.002, "queue": 0.010, "prefill": 0.060, "rest": 0.028})
    assert sum(parts.values()) == pytest.approx(0.1)  # the parts sum to the client TTFT
    assert "rest" not in ttft_parts(t, EngineTiming(queue_s=0.010))  # one engine part: no remainder
    assert ttft_parts(Timings(arrival=1.0, upstream_sent=1.1), EngineTiming(0.1, 0.1)) == {}  # no first token


PROMPT = "Summarise the quarterly ledger in one line. " * 120  # ~1k tokens: a measurable prefill


def chat(proxy, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    client = OpenAI(base_url=proxy.base_url, api_key="x", default_headers=headers or {})
    return client.chat.completions.create(model="sim", max_tokens=4, stream=True,
                                          stream_options={"include_usage": True},
                                          messages=[{"role": "user", "content": PROMPT}])


@pytest.mark.exclusive  # the simulator's queue and prefill seconds on the wall clock (queue <= a 50 ms prefill)
def test_ledger_through_the_gateway_with_a_vllm_reporting_metrics(proxy_factory, sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=1.0, prefill_tps=20_000.0, enable_per_request_metrics=True)
    proxy = proxy_factory(sim, names=["sim-0"])
    chunks = list(chat(proxy))
    usage_chunk = chunks[-1]
    assert usage_chunk.usage is not None and usage_chunk.usage.prompt_tokens > 1000
    assert "metrics" not in (usage_chunk.model_extra or {})  # the client did not ask: not sent
    proxy.settle()
    bucket = "1k-4k"

    def part(name: str) -> float | None:
        return proxy.sample("prefixgate_ttft_part_seconds_sum", part=name, prompt_bucket=bucket, route="chat")

    ttft = proxy.sample("prefixgate_ttft_seconds_sum", route="chat", model="sim", backend="sim-0",
                        prompt_bucket=bucket)
    gateway, queue, prefill, rest = part("gateway"), part("queue"), part("prefill"), part("rest")
    assert None not in (ttft, gateway, queue, prefill, rest)
    cold = usage_chunk.usage.prompt_tokens / 20_000.0
    assert prefill >= cold * 0.9  # the engine's own prefill: the configured rate, at least
    assert queue <= prefill and gateway < prefill
    assert gateway + queue + prefill + rest == pytest.approx(ttft)
    assert part("retries") is None

    # asked for (the opt-in header): the engine's metrics reach the client as vLLM wrote them
    kept = list(chat(proxy, {"x-prefixgate-engine-metrics": "1"}))[-1]
    metrics = (kept.model_extra or {}).get("metrics")
    assert isinstance(metrics, dict) and metrics["time_to_first_token_ms"] > 0


def test_non_streamed_body_loses_the_metrics_object(proxy_factory, sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, enable_per_request_metrics=True)
    proxy = proxy_factory(sim)
    body = {"model": "sim", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    direct = httpx.post(sim.urls[0] + "/v1/chat/completions", json=body, timeout=30).json()
    assert isinstance(direct["metrics"], dict)  # the replica does send it
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and "metrics" not in r.json()
    assert int(r.headers["content-length"]) == len(r.content)


def test_without_the_engine_report_only_the_gateway_part(proxy_factory, sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)  # vLLM without the flag
    proxy = proxy_factory(sim)
    list(chat(proxy))
    proxy.settle()
    text = proxy.metrics_text()
    assert 'prefixgate_ttft_part_seconds_count{part="gateway",prompt_bucket="1k-4k",route="chat"} 1.0' in text
    for absent in ("queue", "prefill", "rest"):
        assert f'part="{absent}"' not in text


def test_parts_on_the_request_span(proxy_factory, sim_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        sim = sim_factory(replicas=1, time_scale=0.0, enable_per_request_metrics=True)
        proxy = proxy_factory(sim, tracing={"enabled": True})
        list(chat(proxy))
        (span,) = rx.wait_for(1)
    a = span["attributes"]
    for name in ("gateway", "queue", "prefill", "rest"):
        assert a[f"prefixgate.ttft.{name}_s"] >= 0
    total = sum(a[f"prefixgate.ttft.{n}_s"] for n in ("gateway", "queue", "prefill", "rest"))
    assert total == pytest.approx(a["prefixgate.ttft_s"])


def test_prefill_model_gauges_learn_from_the_ledger(proxy_factory, sim_factory) -> None:
    """Each streamed request with the engine's prefill time and cached tokens is one sample of its
    replica's prefill model (app/telemetry/prefill_model.py), exported per backend."""
    sim = sim_factory(replicas=1, time_scale=0.0, enable_per_request_metrics=True)
    proxy = proxy_factory(sim, names=["sim-0"])
    client = OpenAI(base_url=proxy.base_url, api_key="x")
    for i in range(9):
        list(client.chat.completions.create(
            model="sim", max_tokens=2, stream=True,
            messages=[{"role": "user", "content": PROMPT + f" question {i} " * (i + 1)}]))
    weight = sum(DEFAULT_FORGET ** k for k in range(9))  # nine samples, exponentially forgotten
    assert proxy.sample("prefixgate_prefill_model_samples", backend="sim-0") == pytest.approx(weight)
    bare = sim_factory(replicas=1, time_scale=0.0)  # no engine report: no samples, no series
    other = proxy_factory(bare, names=["bare"])
    list(chat(other))
    assert other.sample("prefixgate_prefill_model_samples", backend="bare") is None


@pytest.mark.parametrize("drop_usage", [False, True])
def test_observer_finds_the_metrics_in_a_coalesced_read(drop_usage: bool) -> None:
    """Past the first token the observer scans bytes only: a read that carries text, the usage
    chunk and [DONE] together still yields the engine's timing, and the client gets none of it."""
    import time

    from app.proxy.clock import StreamClock
    from app.proxy.observer import StreamObserver
    from app.proxy.openai_shape import shape_for

    first = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    observer = StreamObserver(shape_for("chat"), StreamClock(Timings(arrival=time.perf_counter())),
                              drop_usage=drop_usage, collect_text=True)
    observer.strip_metrics = True
    observer.feed(first, time.perf_counter())
    assert observer.fast
    out = observer.feed(CONTENT + USAGE_CHUNK + b"data: [DONE]\n\n", time.perf_counter())
    observer.finish()
    assert out == CONTENT + (b"" if drop_usage else PLAIN_USAGE) + b"data: [DONE]\n\n"
    assert observer.engine_timing == EngineTiming(queue_s=0.0055, prefill_s=0.04, generation_s=0.02, mean_itl_s=0.01)
    assert observer.usage == {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3}


def test_sglang_never_reports_them_so_only_the_gateway_part(proxy_factory, sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, flavor="sglang", enable_per_request_metrics=True)
    proxy = proxy_factory(sim)
    list(chat(proxy))
    proxy.settle()
    text = proxy.metrics_text()
    assert 'prefixgate_ttft_part_seconds_count{part="gateway",prompt_bucket="1k-4k",route="chat"} 1.0' in text
    assert 'part="queue"' not in text and 'part="prefill"' not in text
