"""Proxy overhead: the simulator at --time-scale 0 behind prefixgate vs the same simulator direct.

    .venv/bin/python bench/overhead.py [--rounds 3] [--quick] [--policy round_robin] [--core-only]
        [--only short:128 ...] [--py-spy profile.txt]
    (or: prefixgate bench overhead [...])
    .venv/bin/python bench/overhead.py --table [...]   issue 16's table beside vllm-router and
        sglang-router on the shared peer harness (bench/peer_table.py)

Streaming chat requests (~35 SSE events each) at concurrency 1/16/128 with short prompts, and
~1 MB prompts at concurrency 1/16. The simulator and the proxy run as separate processes (as in
production); this process is the load generator (aiohttp). Direct and proxied runs alternate in
rounds so machine noise hits both alike. Reported: client-side TTFT (request start to the first
content chunk) p50/p99 per path, the added TTFT (proxy minus direct, per percentile) and the
throughput ratio (proxied requests/s over direct requests/s).

Targets (issue 3): added TTFT p50 <= 1 ms and p99 <= 5 ms at concurrency 16; throughput >= 0.8x
direct at 128; the 1 MB prompt adds <= 2 ms at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from app.serving import free_port  # noqa: E402

CONTENT_MARK = b'"delta":{"content":"'

# `prefixgate serve` minus the pipeline's stages (hygiene, prefix, tracing), for --core-only
CORE_ONLY = """
import sys
import uvicorn
from app.config import Settings
from app.proxy.gctune import tune_for_serving
from app.server import PrefixgateApp, build_services
from app.serving import uvicorn_config
backend, port, policy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = Settings(backends=[{"url": backend}], **({"routing": {"policy": policy}} if policy else {}))
services = build_services(settings)
services.hygiene = services.prefix = services.tracing = None  # read once, when the app wires its pipeline
app = PrefixgateApp(services)
tune_for_serving()
uvicorn.Server(uvicorn_config(app, "127.0.0.1", port)).run()
"""


@dataclass
class Case:
    name: str
    prompt_bytes: int
    concurrency: int
    requests: int


@dataclass
class Result:
    ttfts: list[float]
    wall: float
    errors: int
    cpu_s: float = 0.0  # CPU time of the proxy process during the proxied runs
    overhead: list[tuple[float, float]] | None = None  # delta of prefixgate_proxy_overhead_seconds
    reads: float = float("nan")  # relayed upstream reads carrying content, per request (proxy's metrics)

    @property
    def rps(self) -> float:
        return len(self.ttfts) / self.wall if self.wall > 0 else 0.0


def cpu_seconds(pid: int | None) -> float:
    """user+system CPU time of a process and its live descendants (all threads: workers, the
    cold-prompt tokeniser pool) plus its reaped children, from /proc; 0 where unavailable."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        children = []
        for task in os.listdir(f"/proc/{pid}/task"):  # a child belongs to the thread that forked it
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
    except OSError:
        return 0.0
    own = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(c) for c in children)


