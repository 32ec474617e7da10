"""What the two agents' API benchmarks share (bench/agents_messages.py, bench/agents_responses.py):
one session through a fresh gateway in front of fresh simulated replicas, measured the same way,
and one table. Each benchmark only says what a turn sends (`TurnFn`).

Per run: the client's TTFT (to the first text delta) p50 per prompt bucket, the first (cold)
turn's TTFT and the warm turns' p50; the proxy's predicted cached tokens against the engine's,
summed over the turns, and how many turns differ (the predictions ring); the tenant's continuity
and breaks (`GET /hygiene/tenants/<tenant>`); the engine hit ratio = sum of the engine's cached
prompt tokens over the sum of prompt tokens, cold first turn included.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from app.config import Settings  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402
from app.telemetry.metrics import prompt_bucket  # noqa: E402


@dataclass(frozen=True)
class Turn:
    """One turn as the client saw it: prompt tokens, the engine's cached tokens, client TTFT."""

    prompt: int
    cached: int
    ttft: float | None


TurnFn = Callable[[int], Turn]  # turn index -> what that turn measured


@dataclass
class Run:
    name: str
    turns: list[Turn]
    predicted: int
    engine: int
    mismatched: int
    continuity: float | None
    breaks: dict[str, int]

    @property
    def hit_ratio(self) -> float:
        return sum(t.cached for t in self.turns) / max(1, sum(t.prompt for t in self.turns))

    def ttft_p50(self) -> dict[str, float]:
        buckets: dict[str, list[float]] = {}
        for t in self.turns:
            if t.ttft is not None:
                buckets.setdefault(prompt_bucket(t.prompt), []).append(t.ttft)
        return {b: statistics.median(v) for b, v in sorted(buckets.items())}

    @property
    def warm_ttft_p50(self) -> float | None:
        warm = [t.ttft for t in self.turns[1:] if t.ttft is not None]
        return statistics.median(warm) if warm else None


def run_session(name: str, turns: int, tenant: str, sim: dict[str, Any], gateway: dict[str, Any],
                client_turn: Callable[[str], TurnFn], names: list[str] | None = None) -> Run:
    """`turns` turns of `client_turn(gateway_url)` through a gateway (Settings sections
    `gateway`) in front of a fresh `SimCluster(**sim)`; each turn starts once the gateway has
    processed the previous one (its residency and history learned, as between real turns)."""
    cluster = SimCluster(**sim).start()
    backends = [{"url": u, **({"name": names[i]} if names else {})} for i, u in enumerate(cluster.urls)]
    app = create_app(Settings(backends=backends, **gateway))
    server = ServerThread(app).start()
    stage = app.services.prefix
    try:
        send = client_turn(server.url)
        done = []
        for turn in range(turns):
            done.append(send(turn))
            deadline = time.monotonic() + 30
            while stage.processed < turn + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        report = httpx.get(f"{server.url}/hygiene/tenants/{tenant}", timeout=10).json()
        predictions = [row for row in stage.predictions if row[1] == tenant]
    finally:
        server.stop()
        cluster.stop()
    return Run(name, done, predicted=sum(p for _, _, p, _ in predictions),
               engine=sum(d or 0 for _, _, _, d in predictions),
               mismatched=sum(1 for _, _, p, d in predictions if p != d),
               continuity=report.get("continuity"), breaks=report.get("breaks_by_cause") or {})


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:,.0f} ms"


def print_table(runs: list[Run]) -> None:
    """The closing note's table: one row per run."""
    first = runs[0].turns
    print(f"turns {len(first)}, prompt {first[0].prompt:,} -> {first[-1].prompt:,} tokens\n")
    print("| engine / policy | TTFT p50 by prompt bucket (all turns) | cold first turn | warm p50 "
          "| predicted / engine cached (turns differing) | continuity | breaks | hit ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        buckets = ", ".join(f"{b}: {ms(v)}" for b, v in r.ttft_p50().items())
        cont = "absent" if r.continuity is None else f"{r.continuity:.2f}"
        breaks = ", ".join(f"{n} x {c}" for c, n in sorted(r.breaks.items())) or "none"
        print(f"| {r.name} | {buckets} | {ms(r.turns[0].ttft)} | {ms(r.warm_ttft_p50)} "
              f"| {r.predicted:,} / {r.engine:,} ({r.mismatched}/{len(r.turns)}) | {cont} | {breaks} "
              f"| {r.hit_ratio:.1%} |")
