"""`prefixgate check` end to end against the simulator over real loopback HTTP.

Probes stay small (a few thousand tokens) and repeat counts low so the file runs in well under a
minute; timings are compared by orders of magnitude, except the two-point decode rate, which is
the point of the method (within 10% of the simulator's configured rate).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from app.cli import main
from app.doctor.metrics import parse_metrics

Sim = Callable[..., Any]


def check(capsys: pytest.CaptureFixture[str], url: str, *flags: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", url, "--json", *flags])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_cache_on_steps_down_and_hits(sim_factory: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = sim_factory(replicas=1, prefill_tps=4000, decode_tps=1000, time_scale=1.0)
    code, report = check(capsys, sim.urls[0] + "/v1", "--prompt-tokens", "3000", "--no-decode")
    assert code == 0, report
    assert report["cache_verdict"] == "on"
    assert report["engine"] == "vllm" and report["block_size"] == 16
    assert report["prefix_caching_enabled"] is True
    # 3000 tokens at 4000 tok/s: ~0.75 s cold; warm calls recompute one block.
    assert report["cold_ttft_s"] > 0.3
    assert report["cold_ttft_s"] > 5 * report["warm_ttft_s"]
    # 1 cold + 2 warm sends of the same prompt: ~2/3 of the looked-up tokens hit.
    assert report["hit_rate"] == pytest.approx(2 / 3, abs=0.03)
    assert report["prompt_tokens"] == pytest.approx(3000, rel=0.05)
    assert report["cached_tokens"][0] == 0 and report["cached_tokens"][1] > 2900
    assert report["ceiling_tokens"] is None and report["decode_tps"] is None


def test_cache_off_is_reported_off_with_causes(sim_factory: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = sim_factory(replicas=1, prefill_tps=4000, decode_tps=1000, time_scale=1.0, prefix_caching=False)
    code, report = check(capsys, sim.urls[0], "--prompt-tokens", "3000", "--no-decode")
    assert code == 1
    assert report["cache_verdict"] == "off"
    assert report["cache_queries_tokens"] == 0 and report["hit_rate"] is None
    assert report["prefix_caching_enabled"] is False
    # flat: the warm calls are as slow as the cold one
    assert report["warm_ttft_s"] > 0.5 * report["cold_ttft_s"]
    assert any("hybrid" in cause for cause in report["likely_causes"])
    assert report["problems"] == ["prefix caching is OFF"]

    # The human report says the same.
    code = main(["check", sim.urls[0], "--prompt-tokens", "1000", "--no-decode"])
    out = capsys.readouterr().out
    assert code == 1
    assert "OFF" in out and "Likely causes" in out and "0 prefix-cache queries" in out


@pytest.fixture
def long_request() -> Iterator[Callable[[str], None]]:
    """Starts one long streaming request against a URL in a thread; cancelled at teardown."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(url: str) -> None:
        def body() -> None:
            payload = {"model": "sim", "messages": [{"role": "user", "content": "keep talking"}],
                       "max_tokens": 5000, "ignore_eos": True, "stream": True}
            with httpx.Client(timeout=60) as client, client.stream("POST", url + "/v1/chat/completions",
                                                                   json=payload) as response:
                for _ in response.iter_lines():
                    if stop.is_set():
                        return

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if parse_metrics(httpx.get(url + "/metrics").text).busy:
                return
            time.sleep(0.02)
        raise AssertionError("the long request never showed up as running")

    yield start
    stop.set()
    for thread in threads:
        thread.join(10)


