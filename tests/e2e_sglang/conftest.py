"""Session fixtures of the real-SGLang tier: the tiny model and two real SGLang replicas.

`sglang_fleet` starts the replicas the selected tests use at once and stops them by PID at the end
of the session, failures included (a SIGTERM from CI's `timeout` too). Specs:
- `radix`: the radix cache on, page size 1 (SGLang's default);
- `page16`: the radix cache on, `--page-size 16`;
- `noradix`: `--disable-radix-cache`.

Per-test fixtures flush the replica's radix cache first, so tests are independent. Every test skips
with the reason printed when .venv-sglang is missing. `PREFIXGATE_E2E_MODEL` (set by
scripts/e2e-sglang.sh) points at a prebuilt model; otherwise it is built into a temp dir.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.fleet import fresh, running_fleet, selected_specs, tier_model_dir
from tests.e2e.proxy_handle import make_e2e_proxy
from tests.e2e.vllm_server import ReplicaSpec
from tests.e2e_sglang.sglang_server import SGLANG_PYTHON, SglangReplica, missing_reason

SPECS = (
    ReplicaSpec("radix", block_size=None),
    ReplicaSpec("page16", block_size=16),
    ReplicaSpec("noradix", block_size=None, prefix_caching=False),
)


@pytest.fixture(scope="session")
def sglang_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tier_model_dir(missing_reason(), tmp_path_factory, "e2e-sglang", SGLANG_PYTHON)


@pytest.fixture(scope="session")
def sglang_fleet(request: pytest.FixtureRequest, sglang_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SglangReplica]]:
    log_dir = Path(os.environ.get("PREFIXGATE_E2E_LOGS") or tmp_path_factory.mktemp("sglang-logs"))
    with running_fleet(selected_specs(request, SPECS, "sglang"), sglang_model_dir, log_dir, SglangReplica,
                       prefix="sglang") as fleet:
        yield fleet


@pytest.fixture
def sglang_radix(sglang_fleet: dict[str, SglangReplica]) -> SglangReplica:
    return fresh(sglang_fleet, "radix")


@pytest.fixture
def sglang_noradix(sglang_fleet: dict[str, SglangReplica]) -> SglangReplica:
    return fresh(sglang_fleet, "noradix")


@pytest.fixture
def sglang_replica(request: pytest.FixtureRequest, sglang_fleet: dict[str, SglangReplica]) -> SglangReplica:
    """Indirectly parametrized by spec name (`radix`, `page16`)."""
    return fresh(sglang_fleet, request.param)


@pytest.fixture
def e2e_proxy(proxy_factory: Callable[..., Any], sglang_model_dir: Path) -> Callable[..., Any]:
    """`e2e_proxy(replicas, **sections)`: the vLLM tier's proxy (tests/e2e/proxy_handle.py) with the
    tiny model's tokenizer, in front of SGLang replicas. Health probes every 2 s, not 0.5 s: on two
    busy cores SGLang's HTTP loop can answer /health later than the 2 s probe timeout while it
    tokenizes, and two such probes in a row take a replica out of rotation mid-test."""
    make = make_e2e_proxy(proxy_factory, sglang_model_dir)

    def sglang_proxy(replicas: list[Any], **sections: Any) -> Any:
        routing = {"health_interval_s": 2.0, **sections.pop("routing", {})}
        return make(replicas, routing=routing, **sections)

    return sglang_proxy
