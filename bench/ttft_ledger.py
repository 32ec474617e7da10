"""Where the first-token time goes as load grows: the TTFT ledger (docs/ttft-ledger.md) per
concurrency level, through the real gateway in front of one simulated vLLM that returns its
per-request metrics (`enable_per_request_metrics`).

    .venv/bin/python bench/ttft_ledger.py [--levels 1,4,16] [--requests 32] [--prompt-words 300]

Each level: a fresh simulator replica (prefill 20k tokens/s, 2048-token steps) and a fresh
gateway; `--requests` distinct streamed chats (no shared prefix), `level` at a time. The table is
the mean of each part over the level's requests, read from the gateway's own
`prefixgate_ttft_part_seconds` (sum / count), next to the mean client TTFT
(`prefixgate_ttft_seconds`). Expected: queue grows with concurrency, the gateway part does not.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.config import Settings  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402

PARTS = ("gateway", "queue", "prefill", "rest")


def family_mean(registry: object, name: str, **labels: str) -> float | None:
    """sum / count over every series of histogram `name` whose labels include `labels`."""
    total = count = 0.0
    for metric in registry.collect():  # type: ignore[attr-defined]
        for s in metric.samples:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                if s.name == f"{name}_sum":
                    total += s.value
                elif s.name == f"{name}_count":
                    count += s.value
    return total / count if count else None


def run_level(level: int, requests: int, words: int) -> dict[str, float | None]:
    with SimCluster(replicas=1, time_scale=1.0, prefill_tps=20_000.0, enable_per_request_metrics=True) as sim:
        app = create_app(Settings(backends=[{"url": sim.urls[0], "name": "sim-0"}]))
        with ServerThread(app) as proxy, httpx.Client(timeout=120) as client:
            def one(i: int) -> None:
                body = {"model": "sim", "stream": True, "max_tokens": 4,
                        "messages": [{"role": "user", "content": f"request {i} " + "ledger words " * words}]}
                with client.stream("POST", proxy.url + "/v1/chat/completions", json=body) as r:
                    for _ in r.iter_bytes():
                        pass

            with ThreadPoolExecutor(level) as pool:
                list(pool.map(one, range(requests)))
            while app.openai.active:  # the last requests' metrics are recorded just after their end
                time.sleep(0.005)
            reg = app.services.metrics.registry
            out = {part: family_mean(reg, "prefixgate_ttft_part_seconds", part=part) for part in PARTS}
            out["ttft"] = family_mean(reg, "prefixgate_ttft_seconds")
            return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=300)
    args = ap.parse_args()
    print("$ python bench/ttft_ledger.py " + shlex.join(sys.argv[1:]))
    print(f"{'concurrency':>11} | {'TTFT':>8} | " + " | ".join(f"{p:>8}" for p in PARTS) + "   (means, ms)")
    for level in (int(x) for x in args.levels.split(",")):
        row = run_level(level, args.requests, args.prompt_words)

        def ms(v: float | None) -> str:
            return "—" if v is None else f"{v * 1000:.2f}"

        print(f"{level:>11} | {ms(row['ttft']):>8} | " + " | ".join(f"{ms(row[p]):>8}" for p in PARTS))


if __name__ == "__main__":
    main()
