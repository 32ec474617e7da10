"""What the routing benchmarks share (bench/routing.py on simulated replicas, bench/routing_real.py on
real vLLM): launching a target router, waiting for it, replaying a tenant's turns as streamed chat
requests, reading the replicas' own counters and summarising TTFTs. One copy, so both benchmarks
measure the same way and their tables stay comparable."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.routing_trace import Tenant

ROOT = Path(__file__).resolve().parent.parent
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total")
_SAMPLE = re.compile(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$")


@dataclass
class Result:
    tenant: str
    turn: int
    ok: bool
    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int
    backend: str | None


# ------------------------------------------------------------------ targets
def prefixgate_command(config: dict[str, Any], path: Path, port: int) -> list[str]:
    """Write `config` to `path` and return the `prefixgate serve` command line that uses it."""
    path.write_text(yaml.safe_dump(config))
    return [sys.executable, "-m", "app", "serve", "--config", str(path), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning"]


def sglang_router_command(routers_venv: str, port: int, prom: int, urls: list[str], policy: str) -> list[str]:
    return [str(Path(routers_venv) / "bin" / "sglang-router"), "launch", "--host", "127.0.0.1",
            "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
            "--worker-urls", *urls, "--policy", policy]


def launch(target: str, cmd: list[str], tmp: Path) -> subprocess.Popen:
    """Start a target router with its output in tmp/<target>.log (stopped with app.serving.stop_process)."""
    log = open(tmp / f"{target.replace(':', '_')}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


async def wait_ready(session: aiohttp.ClientSession, base: str, path: str, body: dict[str, Any],
                     timeout: float = 60.0) -> None:
    """Poll POST base+path until it answers 200: the router is up and reaches a replica."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.post(base + path, json=body) as resp:
                await resp.read()
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{base} not ready in {timeout}s")


# ------------------------------------------------------------------ load
async def one_request(session: aiohttp.ClientSession, base: str, tenant: Tenant, turn: int,
                      params: dict[str, Any]) -> Result:
    """One streamed chat turn; TTFT is client-side, at the first content chunk. `params` holds the
    body fields besides messages and streaming (model, max_tokens, ...)."""
    body = {**params, "messages": tenant.messages(turn), "stream": True, "stream_options": {"include_usage": True}}
    headers = {"x-tenant-id": tenant.name, "x-session-id": tenant.name}
    start = time.perf_counter()
    ttft = None
    usage: dict = {}
    backend = None
    try:
        async with session.post(base + "/v1/chat/completions", json=body, headers=headers) as resp:
            backend = resp.headers.get("x-prefixgate-backend")
            if resp.status != 200:
                await resp.read()
                return Result(tenant.name, turn, False, None, 0, 0, backend)
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    if ttft is None and (choice.get("delta") or {}).get("content"):
                        ttft = time.perf_counter() - start
    except aiohttp.ClientError:
        return Result(tenant.name, turn, False, None, 0, 0, backend)
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return Result(tenant.name, turn, ttft is not None, ttft, int(usage.get("prompt_tokens") or 0), int(cached),
                  backend)


async def run_tenant(session: aiohttp.ClientSession, base: str, tenant: Tenant, scale: float, t0: float,
                     out: list[Result], params: dict[str, Any]) -> None:
    """Replay one tenant's turns at its start time and think times, scaled to real seconds."""
    await asyncio.sleep(max(0.0, t0 + tenant.start_s * scale - time.perf_counter()))
    for turn in range(len(tenant.users)):
        out.append(await one_request(session, base, tenant, turn, params))
        await asyncio.sleep(tenant.think_s[turn] * scale)


async def replay(session: aiohttp.ClientSession, base: str, tenants: list[Tenant], scale: float,
                 params: dict[str, Any]) -> tuple[list[Result], float]:
    """The whole trace, every tenant concurrently; returns the results and the wall time it took."""
    results: list[Result] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(run_tenant(session, base, t, scale, t0, results, params) for t in tenants))
    return results, time.perf_counter() - t0


# ------------------------------------------------------------------ numbers
async def counters(session: aiohttp.ClientSession, url: str,
                   names: tuple[str, ...] = COUNTERS) -> dict[str, float]:
    """Samples of `names` from `url`'s /metrics, each summed over its label sets (by default a
    replica's own prefix-cache and request counters); a name with no sample is absent."""
    out: dict[str, float] = {}
    async with session.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            m = _SAMPLE.match(line)
            if m and m.group(1) in names:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def print_commands(rows: list[dict]) -> None:
    """The command each target ran with, so a table row can be reproduced."""
    print("\ntarget commands (replica URLs vary per run):")
    for r in rows:
        print(f"  {r['target']}: {r['command']}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]
