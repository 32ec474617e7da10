"""Event-loop stalls of the proxy under long prompts: who blocks the relay, and for how long.

    .venv/bin/python bench/loop_stalls.py [--long-kb 200,400,600,800] [--turns 6] [--concurrency 16]

The proxy (app.server.create_app in an app.serving.ServerThread, uvloop) runs in this process and
nothing else does: the simulated replicas (app.sim.testing.SimCluster, time_scale 0, so the engine
adds ~nothing) and the load generator run in child processes, so their CPU work never holds this
process's GIL. Load: `--concurrency` clients; one per long tenant runs a multi-turn chat over a
~200-800 KB system prompt, the others send short streamed chats until the long tenants finish.

Two probes watch the proxy's event loop:
- a heartbeat task sleeps 1 ms at a time and records how late it wakes (the loop lag every other
  stream's relay sees; libuv timers tick in whole milliseconds, so ~1 ms is the noise floor);
- a watchdog thread polls every 0.5 ms; while the heartbeat is overdue by more than
  `--threshold-ms` it samples (every 1 ms) the loop thread's Python stack, every thread's on-CPU
  time (/proc/self/task/*/schedstat) and the loop thread's system call. A stall with the loop on
  CPU is attributed to the innermost `app/` frame (and the outermost `app/` coroutine it runs
  in); one with the loop off CPU to the busiest other Python thread ("GIL held by ...") or, when
  none was busy, to the loop thread's system call. Collector pauses come from gc.callbacks.
`--debug` also turns on asyncio debug mode (slow_callback_duration 2 ms) and tallies uvloop's
"Executing <handle> took X seconds" warnings by handle.

The table prints loop lag p50/p99/max, the stalls over the threshold, those with the loop busy
in app/prefix or app/state, collector pauses, the short requests' client-side TTFT, and the top
stall sites. Attribution is approximate: schedstat CPU time updates at scheduler ticks, so a
short stall of a running loop can read as "off-CPU ... running".

Measured (16-core machine, otherwise idle; defaults: 4 long tenants of 200-800 KB x 6 turns, 12
short clients; "before" = the tree before the after-response perf fix, run as a copy of that tree
with this script, interleaved with "after"; mean of 2 runs each, worst stall over both):

| tree | loop lag p99 ms | stalls > 2 ms | stalled ms | prefix/state stalls per run (worst ms) | short TTFT p50 / p99 ms |
|---|---:|---:|---:|---:|---:|
| before | 13.5 | 77 | 517 | 21 (35.2) | 59 / 260 |
| after | 11.0 | 41 | 252 | 0.5 (2.5) | 55 / 223 |

Earlier sessions (3 + 5 pairs) agree: prefix/state stalls 17-24 per run before, 0-1 after; p99
-25 to -30 %. What is left on the loop is outside app/prefix and app/state: tokens.py's
`Encoding.ids` list of a 300k-token segment (12-36 ms with the GIL, in a worker thread),
C-level uvloop/aiohttp work with no Python frame, the heartbeat's own timer while idle
(epoll_pwait), gen-0/1 collections (<= 3 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import multiprocessing as mp
import os
import random
import re
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

APP_DIR = os.path.join(ROOT, "app") + os.sep
PREFIX_STATE = re.compile(r"app/(prefix|state)/|app/pipeline/prefix_stage|PrefixStage|TenantTracker")
WORDS = ("alpha beta gamma delta epsilon policy refund shipping carrier invoice ledger account "
         "customer ticket status escalate warehouse parcel route region tariff clause section "
         "appendix schedule priority").split()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---------------------------------------------------------------- child: simulated replicas
def _sim_main(conn: Any, replicas: int, kv_blocks: int) -> None:
    from app.sim.testing import SimCluster

    with SimCluster(replicas=replicas, time_scale=0.0, kv_blocks=kv_blocks, max_model_len=1_000_000,
                    max_batch_tokens=1_000_000) as sim:
        conn.send(sim.urls)
        conn.recv()  # any message: stop


# ---------------------------------------------------------------- child: load generator
def system_prompt(kb: int, seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < kb * 1024:
        line = f"{len(lines)}. " + " ".join(rng.choice(WORDS) for _ in range(14)) + ".\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)


async def _stream(session: Any, body: dict, tenant: str) -> tuple[float, str, int]:
    """(TTFT ms, generated text, status) of one streamed chat completion."""
    import orjson

    t0 = time.perf_counter()
    ttft = float("nan")
    text: list[str] = []
    async with session.post("/v1/chat/completions", data=orjson.dumps(body),
                            headers={"x-tenant-id": tenant, "content-type": "application/json"}) as r:
        if r.status != 200:
            await r.read()
            return ttft, "", r.status
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if not text:
                        ttft = (time.perf_counter() - t0) * 1000
                    text.append(piece)
    return ttft, "".join(text), 200


async def _drive(url: str, long_kb: list[int], turns: int, concurrency: int) -> dict[str, Any]:
    import aiohttp

    out: dict[str, Any] = {"short_ttft": [], "long_ttft": [], "failed": 0, "short": 0, "long": 0}
    done = asyncio.Event()
    systems = [system_prompt(kb, i) for i, kb in enumerate(long_kb)]

    async with aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def long_tenant(i: int) -> None:
            msgs: list[dict] = [{"role": "system", "content": systems[i]}]
            for turn in range(turns):
                msgs.append({"role": "user", "content": f"Turn {turn}: what does clause {turn * 7} say?"})
                ttft, reply, status = await _stream(session, {"model": "sim", "messages": msgs, "stream": True,
                                                              "max_tokens": 24}, f"long-{i}")
                out["failed"] += status != 200
                out["long"] += 1
                out["long_ttft"].append(ttft)
                msgs.append({"role": "assistant", "content": reply or "ok"})

        async def short_client(i: int) -> None:
            n = 0
            while not done.is_set():
                body = {"model": "sim", "stream": True, "max_tokens": 16, "messages": [
                    {"role": "system", "content": f"You are short helper {i}."},
                    {"role": "user", "content": f"question {n}: " + "details " * (5 + n % 20)}]}
                ttft, _, status = await _stream(session, body, f"short-{i}")
                out["failed"] += status != 200
                out["short"] += 1
                if status == 200:
                    out["short_ttft"].append(ttft)
                n += 1

        async def longs() -> None:
            await asyncio.gather(*(long_tenant(i) for i in range(len(long_kb))))
            done.set()

        await asyncio.gather(longs(), *(short_client(i) for i in range(max(0, concurrency - len(long_kb)))))
    return out


def _driver_main(conn: Any, url: str, long_kb: list[int], turns: int, concurrency: int) -> None:
    conn.send(asyncio.run(_drive(url, long_kb, turns, concurrency)))


# ---------------------------------------------------------------- probes (this process)
@dataclass
class Stall:
    start: float
    lag_ms: float = 0.0
    sites: Counter[str] = field(default_factory=Counter)  # loop thread's stack samples
    cpu0: dict[int, int] = field(default_factory=dict)  # native thread id -> on-CPU ns at start
    cpu1: dict[int, int] = field(default_factory=dict)
    t0: float = 0.0  # first and last sample (perf_counter): the CPU shares are over this window
    t1: float = 0.0
    others: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    syscalls: Counter[str] = field(default_factory=Counter)  # what the loop thread was doing


SYSCALLS = {"0": "read", "1": "write", "7": "poll", "20": "writev", "202": "futex (GIL or a lock)",
            "232": "epoll_wait (idle)", "281": "epoll_pwait (idle)", "44": "sendto", "45": "recvfrom",
            "running": "running"}


def loop_syscall(tid: int) -> str:
    """The system call the thread is in now (/proc/self/task/TID/syscall, x86-64 numbers)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return "?"
    return SYSCALLS.get(first, f"syscall {first}")


