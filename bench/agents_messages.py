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
Per run: client TTFT (to the first text delta) p50 by prompt bucket, predicted vs engine cached
tokens (summed over turns; and how many turns differ), continuity and breaks from /hygiene, and the
engine hit ratio = sum(cache_read_input_tokens) / sum(prompt tokens), cold first turn included.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anthropic  # noqa: E402
import httpx  # noqa: E402

from app.config import Settings  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402
from app.telemetry.metrics import prompt_bucket  # noqa: E402

STATIC = ("You are an interactive CLI coding agent. Use the tools to read, edit and test code; keep "
          "changes minimal and follow the repository's conventions.\n") * 110
TOOLS = [{"name": f"{verb}_{i}", "description": f"{verb.title()} files and report the result ({i}).",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                            "limit": {"type": "integer"}}, "required": ["path"]}}
         for i, verb in enumerate(["read", "edit", "grep", "glob", "bash", "todo"] * 4)]


def billing(turn: int) -> dict[str, str]:
    cch = f"{(0x3c1e7 * (turn + 3)) % 0xfffff:05x}"
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.e4c; cc_entrypoint=cli; cch={cch};"}


def run(mode: str, turns: int, time_scale: float) -> dict[str, Any]:
    keep = mode != "vllm"
    sim = SimCluster(replicas=1, time_scale=time_scale, kv_blocks=200_000, output_tokens=24,
                     strip_billing_header=not keep).start()
    settings = Settings(backends=[{"url": sim.urls[0]}], tenants={"default": {"policy": "rewrite" if mode == "rewrite" else "observe"}},
                        prefix={"billing_header": "keep" if keep else "strip"})
    app = create_app(settings)
    server = ServerThread(app).start()
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    history: list[dict[str, Any]] = []
    rows = []
    try:
        for turn in range(turns):
            if turn:
                history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn - 1}",
                                                             "content": f"exit 0; {turn * 3} tests passed"}]})
            history.append({"role": "user", "content": [{"type": "text", "text": f"Step {turn}: next failing test?"}]})
            start = time.perf_counter()
            ttft = None
            with client.messages.stream(model="sim", max_tokens=24, system=[billing(turn), {"type": "text", "text": STATIC}],
                                        tools=TOOLS, messages=history, extra_headers={"x-tenant-id": "cc"}) as s:
                parts = []
                for text in s.text_stream:
                    if ttft is None and text:
                        ttft = time.perf_counter() - start
                    parts.append(text)
                usage = s.get_final_message().usage
            history.append({"role": "assistant", "content": [
                {"type": "text", "text": "".join(parts)},
                {"type": "tool_use", "id": f"toolu_{turn}", "name": "bash_4", "input": {"path": "tests/"}}]})
            prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
            rows.append((prompt, usage.cache_read_input_tokens or 0, ttft))
            deadline = time.monotonic() + 20
            while app.services.prefix.processed < turn + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        report = httpx.get(server.url + "/hygiene/tenants/cc", timeout=10).json()
        predictions = list(app.services.prefix.predictions)
    finally:
        server.stop()
        sim.stop()
    buckets: dict[str, list[float]] = {}
    for prompt, _, ttft in rows:
        if ttft is not None:
            buckets.setdefault(prompt_bucket(prompt), []).append(ttft)
    predicted = sum(p for _, _, p, _ in predictions)
    engine = sum(d or 0 for _, _, _, d in predictions)
    return {"mode": mode, "ttft": {b: statistics.median(v) for b, v in buckets.items()},
            "first_ttft": rows[0][2], "predicted": predicted, "engine": engine,
            "mismatched": sum(1 for _, _, p, d in predictions if p != d), "turns": len(rows),
            "continuity": report.get("continuity"), "breaks": report.get("breaks_by_cause"),
            "hit_ratio": sum(c for _, c, _ in rows) / max(1, sum(p for p, _, _ in rows)),
            "prompt_range": (rows[0][0], rows[-1][0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()
    results = [run(mode, args.turns, args.time_scale) for mode in ("vllm", "observe", "rewrite")]
    print(f"turns {args.turns}, prompt {results[0]['prompt_range'][0]} -> {results[0]['prompt_range'][1]} tokens "
          f"(24 tools, billing header + static system), time_scale {args.time_scale}\n")
    print("| engine / policy | client TTFT p50 by prompt bucket (all turns) | first-turn TTFT | predicted / engine cached"
          " (turns differing) | continuity | breaks | hit ratio |")
    print("|---|---|---|---|---|---|---|")
    names = {"vllm": "vLLM (strips) / observe", "observe": "keeps (SGLang-like) / observe",
             "rewrite": "keeps (SGLang-like) / rewrite"}
    for r in results:
        ttft = ", ".join(f"{b}: {v * 1000:.0f} ms" for b, v in sorted(r["ttft"].items()))
        cont = "n/a" if r["continuity"] is None else f"{r['continuity']:.2f}"
        print(f"| {names[r['mode']]} | {ttft} | {r['first_ttft'] * 1000:.0f} ms | {r['predicted']} / {r['engine']}"
              f" ({r['mismatched']}/{r['turns']}) | {cont} | {r['breaks'] or {}} | {r['hit_ratio']:.1%} |")


if __name__ == "__main__":
    main()
