"""A Codex-shaped session through `POST /v1/responses`: TTFT by prompt bucket, predicted vs engine
cached tokens, continuity, and the hit ratio under `observe` vs `rewrite` (issue 15).

    .venv/bin/python bench/agents_responses.py [--turns 10] [--replicas 2] [--time-scale 1]

Workload: simulated vLLM replicas (prefill 8000 tok/s, 16-token blocks) behind the proxy with
prefix-affinity routing; one tenant runs a Codex-shaped session with the real `openai` client
(`client.responses.create(stream=True)`): ~2.5k tokens of `instructions` whose first line is
`Current time: …` (a new second every turn, the usual dynamic head), 12 function tools, and input
items that grow every turn by a user message, a `function_call` and its `function_call_output`.
Each policy runs on fresh replicas. What is measured per run, and the table:
bench/agents_session.py (shared with bench/agents_messages.py); TTFT stops at the first
`response.output_text.delta`, the engine's cached tokens are `input_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from bench.agents_session import Run, Turn, TurnFn, print_table, run_session  # noqa: E402
from tests.chat_history import codex_items, words  # noqa: E402

POLICIES = ("observe", "rewrite")
TENANT = "codex"
TOOLS = [{"type": "function", "name": f"tool_{i:02d}", "description": f"tool {i}: " + words(50 + i, 30),
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for i in range(12)]
STATIC_INSTRUCTIONS = "You are a coding agent working in a git repository.\n" + words(7, 1800)


def instructions(turn: int) -> str:
    now = datetime(2026, 12, 1, 18, 0, tzinfo=UTC) + timedelta(seconds=turn)
    return f"Current time: {now:%Y-%m-%d %H:%M:%S} UTC\n" + STATIC_INSTRUCTIONS


def codex_session(turns: int) -> Callable[[str], TurnFn]:
    """The session's turns (input items growing by a function call and its output each turn)."""
    items = codex_items(turns, 300, 40, 400, 150, "tool_01")

    def for_gateway(url: str) -> TurnFn:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                               default_headers={"x-tenant-id": TENANT})

        def turn(n: int) -> Turn:
            start = time.perf_counter()
            ttft = None
            final = None
            with client.responses.create(model="sim", stream=True, instructions=instructions(n), tools=TOOLS,
                                         input=items[n], max_output_tokens=16, store=False) as stream:
                for event in stream:
                    if ttft is None and event.type == "response.output_text.delta" and event.delta:
                        ttft = time.perf_counter() - start
                    if event.type == "response.completed":
                        final = event.response
            assert final is not None and final.usage is not None
            return Turn(final.usage.input_tokens, final.usage.input_tokens_details.cached_tokens, ttft)

        return turn

    return for_gateway


def run_policy(policy: str, turns: int, replicas: int, time_scale: float) -> Run:
    return run_session(policy, turns, TENANT,
                       sim={"replicas": replicas, "time_scale": time_scale, "prefill_tps": 8000.0,
                            "kv_blocks": 200_000},
                       gateway={"routing": {"policy": "prefix_affinity"}, "tenants": {"default": {"policy": policy}}},
                       client_turn=codex_session(turns), names=[f"r{i}" for i in range(replicas)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{args.replicas} replicas, prefix_affinity, 12 tools, instructions headed by a timestamp, "
          f"time_scale {args.time_scale}")
    print_table([run_policy(p, args.turns, args.replicas, args.time_scale) for p in POLICIES])


if __name__ == "__main__":
    main()
