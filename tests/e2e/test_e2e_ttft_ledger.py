"""The TTFT ledger against a real vLLM 0.32 started with `--enable-per-request-metrics`
(docs/ttft-ledger.md): the engine's `metrics` object really rides on the final usage chunk, the
ledger's engine parts are present and consistent (queue <= engine TTFT <= client TTFT, the parts
summing to the client TTFT), and the client's stream is the engine's minus that object."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.workload import chat_body, stream_chat

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
PROMPT = [{"role": "user", "content": "Where does the time to the first token go? " * 30}]


def test_ledger_against_real_vllm(vllm_metrics: Any, e2e_proxy: Any) -> None:
    body = chat_body(PROMPT, max_tokens=4)
    with httpx.Client(timeout=120) as client:
        direct = stream_chat(client, vllm_metrics.url, body)
        engine_metrics = direct.events[-1][1].get("metrics")
        assert isinstance(engine_metrics, dict), direct.events[-1][1]  # vLLM sends it: the fact we rely on
        assert {"time_to_first_token_ms", "queue_time_ms"} <= set(engine_metrics)
        proxy = e2e_proxy([vllm_metrics])
        relayed = stream_chat(client, proxy.url, body)
        kept = stream_chat(client, proxy.url, body, headers={"x-prefixgate-engine-metrics": "1"})
    last = relayed.events[-1][1]
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == direct.prompt_tokens
    assert "metrics" not in last  # not asked for: taken out, the rest of the chunk as vLLM wrote it
    assert set(last) == set(direct.events[-1][1]) - {"metrics"}
    assert isinstance(kept.events[-1][1].get("metrics"), dict)  # asked for: kept
    proxy.settle()
    (ctx, _) = sorted(proxy.recorder.contexts.values(), key=lambda c: c.timings.arrival)[:2]
    parts = ctx.result.ttft_parts
    assert {"gateway", "queue", "prefill", "rest"} <= set(parts), parts
    ttft = ctx.timings.first_token - ctx.timings.arrival
    engine_ttft = parts["queue"] + parts["prefill"]
    print(f"client TTFT {ttft * 1000:.2f} ms; parts (ms): "
          + ", ".join(f"{k} {v * 1000:.2f}" for k, v in parts.items())
          + f"; vLLM direct metrics: {engine_metrics}")
    assert parts["queue"] <= engine_ttft <= ttft
    assert sum(parts.values()) == pytest.approx(ttft)
