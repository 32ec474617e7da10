"""Records the real-SGLang fixtures in tests/fixtures/real_sglang/ (run by hand after an SGLang
upgrade: `.venv/bin/python tests/e2e_sglang/record_fixtures.py` after `make e2e-sglang` built the
venv, stand-in and model). Starts a radix-cache replica and a `--disable-radix-cache` one, sends a
cold and a warm streaming chat request to each, saves the SSE bodies byte for byte, /metrics idle
and after, and /server_info, then stops both by PID."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e.vllm_server import ROOT, ReplicaSpec, start_replicas, stop_all  # noqa: E402
from tests.e2e.workload import chat_body, words  # noqa: E402
from tests.e2e_sglang.sglang_server import SglangReplica  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "real_sglang"
MODEL = ROOT / ".e2e-sglang" / "model"
MESSAGES = [{"role": "system", "content": words("fixture-system", 400)},
            {"role": "user", "content": words("fixture-user", 40)}]


def raw_stream(url: str) -> bytes:
    """The SSE body as the engine wrote it (each HTTP read kept whole)."""
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", url + "/v1/chat/completions", json=chat_body(MESSAGES, 8)) as resp:
        resp.raise_for_status()
        return b"".join(resp.iter_raw())


def record(replica: SglangReplica, tag: str) -> None:
    (OUT / f"metrics_idle{tag}.txt").write_text(replica.metrics_text())
    (OUT / f"server_info{tag}.json").write_text(httpx.get(replica.url + "/server_info", timeout=10).text)
    (OUT / f"chat_stream_cold{tag}.sse").write_bytes(raw_stream(replica.url))
    (OUT / f"chat_stream_warm{tag}.sse").write_bytes(raw_stream(replica.url))
    (OUT / f"metrics_after{tag}.txt").write_text(replica.metrics_text())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    specs = [ReplicaSpec("radix", block_size=None), ReplicaSpec("noradix", block_size=None, prefix_caching=False)]
    replicas = start_replicas(specs, MODEL, Path(tempfile.mkdtemp()), SglangReplica, prefix="sglang")
    try:
        record(replicas[0], "")  # type: ignore[arg-type]
        record(replicas[1], "_noradix")  # type: ignore[arg-type]
    finally:
        stop_all(replicas)
    print(f"recorded into {OUT}")


if __name__ == "__main__":
    main()
