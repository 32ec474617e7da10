"""A queueing model of bench/admission.py's fleet, to compare gateway queue policies without HTTP.

    python bench/admission_model.py                 # 5,000 requests per cell, 70% load, 3 seeds
    python bench/admission_model.py --n 180 --loads 0.7,0.85

Why it exists: bench/admission.py runs 180-600 requests per cell through the real gateway and
simulator, where one cell's short p95 moves by 2x between runs. This model runs the same mix
(80% 530-token and 20% 4030-token cold prompts, Poisson arrivals, the benchmark's --token-scale
0.25 sizes) on four replicas with the simulator's scheduler (app/sim/engine.py: running requests
first, a 512-token step budget, a step takes prefill tokens / 2000 tokens/s plus 1/60 s when it
carries decodes, 8 output tokens) for thousands of requests, so a policy's steady state shows.
It is a model of the engine, not the gateway: routing is instantaneous and every number is
exact. docs/admission.md quotes it for the choice of the queue's order (cheapest prefill first,
not alternating lanes).

Policies (each a row):
- `least backlog`: no queue; each request goes to a replica within one chunk of the least queued
  prefill (+ 64 tokens per running request), picked at random (prefix_affinity's cold spread);
- `lane 0.75`: the same inside the long-prefill lane's filter (app/routing/lanes.py, shared mode);
- `queue, FCFS` / `queue, lanes alternate` / `queue, cheapest first`: the gateway queue as
  app/admission/gate.py runs it with `saturated_prefill_tokens` = `--lead` and the lane: a request
  leaves for the replica of its lane with the least prefill routed and not yet past its first
  token, once that is at most `--lead` tokens (late binding); long requests on at most 3 of the 4
  replicas at once (max_share 0.75), short ones on replicas without a long prefill while one has
  none.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import pct  # noqa: E402  (the percentile bench/admission.py prints)

TPS, BUDGET, DECODE_TPS, OUTPUT_TOKENS = 2000.0, 512, 60.0, 8
SHORT, LONG = 530, 4030
REPLICAS = 4


class Req:
    def __init__(self, arrival: float, tokens: int, long: bool) -> None:
        self.arrival, self.tokens, self.long = arrival, tokens, long
        self.done = self.out = 0
        self.ttft: float | None = None


class Replica:
    def __init__(self, k: int) -> None:
        self.k = k
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.busy = False
        self.step_plan: list[tuple[Req, int]] = []

    def remaining(self) -> int:
        """Prefill tokens not yet computed (what a request sent now would wait behind)."""
        return sum(r.tokens - r.done for r in self.running + self.waiting if r.done < r.tokens)

    def queued(self) -> int:
        """The gateway's view: prompt tokens routed here whose first token has not come yet."""
        return sum(r.tokens for r in self.running + self.waiting if r.done < r.tokens)

    def has_long(self) -> bool:
        return any(r.long and r.done < r.tokens for r in self.running + self.waiting)

    def inflight(self) -> int:
        return len(self.running) + len(self.waiting)

    def plan(self) -> float:
        """The next step (running first, then waiting FCFS, within the budget); its duration."""
        budget, prefill, decodes, plan = BUDGET, 0, False, []
        for r in self.running:
            if budget <= 0:
                break
            n = min(r.tokens - r.done, budget) if r.done < r.tokens else 1
            plan.append((r, n))
            budget -= n
            prefill += n if r.done < r.tokens else 0
            decodes |= r.done >= r.tokens
        while self.waiting and budget > 0:
            r = self.waiting.pop(0)
            self.running.append(r)
            n = min(r.tokens, budget)
            plan.append((r, n))
            budget -= n
            prefill += n
        self.step_plan = plan
        return prefill / TPS + (1 / DECODE_TPS if decodes else 0.0)

    def finish_step(self, now: float) -> None:
        for r, n in self.step_plan:
            if r.done < r.tokens:
                r.done += n
                if r.done >= r.tokens:
                    r.ttft, r.out = now - r.arrival, 1
            else:
                r.out += 1
        self.running = [r for r in self.running if r.out < OUTPUT_TOKENS]


Policy = Callable[[Req, list[Replica], random.Random], int]


def least_backlog(req: Req, pool: list[Replica], rng: random.Random) -> int:
    load = {p.k: p.remaining() + 64 * p.inflight() for p in pool}
    least = min(load.values())
    return rng.choice([k for k, v in load.items() if v <= least + BUDGET])


