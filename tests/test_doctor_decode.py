"""The two-point prefill/decode measurement against a simulator that batches 16 deltas per SSE event.

Kept in its own file: it needs real decode time (2.5 ms simulated steps; the simulator paces each step
to an absolute deadline, so a late wake-up is caught up rather than accumulated) and takes ~3.5 s,
alone (`exclusive`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from app.cli import main


@pytest.mark.exclusive  # a decode rate within 10% of the wall clock's 400 tok/s
def test_two_point_decode_is_immune_to_batched_deltas(sim_factory: Callable[..., Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    decode_tps, time_scale = 1600.0, 4.0
    real_rate = decode_tps / time_scale  # 400 tok/s on the wall clock
    sim = sim_factory(replicas=1, decode_tps=decode_tps, time_scale=time_scale, deltas_per_chunk=16,
                      prefill_tps=20000)
    code = main(["check", sim.urls[0], "--json", "--prompt-tokens", "1000", "--warmups", "0",
                 "--measurements", "3"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["decode_tps"] == pytest.approx(real_rate, rel=0.10)
    # The naive method — one token per SSE event, timed by arrival — sees one event per 16 tokens
    # and reports ~1/16 of the real rate (and absurd speeds when deltas are flushed together).
    naive = report["naive_decode_tps"]
    assert naive < real_rate / 4, (naive, report["decode_tps"])
    assert naive == pytest.approx(real_rate / 16, rel=0.3)
    for point in report["two_point"].values():
        assert point["consistent"] and point["spread"] < 1.5
    assert report["two_point"]["64"]["completion_tokens"] == [64, 64, 64]
    assert report["two_point"]["320"]["completion_tokens"] == [320, 320, 320]
    assert 0 <= report["prefill_s"] < 0.3
    assert report["cache_verdict"] == "on"
