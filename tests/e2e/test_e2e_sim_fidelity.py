"""Simulator fidelity: the same request sequence, the same tokenizer and block size, sent to real
vLLM and to `app.sim` must give the same `cached_tokens` for every request.

The scripted sequence is used (assistant turns are fixed text): the simulator generates its own
filler tokens, not vLLM's random ones, so generated blocks can only agree when neither engine's
output is fed back.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.sim.testing import SimCluster
from tests.e2e.workload import replay, run_sequence, table

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.mark.parametrize("vllm_replica,block_size", [("b32", 32), ("b128", 128)], indirect=["vllm_replica"])
def test_simulator_reports_what_vllm_reports(vllm_model_dir: Any, vllm_replica: Any, block_size: int) -> None:
    replica, replica_name = vllm_replica, vllm_replica.name
    with httpx.Client(timeout=120) as client:
        records = run_sequence(client, replica.url, echo=False, max_tokens=40, tag=f"sim-{replica_name}")
        with SimCluster(replicas=1, tokenizer=str(vllm_model_dir), block_size=block_size, model="tiny",
                        time_scale=0.0, kv_blocks=100_000, max_model_len=4096) as sim:
            simulated = replay(client, sim.urls[0], records)
    rows = [(r.request_id, r.step.label, r.prompt_tokens, r.cached_tokens, s)
            for r, s in zip(records, simulated, strict=True)]
    equal = sum(1 for r, s in zip(records, simulated, strict=True) if r.cached_tokens == s)
    print(f"\nsimulator vs vLLM, block {block_size}: {equal}/{len(records)} equal\n"
          + table(rows, ("request", "step", "prompt", "vllm cached", "sim cached")))
    assert any(r.cached_tokens for r in records)
    assert simulated == [r.cached_tokens for r in records]