def thread_cpu_ns(tids: Any) -> dict[int, int]:
    """On-CPU nanoseconds of these threads of this process (/proc/self/task/*/schedstat)."""
    out: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


class LoopProbe:
    """Heartbeat in the proxy loop + a stack-sampling watchdog thread (see module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int, threshold_ms: float) -> None:
        self.loop = loop
        self.thread_id = thread_id
        self.threshold_s = threshold_ms / 1000.0
        self.lags_ms: list[float] = []
        self.stalls: list[Stall] = []
        self.site_ms: Counter[str] = Counter()
        self.site_max_ms: dict[str, float] = defaultdict(float)
        self.site_count: Counter[str] = Counter()
        self._due = time.perf_counter() + 1.0
        self._running = True
        self._current: Stall | None = None
        self._natives: dict[int, int] = {}
        self._names: dict[int, str] = {}
        self.gc_pauses_ms: list[float] = []
        self._self_native = 0
        self.gc_by_gen: dict[int, list[float]] = defaultdict(list)
        self._gc_t0 = 0.0
        self.prefix_state_ms: list[float] = []  # stalls with the loop busy in app/prefix or app/state
        self._beat_future: Any = None
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name="loop-watchdog")

    def start(self) -> None:
        self._beat_future = asyncio.run_coroutine_threadsafe(self._beat(), self.loop)
        self._watchdog.start()
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        """Collector pauses hold the GIL whichever thread triggers them: they stall the loop too."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0:
            ms = (time.perf_counter() - self._gc_t0) * 1000
            if ms >= 1.0:
                self.gc_pauses_ms.append(ms)
                self.gc_by_gen[info.get("generation", -1)].append(ms)

    def stop(self) -> None:
        gc.callbacks.remove(self._gc)
        self._running = False
        self._watchdog.join(2)
        if self._beat_future is not None:
            self._beat_future.result(timeout=5)

    async def _beat(self) -> None:
        while self._running:
            self._due = time.perf_counter() + 0.001
            await asyncio.sleep(0.001)
            lag = time.perf_counter() - self._due
            self.lags_ms.append(max(0.0, lag) * 1000)

    def _watch(self) -> None:
        self._self_native = threading.get_native_id()
        while self._running:
            time.sleep(0.001 if self._current is not None else 0.0005)
            now = time.perf_counter()
            due = self._due
            overdue = now - due
            if overdue > self.threshold_s:
                if self._current is None or self._current.start != due:
                    self._close()
                    self._natives = {t.ident: t.native_id for t in threading.enumerate()
                                     if t.ident is not None and t.native_id is not None}
                    self._names = {t.native_id: t.name for t in threading.enumerate()
                                   if t.native_id and t is not threading.current_thread()}
                    self._current = Stall(due, cpu0=thread_cpu_ns([*self._names, self._self_native]), t0=now)
                frames = sys._current_frames()
                self._current.sites[site_of(frames.get(self.thread_id))] += 1
                self._current.syscalls[loop_syscall(self._natives.get(self.thread_id, 0))] += 1
                for ident, frame in frames.items():
                    native = self._natives.get(ident)
                    if ident != self.thread_id and native is not None:
                        self._current.others[native][site_of(frame)] += 1
                self._current.cpu1 = thread_cpu_ns([*self._names, self._self_native])
                self._current.t1 = time.perf_counter()
                self._current.lag_ms = overdue * 1000
            elif self._current is not None and self._current.start != due:
                self._close()
        self._close()

    def _close(self) -> None:
        stall, self._current = self._current, None
        if stall is None or not stall.sites:
            return
        self.stalls.append(stall)
        native = self._natives.get(self.thread_id, 0)
        cpu = {t: stall.cpu1.get(t, 0) - stall.cpu0.get(t, 0) for t in stall.cpu1 if t in stall.cpu0}
        window_ns = (stall.t1 - stall.t0) * 1e9
        sites = stall.sites
        if window_ns > 1e6 and cpu.get(native, 0) < 0.5 * window_ns:
            # the loop thread was not running: it waited for the GIL (or the OS). Blame the
            # busiest other Python thread of this process over the stall, at its most sampled frame.
            others = [t for t in cpu if t != native and (t in self._names or t == self._self_native)]
            busy = max(others, key=lambda t: cpu[t], default=None)
            if busy == self._self_native and busy is not None and cpu[busy] >= 0.3 * window_ns:
                sites = Counter({"(the watchdog itself: sampling cost)": 1})
            elif busy is not None and sum(cpu[t] for t in others) >= 0.3 * window_ns and stall.others.get(busy):
                where = stall.others[busy].most_common(1)[0][0]
                sites = Counter({f"GIL held by {self._names.get(busy, busy)}: {where}": 1})
            else:
                call = stall.syscalls.most_common(1)[0][0] if stall.syscalls else "?"
                sites = Counter({f"(loop off-CPU, no Python thread busy; loop thread in: {call})": 1})
        elif any(PREFIX_STATE.search(site) for site in sites):
            self.prefix_state_ms.append(stall.lag_ms)
        total = sum(sites.values())
        for site, n in sites.items():
            share = stall.lag_ms * n / total
            self.site_ms[site] += share
            self.site_count[site] += 1
            self.site_max_ms[site] = max(self.site_max_ms[site], share)


