"""Contract tests: the recorded-style /metrics samples in tests/fixtures/engines parse into the
numbers engine-facts.md says they carry (vLLM 0.32/0.33, SGLang 0.5.23)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engines import sglang, vllm
from app.engines.sample import (
    BLOCK_SIZE,
    CACHE_HITS,
    CACHE_QUERIES,
    HIT_ALIGNMENT,
    KV_BLOCKS,
    KV_RESERVED_BLOCKS,
    KV_USAGE,
    PROMPT_TOKENS,
    RUNNING,
    SPEC_ACCEPT_LENGTH,
    SPEC_ACCEPTED,
    SPEC_DRAFTS,
    WAITING,
    detect_engine,
    parse_exposition,
)

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
REAL_SGLANG = Path(__file__).parent / "fixtures" / "real_sglang"  # recorded from SGLang 0.5.23 on CPU


def load(name: str):
    return parse_exposition((FIXTURES / name).read_text())


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.txt")) + sorted(REAL_SGLANG.glob("metrics_*.txt")),
                         ids=lambda p: p.name)
def test_every_fixture_parses_and_is_detected(path: Path) -> None:
    samples = parse_exposition(path.read_text())
    expected = "sglang" if path.name.startswith("sglang") or path.parent == REAL_SGLANG else "vllm"
    assert detect_engine(samples) == expected
    assert not any(name.endswith("_created") for name in samples)


def test_vllm_033_counters_gauges_and_cache_config() -> None:
    sample = vllm.adapt(load("vllm-0.33-spec-a.txt"))
    assert sample.engine == "vllm"
    assert sample.counters == {CACHE_QUERIES: 120000.0, CACHE_HITS: 90000.0, PROMPT_TOKENS: 121000.0,
                               SPEC_DRAFTS: 4000.0, SPEC_ACCEPTED: 6000.0}
    assert sample.gauges[WAITING] == 2.0 and sample.gauges[RUNNING] == 5.0
    assert sample.gauges[KV_USAGE] == pytest.approx(0.37)
    assert sample.gauges[BLOCK_SIZE] == 16 and sample.gauges[HIT_ALIGNMENT] == 16
    assert sample.gauges[KV_BLOCKS] == 27306
    assert sample.prefix_caching_configured is True
    assert sample.hash_algo == "sha256"
    assert sample.process_start == pytest.approx(1.764441237e9)
    assert sample.cache_config["num_gpu_blocks"] == "27306"


def test_vllm_032_prefix_off_without_new_labels() -> None:
    sample = vllm.adapt(load("vllm-0.32-prefix-off.txt"))
    assert sample.prefix_caching_configured is False
    assert "hash_block_size" not in sample.cache_config
    assert sample.gauges[HIT_ALIGNMENT] == 16  # falls back to block_size
    assert SPEC_DRAFTS not in sample.counters  # no --speculative-config: absent, not zero


def test_vllm_hybrid_hits_align_on_cache_hit_alignment_tokens() -> None:
    sample = vllm.adapt(load("vllm-0.33-hybrid-a.txt"))
    assert sample.gauges[BLOCK_SIZE] == 1056
    assert sample.gauges[HIT_ALIGNMENT] == 528


def test_vllm_data_parallel_engines_are_summed() -> None:
    text = "\n".join([
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2',
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4',
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100',
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50',
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1',
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1',
        "",
    ])
    sample = vllm.adapt(parse_exposition(text))
    assert sample.gauges[WAITING] == 5
    assert sample.gauges[KV_USAGE] == pytest.approx(0.3)
    assert sample.counters[CACHE_QUERIES] == 150
    assert sample.gauges[KV_BLOCKS] == 2000
    assert sample.gauges[KV_RESERVED_BLOCKS] == 2  # each engine's pool keeps its null block


def real_sglang(name: str):
    return parse_exposition((REAL_SGLANG / name).read_text())


def real_info(name: str) -> dict:
    import json

    return json.loads((REAL_SGLANG / name).read_text())


def test_real_sglang_effective_token_modes_page_size_and_capacity() -> None:
    """Real SGLang after a cold and a warm 904-token request (plus 1 start-up token): queried =
    every prefill_effective_tokens mode (906 input + 903 device_hit), hits = the *_hit modes."""
    sample = sglang.adapt(real_sglang("metrics_after.txt"))
    assert sample.engine == "sglang"
    assert sample.counters[CACHE_QUERIES] == 1809.0
    assert sample.counters[CACHE_HITS] == 903.0
    assert sample.counters[PROMPT_TOKENS] == 1808.0
    assert sample.gauges[WAITING] == 0 and sample.gauges[RUNNING] == 0
    assert sample.gauges[BLOCK_SIZE] == 1 and sample.gauges[HIT_ALIGNMENT] == 1
    assert sample.gauges[KV_BLOCKS] == 8192  # sglang:max_total_num_tokens / page size 1
    assert SPEC_ACCEPT_LENGTH not in sample.gauges  # real SGLang exports 0.0 without speculation
    assert sample.prefix_caching_configured is None  # nothing says so without /server_info


def test_real_sglang_server_info_says_radix_on_and_off() -> None:
    on = sglang.adapt(real_sglang("metrics_after.txt"), real_info("server_info.json"))
    off = sglang.adapt(real_sglang("metrics_after_noradix.txt"), real_info("server_info_noradix.json"))
    assert on.prefix_caching_configured is True and off.prefix_caching_configured is False
    assert off.counters[CACHE_HITS] == 0.0 and off.counters[CACHE_QUERIES] == 1810.0
    assert off.cache_config == {"disable_radix_cache": "True", "page_size": "1", "radix_eviction_policy": "lru"}


def test_sglang_effective_token_modes_and_rank_zero_only() -> None:
    """Hand-written (a CPU replica has one rank and no speculative decoding): tp_rank=1 rows
    and spec_accept_length, in the shape of the real capture."""
    sample = sglang.adapt(load("sglang-0.5.23-a.txt"))
    assert sample.engine == "sglang"
    # all modes (input + device + host + storage) vs the *_hit modes, tp_rank 0 only
    assert sample.counters[CACHE_QUERIES] == 195000.0
    assert sample.counters[CACHE_HITS] == 155000.0
    assert sample.gauges[WAITING] == 3 and sample.gauges[RUNNING] == 8  # not doubled by tp_rank=1
    assert sample.gauges[SPEC_ACCEPT_LENGTH] == pytest.approx(2.61)
    assert sample.gauges[BLOCK_SIZE] == 1
    assert KV_BLOCKS not in sample.gauges  # no capacity without server_info
    assert sample.prefix_caching_configured is None


def test_sglang_server_info_gives_capacity_and_radix_flag() -> None:
    info = {"disable_radix_cache": True, "page_size": 1, "max_total_num_tokens": 412000}
    sample = sglang.adapt(load("sglang-0.5.23-a.txt"), info)
    assert sample.prefix_caching_configured is False
    assert sample.gauges[KV_BLOCKS] == 412000


def test_sglang_without_spec_has_no_acceptance_length() -> None:
    text = ('sglang:spec_accept_length{tp_rank="0"} 0.0\n'
            'sglang:num_queue_reqs{tp_rank="0"} 0\n')
    sample = sglang.adapt(parse_exposition(text))
    assert SPEC_ACCEPT_LENGTH not in sample.gauges
    assert CACHE_QUERIES not in sample.counters


def test_unknown_exposition_is_unknown() -> None:
    assert detect_engine(parse_exposition("process_start_time_seconds 1\nfoo_total 3\n")) == "unknown"


REAL = Path(__file__).parent / "fixtures" / "real_vllm"


def test_real_vllm_032_capture_contract() -> None:
    """A true capture (tests/fixtures/real_vllm, vLLM 0.32.0 on CPU, --block-size 32): the
    0.32 cache_config_info writes "None" for hash_block_size/cache_hit_alignment_tokens."""
    idle = vllm.adapt(parse_exposition((REAL / "metrics_idle.txt").read_text()))
    after = vllm.adapt(parse_exposition((REAL / "metrics_after.txt").read_text()))
    assert detect_engine(parse_exposition((REAL / "metrics_after.txt").read_text())) == "vllm"
    assert idle.counters[CACHE_QUERIES] == 0 and idle.counters[CACHE_HITS] == 0
    assert after.counters[CACHE_QUERIES] == 7235 and after.counters[CACHE_HITS] == 3584
    assert after.counters[PROMPT_TOKENS] == 7235
    assert SPEC_DRAFTS not in after.counters  # started without --speculative-config
    assert after.gauges[BLOCK_SIZE] == 32 and after.gauges[HIT_ALIGNMENT] == 32
    assert after.gauges[KV_BLOCKS] == 32768
    assert after.gauges[WAITING] == 0 and after.gauges[RUNNING] == 0 and after.gauges[KV_USAGE] == 0
    assert after.prefix_caching_configured is True and after.hash_algo == "sha256"
    assert after.process_start == idle.process_start is not None


def test_slimmed_parse_keeps_every_non_bucket_sample() -> None:
    """Skipping comments and buckets must not change any value the adapters read."""
    from prometheus_client.parser import text_string_to_metric_families

    for path in [*FIXTURES.glob("*.txt"), *REAL.glob("metrics_*.txt")]:
        text = path.read_text()
        full: dict[str, list] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not s.name.endswith(("_created", "_bucket")):
                    full.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        assert parse_exposition(text) == full, path.name
