"""Issue 16's table: prefixgate beside the Rust routers, on the shared peer harness (bench/peerbench/).

    .venv/bin/python bench/overhead.py --table [--reps 3] [--duration 6] [--workers 2] [--quick]
    (or: prefixgate bench overhead --table [...])

Two vLLM-shaped fake backends (35 SSE events, 20 ms to the first token), a closed-loop client
(prompts from a pool of 32, a unique suffix per request; one line of words each, or with
`--line-chars N` a line break every ~N characters, as documents have), every target measured beside `direct`
(the client spreading over the backends itself) in the same rounds, in rotated order. Targets:
vllm-router 0.1.17 round_robin and cache_aware, sglang-router 0.3.2 cache_aware (from
`.venv-routers`: `pip install sglang-router==0.3.2 vllm-router==0.1.17`, as bench/routing.py), and
prefixgate three times: the default config, what multi-pod users run (`cache_salt` on, Redis state,
a `rewrite` tenant, API keys), and the default config with `--workers` (default `auto`); and, on
request (`py_relay`), a Python relay without features on prefixgate's own server and client
(bench/bare_relay.py), the floor of its stack. With `--ref-tree`, the default config (`pg_ref`) and,
when `pg_mp` runs, the multi-pod config (`pg_mp_ref`, its own Redis namespace) of another checkout
in the same rounds. Prompt sizes 200 B / 100 KB / 1 MB; concurrency 1 / 16 / 128
(1 MB: 1 / 4, as the issue). Columns (medians over rounds; "added" = target - direct of the same
round): added TTFT p50, throughput vs direct, gateway CPU per request (from /proc, summed over the
target's whole process tree: workers, tokeniser processes), and the share of prefixgate's requests
fingerprinted exactly (its /metrics: a `prefixgate_fingerprint*` counter with a `mode` label,
and `prefixgate_fingerprint_deferred_total{outcome="completed"}`; "n/a" where the gateway exports
none).

The harness (client, backends) runs under `--harness-python` (needs uvloop, httptools, orjson;
default: the routers' venv, where `pip install uvloop httptools orjson` puts them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "bench" / "peerbench"
API_KEY = "sk-bench-team-a"
ADMIN_TOKEN = "bench-admin-token"
LABELS = {"direct": "direct", "vl_rr": "vllm-router 0.1.17 round_robin", "vl_ca": "vllm-router 0.1.17 cache_aware",
          "sg_ca": "sglang-router 0.3.2 cache_aware", "pg": "prefixgate (default config)",
          "pg_mp": "prefixgate, multi-pod (salt, Redis, rewrite tenant, API keys)",
          "pg_w": "prefixgate (default config, --workers)",
          "pg_ref": "prefixgate (default config) at --ref-tree",
          "pg_mp_ref": "prefixgate, multi-pod, at --ref-tree",
          "py_relay": "Python relay without features (prefixgate's server and client; bench/bare_relay.py)"}
COMPLETED = "approx, completed after the response"  # probe's key for the deferred counter
GROUPS = ((200, "1,16,128"), (100_000, "1,16,128"), (1_000_000, "1,4"))


def probe(url: str, token: str | None) -> None:
    """Print {mode: requests} from a gateway's fingerprint-mode counter (nothing if absent)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"authorization": f"Bearer {token}"} if token else {}
    out: dict[str, float] = {}
    try:
        text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    except httpx.HTTPError:
        print("{}")
        return
    for family in text_string_to_metric_families(text):
        if family.name.startswith("prefixgate_fingerprint") and family.type == "counter":
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                if "mode" in sample.labels:
                    out[sample.labels["mode"]] = out.get(sample.labels["mode"], 0.0) + sample.value
                elif sample.labels.get("outcome") == "completed":  # prefixgate_fingerprint_deferred_total
                    out[COMPLETED] = out.get(COMPLETED, 0.0) + sample.value
    print(json.dumps(out))


