"""Real SGLang 0.5.23 replicas on this CPU, as subprocesses: start on free loopback ports, wait for
/health, stop by PID (the process handling is the vLLM tier's, tests/e2e/vllm_server.py).

What it relies on (docs/e2e-sglang.md): SGLang's kernel package ships CUDA-only wheels, so
scripts/e2e-sglang.sh writes a stand-in `sgl_kernel` package into `.e2e-sglang/stub`, whose
functions raise if ever called; none is on the path a tiny Llama takes with the torch-native
attention backend and the PyTorch sampler. `SGLANG_USE_CPU_ENGINE=1` keeps `--device cpu` off the
GPU paths. `--enable-cache-report` makes `usage.prompt_tokens_details.cached_tokens` appear;
`POST /flush_cache` empties the radix cache when nothing is running; with `?timeout=S` SGLang
defers the flush until it is idle (up to S seconds) instead of answering 400 at once — an idle
`/health` probe makes SGLang generate a token, so a flush can land while one runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import httpx

from tests.e2e.vllm_server import ROOT, SERVED_MODEL, VllmReplica

SGLANG_VENV = Path(os.environ.get("PREFIXGATE_SGLANG_VENV", ROOT / ".venv-sglang"))
SGLANG_PYTHON = SGLANG_VENV / "bin" / "python"
STUB_DIR = Path(os.environ.get("PREFIXGATE_SGLANG_STUB", ROOT / ".e2e-sglang" / "stub"))


def missing_reason() -> str | None:
    """Why the real-SGLang tier cannot run here (None when it can)."""
    if not SGLANG_PYTHON.exists():
        return (f"real-SGLang tier skipped: {SGLANG_PYTHON} is missing "
                "(create it with `make e2e-sglang`, which installs sglang==0.5.23 for CPU)")
    if not (STUB_DIR / "sgl_kernel" / "__init__.py").exists():
        return f"real-SGLang tier skipped: the sgl_kernel stand-in is missing under {STUB_DIR} (run `make e2e-sglang`)"
    return None


class SglangReplica(VllmReplica):
    """One `python -m sglang.launch_server`. `spec.block_size` is `--page-size` (None: SGLang's
    default, 1); `spec.prefix_caching=False` adds `--disable-radix-cache`."""

    engine: ClassVar[str] = "SGLang"

    def command(self) -> list[str]:
        s = self.spec
        cmd = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(self.model_dir),
               "--served-model-name", SERVED_MODEL, "--device", "cpu", "--host", "127.0.0.1",
               "--port", str(self.port), "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
               "--disable-cuda-graph", "--mem-fraction-static", "0.1", "--max-total-tokens", "8192",
               "--enable-metrics", "--enable-cache-report", "--skip-server-warmup"]
        if s.block_size is not None:
            cmd += ["--page-size", str(s.block_size)]
        if not s.prefix_caching:
            cmd.append("--disable-radix-cache")
        return cmd + list(s.extra_args)

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(STUB_DIR), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SGLANG_USE_CPU_ENGINE": "1",
                "PYTHONPATH": path}

    def reset_prefix_cache(self) -> None:
        """Empty the radix cache (SGLang's POST /flush_cache, deferred until SGLang is idle)."""
        resp = httpx.post(self.url + "/flush_cache", params={"timeout": 20}, timeout=30.0)
        resp.raise_for_status()

    def server_info(self) -> dict[str, Any]:
        return httpx.get(self.url + "/server_info", timeout=10.0).json()
