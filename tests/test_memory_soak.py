"""Long run: a real gateway process in front of the simulator holds its memory at the budget.

Many streamed chat requests with a shared head and a unique tail (what agents send, the shape that
grew RSS without bound before) from a few tenants, until the budgeted parts are full and as many requests again (at most MAX_S seconds), at a small memory budget so
that every budgeted part fills well within the run. The gateway's RSS (/proc, the real process)
must stay within the budget plus a fixed base, and stop growing once the parts are full; the
gauges must say the parts hold no more than the budget (docs/memory.md).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.prefix.budget import MemoryCaps
from app.sim.testing import SimCluster

pytestmark = pytest.mark.soak

MAX_S = float(os.environ.get("PREFIXGATE_SOAK_MAX_S", "85"))  # the whole run stops by then
BUDGET_MB = 8
# The gateway with nothing kept: interpreter, libraries, tokenizer, template, thread stacks,
# allocator arenas (measured idle after start-up: 95-110 MB).
BASE_MB = 140
CONCURRENCY = 24
TENANTS = 8
HEAD = "".join(f"Rule {i}: answer the customer politely and cite the policy section.\n" for i in range(24))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _gauges(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("prefixgate_memory_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


FULL_PARTS = ("token_memo", "chain_memo", "tracker_hashes")  # the parts this traffic fills
FULL_SHARE = 0.9


class Soak:
    """Closed-loop clients; `run` fills the budgeted parts, then sends as many requests again."""

    def __init__(self, url: str, pid: int, caps: dict[str, int]) -> None:
        self.url, self.pid, self.caps = url, pid, caps
        self.done = 0
        self.stop = False
        self.filled_at: tuple[int, float] | None = None  # (requests, RSS MB) when the parts were full
        self.samples: list[tuple[int, float]] = []  # (requests, RSS MB) every second

    async def client(self, c: httpx.AsyncClient, k: int) -> None:
        n = 0
        while not self.stop:
            n += 1
            tail = f"Ticket {k}-{n}: " + " ".join(f"w{(k * 7919 + n * 31 + j) % 10007}" for j in range(90))
            body = {"model": "sim", "stream": True, "max_tokens": 4,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "system", "content": HEAD}, {"role": "user", "content": tail}]}
            async with c.stream("POST", "/v1/chat/completions", json=body,
                                headers={"x-tenant-id": f"t{k % TENANTS}"}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    pass
            self.done += 1

    async def watch(self, c: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + MAX_S
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            rss = _rss_mb(self.pid)
            self.samples.append((self.done, rss))
            if self.filled_at is None:
                used = _gauges((await c.get("/metrics")).text)
                if all(used.get(f'prefixgate_memory_used_bytes{{part="{p}"}}', 0) >= FULL_SHARE * self.caps[p]
                       for p in FULL_PARTS):
                    self.filled_at = (self.done, rss)
            elif self.done >= 2 * self.filled_at[0]:
                break
        self.stop = True

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=CONCURRENCY + 1, max_keepalive_connections=CONCURRENCY + 1)
        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as c:
            await asyncio.gather(self.watch(c), *(self.client(c, k) for k in range(CONCURRENCY)))


def test_rss_stays_within_the_memory_budget_at_steady_state(tmp_path: Path) -> None:
    caps = MemoryCaps.from_budget(BUDGET_MB)
    with SimCluster(replicas=2, time_scale=0) as sim:
        port = _free_port()
        config = tmp_path / "gateway.yaml"
        config.write_text(f"memory:\n  budget_mb: {BUDGET_MB}\n")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        cmd = [sys.executable, "-m", "app", "serve", "--config", str(config), "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]
        for u in sim.urls:
            cmd += ["--backend", u]
        proc = subprocess.Popen(cmd, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.1)
            idle = _rss_mb(proc.pid)
            soak = Soak(url, proc.pid, {"token_memo": caps.token_memo_bytes, "chain_memo": caps.chain_memo_bytes,
                                        "tracker_hashes": caps.tracker_hash_bytes})
            asyncio.run(soak.run())
            gauges = _gauges(httpx.get(f"{url}/metrics", timeout=10).text)
        finally:
            proc.terminate()
            proc.wait(timeout=20)

    used = {k.split('"')[1]: v for k, v in gauges.items() if k.startswith("prefixgate_memory_used_bytes")}
    peak = max(rss for _, rss in soak.samples)
    print(f"\n{soak.done} requests; RSS idle {idle:.0f} MB, when full {soak.filled_at}, peak {peak:.0f} MB, "
          f"end {soak.samples[-1]}; parts {used}")
    assert gauges["prefixgate_memory_budget_bytes"] == caps.budget_bytes
    assert sum(used.values()) <= caps.budget_bytes
    assert soak.filled_at is not None, f"the budgeted parts did not fill within {MAX_S}s: {used}"
    assert soak.done >= 2 * soak.filled_at[0], f"too few requests after the parts filled within {MAX_S}s"
    assert peak <= BASE_MB + BUDGET_MB, f"RSS {peak:.0f} MB over base {BASE_MB} + budget {BUDGET_MB} MB"
    # steady state: as many requests again as it took to fill the parts, and RSS stops growing
    # (before: every request kept ~2.6 KB; with 128 MB memos this traffic grew ~5 KB a request)
    growth = soak.samples[-1][1] - soak.filled_at[1]
    assert growth <= BUDGET_MB / 2, f"RSS grew {growth:.1f} MB after the parts were full"
