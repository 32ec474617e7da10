"""The session plumbing both real-engine tiers share (tests/e2e/conftest.py for vLLM,
tests/e2e_sglang/conftest.py for SGLang): the tiny model, the replicas the selected tests use,
started at once and stopped by PID whatever happens, and a per-test cache reset.

- `tier_model_dir`: skips (printing why) when the engine's venv is missing -- fails instead under
  `PREFIXGATE_E2E_REQUIRED=1`, which the tiers' scripts set (a tier never passes by skipping);
  otherwise the prebuilt model `PREFIXGATE_E2E_MODEL` points at (the script builds it), or one built now.
- `selected_specs`: the specs whose fixture (`<prefix>_<name>`, or `<prefix>_replica`
  parametrized indirectly by name) some collected test uses; all of them when none matches.
- `running_fleet`: starts them together (their ~30 s start-ups overlap) and stops every one at
  the end, failures included: a SIGTERM (CI's `timeout`) becomes a KeyboardInterrupt so the
  teardown runs (the replicas run in their own sessions, so nothing else would stop them), and an
  atexit hook stops whatever an interrupted session left.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.vllm_server import ReplicaSpec, VllmReplica, build_tiny_model, start_replicas, stop_all


def tier_model_dir(reason: str | None, tmp_path_factory: pytest.TempPathFactory, tmp_name: str,
                   python: Path) -> Path:
    if reason:
        print(f"\n{reason}")
        if os.environ.get("PREFIXGATE_E2E_REQUIRED") == "1":
            pytest.fail(f"{reason} (PREFIXGATE_E2E_REQUIRED=1: this tier must run)")
        pytest.skip(reason)
    given = os.environ.get("PREFIXGATE_E2E_MODEL")
    out = Path(given) if given else tmp_path_factory.mktemp(tmp_name) / "tiny-model"
    return build_tiny_model(out, python)


def selected_specs(request: pytest.FixtureRequest, specs: Iterable[ReplicaSpec], prefix: str) -> list[ReplicaSpec]:
    wanted: set[str] = set()
    for item in request.session.items:
        wanted.update(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and f"{prefix}_replica" in callspec.params:
            wanted.add(f"{prefix}_{callspec.params[f'{prefix}_replica']}")
    specs = list(specs)
    return [s for s in specs if f"{prefix}_{s.name}" in wanted] or specs


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running_fleet(specs: list[ReplicaSpec], model_dir: Path, log_dir: Path,
                  replica_type: type[VllmReplica] | None = None, prefix: str = "vllm") -> Iterator[dict[str, Any]]:
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        replicas = start_replicas(specs, model_dir, log_dir, replica_type, prefix=prefix)
        atexit.register(stop_all, replicas)
        try:
            yield {r.name: r for r in replicas}
        finally:
            stop_all(replicas)
    finally:
        signal.signal(signal.SIGTERM, previous)


def fresh(fleet: dict[str, Any], name: str) -> Any:
    """The named replica with its prefix cache emptied (when it has one): tests stay independent."""
    replica = fleet[name]
    if replica.spec.prefix_caching:
        replica.reset_prefix_cache()
    return replica