def _name(frame: Any) -> str:
    path = frame.f_code.co_filename
    rel = os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path)
    return f"{rel}:{frame.f_code.co_qualname}"


def site_of(frame: Any) -> str:
    """'innermost app/ function  <  outermost app/ frame' for one stack sample."""
    if frame is None:
        return "(no frame)"
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    app_frames = [f for f in frames if f.f_code.co_filename.startswith(APP_DIR)
                  and "serving.py" not in f.f_code.co_filename]
    if not app_frames:
        inner = frames[0]
        return f"(outside app/) {_name(inner)}"
    inner, outer = app_frames[0], app_frames[-1]
    return _name(inner) if inner is outer else f"{_name(inner)}  <  {outer.f_code.co_qualname}"


class SlowCallbacks(logging.Handler):
    """Collects asyncio debug mode's 'Executing <handle> took X seconds' warnings."""

    PATTERN = re.compile(r"Executing (.*) took ([0-9.]+) seconds", re.S)

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_handle: dict[str, list[float]] = defaultdict(list)

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.match(record.getMessage())
        if m:
            handle = re.sub(r" at 0x[0-9a-f]+| id=0x[0-9a-f]+|0x[0-9a-f]+", "", m.group(1))
            handle = re.sub(r"\s+", " ", handle)[:140]
            self.by_handle[handle].append(float(m.group(2)) * 1000)


