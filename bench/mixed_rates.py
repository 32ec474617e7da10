"""A fleet whose replicas prefill at different rates: routing priced in tokens against routing
priced by each replica's fitted prefill model (app/routing/prefill_cost.py, docs/routing.md).

    .venv/bin/python bench/mixed_rates.py [--n 200] [--load 0.6] [--seed 5]

Two simulated vLLM replicas (`enable_per_request_metrics`, so the ledger feeds each replica's
prefill model): `fast` at 20k prefill tokens/s and `slow` at 5k, 2048-token steps. One gateway
(prefix_affinity, defaults). Warm-up: distinct short prompts until both models are fitted. Then per
row the same open-loop trace (Poisson arrivals at `--load` of the fleet's prefill capacity; 20%
long cold prompts of ~`--long-words` words, 80% short cold ones of ~`--short-words`; every prompt
distinct, so every one is a cold spread): once with the router's prices set back to token prices
(the behaviour before the fitted model was used; the models still learn), once with the fitted
prices. Client TTFT (first content byte) per class, and where the long prompts went.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.config import Settings  # noqa: E402
from app.routing.prefill_cost import TOKEN_PRICES, PrefillPrices  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402

FAST_TPS, SLOW_TPS = 20_000.0, 5_000.0


def words(seed: int, n: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 31) % 9973}" for i in range(n))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def stream(client: httpx.Client, url: str, text: str) -> tuple[float, str, int]:
    """(client TTFT s, backend, prompt tokens) of one streamed chat."""
    body = {"model": "sim", "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": text}]}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        backend = r.headers.get("x-prefixgate-backend", "?")
        for line in r.iter_lines():
            if ttft is None and '"content"' in line:
                ttft = time.perf_counter() - t0
            if '"prompt_tokens"' in line:
                tokens = int(line.split('"prompt_tokens":')[1].split(",")[0].split("}")[0])
    return (ttft if ttft is not None else float("nan")), backend, tokens


def run_row(client: httpx.Client, url: str, trace: list[tuple[float, str, str]]) -> dict:
    out: list[tuple[str, float, str, int]] = []
    lock = threading.Lock()

    def one(item: tuple[float, str, str], t0: float) -> None:
        at, kind, text = item
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ttft, backend, tokens = stream(client, url, text)
        with lock:
            out.append((kind, ttft, backend, tokens))

    t0 = time.perf_counter() + 0.05
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(lambda it: one(it, t0), trace))
    row: dict = {}
    for kind in ("short", "long"):
        ttfts = [t for k, t, _, _ in out if k == kind]
        row[kind] = (pct(ttfts, 0.5), pct(ttfts, 0.95))
        row[kind + "_tokens"] = sum(n for k, _, _, n in out if k == kind) / max(1, len(ttfts))
    longs = [b for k, _, b, _ in out if k == "long"]
    row["long_on_fast"] = (longs.count("fast"), len(longs))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--load", type=float, default=0.6)
    ap.add_argument("--long-words", type=int, default=2500)
    ap.add_argument("--short-words", type=int, default=150)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    print("$ python bench/mixed_rates.py " + shlex.join(sys.argv[1:]))
    load_before = os.getloadavg()
    started = time.perf_counter()
    opts = {"replicas": 1, "time_scale": 1.0, "enable_per_request_metrics": True}
    with SimCluster(prefill_tps=FAST_TPS, **opts) as fast, SimCluster(prefill_tps=SLOW_TPS, **opts) as slow:
        app = create_app(Settings(backends=[{"url": fast.urls[0], "name": "fast"},
                                            {"url": slow.urls[0], "name": "slow"}]))
        models = app.services.metrics.prefill_models
        with ServerThread(app) as proxy, httpx.Client(timeout=300) as client:
            i = 0
            while not all(models.fit_of(n) is not None for n in ("fast", "slow")) and i < 200:
                stream(client, proxy.url, f"warm-up {i}: " + words(100 + i, 40 + 30 * (i % 8)))
                i += 1
            fits = {n: models.fit_of(n) for n in ("fast", "slow")}
            print(f"warm-up: {i} requests; fitted cold prefill tokens/s: "
                  + ", ".join(f"{n} {f.cold_tokens_per_second:.0f}" for n, f in fits.items() if f is not None))
            # the arrival rate is set from the prompt tokens of one probe of each kind (the
            # simulator's tokenizer decides how many tokens a word is)
            _, _, long_tokens = stream(client, proxy.url, "probe long " + words(1, args.long_words))
            _, _, short_tokens = stream(client, proxy.url, "probe short " + words(2, args.short_words))
            mean_tokens = 0.2 * long_tokens + 0.8 * short_tokens
            rate = args.load * (FAST_TPS + SLOW_TPS) / mean_tokens
            router = app.services.router
            rows = []
            for label, prices in (("token prices (before)", TOKEN_PRICES), ("fitted prices", PrefillPrices(models))):
                rng = random.Random(args.seed)  # the same arrivals and kinds in every row
                trace, at = [], 0.0
                for k in range(args.n):
                    at += rng.expovariate(rate)
                    kind = "long" if rng.random() < 0.2 else "short"
                    n = args.long_words if kind == "long" else args.short_words
                    trace.append((at, kind, f"{label} {k}: " + words(10_000 + len(rows) * args.n + k, n)))
                router.prices = prices  # type: ignore[attr-defined]
                rows.append((label, run_row(client, proxy.url, trace)))
                while app.openai.active:  # every request of the row ended: the next starts idle
                    time.sleep(0.01)
                time.sleep(0.5)
    print(f"prompt tokens: long ~{long_tokens}, short ~{short_tokens}; arrivals {rate:.2f}/s "
          f"({args.load:.0%} of {FAST_TPS + SLOW_TPS:.0f} prefill tokens/s), {args.n} requests per row")
    print(f"took {time.perf_counter() - started:.0f} s; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.1f}' for x in load_before)}, after {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    print("| routing | short TTFT p50/p95 s | long TTFT p50/p95 s | long prompts on fast |")
    print("|---|---|---|---|")
    for label, row in rows:
        (sp50, sp95), (lp50, lp95) = row["short"], row["long"]
        on_fast, n_long = row["long_on_fast"]
        print(f"| {label} | {sp50:.2f}/{sp95:.2f} | {lp50:.2f}/{lp95:.2f} | {on_fast}/{n_long} |")


if __name__ == "__main__":
    main()
