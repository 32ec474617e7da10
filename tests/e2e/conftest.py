"""Session fixtures of the real-vLLM tier: the tiny model and up to three real vLLM replicas.

`vllm_fleet` starts every replica the selected tests use at once (their ~30 s start-ups overlap)
and stops them all by PID at the end of the session, on failure too. Specs:
- `b32`: block 32, prefix caching on, KV events on a free port, stored responses
  (`VLLM_ENABLE_RESPONSES_API_STORE=1`) (prediction, simulator, TTFT, gauges, KV events, the agents' routes);
- `b128`: vLLM's default block size (128 on the CPU backend), prefix caching on;
- `nocache`: `--no-enable-prefix-caching` (the caching-enabled gauge must read 0).

Per-test fixtures (`vllm_b32`, ...) empty the replica's prefix cache first, so tests are independent.
Every test skips with the reason printed when .venv-vllm is missing (fails, under scripts/e2e.sh). `PREFIXGATE_E2E_MODEL` (set by
scripts/e2e.sh) points at a prebuilt model; otherwise it is built into a temp dir.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.fleet import fresh, running_fleet, selected_specs, tier_model_dir
from tests.e2e.proxy_handle import make_e2e_proxy
from tests.e2e.vllm_server import (
    AGENTS_ENV,
    VLLM_PYTHON,
    ReplicaSpec,
    VllmReplica,
    missing_reason,
)

SPECS = (
    # token ids as logprob tokens: the previous_response_id test reads the ids vLLM sampled
    ReplicaSpec("b32", block_size=32, kv_events=True, cpu="0", env=AGENTS_ENV,
                extra_args=["--return-tokens-as-token-ids"]),
    ReplicaSpec("b128", block_size=None, cpu="1"),
    ReplicaSpec("nocache", block_size=32, prefix_caching=False, cpu="1"),
    # vLLM's per-request metrics (the TTFT ledger, docs/ttft-ledger.md); started only when asked for
    ReplicaSpec("metrics", block_size=32, cpu="0", extra_args=["--enable-per-request-metrics"]),
)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tier_model_dir(missing_reason(), tmp_path_factory, "e2e", VLLM_PYTHON)


@pytest.fixture(scope="session")
def vllm_fleet(request: pytest.FixtureRequest, vllm_model_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmReplica]]:
    log_dir = Path(os.environ.get("PREFIXGATE_E2E_LOGS") or tmp_path_factory.mktemp("vllm-logs"))
    with running_fleet(selected_specs(request, SPECS, "vllm"), vllm_model_dir, log_dir) as fleet:
        yield fleet


@pytest.fixture
def vllm_b32(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return fresh(vllm_fleet, "b32")


@pytest.fixture
def vllm_b128(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return fresh(vllm_fleet, "b128")


@pytest.fixture
def vllm_replica(request: pytest.FixtureRequest, vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    """Indirectly parametrized by spec name: `@pytest.mark.parametrize("vllm_replica", ["b32"], indirect=True)`."""
    return fresh(vllm_fleet, request.param)


@pytest.fixture
def vllm_nocache(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return fresh(vllm_fleet, "nocache")


@pytest.fixture
def vllm_metrics(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return fresh(vllm_fleet, "metrics")


@pytest.fixture
def e2e_proxy(proxy_factory: Callable[..., Any], vllm_model_dir: Path) -> Callable[..., Any]:
    return make_e2e_proxy(proxy_factory, vllm_model_dir)
