"""What each pipeline stage costs in the whole gateway: CPU per request with stages switched off.

    .venv/bin/python bench/stage_cost.py [--size 100000] [--conc 16] [--seconds 8] [--rounds 2]
        [--variants all,-prefix,-prefix-hygiene-tracing,py-relay] [--routers-venv .venv-routers]

The peer harness's shape (bench/peerbench: two fake vLLM-shaped backends, the closed-loop client
with a pool of 32 prompts of `--size` characters and a unique suffix per request). Each variant is
`prefixgate serve`'s app with the named stages left out (`-prefix` drops the prefix stage: no
fingerprint, residency learning, continuity or diagnosis; the relay, routing, metrics and the
stream observer stay; `py-relay` is bench/bare_relay.py, the same server and client with no
feature at all: the floor of the Python stack), started fresh, primed (every prompt of the pool
once, then `--warm` seconds of load), then measured: the gateway process tree's CPU over
`--seconds` of load divided by the requests served. Variants run interleaved, `--rounds` times;
with `--routers-venv`, vllm-router's round_robin runs in the same rounds as the yardstick (issue
26's ratios). The difference between two variants is what the dropped stages cost a request,
measured where the issue measures it (the whole process, not in-process).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "bench" / "peerbench"
sys.path.insert(0, str(HARNESS))

from runner import proc_cpu  # noqa: E402  (the harness's process-tree CPU, from /proc)

STAGES = ("prefix", "hygiene", "tracing")


def serve(port: int, backends: list[str], off: list[str]) -> None:
    """The gateway with `off` stages left out (run in a child process: `--serve`)."""
    import uvicorn

    sys.path.insert(0, str(ROOT))
    from app.config import Settings
    from app.proxy.gctune import tune_for_serving
    from app.server import PrefixgateApp, build_services
    from app.serving import uvicorn_config

    services = build_services(Settings(backends=[{"url": b} for b in backends]))
    for stage in off:
        setattr(services, stage, None)  # read once, when the app wires its pipeline
    app = PrefixgateApp(services)
    tune_for_serving()
    uvicorn.Server(uvicorn_config(app, "127.0.0.1", port)).run()


def _wait(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} never answered")


def stop(proc: subprocess.Popen) -> None:
    """Terminate a gateway, killed if it has not ended within 20 s."""
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _load(url: str, a: argparse.Namespace, *extra: str) -> dict:
    cmd = [sys.executable, str(HARNESS / "load_client.py"), "--url", url, "--warmup", "0",
           "--prompt-chars", str(a.size), *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    return json.loads(out[-1]) if out else {}


def measure(url: str, gateway: subprocess.Popen, a: argparse.Namespace) -> float:
    """Prime (each prompt of the pool once, one at a time), load `--warm` s, then the measured run."""
    _wait(url + "/health")
    _load(url, a, "--sweep", "-c", "1", "-t", "600")
    _load(url, a, "-c", str(a.conc), "-t", str(a.warm))
    c0 = proc_cpu(gateway.pid)
    result = _load(url, a, "-c", str(a.conc), "-t", str(a.seconds))
    cpu = proc_cpu(gateway.pid) - c0
    n = result.get("n_total_ok") or 0
    return 1000 * cpu / n if n else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--backend", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--off", default="", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warm", type=float, default=6.0, help="seconds of unmeasured load after priming")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="all,-prefix,-prefix-hygiene-tracing,py-relay")
    ap.add_argument("--routers-venv", default=None, help="run vllm-router round_robin too (its venv)")
    ap.add_argument("--port", type=int, default=18400)
    a = ap.parse_args(argv)
    if a.serve is not None:
        serve(a.serve, a.backend, [s for s in a.off.split(",") if s])
        return 0
    backends = [f"http://127.0.0.1:{a.port + 1 + i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(HARNESS / "fake_backend.py"), "--port", str(a.port + 1 + i)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    variants = a.variants.split(",") + (["vllm-router round_robin"] if a.routers_venv else [])
    rows: dict[str, list[float]] = {v: [] for v in variants}
    url = f"http://127.0.0.1:{a.port}"
    try:
        for _ in range(a.rounds):
            for variant in variants:
                if variant == "py-relay":
                    cmd = [sys.executable, str(ROOT / "bench" / "bare_relay.py"), "--port", str(a.port),
                           *[x for b in backends for x in ("--backend", b)]]
                elif variant.startswith("vllm-router"):
                    cmd = [os.path.join(a.routers_venv, "bin", "vllm-router"), "--host", "127.0.0.1", "--port",
                           str(a.port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(a.port + 99),
                           "--worker-urls", *backends, "--policy", "round_robin",
                           "--worker-startup-check-interval", "1"]
                else:
                    off = [s for s in STAGES if f"-{s}" in variant]
                    cmd = [sys.executable, __file__, "--serve", str(a.port), "--off", ",".join(off),
                           *[x for b in backends for x in ("--backend", b)]]
                gw = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    rows[variant].append(measure(url, gw, a))
                finally:
                    stop(gw)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    print(f"`{shlex.join(['python', 'bench/stage_cost.py', *(argv if argv is not None else sys.argv[1:])])}`\n")
    print(f"{a.size:,} B prompts, concurrency {a.conc}, {a.seconds:g} s measured per run, {a.rounds} rounds "
          "(interleaved); gateway process-tree CPU per request:\n")
    print("| variant | CPU / request, each round | median |")
    print("|---|---|---:|")
    for variant, values in rows.items():
        label = {"all": "all stages (default config)",
                 "py-relay": "py-relay (bench/bare_relay.py: no feature)"}.get(variant, variant)
        print(f"| {label} | {', '.join(f'{v:.2f}' for v in values)} ms | {statistics.median(values):.2f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