def print_census(top: int = 8) -> None:
    """The GC-tracked containers holding the most references (what a full collection walks)."""
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        if not isinstance(obj, list | dict | tuple | set | deque):
            continue
        n = len(obj)
        if n >= 256:
            kind = type(obj).__name__
            sizes[kind] += n
            counts[kind] += 1
    print("\n| container (len >= 256) | objects | total len |\n|---|---:|---:|")
    for kind, n in sizes.most_common(top):
        print(f"| {kind} | {counts[kind]} | {n} |")


# ---------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    from app.config import Settings
    from app.server import create_app
    from app.serving import ServerThread

    ctx = mp.get_context("spawn")
    sim_conn, sim_child = ctx.Pipe()
    sim_proc = ctx.Process(target=_sim_main, args=(sim_child, args.replicas, args.kv_blocks), daemon=True)
    sim_proc.start()
    server = None
    try:
        urls = sim_conn.recv()
        settings = Settings(backends=[{"url": u} for u in urls],
                            routing={"policy": args.policy, "kv_blocks": args.kv_blocks},
                            limits={"max_body_bytes": 64 * 1024 * 1024}, state=args.state)
        app = create_app(settings)
        server = ServerThread(app).start()
        assert server.loop is not None and server._thread.ident is not None
        slow = SlowCallbacks()
        if args.debug:
            logging.getLogger("asyncio").addHandler(slow)

            def debug_on() -> None:
                server.loop.set_debug(True)  # type: ignore[union-attr]
                server.loop.slow_callback_duration = args.threshold_ms / 1000.0  # type: ignore[union-attr]
            server.loop.call_soon_threadsafe(debug_on)
        time.sleep(args.warmup_s)  # start-up work (first engine scrape, health checks) stays out of the window
        probe = LoopProbe(server.loop, server._thread.ident, args.threshold_ms)
        probe.start()
        drv_conn, drv_child = ctx.Pipe()
        t0 = time.perf_counter()
        driver = ctx.Process(target=_driver_main, daemon=True,
                             args=(drv_child, server.url, args.long_kb, args.turns, args.concurrency))
        driver.start()
        load = drv_conn.recv()
        driver.join(10)
        wall = time.perf_counter() - t0
        hook = app.services.prefix
        if hook is not None:
            asyncio.run_coroutine_threadsafe(hook.drain(), server.loop).result(timeout=120)
        probe.stop()
        if args.census:
            print_census()
        gc.collect()  # garbage first: the second collection times walking what stays alive
        t_gc = time.perf_counter()
        gc.collect()
        full_gc_ms = (time.perf_counter() - t_gc) * 1000
        return {"probe": probe, "load": load, "wall": wall, "slow": slow, "full_gc_ms": full_gc_ms,
                "gc_objects": len(gc.get_objects()),
                "processed": getattr(hook, "processed", None)}
    finally:
        if server is not None:
            server.stop()
        sim_conn.send("stop")
        sim_proc.join(20)


