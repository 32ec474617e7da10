"""The clock: TTFT at the first content chunk, gaps, decode rate immune to batched deltas."""

from __future__ import annotations

import pytest

from app.proxy.clock import StreamClock
from app.proxy.context import Timings


def test_ttft_is_first_content_not_first_byte() -> None:
    clock = StreamClock(Timings(arrival=100.0))
    clock.upstream_sent(100.001)
    clock.first_byte(100.010)  # role chunk
    clock.content(100.500, chars=5)
    clock.content(100.600, chars=5)
    clock.end(100.700)
    assert clock.first_byte_latency == pytest.approx(0.010)
    assert clock.ttft == pytest.approx(0.5)
    assert clock.overhead == pytest.approx(0.001)
    assert clock.gaps == [pytest.approx(0.1)]
    assert clock.duration == pytest.approx(0.7)


def test_decode_rate_with_batched_deltas_uses_usage_not_chunks() -> None:
    # 64 tokens at 100 tok/s delivered as 8 chunks of 8 tokens (one chunk every 80 ms)
    clock = StreamClock(Timings(arrival=0.0))
    for i in range(8):
        clock.content(1.0 + i * 0.08, chars=8 * 4)
    rate = clock.decode_rate(64, total_chars=64 * 4)
    assert rate == pytest.approx(100.0, rel=0.01)
    # tokens-per-chunk arithmetic would say 1 token per 80 ms = 12.5 tok/s: far from the truth
    assert rate > 5 * (1 / 0.08)


def test_decode_rate_without_text_counts_first_chunk_as_one_token() -> None:
    clock = StreamClock(Timings(arrival=0.0))
    for i in range(11):
        clock.content(1.0 + i * 0.01)
    assert clock.decode_rate(11) == pytest.approx(100.0)


def test_decode_rate_undefined_cases() -> None:
    clock = StreamClock(Timings(arrival=0.0))
    assert clock.decode_rate(10) is None
    clock.content(1.0, chars=3)
    assert clock.decode_rate(10) is None  # a single chunk has no span
    clock.content(1.5, chars=3)
    assert clock.decode_rate(None) is None
    assert clock.decode_rate(0) is None


def test_overhead_excludes_failed_attempts_but_not_the_gateways_own_time() -> None:
    clock = StreamClock(Timings(arrival=10.0))
    clock.upstream_sent(10.002)  # parse + hooks + routing: 2 ms
    clock.attempt_failed(12.002)  # the first replica took 2 s to fail
    clock.upstream_sent(12.003)  # 1 ms to route the retry
    clock.first_byte(12.5)
    assert clock.overhead == pytest.approx(0.003)
    assert clock.first_byte_latency == pytest.approx(2.5)  # the client waited for the failure too


def test_overhead_when_every_attempt_failed_counts_the_last_one_as_sent() -> None:
    clock = StreamClock(Timings(arrival=0.0))
    clock.upstream_sent(0.001)
    clock.attempt_failed(1.001)
    clock.upstream_sent(1.002)
    clock.attempt_failed(2.002)  # no attempt follows: nothing more to subtract
    assert clock.overhead == pytest.approx(0.002)
