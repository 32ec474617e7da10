"""A Claude-Code-shaped session through `/v1/messages` (issue 15): what the gateway sees and predicts.

    .venv/bin/python bench/agents_messages.py [--turns 10] [--time-scale 1]

Workload: one simulated vLLM replica (prefill 8000 tok/s, 16-token blocks) behind the proxy; the
real `anthropic` client streams `--turns` turns of one session: system blocks = Claude Code's
`x-anthropic-billing-header` (a new `cch=` every turn) + a ~4k-token static prompt, 24 tools with
input schemas, and a history that grows by a user turn, a tool_use / tool_result round trip and the
assistant's reply each turn. Three runs, each on a fresh replica:
  - vllm:    the replica drops the billing-header block (vLLM 0.32), policy observe;
  - observe: the replica keeps it (as SGLang: `--no-strip-billing-header`), policy observe;
  - rewrite: the replica keeps it, policy rewrite (the gateway removes the block).
What is measured per run, and the table: bench/agents_session.py (shared with
bench/agents_responses.py); the engine's cached tokens are `cache_read_input_tokens`, the prompt
`input_tokens + cache_read_input_tokens + cache_creation_input_tokens`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anthropic  # noqa: E402

from bench.agents_session import Run, Turn, TurnFn, print_table, run_session  # noqa: E402

TENANT = "cc"
STATIC = ("You are an interactive CLI coding agent. Use the tools to read, edit and test code; keep "
          "changes minimal and follow the repository's conventions.\n") * 110
TOOLS = [{"name": f"{verb}_{i}", "description": f"{verb.title()} files and report the result ({i}).",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                            "limit": {"type": "integer"}}, "required": ["path"]}}
         for i, verb in enumerate(["read", "edit", "grep", "glob", "bash", "todo"] * 4)]
NAMES = {"vllm": "vLLM (strips) / observe", "observe": "keeps (SGLang-like) / observe",
         "rewrite": "keeps (SGLang-like) / rewrite"}


def billing(turn: int) -> dict[str, str]:
    cch = f"{(0x3c1e7 * (turn + 3)) % 0xfffff:05x}"
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.e4c; cc_entrypoint=cli; cch={cch};"}


def claude_code(url: str) -> TurnFn:
    """The session's turns: each grows the history by a tool_result, a question and the reply."""
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    history: list[dict[str, Any]] = []

    def turn(n: int) -> Turn:
        if n:
            history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n - 1}",
                                                         "content": f"exit 0; {n * 3} tests passed"}]})
        history.append({"role": "user", "content": [{"type": "text", "text": f"Step {n}: next failing test?"}]})
        start = time.perf_counter()
        ttft = None
        with client.messages.stream(model="sim", max_tokens=24, system=[billing(n), {"type": "text", "text": STATIC}],
                                    tools=TOOLS, messages=history, extra_headers={"x-tenant-id": TENANT}) as s:
            parts = []
            for text in s.text_stream:
                if ttft is None and text:
                    ttft = time.perf_counter() - start
                parts.append(text)
            usage = s.get_final_message().usage
        history.append({"role": "assistant", "content": [
            {"type": "text", "text": "".join(parts)},
            {"type": "tool_use", "id": f"toolu_{n}", "name": "bash_4", "input": {"path": "tests/"}}]})
        read = usage.cache_read_input_tokens or 0
        return Turn(usage.input_tokens + read + (usage.cache_creation_input_tokens or 0), read, ttft)

    return turn


def run(mode: str, turns: int, time_scale: float) -> Run:
    keep = mode != "vllm"
    return run_session(NAMES[mode], turns, TENANT,
                       sim={"replicas": 1, "time_scale": time_scale, "kv_blocks": 200_000, "output_tokens": 24,
                            "strip_billing_header": not keep},
                       gateway={"tenants": {"default": {"policy": "rewrite" if mode == "rewrite" else "observe"}},
                                "prefix": {"billing_header": "keep" if keep else "strip"}},
                       client_turn=claude_code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()
    print(f"24 tools, billing header + static system blocks, time_scale {args.time_scale}")
    print_table([run(mode, args.turns, args.time_scale) for mode in NAMES])


if __name__ == "__main__":
    main()
