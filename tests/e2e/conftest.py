"""Session fixtures of the real-vLLM tier: the tiny model and up to three real vLLM replicas.

`vllm_fleet` starts every replica the selected tests use at once (their ~30 s start-ups overlap)
and stops them all by PID at the end of the session, on failure too. Specs:
- `b32`: block 32, prefix caching on, KV events on a free port (prediction, simulator, TTFT,
  gauges, KV events);
- `b128`: vLLM's default block size (128 on the CPU backend), prefix caching on;
- `nocache`: `--no-enable-prefix-caching` (the caching-enabled gauge must read 0).

Per-test fixtures (`vllm_b32`, ...) empty the replica's prefix cache first, so tests are independent.
Every test skips with the reason printed when .venv-vllm is missing. `PREFIXGATE_E2E_MODEL` (set by
scripts/e2e.sh) points at a prebuilt model; otherwise it is built into a temp dir.
"""

from __future__ import annotations

import atexit
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.proxy_handle import make_e2e_proxy
from tests.e2e.vllm_server import (
    ReplicaSpec,
    VllmReplica,
    build_tiny_model,
    missing_reason,
    start_replicas,
    stop_all,
)

SPECS = (
    ReplicaSpec("b32", block_size=32, kv_events=True, cpu="0"),
    ReplicaSpec("b128", block_size=None, cpu="1"),
    ReplicaSpec("nocache", block_size=32, prefix_caching=False, cpu="1"),
)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = missing_reason()
    if reason:
        print(f"\n{reason}")
        pytest.skip(reason)
    given = os.environ.get("PREFIXGATE_E2E_MODEL")
    out = Path(given) if given else tmp_path_factory.mktemp("e2e") / "tiny-model"
    return build_tiny_model(out)


@pytest.fixture(scope="session")
def vllm_fleet(request: pytest.FixtureRequest, vllm_model_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmReplica]]:
    log_dir = Path(os.environ.get("PREFIXGATE_E2E_LOGS") or tmp_path_factory.mktemp("vllm-logs"))
    wanted: set[str] = set()
    for item in request.session.items:
        wanted.update(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "vllm_replica" in callspec.params:
            wanted.add(f"vllm_{callspec.params['vllm_replica']}")
    specs = [s for s in SPECS if f"vllm_{s.name}" in wanted] or list(SPECS)
    # a SIGTERM (CI's `timeout`) must still reach the teardown below: the replicas run in their own
    # sessions, so nothing else would stop them
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        replicas = start_replicas(specs, vllm_model_dir, log_dir)
        atexit.register(stop_all, replicas)  # belt and braces: an interrupted session still stops them
        try:
            yield {r.name: r for r in replicas}
        finally:
            stop_all(replicas)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _fresh(fleet: dict[str, VllmReplica], name: str) -> VllmReplica:
    replica = fleet[name]
    if replica.spec.prefix_caching:
        replica.reset_prefix_cache()
    return replica


@pytest.fixture
def vllm_b32(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return _fresh(vllm_fleet, "b32")


@pytest.fixture
def vllm_b128(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return _fresh(vllm_fleet, "b128")


@pytest.fixture
def vllm_replica(request: pytest.FixtureRequest, vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    """Indirectly parametrized by spec name: `@pytest.mark.parametrize("vllm_replica", ["b32"], indirect=True)`."""
    return _fresh(vllm_fleet, request.param)


@pytest.fixture
def vllm_nocache(vllm_fleet: dict[str, VllmReplica]) -> VllmReplica:
    return _fresh(vllm_fleet, "nocache")


@pytest.fixture
def e2e_proxy(proxy_factory: Callable[..., Any], vllm_model_dir: Path) -> Callable[..., Any]:
    return make_e2e_proxy(proxy_factory, vllm_model_dir)