def overhead_buckets(proxied: str) -> dict[float, float]:
    """Cumulative buckets of the proxy's own `prefixgate_proxy_overhead_seconds` histogram, plus
    the counts of TTFT and inter-token observations under the keys -1 and -2 (content reads)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[float, float] = {TTFT_COUNT: 0.0, GAP_COUNT: 0.0}
    for family in text_string_to_metric_families(httpx.get(proxied + "/metrics", timeout=10).text):
        if family.name == "prefixgate_proxy_overhead_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[float(sample.labels["le"])] = sample.value
        for name, key in (("prefixgate_ttft_seconds", TTFT_COUNT), ("prefixgate_inter_token_seconds", GAP_COUNT)):
            if family.name == name:
                out[key] += sum(s.value for s in family.samples if s.name.endswith("_count"))
    return out


TTFT_COUNT, GAP_COUNT = -1.0, -2.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def make_body(prompt_bytes: int, i: int) -> bytes:
    unit = f"request {i}: the quick brown fox jumps over the lazy dog. "
    text = (unit * (prompt_bytes // len(unit) + 1))[:prompt_bytes]
    return orjson.dumps({"model": "sim", "messages": [{"role": "user", "content": text}], "max_tokens": 32,
                         "ignore_eos": True, "stream": True})


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> float | None:
    start = time.perf_counter()
    ttft = None
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        if resp.status != 200:
            await resp.read()
            return None
        async for data in resp.content.iter_any():
            if ttft is None and CONTENT_MARK in data:
                ttft = time.perf_counter() - start
    return ttft


async def run_case(base: str, case: Case, bodies: list[bytes]) -> Result:
    url = base + "/v1/chat/completions"
    ttfts: list[float] = []
    errors = 0
    queue = list(range(case.requests))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one(session, url, bodies[0])  # warm the connection(s)

        async def worker() -> None:
            nonlocal errors
            while queue:
                i = queue.pop()
                try:
                    t = await one(session, url, bodies[i % len(bodies)])
                except aiohttp.ClientError:
                    t = None
                if t is None:
                    errors += 1
                else:
                    ttfts.append(t)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(case.concurrency)))
        wall = time.perf_counter() - start
    return Result(ttfts, wall, errors)


def wait_ready(url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout}s")


def start(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cases(quick: bool, only: list[str] | None = None) -> list[Case]:
    """The benchmark's cases; `only` keeps those named `short:128` / `1MB:16` (prompt:concurrency)."""
    scale = 0.25 if quick else 1.0
    mb = 1024 * 1024
    every = [
        Case("short", 200, 1, int(200 * scale)),
        Case("short", 200, 16, int(800 * scale)),
        Case("short", 200, 128, int(2048 * scale)),
        Case("1 MB", mb, 1, int(20 * scale) or 4),
        Case("1 MB", mb, 16, int(48 * scale) or 16),
    ]
    if not only:
        return every
    keys = {k.replace(" ", "").lower() for k in only}
    return [c for c in every if f"{c.name.replace(' ', '').lower()}:{c.concurrency}" in keys]