def report(args: argparse.Namespace, res: dict[str, Any], cmd: str) -> None:
    probe: LoopProbe = res["probe"]
    load = res["load"]
    lags = probe.lags_ms
    over = probe.stalls
    print(f"\n## proxy event-loop lag, {args.concurrency} clients, long tenants {args.long_kb} KB x "
          f"{args.turns} turns  (`{cmd}`)\n")
    print("| label | requests long/short | failed | loop lag p50 ms | p99 ms | max ms | stalls > "
          f"{args.threshold_ms:g} ms | stalled ms total | prefix/state stalls (max ms) | GC pauses > 2 ms "
          "(max ms) | short TTFT p50 ms | p99 ms | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.label} | {load['long']}/{load['short']} | {load['failed']} | {pct(lags, 0.5):.2f} | "
          f"{pct(lags, 0.99):.2f} | {max(lags, default=0):.1f} | {len(over)} | "
          f"{sum(s.lag_ms for s in over):.0f} | {len(probe.prefix_state_ms)} "
          f"({max(probe.prefix_state_ms, default=0):.1f}) | {sum(ms > 2 for ms in probe.gc_pauses_ms)} "
          f"({max(probe.gc_pauses_ms, default=0):.1f}) | {pct(load['short_ttft'], 0.5):.1f} | "
          f"{pct(load['short_ttft'], 0.99):.1f} | {res['wall']:.1f} |")
    print(f"\nafter the run: {res['gc_objects']} GC-tracked objects; a full collection of them took "
          f"{res['full_gc_ms']:.1f} ms; GC pauses >= 1 ms during the run: {len(probe.gc_pauses_ms)}, "
          f"{sum(probe.gc_pauses_ms):.0f} ms in all (" + ", ".join(
              f"gen{g}: {len(v)}, max {max(v):.1f} ms" for g, v in sorted(probe.gc_by_gen.items())) + ")")
    print(f"\n### top stall sites (watchdog stack samples while the loop was > {args.threshold_ms:g} ms late)\n")
    print("| site (innermost app/ frame  <  outermost app/ frame) | stalls | ms total | max ms |")
    print("|---|---:|---:|---:|")
    for site, ms in probe.site_ms.most_common(args.top):
        print(f"| `{site}` | {probe.site_count[site]} | {ms:.0f} | {probe.site_max_ms[site]:.1f} |")
    if args.debug:
        slow = res["slow"].by_handle
        print(f"\n### asyncio debug: callbacks over {args.threshold_ms:g} ms\n")
        print("| handle | count | ms total | max ms |")
        print("|---|---:|---:|---:|")
        rows = sorted(slow.items(), key=lambda kv: -sum(kv[1]))[:args.top]
        for handle, ms in rows:
            print(f"| `{handle}` | {len(ms)} | {sum(ms):.0f} | {max(ms):.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-kb", type=lambda s: [int(x) for x in s.split(",")], default=[200, 400, 600, 800])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kv-blocks", type=int, default=200_000)
    parser.add_argument("--policy", default="prefix_affinity")
    parser.add_argument("--threshold-ms", type=float, default=2.0)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--warmup-s", type=float, default=2.0, help="idle time before the probes start")
    parser.add_argument("--state", default="memory", help="memory | redis://host:port/db")
    parser.add_argument("--census", action="store_true", help="print the largest GC-tracked containers")
    parser.add_argument("--debug", action="store_true", help="also asyncio debug mode's slow callbacks")
    parser.add_argument("--label", default="this tree")
    args = parser.parse_args(argv)
    cmd = "python bench/loop_stalls.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report(args, run(args), cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
