"""What pricing by the fitted prefill models adds to a routing decision's scoring (CPU only).

    .venv/bin/python bench/prefill_prices.py [--replicas 4]

`replica_costs` (app/routing/scorers.py) over N candidates at token prices and at fitted prices
(app/routing/prefill_cost.py), and the same after one new sample of one replica (its fit and the
fleet reference are re-solved once, as after every answered request). Best of 5 repeats of 2000
calls each, in microseconds per call.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.routing.base import Replica  # noqa: E402
from app.routing.prefill_cost import TOKEN_PRICES, PrefillPrices  # noqa: E402
from app.routing.scorers import ScoreWeights, replica_costs  # noqa: E402
from app.telemetry.prefill_model import PrefillModels  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=4)
    args = ap.parse_args()
    print("$ python bench/prefill_prices.py " + shlex.join(sys.argv[1:]))
    print(f"load average (1/5/15 min): {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
    models = PrefillModels()
    names = [f"r{i}" for i in range(args.replicas)]
    for i, name in enumerate(names):
        for k in range(50):
            new, cached = 100 + 37 * k, (k % 5) * 1000
            models.add(name, new, cached, 0.002 + new / (5000 * (i + 1)) + 2e-9 * new * cached)
    replicas = [Replica(n, "http://x", queued_prompt_tokens=1000 * i) for i, n in enumerate(names)]
    matched = {names[0]: 10, names[-1]: 40}
    weights, fitted = ScoreWeights(), PrefillPrices(models)

    def best_us(fn) -> float:
        return min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6

    def sample_then_score() -> None:
        models.add(names[1], 500, 1000, 0.05)
        replica_costs(replicas, matched, 4000, 16, weights, fitted)

    rows = [
        ("token prices", best_us(lambda: replica_costs(replicas, matched, 4000, 16, weights, TOKEN_PRICES))),
        ("fitted prices", best_us(lambda: replica_costs(replicas, matched, 4000, 16, weights, fitted))),
        ("fitted, after a new sample", best_us(sample_then_score)),
    ]
    print(f"\n| scoring {args.replicas} candidates | us per decision |\n|---|---|")
    for label, us in rows:
        print(f"| {label} | {us:.1f} |")


if __name__ == "__main__":
    main()
