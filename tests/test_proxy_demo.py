"""`prefixgate demo --once` end to end, and the report's quantile arithmetic."""

from __future__ import annotations

import math

import pytest

from app.cli import main
from app.demo import histogram_quantile


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 0.0), (0.2, 50.0), (0.4, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.2)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.5, [(math.inf, 0.0)]) is None


def test_demo_once_prints_the_report(capsys) -> None:
    assert main(["demo", "--once", "--time-scale", "0", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert "TTFT at the proxy" in out and "0-1k" in out
    # the TTFT ledger by bucket: the simulated vLLMs report their queue and prefill per request
    assert "TTFT ledger" in out
    header = next(line.split() for line in out.splitlines() if line.strip().startswith("bucket") and "prefill" in line)
    assert header[1:] == ["gateway", "queue", "prefill", "rest"], header
    assert "globex" in out and "dynamic_head" in out  # the timestamp tenant's breaks are diagnosed
    # and billed: the tokens the replicas recomputed because of them (no other tenant breaks)
    bill = out[out.index("The bill for prefix breaks"):].splitlines()
    (globex,) = [line.split() for line in bill if line.strip().startswith("globex")]
    assert globex[1:3] == ["dynamic_head", "2"] and int(globex[3].replace(",", "")) > 0, globex
    assert not [line for line in bill if line.strip().startswith(("acme", "initech", "hooli"))]
    assert "/v1/chat/completions" in out
    # acme's stateless clients start a new conversation over one system prompt every time: counted
    # as new conversations, never listed as a break cause to fix
    acme = next(line.split() for line in out.splitlines() if line.strip().startswith("acme"))
    assert int(acme[3]) >= 2 and acme[4:] == ["0", "-"], acme