def test_busy_replica_refuses_to_measure(sim_factory: Sim, long_request: Callable[[str], None],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sim = sim_factory(replicas=1, decode_tps=100, time_scale=1.0)
    long_request(sim.urls[0])
    before = parse_metrics(httpx.get(sim.urls[0] + "/metrics").text).queries
    code, report = check(capsys, sim.urls[0], "--prompt-tokens", "1000")
    assert code == 2
    assert report["measured"] is False
    assert "busy" in report["refused"] and "running=1" in report["refused"]
    assert report["cache_verdict"] is None
    # Nothing was sent: the engine looked up no new prompt.
    assert parse_metrics(httpx.get(sim.urls[0] + "/metrics").text).queries == before

    code = main(["check", sim.urls[0], "--prompt-tokens", "1000"])
    assert code == 2
    assert "Could not measure" in capsys.readouterr().out

    # --force measures anyway, and says the numbers include someone else's traffic.
    code, report = check(capsys, sim.urls[0], "--prompt-tokens", "1000", "--no-decode", "--force")
    assert report["measured"] is True and code in (0, 1)
    assert any("busy" in w for w in report["warnings"])


@pytest.mark.exclusive  # a ladder of timed requests at time_scale 1
def test_ladder_stops_at_the_context_limit(sim_factory: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = sim_factory(replicas=1, time_scale=1.0, decode_tps=1000, max_model_len=6000)
    code, report = check(capsys, sim.urls[0], "--prompt-tokens", "1000", "--no-decode", "--ladder")
    assert code == 0, report
    assert report["max_model_len"] == 6000
    targets = [step["target_tokens"] for step in report["ladder"]]
    assert targets[:3] == [1000, 2000, 4000] and targets[-1] == int((6000 - 8) * 0.99)
    assert all(step["prompt_tokens"] is None or step["prompt_tokens"] < 6000 for step in report["ladder"])
    # The last rung, aimed 1% under the limit, passes: the ceiling is just under max_model_len.
    assert report["ladder"][-1]["outcome"] == "ok"
    assert 5800 <= report["ceiling_tokens"] < 6000
    assert report["ladder_stopped"].startswith("reached the cap")


def test_ladder_stops_at_a_crash_and_reports_the_last_good_length(
        sim_factory: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = sim_factory(replicas=1, time_scale=1.0, decode_tps=1000, max_model_len=32768,
                      crash_above_tokens=3000)
    code, report = check(capsys, sim.urls[0], "--prompt-tokens", "1000", "--no-decode", "--ladder")
    assert code == 1
    assert [s["outcome"] for s in report["ladder"]] == ["ok", "ok", "unhealthy"]
    assert report["ceiling_tokens"] == pytest.approx(2000, rel=0.05)
    assert "unhealthy" in report["ladder_stopped"]
    assert any("length ladder" in p for p in report["problems"])
    assert httpx.get(sim.urls[0] + "/health").status_code == 500  # the simulated engine died


def test_sglang_flavor(sim_factory: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = sim_factory(replicas=1, flavor="sglang", prefill_tps=4000, decode_tps=1000, time_scale=1.0)
    code, report = check(capsys, sim.urls[0], "--prompt-tokens", "2000", "--no-decode")
    assert code == 0, report
    assert report["engine"] == "sglang" and report["block_size"] == 1
    assert report["cache_verdict"] == "on" and report["hit_rate"] > 0.5


def test_through_prefixgate_itself(sim_factory: Sim, proxy_factory: Callable[..., Any],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Behind the proxy the engine counters are per replica; the doctor falls back to the
    # engine-reported usage.prompt_tokens_details.cached_tokens of its own requests.
    sim = sim_factory(replicas=1, prefill_tps=4000, decode_tps=1000, time_scale=1.0)
    proxy = proxy_factory(sim)
    code, report = check(capsys, proxy.base_url, "--prompt-tokens", "2000", "--no-decode")
    # what the doctor found, whole (the report itself is cut short in pytest's summary)
    assert code == 0, {k: report.get(k) for k in ("problems", "cache_verdict", "reasons", "ttfts_s", "hit_rate")}
    assert report["engine"] == "prefixgate"
    assert report["cache_verdict"] == "on"
    assert report["cached_tokens"][0] == 0 and report["hit_rate"] == pytest.approx(2 / 3, abs=0.03)


@pytest.mark.exclusive  # the same ladder of timed requests at time_scale 1, through the gateway
def test_ladder_through_prefixgate_sizes_without_tokenize(sim_factory: Sim, proxy_factory: Callable[..., Any],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # prefixgate serves no /tokenize: documents are sized from usage.prompt_tokens alone, and the
    # context limit comes from the proxy's /v1/models.
    sim = sim_factory(replicas=1, time_scale=1.0, decode_tps=1000, max_model_len=6000)
    proxy = proxy_factory(sim)
    code, report = check(capsys, proxy.url, "--prompt-tokens", "1000", "--no-decode", "--ladder")
    assert code == 0, report
    assert report["max_model_len"] == 6000
    assert report["ladder"][-1]["outcome"] == "ok"
    assert 5500 <= report["ceiling_tokens"] < 6000


def test_reports_whether_vllm_returns_per_request_metrics(sim_factory: Sim,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The TTFT ledger needs vLLM's `metrics` object per answer: the check says whether the
    endpoint returns it, and how to turn it on when it does not (docs/ttft-ledger.md)."""
    flagged = sim_factory(replicas=1, time_scale=0.0, enable_per_request_metrics=True)
    code, report = check(capsys, flagged.urls[0], "--prompt-tokens", "1000", "--no-decode")
    assert report["per_request_metrics"] is True
    assert not any("--enable-per-request-metrics" in w for w in report["warnings"])
    plain = sim_factory(replicas=1, time_scale=0.0)
    code, report = check(capsys, plain.urls[0], "--prompt-tokens", "1000", "--no-decode")
    assert report["per_request_metrics"] is False
    assert any("--enable-per-request-metrics" in w for w in report["warnings"])
