"""Predicted cached tokens against real SGLang's `usage.prompt_tokens_details.cached_tokens`, request
by request, on the multi-turn, multi-tenant sequence of the vLLM tier (tests/e2e/workload.py), and
the simulator's SGLang flavour replaying the same bodies.

SGLang's radix cache matches per token (page size 1; `--page-size 16` floors matches to whole
pages) and never hands out the prompt's last token, so a repeat reports `prompt_tokens - 1`. The
assistant turns are scripted text: the engine's own sampled ids would be cached too, which the
simulator cannot reproduce.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.sim.testing import SimCluster
from tests.e2e.workload import replay, run_sequence, table, wait_processed

pytestmark = [pytest.mark.e2e_sglang, pytest.mark.timeout(900)]
MAX_TOKENS = 24


@pytest.mark.parametrize("sglang_replica,page_size", [("radix", 1), ("page16", 16)], indirect=["sglang_replica"])
def test_predicted_and_simulated_equal_sglang_cached_tokens(e2e_proxy: Any, sglang_model_dir: Any,
                                                            sglang_replica: Any, page_size: int) -> None:
    proxy = e2e_proxy([sglang_replica])
    assert sglang_replica.server_info()["page_size"] == page_size
    with httpx.Client(timeout=180) as client:
        records = run_sequence(client, proxy.url, echo=False, max_tokens=MAX_TOKENS, tag=f"sg-{sglang_replica.name}")
        hook = proxy.services.prefix
        wait_processed(hook, len(records))
        predicted = {rid: value for rid, _tenant, value, _delivered in hook.predictions}
        with SimCluster(replicas=1, tokenizer=str(sglang_model_dir), flavor="sglang", sglang_page_size=page_size,
                        model="tiny", time_scale=0.0, kv_blocks=100_000, max_model_len=8192) as sim:
            simulated = replay(client, sim.urls[0], records)
    rows = [(r.request_id, r.step.label, r.prompt_tokens, r.cached_tokens, predicted.get(r.request_id), s)
            for r, s in zip(records, simulated, strict=True)]
    print(f"\nSGLang page size {page_size}:\n"
          + table(rows, ("request", "step", "prompt", "sglang cached", "predicted", "simulator")))
    cached = [r.cached_tokens for r in records]
    assert any(cached) and not all(cached), "the sequence must contain both hits and misses"
    assert [predicted.get(r.request_id) for r in records] == cached
    assert simulated == cached
    assert proxy.sample("prefixgate_engine_block_size_tokens", backend=sglang_replica.name) == float(page_size)
    # the contract metric carries the same numbers (summed over tenants)
    for source in ("predicted", "engine"):
        total = sum(proxy.sample("prefixgate_cached_tokens_total", route="chat", model="tiny", tenant=t, source=source) or 0
                    for t in {rec.tenant for rec in records})
        assert total == sum(c or 0 for c in cached), source