async def measure(direct: str, proxied: str, rounds: int, quick: bool,
                  proxy_pid: int | None = None, only: list[str] | None = None) -> list[tuple[Case, Result, Result]]:
    rows = []
    for case in cases(quick, only):
        per_round = max(1, case.requests // rounds)
        bodies = [make_body(case.prompt_bytes, i) for i in range(min(per_round, 64))]
        d_all, p_all = Result([], 0.0, 0), Result([], 0.0, 0)
        sub = Case(case.name, case.prompt_bytes, case.concurrency, per_round)
        # one unmeasured pass over the bodies: whichever path ran first would otherwise pay the
        # simulator's cold prefix cache and tokenisation (1 MB: ~0.5 s per body) alone
        await run_case(direct, Case(case.name, case.prompt_bytes, min(case.concurrency, 8), len(bodies)), bodies)
        before = overhead_buckets(proxied)
        for r in range(rounds):
            order = [(direct, d_all), (proxied, p_all)] if r % 2 == 0 else [(proxied, p_all), (direct, d_all)]
            for base, acc in order:
                cpu0 = cpu_seconds(proxy_pid)
                res = await run_case(base, sub, bodies)
                if acc is p_all:
                    acc.cpu_s += cpu_seconds(proxy_pid) - cpu0
                acc.ttfts += res.ttfts
                acc.wall += res.wall
                acc.errors += res.errors
        after = overhead_buckets(proxied)
        firsts = after.pop(TTFT_COUNT) - before.pop(TTFT_COUNT)
        gaps = after.pop(GAP_COUNT) - before.pop(GAP_COUNT)
        p_all.reads = 1 + gaps / firsts if firsts else float("nan")
        p_all.overhead = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
        rows.append((case, d_all, p_all))
        print(f"  done: {case.name} x{case.concurrency}", file=sys.stderr, flush=True)
    return rows


def _q(buckets: list[tuple[float, float]] | None, q: float) -> str:
    from app.demo import histogram_quantile

    value = histogram_quantile(q, buckets or [])
    return "-" if value is None else f"{value * 1000:.2f} ms"


def table(rows: list[tuple[Case, Result, Result]], command: str) -> str:
    head = ("| prompt | conc | requests | direct TTFT p50 / p99 | proxied TTFT p50 / p99 | added p50 | added p99 "
            "| direct req/s | proxied req/s | throughput ratio | proxy CPU / req | proxy overhead p50 / p99 "
            "| content reads / req | errors |")
    lines = [f"command: {command}", "", head, "|" + "---|" * 14]
    for case, d, p in rows:
        ms = 1000.0
        lines.append(
            f"| {case.name} | {case.concurrency} | {len(p.ttfts)} "
            f"| {pct(d.ttfts, .5) * ms:.2f} / {pct(d.ttfts, .99) * ms:.2f} ms "
            f"| {pct(p.ttfts, .5) * ms:.2f} / {pct(p.ttfts, .99) * ms:.2f} ms "
            f"| {(pct(p.ttfts, .5) - pct(d.ttfts, .5)) * ms:+.2f} ms "
            f"| {(pct(p.ttfts, .99) - pct(d.ttfts, .99)) * ms:+.2f} ms "
            f"| {d.rps:.0f} | {p.rps:.0f} | {p.rps / d.rps if d.rps else float('nan'):.2f}x "
            f"| {p.cpu_s / max(1, len(p.ttfts)) * ms:.2f} ms "
            f"| {_q(p.overhead, .5)} / {_q(p.overhead, .99)} | {p.reads:.1f} | {d.errors}/{p.errors} |")
    lines.append("")
    lines.append("proxy overhead = the proxy's own histogram (arrival -> upstream request sent), "
                 "interpolated within its buckets; proxy CPU = the proxy process's CPU time / requests; "
                 "content reads = upstream reads carrying tokens per request (1 + inter-token gaps / TTFTs; "
                 "max_tokens=32: fewer reads means events arrived together and went out in one read and one send)")
    lines.append("targets: added p50 <= 1 ms and p99 <= 5 ms at conc 16; ratio >= 0.8x at 128; 1 MB adds <= 2 ms p50")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    if "--table" in argv:  # issue 16's table beside the Rust routers: bench/peer_table.py
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from peer_table import main as table_main

        argv.remove("--table")
        return table_main(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--policy", default=None, help="proxy routing policy (default: the config default)")
    parser.add_argument("--core-only", action="store_true",
                        help="run the proxy without its request hooks (hygiene, fingerprint, tracing): "
                             "the relay core's own cost")
    parser.add_argument("--only", action="append", metavar="PROMPT:CONC",
                        help="run only these cases, e.g. --only short:128 --only 1MB:16")
    parser.add_argument("--py-spy", metavar="FILE",
                        help="sample the proxy process with py-spy (installed separately) during the "
                             "run and write collapsed stacks to FILE (--format raw)")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    py = sys.executable
    sim_port, proxy_port = free_port(), free_port()
    sim = start([py, "-m", "app.cli", "sim", "--replicas", "1", "--port", str(sim_port), "--time-scale", "0",
                 "--max-model-len", "4000000", "--max-num-seqs", "1024", "--kv-blocks", "400000"])
    proxy = spy = None
    try:
        direct = f"http://127.0.0.1:{sim_port}"
        wait_ready(direct + "/health")
        serve = [py, "-m", "app.cli", "serve", "--backend", direct, "--host", "127.0.0.1", "--port",
                 str(proxy_port), "--log-level", "warning"]
        if args.policy:
            serve += ["--policy", args.policy]
        if args.core_only:
            serve = [py, "-c", CORE_ONLY, direct, str(proxy_port), args.policy or ""]
        proxy = start(serve)
        proxied = f"http://127.0.0.1:{proxy_port}"
        wait_ready(proxied + "/readyz")
        if args.py_spy:
            spy = subprocess.Popen([os.path.join(os.path.dirname(py), "py-spy"), "record", "--format", "raw",
                                    "--rate", "250", "--nonblocking", "-o", args.py_spy, "--pid", str(proxy.pid)],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = asyncio.run(measure(direct, proxied, args.rounds, args.quick, proxy.pid, args.only))
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        if proxy is not None:
            stop(proxy)
        stop(sim)
    command = "python bench/overhead.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(table(rows, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