def lane(max_share: float) -> Policy:
    def pick(req: Req, pool: list[Replica], rng: random.Random) -> int:
        busy = [p for p in pool if p.has_long()]
        free = [p for p in pool if not p.has_long()]
        if not req.long:
            return least_backlog(req, free or pool, rng)
        if len(busy) < max(1, math.floor(max_share * len(pool))) and free:
            return least_backlog(req, free, rng)
        return least_backlog(req, busy, rng)
    return pick


def simulate(reqs: list[Req], policy: Policy | None = None, order: str = "cheapest", cap: int = 3,
             lead: int = 512, seed: int = 0) -> list[Req]:
    """Route on arrival with `policy`, or (None) hold requests in a gateway queue and release
    them in `order` (fcfs | alternate | cheapest) onto a replica of their lane with <= `lead`
    tokens queued (long requests on at most `cap` replicas)."""
    rng = random.Random(seed)
    reps = [Replica(k) for k in range(REPLICAS)]
    events: list[tuple[float, int, int]] = [(r.arrival, 0, i) for i, r in enumerate(reqs)]
    heapq.heapify(events)
    queue: list[Req] = []
    turn = [False]  # alternate: whether a long request goes first next

    def start(rep: Replica, now: float) -> None:
        if not rep.busy and (rep.waiting or rep.running):
            rep.busy = True
            heapq.heappush(events, (now + rep.plan(), 1, rep.k))

    def ranked() -> list[Req]:
        if order == "cheapest":
            return sorted(queue, key=lambda r: (r.tokens, r.arrival))
        by_arrival = sorted(queue, key=lambda r: r.arrival)
        if order == "alternate":
            shorts = [r for r in by_arrival if not r.long]
            longs = [r for r in by_arrival if r.long]
            return longs + shorts if turn[0] else shorts + longs
        return by_arrival

    def release(now: float) -> None:
        while queue:
            for r in ranked():
                free = [p for p in reps if not p.has_long()]
                if r.long:  # the lane: a replica without a long prefill, while fewer than cap have one
                    lane_pool = free if len(reps) - len(free) < cap else []
                else:  # short requests avoid replicas with a long prefill while one has none
                    lane_pool = free or reps
                ok = [p for p in lane_pool if p.queued() <= lead]
                if ok:
                    rep = min(ok, key=lambda p: (p.queued(), p.k))
                    queue.remove(r)
                    rep.waiting.append(r)
                    start(rep, now)
                    turn[0] = not r.long
                    break
            else:
                return

    while events:
        now, kind, k = heapq.heappop(events)
        if kind == 0:
            req = reqs[k]
            if policy is None:
                queue.append(req)
            else:
                rep = reps[policy(req, reps, rng)]
                rep.waiting.append(req)
                start(rep, now)
        else:
            rep = reps[k]
            rep.busy = False
            rep.finish_step(now)
            start(rep, now)
        if policy is None:
            release(now)
    return reqs


def trace(n: int, load: float, seed: int) -> list[Req]:
    rng = random.Random(seed)
    rate = load * REPLICAS * TPS / (0.8 * SHORT + 0.2 * LONG)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        long = rng.random() < 0.2
        out.append(Req(t, LONG if long else SHORT, long))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.7])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[17, 18, 19])
    p.add_argument("--lead", type=int, default=512, help="release onto a replica with at most this prefill left")
    args = p.parse_args()
    rows: list[tuple[str, dict]] = [
        ("least backlog (no queue)", {"policy": least_backlog}),
        ("lane 0.75 (no queue)", {"policy": lane(0.75)}),
        ("queue, FCFS", {"order": "fcfs"}),
        ("queue, lanes alternate", {"order": "alternate"}),
        ("queue, cheapest first", {"order": "cheapest"}),
    ]
    print(f"{REPLICAS} replicas, {SHORT}/{LONG}-token prompts, budget {BUDGET}, {TPS:g} tokens/s; "
          f"{args.n} requests per cell; queue rows: lead {args.lead}, long requests on <= 3 replicas")
    print("| load | seed | policy | short TTFT p50/p95/p99 s | long TTFT p50/p95 s |")
    print("|---|---|---|---|---|")
    for load in args.loads:
        for seed in args.seeds:
            for name, kw in rows:
                reqs = simulate(trace(args.n, load, seed), lead=args.lead, **kw)
                short = [r.ttft for r in reqs if not r.long and r.ttft is not None]
                long = [r.ttft for r in reqs if r.long and r.ttft is not None]
                print(f"| {load:.0%} | {seed} | {name} | {pct(short, .5):.2f}/{pct(short, .95):.2f}/"
                      f"{pct(short, .99):.2f} | {pct(long, .5):.2f}/{pct(long, .95):.2f} |")


if __name__ == "__main__":
    main()