def exact_share(runs: list[dict]) -> str:
    """Requests fingerprinted exactly over all fingerprinted, in these runs, as two shares: exact
    when routed (mode `exact`), and exact in the end (any mode but `approx`, and the `approx` ones
    whose chain was completed after the response: a `pending` chain is completed exactly after
    routing, so its prediction and continuity are exact, its pick was not)."""
    routed = exact = total = 0.0
    seen = False
    for r in runs:
        before, after = r.get("probe_before"), r.get("probe_after")
        if not before and not after:
            continue
        seen = True
        for mode, value in (after or {}).items():
            delta = value - (before or {}).get(mode, 0.0)
            if mode == COMPLETED:
                exact += delta
                continue
            total += delta
            exact += 0.0 if mode == "approx" else delta
            routed += delta if mode == "exact" else 0.0
    if not seen or total <= 0:
        return "n/a"
    return f"{routed / total * 100:.1f}% / {exact / total * 100:.1f}%"


def _med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(jsonl: str, command: str, notes: list[str] | None = None) -> str:
    runs = [json.loads(line) for line in open(jsonl) if '"type": "run"' in line]
    rounds: dict[tuple[int, int, int], dict[str, dict]] = defaultdict(dict)
    for r in runs:
        rounds[(r["prompt_chars"], r["concurrency"], r["rep"])][r["target"]] = r
    cells: dict[tuple[int, int, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for (size, conc, _), targets in rounds.items():
        base = targets.get("direct")
        for name, r in targets.items():
            cell = cells[(size, conc, name)]
            cell["runs"].append(r)
            ok = r.get("n_total_ok") or 0
            cell["err"].append((r.get("errors") or 0) + (r.get("bad_event_count") or 0))
            if r.get("router_cpu_s") is not None and ok:
                cell["cpu"].append(r["router_cpu_s"] / ok * 1000)
            if base and r.get("ttft_p50_ms") is not None and base.get("ttft_p50_ms") is not None and name != "direct":
                cell["add"].append(r["ttft_p50_ms"] - base["ttft_p50_ms"])
                cell["add99"].append(r["ttft_p99_ms"] - base["ttft_p99_ms"])
                cell["ratio"].append(r["rps"] / base["rps"] if base.get("rps") else None)
            cell["ttft"].append(r.get("ttft_p50_ms"))
            cell["rps"].append(r.get("rps"))
    lines = [f"command: {command}", "",
             "| prompt | conc | target | TTFT p50 | added TTFT p50 | added p99 | throughput vs direct | req/s "
             "| gateway CPU / req | exact fingerprints (routed / in the end) | errors |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = list(LABELS)
    for size, conc, name in sorted(cells, key=lambda k: (k[0], k[1], order.index(k[2]) if k[2] in order else 99)):
        c = cells[(size, conc, name)]
        prompt = f"{size} B" if size < 1000 else (f"{size // 1000} KB" if size < 1_000_000 else f"{size // 1_000_000} MB")
        add, add99, ratio, cpu = _med(c["add"]), _med(c["add99"]), _med(c["ratio"]), _med(c["cpu"])
        ttft, rps = _med(c["ttft"]), _med(c["rps"])
        share = exact_share(c["runs"]) if name.startswith("pg") else "-"
        lines.append(
            f"| {prompt} | {conc} | {LABELS.get(name, name)} | {ttft:.1f} ms | "
            + ("-" if name == "direct" or add is None else f"{add:+.1f} ms") + " | "
            + ("-" if name == "direct" or add99 is None else f"{add99:+.1f} ms") + " | "
            + ("-" if name == "direct" or ratio is None else f"{ratio:.2f}") + f" | {rps:.0f} | "
            + ("-" if cpu is None else f"{cpu:.2f} ms") + f" | {share} | {sum(c['err'])} |")
    lines += ["", f"{len({k[2] for k in rounds})} rounds per cell; medians over rounds; gateway CPU = utime+stime of "
              "the target's process tree during the run / requests", *(notes or [])]
    return "\n".join(lines)


def _has_fast_io(py: str) -> bool:
    return subprocess.run([py, "-c", "import uvloop, httptools"], capture_output=True).returncode == 0


def _fast_io_path(py: str, venv: str) -> str:
    """`:DIR` with uvloop and httptools for the gateway when its own environment lacks them.

    `pip install prefixgate` installs `uvicorn[standard]` (uvloop + httptools), which is what
    production runs; a dev venv may not have them, and asyncio + h11 would then be measured
    instead. They are taken from the routers' venv (same Python) through a directory of links."""
    if _has_fast_io(py):
        return ""
    site = next(Path(venv, "lib").glob("python3*/site-packages"), None)
    if site is None or not (site / "uvloop").is_dir() or not (site / "httptools").is_dir():
        print("note: prefixgate runs on asyncio + h11 (no uvloop/httptools found)", file=sys.stderr)
        return ""
    links = Path(tempfile.mkdtemp(prefix="prefixgate-fastio-"))
    for name in ("uvloop", "httptools"):
        (links / name).symlink_to(site / name)
    return f":{links}"


def _port_base() -> int:
    """A base port with base..base+201 free on loopback (the runner numbers its ports from it), so
    this run never collides with another harness on a shared machine."""
    import random
    import socket

    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(20000, 60000, 10)
        try:
            socks = []
            for port in range(base, base + 202):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free port range")


def gateway_command(py: str, workers: int, config: str | None, env: str = "") -> str:
    cmd = f"{env}{shlex.quote(py)} -m app.cli serve --host 127.0.0.1 --port {{port}} --backend {{w1}} --backend {{w2}} " \
          f"--log-level warning --workers {workers}"
    return cmd + (f" --config {shlex.quote(config)}" if config else "")


def multipod_config(path: str, redis_url: str, namespace: str = "prefixgate") -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump({
        "state": redis_url, "state_options": {"namespace": namespace},
        "tenants": {"api_keys": {API_KEY: "team-a"}, "overrides": {"team-a": {"policy": "rewrite"}},
                    "cache_salt": {"enabled": True}},
    }))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--duration-c1", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--workers", default="auto", help="--workers of the pg_w target (N or auto)")
    ap.add_argument("--targets", default="direct,vl_rr,vl_ca,sg_ca,pg,pg_mp,pg_w")
    ap.add_argument("--ref-tree", default=None,
                    help="another checkout of prefixgate (e.g. `git archive` of main) run as the pg_ref target "
                         "in the same rounds: a before/after measured under the same machine noise")
    ap.add_argument("--prime", action="store_true",
                    help="before each measured run, every prompt of its pool once, unmeasured (the runner's --prime): "
                         "the requests measured are over heads the gateway has seen, not their first sighting")
    ap.add_argument("--sizes", default="200,100000,1000000")
    ap.add_argument("--line-chars", type=int, default=0,
                    help="prompts with a line break every ~N characters, as documents have (0: one line, the harness's default)")
    ap.add_argument("--conc", default=None, help="concurrencies for every size (default: the issue's per size)")
    ap.add_argument("--routers-venv", default=os.environ.get("ROUTERS_VENV", str(ROOT / ".venv-routers")))
    ap.add_argument("--harness-python", default=None, help="default: the routers' venv python")
    ap.add_argument("--out", default=None, help="JSONL of every run (default: a temporary file)")
    ap.add_argument("--probe-url", help=argparse.SUPPRESS)
    ap.add_argument("--probe-token", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.probe_url:
        probe(a.probe_url, a.probe_token)
        return 0
    from tests.redis_server import RedisServer

    names = a.targets.split(",")
    base = _port_base()
    harness_py = a.harness_python or os.path.join(a.routers_venv, "bin", "python")
    out = a.out or tempfile.mkstemp(prefix="prefixgate-overhead-", suffix=".jsonl")[1]
    py = sys.executable
    me = f"{shlex.quote(py)} {shlex.quote(str(Path(__file__)))}"
    redis = RedisServer().start() if "pg_mp" in names else None
    cfg = tempfile.mkstemp(prefix="prefixgate-multipod-", suffix=".yaml")[1]
    cfg_ref = tempfile.mkstemp(prefix="prefixgate-multipod-ref-", suffix=".yaml")[1]
    try:
        extra: list[str] = []
        probes: list[str] = []
        fast_io = _fast_io_path(py, a.routers_venv)
        env = f"env PYTHONPATH={shlex.quote(str(ROOT) + fast_io)} "
        mp_vars = f"PREFIXGATE_SALT_SECRET=bench-salt-secret-0123456789abcdef PREFIXGATE_ADMIN_TOKEN={ADMIN_TOKEN} "
        mp_env = env + mp_vars
        if redis is not None:
            multipod_config(cfg, redis.url)
            multipod_config(cfg_ref, redis.url, namespace="prefixgate-ref")
        gateways = {"pg": ("1", None, env, ""), "pg_mp": ("1", cfg, mp_env, f" --probe-token {ADMIN_TOKEN}"),
                    "pg_w": (a.workers, None, env, "")}
        if a.ref_tree:
            if "pg_ref" not in names:
                names.append("pg_ref")
            ref = str(Path(a.ref_tree).resolve())  # `python -m` imports from the working directory first
            ref_env = f"env -C {shlex.quote(ref)} PYTHONPATH={shlex.quote(ref + fast_io)} "
            gateways["pg_ref"] = ("1", None, ref_env, "")
            if "pg_mp" in names:  # the multi-pod config at the reference too (its own Redis namespace)
                names.append("pg_mp_ref")
                gateways["pg_mp_ref"] = ("1", cfg_ref, ref_env + mp_vars,
                                         f" --probe-token {ADMIN_TOKEN}")
        for name, (workers, config, gw_env, token) in gateways.items():
            if name in names:  # the runner numbers add-targets from port_base+50, in this order
                port = base + 50 + len(extra) // 2
                extra += ["--add-target", f"{name}|" + gateway_command(py, workers, config, gw_env)]
                probes += ["--probe", f"{name}|{me} --probe-url http://127.0.0.1:{port}{token}"]
        if "py_relay" in names:  # no fingerprint counter to probe
            relay = ROOT / "bench" / "bare_relay.py"
            extra += ["--add-target", f"py_relay|{env}{shlex.quote(py)} {shlex.quote(str(relay))} --port {{port}} "
                                      "--backend {w1} --backend {w2}"]
        builtin = ",".join(n for n in names if n not in gateways and n != "py_relay")
        for size in [int(s) for s in a.sizes.split(",")]:
            conc = a.conc or dict(GROUPS).get(size, "1,16,128")
            cmd = [harness_py, str(HARNESS / "runner.py"), "--router-bin", os.path.join(a.routers_venv, "bin"),
                   "--out", out, "--tag", "overhead", "--reps", str(a.reps), "--targets", builtin,
                   "--conc", conc, "--prompt-chars", str(size), "--duration", str(a.duration),
                   "--duration-c1", str(a.duration_c1), "--warmup", str(a.warmup), "--pause", str(a.pause),
                   "--port-base", str(base), "--backend-ports", f"{base + 200},{base + 201}",
                   "--logdir", os.path.join(tempfile.gettempdir(), "prefixgate-overhead-logs"),
                   "--header", f"authorization: Bearer {API_KEY}", *extra, *probes,
                   *(["--prime"] if a.prime else []), *(["--line-chars", str(a.line_chars)] if a.line_chars else [])]
            print("running:", shlex.join(cmd), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=sys.stderr)
    finally:
        if redis is not None:
            redis.stop()
        os.unlink(cfg)
        os.unlink(cfg_ref)
    notes = [f"prefixgate: one process, except the --workers row ({a.workers}); HTTP stack: "
             + ("uvloop + httptools" + (" (linked from the routers' venv)" if fast_io else "")
                if fast_io or _has_fast_io(py) else "asyncio + h11"),
             "exact fingerprints: n/a = the gateway exports no per-request fingerprint-mode counter",
             *([f"prompts: a line break every ~{a.line_chars} characters"] if a.line_chars else []),
             *(["primed: before each measured run, every target got each prompt of that run's pool once, one at a time "
                "(unmeasured); the CPU is that of requests over heads already seen"] if a.prime else
               ["not primed: each round's pool (seed 1000 + round) is new to the targets, so its heads' "
                "first sightings are inside the measured runs"])]
    print(table(out, "python bench/overhead.py --table " + shlex.join(argv), notes))
    print(f"\n(runs: {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
