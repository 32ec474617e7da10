"""Windowed deltas: exact ratios, restarts never produce negative or spiking values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engines.rates import CounterWindow, SumWindow, acceptance_length, hit_ratio, prompt_tokens_per_s
from app.engines.sample import CACHE_HITS, CACHE_QUERIES, PROMPT_TOKENS, SPEC_ACCEPTED, SPEC_DRAFTS


def counters(q: float, h: float, p: float = 0.0) -> dict[str, float]:
    return {CACHE_QUERIES: q, CACHE_HITS: h, PROMPT_TOKENS: p}


def test_ratio_is_delta_over_delta_not_lifetime() -> None:
    w = CounterWindow(window_s=60)
    w.add(0, counters(1000, 900))  # lifetime 90 %
    w.add(5, counters(2000, 1000))  # this window: 100 hit of 1000
    d = w.deltas()
    assert d is not None and d.span_s == 5
    assert hit_ratio(d) == pytest.approx(0.1)


def test_window_slides_and_keeps_a_base_at_or_before_the_cutoff() -> None:
    w = CounterWindow(window_s=10)
    for t in range(0, 31, 5):
        w.add(t, counters(100 * t, 50 * t))
    d = w.deltas()
    assert d is not None and d.span_s == 10  # base at t=20, newest t=30
    assert d.get(CACHE_QUERIES) == 1000


def test_no_queries_gives_no_ratio() -> None:
    w = CounterWindow(60)
    w.add(0, counters(10, 5))
    assert w.deltas() is None
    w.add(5, counters(10, 5))
    d = w.deltas()
    assert d is not None and hit_ratio(d) is None


def test_decrease_is_a_restart_and_the_new_value_is_the_base() -> None:
    w = CounterWindow(60)
    w.add(0, counters(100000, 90000, 100000))
    assert w.add(5, counters(300, 100, 300)) is True
    assert w.deltas() is None  # no delta spans two processes
    w.add(10, counters(1300, 600, 1300))
    d = w.deltas()
    assert d is not None
    assert d.get(CACHE_QUERIES) == 1000 and hit_ratio(d) == pytest.approx(0.5)
    assert w.restarts == 1


def test_changed_process_start_is_a_restart_even_when_counters_grew() -> None:
    w = CounterWindow(60)
    w.add(0, counters(100, 50), process_start=1000.0)
    assert w.add(5, counters(5000, 10), process_start=2000.0) is True
    assert w.deltas() is None


def test_acceptance_length_includes_the_bonus_token() -> None:
    w = CounterWindow(60)
    w.add(0, {SPEC_DRAFTS: 100, SPEC_ACCEPTED: 150})
    w.add(5, {SPEC_DRAFTS: 600, SPEC_ACCEPTED: 1050})
    d = w.deltas()
    assert d is not None and acceptance_length(d) == pytest.approx(1 + 900 / 500)


def test_counter_that_appears_mid_window_has_no_delta_yet() -> None:
    w = CounterWindow(60)
    w.add(0, {PROMPT_TOKENS: 10})
    w.add(5, {PROMPT_TOKENS: 60, SPEC_DRAFTS: 9})
    d = w.deltas()
    assert d is not None and d.get(SPEC_DRAFTS) is None and prompt_tokens_per_s(d) == 10


RESTART = st.integers(0, 9).map(lambda n: n == 0)  # rare enough that windows fill up between restarts


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), RESTART), min_size=2, max_size=40))
def test_ratio_is_exactly_the_window_delta_and_never_spans_a_restart(steps) -> None:
    """The expected ratio comes from the counters the test itself fed in: the samples of the
    current process (each restart has a new process_start), the base being the newest one at or
    before now - 30 s (else the process's first). A delta across a restart, a lifetime ratio or a
    wrong base gives a different number, not just one outside [0, 1]."""
    w = CounterWindow(window_s=30)
    q = h = 0.0
    process: list[tuple[float, float, float]] = []  # (t, queries, hits) of the current process
    start = 0
    for i, (dq, dh, restart) in enumerate(steps):
        t = i * 5.0
        if restart:
            q = h = 0.0
            start += 1
            process = []
        q += dq
        h += min(dh, dq)
        assert w.add(t, counters(q, h), process_start=float(start)) is (restart and i > 0)
        process.append((t, q, h))
        d = w.deltas()
        if len(process) < 2:
            assert d is None
            continue
        base = [s for s in process if s[0] <= t - 30] or process[:1]
        t0, q0, h0 = base[-1]
        assert d is not None and d.span_s == t - t0
        assert d.get(CACHE_QUERIES) == q - q0 and d.get(CACHE_HITS) == h - h0
        expected = (h - h0) / (q - q0) if q > q0 else None
        assert hit_ratio(d) == expected


def test_sum_window_forgets_old_buckets() -> None:
    s = SumWindow(window_s=10)
    s.add(0.5, 100, 50)
    s.add(0.7, 100, 50)
    s.add(8.0, 10, 10)
    assert s.totals(8.0) == (210, 110)
    assert s.totals(15.0) == (10, 10)
    assert s.totals(30.0) == (0, 0)
