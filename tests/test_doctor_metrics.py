"""The doctor's /metrics reading: engine detection, busy gate, cache counters, deltas."""

from __future__ import annotations

from pathlib import Path

from app.doctor.metrics import counters_delta, parse_metrics

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 8286381.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 6866496.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="784",enable_prefix_caching="False",engine="0",num_gpu_blocks="2000"} 1.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 0.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
# TYPE sglang:page_size gauge
sglang:page_size{model_name="m",tp_rank="0"} 1.0
# TYPE sglang:prefill_effective_tokens_total counter
sglang:prefill_effective_tokens_total{mode="input",model_name="m",tp_rank="0"} 300.0
sglang:prefill_effective_tokens_total{mode="device_hit",model_name="m",tp_rank="0"} 600.0
sglang:prefill_effective_tokens_total{mode="host_hit",model_name="m",tp_rank="0"} 100.0
"""


def test_vllm_snapshot() -> None:
    snap = parse_metrics(VLLM)
    assert snap.engine == "vllm"
    assert snap.running == 1.0 and snap.waiting == 0.0
    assert snap.busy
    assert snap.queries == 8286381.0 and snap.hits == 6866496.0
    assert snap.block_size == 784
    assert snap.prefix_caching_enabled is False


def test_sglang_snapshot() -> None:
    snap = parse_metrics(SGLANG)
    assert snap.engine == "sglang"
    assert snap.busy  # two waiting
    assert snap.queries == 1000.0 and snap.hits == 700.0
    assert snap.block_size == 1


def test_unknown_and_idle() -> None:
    snap = parse_metrics("# TYPE foo gauge\nfoo 1\n")
    assert snap.engine == "unknown" and not snap.busy
    assert snap.queries is None
    idle = parse_metrics(VLLM.replace('engine="1",model_name="m"} 1.0', 'engine="1",model_name="m"} 0.0'))
    assert not idle.busy


def test_prefixgate_itself_gates_on_replica_queues() -> None:
    text = "# TYPE prefixgate_engine_requests_waiting gauge\nprefixgate_engine_requests_waiting{backend=\"a\"} 3\n"
    snap = parse_metrics(text)
    assert snap.engine == "prefixgate" and snap.busy


def test_counters_delta() -> None:
    before = parse_metrics(VLLM)
    after = parse_metrics(VLLM.replace("8286381.0", "8310381.0").replace("6866496.0", "6882464.0"))
    delta = counters_delta(before, after)
    assert delta is not None
    assert delta.queries == 24000.0 and delta.hits == 15968.0
    assert delta.hit_rate is not None and abs(delta.hit_rate - 15968 / 24000) < 1e-9
    assert counters_delta(None, after) is None
    assert counters_delta(parse_metrics("foo 1\n"), parse_metrics("foo 2\n")) is None


# ---- contract: real and engine-shaped expositions (tests/fixtures) ---------------------------

FIXTURES = Path(__file__).parent / "fixtures"


def test_real_vllm_032_capture() -> None:
    idle = parse_metrics((FIXTURES / "real_vllm" / "metrics_idle.txt").read_text())
    after = parse_metrics((FIXTURES / "real_vllm" / "metrics_after.txt").read_text())
    assert idle.engine == after.engine == "vllm"
    assert not idle.busy and not after.busy
    assert after.block_size == 32 and after.prefix_caching_enabled is True
    delta = counters_delta(idle, after)
    assert delta is not None and delta.queries == 7235.0 and delta.hits == 3584.0


def test_engine_fixtures_off_hybrid_and_sglang() -> None:
    off = parse_metrics((FIXTURES / "engines" / "vllm-0.32-prefix-off.txt").read_text())
    assert off.prefix_caching_enabled is False and off.queries == 0 and off.busy
    hybrid = parse_metrics((FIXTURES / "engines" / "vllm-0.33-hybrid-a.txt").read_text())
    assert hybrid.block_size == 1056 and hybrid.queries == 0  # on by config, yet never queried
    sg = parse_metrics((FIXTURES / "engines" / "sglang-0.5.23-a.txt").read_text())
    # tensor-parallel ranks report the same batch: counted once (tp_rank 0)
    assert sg.engine == "sglang" and sg.running == 8 and sg.waiting == 3 and sg.busy
    assert sg.queries == 195_000 and sg.hits == 155_000 and sg.block_size == 1


def test_real_sglang_0523_capture() -> None:
    idle = parse_metrics((FIXTURES / "real_sglang" / "metrics_idle.txt").read_text())
    after = parse_metrics((FIXTURES / "real_sglang" / "metrics_after.txt").read_text())
    off = parse_metrics((FIXTURES / "real_sglang" / "metrics_after_noradix.txt").read_text())
    assert idle.engine == after.engine == off.engine == "sglang"
    assert not idle.busy and not after.busy
    assert after.block_size == 1
    delta = counters_delta(idle, after)
    assert delta is not None and delta.queries == 1808.0 and delta.hits == 903.0
    assert off.hits == 0 and off.queries == 1810.0  # radix off: every prefill token is `input`
