"""What Redis state costs a request, the gateway's CPU and Redis's own, beside memory state.

    .venv/bin/python bench/redis_state_cost.py [--size 100000] [--conc 16] [--seconds 8] [--rounds 2]
        [--kv-blocks 0] [--ref-tree DIR]

The peer harness's shape (bench/peerbench: two fake vLLM-shaped backends, the closed-loop client,
a pool of 32 prompts of `--size` characters with a unique suffix per request). Each run starts a
fresh redis-server and `prefixgate serve` (default config; `state:` the Redis, or memory),
primes it (every prompt of the pool once, then `--warm` seconds of load) and measures `--seconds`
of load: the gateway's process-tree CPU and the redis-server's CPU, each divided by the requests
served, and the client's TTFT p50. `--ref-tree`: another checkout (e.g. `git archive` of main),
run with Redis in the same rounds. `--kv-blocks N`: the replicas' capacity (the fake backends
report none, so the gateway assumes 4,096 blocks: less than one 1 MB prompt).

peer_table.py's multi-pod row measures the gateway beside the Rust routers; it does not count
Redis's CPU, which every pod of a deployment shares.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "peerbench"))

from runner import proc_cpu  # noqa: E402  (the harness's process-tree CPU, from /proc)
from stage_cost import HARNESS, _load, _wait, stop  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402


def _config(path: Path, redis_url: str | None, kv_blocks: int) -> None:
    lines = [f"state: {redis_url}"] if redis_url else []
    if kv_blocks:
        lines.append(f"routing: {{kv_blocks: {kv_blocks}}}")
    path.write_text("\n".join(lines) + "\n" if lines else "{}\n")


def _run(tree: Path, redis: bool, a: argparse.Namespace, backends: list[str]) -> tuple[float, float, float]:
    """(gateway CPU, Redis CPU, TTFT p50), ms a request."""
    server = RedisServer().start() if redis else None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        cfg = Path(f.name)
    _config(cfg, server.url if server else None, a.kv_blocks)
    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(a.port),
           "--log-level", "warning", "--config", str(cfg), *[x for b in backends for x in ("--backend", b)]]
    env = dict(os.environ, PYTHONPATH=str(tree))
    gw = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{a.port}"
    try:
        _wait(url + "/health")
        _load(url, a, "--sweep", "-c", "1", "-t", "600")
        _load(url, a, "-c", str(a.conc), "-t", str(a.warm))
        g0 = proc_cpu(gw.pid)
        r0 = proc_cpu(server.proc.pid) if server and server.proc else 0.0
        result = _load(url, a, "-c", str(a.conc), "-t", str(a.seconds))
        gcpu = proc_cpu(gw.pid) - g0
        rcpu = (proc_cpu(server.proc.pid) - r0) if server and server.proc else 0.0
        n = result.get("n_total_ok") or 0
        if not n:
            return float("nan"), float("nan"), float("nan")
        return 1000 * gcpu / n, 1000 * rcpu / n, float(result.get("ttft_p50_ms", float("nan")))
    finally:
        stop(gw)
        if server is not None:
            server.stop()
        cfg.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warm", type=float, default=3.0, help="seconds of unmeasured load after priming")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kv-blocks", type=int, default=0, help="the replicas' capacity in blocks (0: the default)")
    ap.add_argument("--ref-tree", default=None, help="another checkout, run with Redis state in the same rounds")
    ap.add_argument("--port", type=int, default=18450)
    a = ap.parse_args(argv)
    backends = [f"http://127.0.0.1:{a.port + 1 + i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(HARNESS / "fake_backend.py"), "--port", str(a.port + 1 + i)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    variants: dict[str, tuple[Path, bool]] = {"memory state": (ROOT, False), "Redis state": (ROOT, True)}
    if a.ref_tree:
        variants["Redis state, --ref-tree"] = (Path(a.ref_tree).resolve(), True)
    rows: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    try:
        for _ in range(a.rounds):
            for name, (tree, redis) in variants.items():
                rows[name].append(_run(tree, redis, a, backends))
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    print(f"`{shlex.join(['python', 'bench/redis_state_cost.py', *(argv if argv is not None else sys.argv[1:])])}`\n")
    print(f"{a.size:,} B prompts, concurrency {a.conc}, {a.seconds:g} s measured per run, {a.rounds} rounds "
          f"(interleaved), capacity {a.kv_blocks or 'the default (4,096 blocks)'}; medians:\n")
    print("| state | gateway CPU / request | Redis CPU / request | TTFT p50 |")
    print("|---|---:|---:|---:|")
    for name, runs in rows.items():
        g, r, t = (statistics.median(x[i] for x in runs) for i in range(3))
        print(f"| {name} | {g:.2f} ms | {r:.2f} ms | {t:.1f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
