"""CPU of the prefix stage per request, warm head (issue 16, the fingerprint half).

    .venv/bin/python bench/fingerprint_cpu.py [--sizes 200,100000,1000000] [--n 40] [--pool 4] [--line-chars 0]

The benchmark's request shape (bench/peerbench/load_client.py): a system prompt and a user message
of `size` characters of words on one line (`--line-chars N`: a line break after every ~N
characters instead, as a document has), drawn from a pool of `--pool` prompts, plus a unique
suffix per request, all from one tenant. Each head is sent twice first (warm). Then for `--n`
requests it measures process CPU (every thread: the worker threads' tokenising and hashing, the
diagnosis executor; and the cold-prompt pool's processes, none of which runs when warm) from
`before_route` to the end of the after-response work (`drain`): render, split, memo walk,
tail tokenising, block hashing, prediction, residency write, continuity and diagnosis. The relay,
the HTTP parsing and the router are not in it (bench/overhead.py measures the whole gateway).
`break diagnosed`: the share of the measured requests whose break the tenant tracker diagnosed
(in this shape a new question about one of the pool's documents: a new conversation each time),
and what those diagnoses cost a request (their CPU on their own threads' clocks, included in the
stage's CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "peerbench"))

from app.config import Settings  # noqa: E402
from app.dialects import CHAT  # noqa: E402
from app.proxy.context import Arrival, RequestContext, Timings  # noqa: E402
from app.server import build_services  # noqa: E402


def _prompt(rng: random.Random, chars: int, line_chars: int = 0) -> str:
    from load_client import make_prompt  # the peer harness's own prompt generator
    return make_prompt(rng, chars, line_chars)


def _ctx(i: int, content: str) -> RequestContext:
    body = {"model": "m", "stream": True, "messages": [
        {"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": content}]}
    ctx = RequestContext(Arrival(request_id=f"r-{i}", dialect=CHAT, path="/v1/chat/completions", tenant="default",
                         headers={}, body=body, model="m", stream=True), Timings(arrival=time.perf_counter()))
    return ctx


def _tree_cpu(start: bool = False) -> float:
    """This process (all threads) plus its children (the cold-prompt pool), in seconds. Reading
    the children's /proc files costs ~0.1-0.2 ms of this process's CPU: a `start` mark reads them
    before the process clock, an end mark after it, so a measured interval does not include them."""
    if start:
        children = _children_cpu()
        return time.process_time() + children  # every thread, ns resolution
    own = time.process_time()
    return own + _children_cpu()


def _children_cpu() -> float:
    total = 0.0
    for child in _children(os.getpid()):
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    """Every thread's children (the pool is spawned from a worker thread, not the main one)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        pass
    return out


async def one(stage, services, i: int, content: str) -> float:
    """One request through the stage; returns the CPU of its routing-time part (before_route)."""
    ctx = _ctx(i, content)
    c0 = time.process_time()
    await stage.before_route(ctx)
    routed = time.process_time() - c0
    replica = services.replicas.all()[0]
    ctx.decision = SimpleNamespace(replica=replica, matched_blocks=0, available_blocks=0, reason="bench")
    ctx.timings.upstream_sent = time.perf_counter()
    ctx.result.answered(200)
    n = ctx.fingerprint.num_tokens if ctx.fingerprint is not None and ctx.fingerprint.num_tokens else 1
    ctx.result.observed({"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12},
                        "The answer is forty-two, as computed from the document above.")
    stage.after_response(ctx)
    await stage.drain()
    return routed


async def run(sizes: list[int], n: int, pool: int,
              line_chars: int = 0) -> list[tuple[int, float, float, float, str, str, float]]:
    services = build_services(Settings(backends=[{"url": "http://127.0.0.1:9"}]))
    stage = services.prefix
    await services.store.start()
    rng = random.Random(1)
    out = []
    seq = 0
    try:
        for size in sizes:
            prompts = [_prompt(rng, size, line_chars) for _ in range(pool)]
            for k in range(pool):  # warm every head (the first is cold: tokenised whole)
                for _ in range(2):
                    seq += 1
                    await one(stage, services, seq, f"{prompts[k]} [q{seq}]")
            before = {m: stage.metrics.fingerprint_requests.labels(m)._value.get() for m in ("exact", "pending", "approx")}
            diagnosed, diagnosing = stage.tracker.diagnoses, sum(stage.tracker.diagnosis_cpu_s.values())
            samples, routing = [], []
            for i in range(n):
                seq += 1
                c0 = _tree_cpu(start=True)
                routing.append(await one(stage, services, seq, f"{prompts[i % pool]} [q{seq}]"))
                samples.append(_tree_cpu() - c0)
            modes = {m: stage.metrics.fingerprint_requests.labels(m)._value.get() - before[m] for m in before}
            exact = 100.0 * modes["exact"] / max(1, sum(modes.values()))
            out.append((size, statistics.mean(samples), statistics.median(samples),
                        statistics.median(routing), f"{exact:.0f}%",
                        f"{100.0 * (stage.tracker.diagnoses - diagnosed) / n:.0f}%",
                        (sum(stage.tracker.diagnosis_cpu_s.values()) - diagnosing) / n))
    finally:
        stage.shutdown()
        await services.store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="200,100000,1000000")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--line-chars", type=int, default=0, help="a line break every ~N characters (0: one line)")
    a = ap.parse_args(argv)
    rows = asyncio.run(run([int(s) for s in a.sizes.split(",")], a.n, a.pool, a.line_chars))
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    print("| prompt (head seen before) | prefix-stage CPU / request, mean | median | of which before routing, median "
          "| exact on the hot path | break diagnosed | of which diagnosing, mean |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for size, mean, med, routed, exact, diagnosed, diagnosing in rows:
        print(f"| {size:,} B | {1000 * mean:.2f} ms | {1000 * med:.2f} ms | {1000 * routed:.2f} ms | {exact} "
              f"| {diagnosed} | {1000 * diagnosing:.2f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
