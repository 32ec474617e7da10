"""A Codex-shaped session through `POST /v1/responses`: TTFT by prompt bucket, predicted vs engine
cached tokens, continuity, and the hit ratio under `observe` vs `rewrite` (issue 15).

    .venv/bin/python bench/agents_responses.py [--turns 10] [--replicas 2] [--time-scale 1]

Workload: simulated vLLM replicas (prefill 8000 tok/s, 16-token blocks) behind the proxy with
prefix-affinity routing; one tenant runs a Codex-shaped session with the real `openai` client
(`client.responses.create(stream=True)`): ~2.5k tokens of `instructions` whose first line is
`Current time: …` (a new second every turn, the usual dynamic head), 12 function tools, and input
items that grow every turn by a user message, a `function_call` and its `function_call_output`.
Each policy runs on fresh replicas. Per policy: client TTFT p50 per prompt bucket (to the first
`response.output_text.delta`), the engine's hit ratio (sum cached / sum input tokens, the cold
first turn included), the proxy's predicted cached tokens against the engine's, and the tenant's
last continuity ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from app.config import Settings  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402
from app.telemetry.metrics import prompt_bucket  # noqa: E402
from tests.chat_history import words  # noqa: E402

POLICIES = ("observe", "rewrite")
TENANT = "codex"
TOOLS = [{"type": "function", "name": f"tool_{i:02d}", "description": f"tool {i}: " + words(50 + i, 30),
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for i in range(12)]
STATIC_INSTRUCTIONS = "You are a coding agent working in a git repository.\n" + words(7, 1800)


def instructions(turn: int) -> str:
    now = datetime(2026, 12, 1, 18, 0, tzinfo=UTC) + timedelta(seconds=turn)
    return f"Current time: {now:%Y-%m-%d %H:%M:%S} UTC\n" + STATIC_INSTRUCTIONS


def session(turns: int) -> list[list[dict[str, Any]]]:
    items: list[dict[str, Any]] = []
    out = []
    for t in range(turns):
        items.append({"type": "message", "role": "user",
                      "content": [{"type": "input_text", "text": f"task step {t}: " + words(300 + t, 40)}]})
        out.append(list(items))
        items.append({"type": "function_call", "call_id": f"call_{t}", "name": "tool_01",
                      "arguments": '{"path": "src/file_' + str(t) + '.py"}'})
        items.append({"type": "function_call_output", "call_id": f"call_{t}", "output": words(400 + t, 150)})
    return out


def run_policy(policy: str, turns: int, replicas: int, time_scale: float) -> dict[str, Any]:
    sim = SimCluster(replicas=replicas, time_scale=time_scale, prefill_tps=8000.0, kv_blocks=200_000).start()
    settings = Settings(backends=[{"url": u, "name": f"r{i}"} for i, u in enumerate(sim.urls)],
                        routing={"policy": "prefix_affinity"}, tenants={"default": {"policy": policy}})
    app = create_app(settings)
    server = ServerThread(app).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                               default_headers={"x-tenant-id": TENANT})
        rows = []
        for turn, items in enumerate(session(turns)):
            start = time.perf_counter()
            ttft = None
            final = None
            with client.responses.create(model="sim", stream=True, instructions=instructions(turn), tools=TOOLS,
                                         input=items, max_output_tokens=16, store=False) as stream:
                for event in stream:
                    if ttft is None and event.type == "response.output_text.delta" and event.delta:
                        ttft = time.perf_counter() - start
                    if event.type == "response.completed":
                        final = event.response
            assert final is not None and final.usage is not None
            rows.append((ttft, final.usage.input_tokens, final.usage.input_tokens_details.cached_tokens))
        deadline = time.monotonic() + 30
        stage = app.services.prefix
        while stage.processed < turns and time.monotonic() < deadline:
            time.sleep(0.01)
        registry = app.services.metrics.registry
        predicted = registry.get_sample_value("prefixgate_cached_tokens_total",
                                              {"model": "sim", "tenant": TENANT, "source": "predicted"})
        continuity = registry.get_sample_value("prefixgate_prefix_continuity_ratio", {"tenant": TENANT})
        matched = sum(1 for _, _, p, d in stage.predictions if p == d)
    finally:
        server.stop()
        sim.stop()
    by_bucket: dict[str, list[float]] = {}
    for ttft, prompt, _ in rows:
        if ttft is not None:
            by_bucket.setdefault(prompt_bucket(prompt), []).append(ttft)
    prompt_sum = sum(r[1] for r in rows)
    cached_sum = sum(r[2] for r in rows)
    return {"policy": policy, "hit_ratio": cached_sum / prompt_sum if prompt_sum else 0.0,
            "engine_cached": cached_sum, "predicted": int(predicted or 0), "exact_turns": matched,
            "turns": len(rows), "continuity": continuity,
            "ttft_p50": {b: statistics.median(v) for b, v in sorted(by_bucket.items())},
            "warm_ttft_p50": statistics.median([r[0] for r in rows[1:] if r[0] is not None]) if turns > 1 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args()
    results = [run_policy(p, args.turns, args.replicas, args.time_scale) for p in POLICIES]
    print("| policy | hit ratio | engine cached | predicted cached | turns predicted exactly | continuity "
          "| warm TTFT p50 | TTFT p50 by prompt bucket |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        buckets = ", ".join(f"{b}: {v * 1000:.0f} ms" for b, v in r["ttft_p50"].items())
        cont = "absent" if r["continuity"] is None else f"{r['continuity']:.2f}"
        warm = "n/a" if r["warm_ttft_p50"] is None else f"{r['warm_ttft_p50'] * 1000:.0f} ms"
        print(f"| {r['policy']} | {r['hit_ratio']:.1%} | {r['engine_cached']} | {r['predicted']} "
              f"| {r['exact_turns']}/{r['turns']} | {cont} | {warm} | {buckets} |")


if __name__ == "__main__":
    main()
