"""Mid-stream migration under a rolling restart of a simulated fleet: how many streamed answers
are lost, and the pause a client sees when its replica goes away mid-answer.

    PYTHONPATH=$PWD python bench/migrate.py [--clients 12] [--rounds 2] [--no-migrate]

Three simulated replicas (real time: `decode_tps` tokens/s per request) behind an in-process
prefixgate with `routing.migrate_midstream` on; `clients` loops send streamed chat requests. A
"restart" of a replica aborts every request it holds (its streams end without their end marker:
the connection closes, as when the process dies) and answers 503 to new ones for `down_s`; the
replicas restart one after the other, `gap_s` apart, `rounds` times. A request is lost when its
stream did not reach `[DONE]` without an error event, or its text differs from the uninterrupted
answer (the simulator's answers are deterministic). The pause is each observation of the
gateway's `prefixgate_migration_pause_seconds` (tapped in-process: the last event relayed before
the break to the continuation's first relayed event, both stamped as the gateway hands them on).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from typing import Any

import aiohttp
import httpx
import orjson

from app.config import Settings
from app.server import create_app
from app.serving import ServerThread
from app.sim.testing import SimCluster

OUTPUT_TOKENS = 96


class _Tap:
    """The pause histogram, with every observation also kept (for exact percentiles)."""

    def __init__(self, histogram: Any, sink: list[float]) -> None:
        self.histogram, self.sink = histogram, sink

    def labels(self, *values: str) -> _Tap:
        return _Tap(self.histogram.labels(*values), self.sink)

    def observe(self, value: float) -> None:
        self.sink.append(value)
        self.histogram.observe(value)


async def client_loop(url: str, stop_at: float, index: int, results: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            body = {"model": "sim", "stream": True, "max_tokens": 512, "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": f"client {index} turn {n}: tell me about caches"}]}
            stamps: list[float] = []
            text, done, errors, usage = "", False, 0, None
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    if resp.status != 200:
                        results.append({"ok": False, "status": resp.status, "gaps": []})
                        await resp.read()
                        await asyncio.sleep(0.05)
                        continue
                    buf = b""
                    async for data in resp.content.iter_any():
                        buf += data
                        while b"\n\n" in buf:
                            event, buf = buf.split(b"\n\n", 1)
                            stamps.append(time.perf_counter())
                            payload = event[len(b"data: "):]
                            if payload == b"[DONE]":
                                done = True
                                continue
                            obj = orjson.loads(payload)
                            if "error" in obj:
                                errors += 1
                                continue
                            usage = obj.get("usage") or usage
                            for choice in obj.get("choices") or []:
                                text += choice["delta"].get("content") or ""
            except aiohttp.ClientError:
                pass
            gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
            results.append({"ok": done and errors == 0, "text": text, "usage": usage, "gaps": gaps, "status": 200})


def restart(sim: SimCluster, i: int, down_s: float) -> None:
    """Replica i goes away mid-answer: its requests are aborted (their connections close) and it
    answers 503 for `down_s`."""
    app, loop = sim.app(i), sim.servers[i].loop
    assert loop is not None

    async def go() -> None:
        engine = app.engine
        for req in [*engine.running, *engine.waiting]:
            engine.abort(req)

    httpx.post(sim.urls[i] + "/sim/faults", json={"mode": "error", "status": 503, "count": 10**6}, timeout=10)
    asyncio.run_coroutine_threadsafe(go(), loop).result(10)
    time.sleep(down_s)
    httpx.post(sim.urls[i] + "/sim/faults", json={"mode": "clear"}, timeout=10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decode-tps", type=float, default=40.0)
    ap.add_argument("--down-s", type=float, default=1.0)
    ap.add_argument("--gap-s", type=float, default=1.5)
    ap.add_argument("--no-migrate", action="store_true")
    args = ap.parse_args(argv)

    sim = SimCluster(replicas=3, time_scale=1.0, decode_tps=args.decode_tps, output_tokens=OUTPUT_TOKENS).start()
    settings = Settings(backends=[{"url": u, "name": f"r{i}"} for i, u in enumerate(sim.urls)],
                        routing={"health_interval_s": 3600,
                                 "migrate_midstream": {"enabled": not args.no_migrate, "max_attempts": 2}})
    app = create_app(settings)
    pauses: list[float] = []
    app.services.metrics.migration_pause = _Tap(app.services.metrics.migration_pause, pauses)
    server = ServerThread(app).start()
    results: list[dict[str, Any]] = []
    try:
        warm = 2.0
        duration = warm + args.rounds * 3 * (args.down_s + args.gap_s) + 4.0
        stop_at = time.monotonic() + duration

        async def load() -> None:
            await asyncio.gather(*(client_loop(server.url, stop_at, i, results) for i in range(args.clients)))

        t = threading.Thread(target=lambda: asyncio.run(load()), daemon=True)
        t.start()
        time.sleep(warm)
        for _ in range(args.rounds):
            for i in range(3):
                restart(sim, i, args.down_s)
                time.sleep(args.gap_s)
        t.join(duration + 60)
        metrics = app.services.metrics.render()[0].decode()
    finally:
        server.stop()
        sim.stop()

    texts = [r["text"] for r in results if r["ok"]]
    reference = max(set(texts), key=texts.count) if texts else None  # every answer is the same text
    streams = [r for r in results if r["status"] == 200]
    lost = [r for r in streams if not r["ok"] or r["text"] != reference]
    pauses.sort()
    migrations = {line.split(" ")[0]: line.split(" ")[1] for line in metrics.splitlines()
                  if line.startswith("prefixgate_migrations_total{")}
    cmd = "PYTHONPATH=$PWD python bench/migrate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: {cmd}")
    print(f"replicas 3, clients {args.clients}, decode {args.decode_tps:g} tok/s, answer {OUTPUT_TOKENS} tokens, "
          f"{args.rounds} rolling restarts (down {args.down_s:g} s, {args.gap_s:g} s apart), "
          f"migrate_midstream {'off' if args.no_migrate else 'on'}")
    print("| streams | lost | not 200 | migrated | pause p50 | pause p95 | pause max |")
    print("|---|---|---|---|---|---|---|")
    p50 = f"{statistics.median(pauses) * 1e3:.0f} ms" if pauses else "-"
    p95 = f"{pauses[min(len(pauses) - 1, int(0.95 * len(pauses)))] * 1e3:.0f} ms" if pauses else "-"
    pmax = f"{pauses[-1] * 1e3:.0f} ms" if pauses else "-"
    print(f"| {len(streams)} | {len(lost)} | {len(results) - len(streams)} | {len(pauses)} | {p50} | {p95} | {pmax} |")
    for name, value in sorted(migrations.items()):
        print(f"  {name} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
