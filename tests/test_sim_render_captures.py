"""The simulator's own rendering reproduces the prompt ids real vLLM rendered (no vLLM needed).

tests/fixtures/real_vllm_agents/render.json holds Messages and Responses bodies and the
`token_ids` real vLLM 0.32's `POST /v1/messages/render` and `/v1/responses/render` answered
(recorded by scripts/record_vllm_agents.py; tiny model = the default tokenizer). Each body is
posted to the simulator's same endpoints over loopback HTTP: its conversion, billing-header strip,
tool dump, chat template and tokenizer are its own code (app/sim/, no app/prefix import:
tests/test_sim_independence.py), so equal ids here make the simulator an oracle the gateway's
predictions can be checked against (docs/testing-oracles.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sim.testing import SimCluster

CASES = json.loads((Path(__file__).parent / "fixtures" / "real_vllm_agents" / "render.json").read_text())


@pytest.fixture(scope="module")
def sim() -> Any:
    with SimCluster(replicas=1, model="tiny", time_scale=0.0, kv_blocks=100_000, max_model_len=4096) as cluster:
        yield cluster


@pytest.mark.parametrize("case", CASES, ids=[f"{c['route']}-{i}" for i, c in enumerate(CASES)])
def test_sim_renders_the_ids_real_vllm_rendered(sim: Any, case: dict[str, Any]) -> None:
    resp = httpx.post(f"{sim.urls[0]}/v1/{case['route']}/render", json=case["body"], timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json()["token_ids"] == case["token_ids"]
