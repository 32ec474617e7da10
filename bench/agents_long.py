"""Agents at the seeds' lengths (issue 29): 8 concurrent sessions growing to ~240k tokens with one
compaction each, on 4 simulated replicas, with and without `routing.session_keys`.

    .venv/bin/python bench/agents_long.py [--turns 10] [--step-tokens 57000] [--time-scale 0.5]

Workload: 4 Claude-Code-shaped sessions on `/v1/messages` (session id in `metadata.user_id`, the
JSON shape) and 4 Codex-shaped ones on `/v1/responses` (`prompt_cache_key`), all at once, each its
own tenant, over one shared ~4k-token system prompt and 12 tools. Every turn appends a ~`step`
token tool output and a question; at the middle turn each session compacts (Claude Code: the
history becomes one summary message; Codex: its user messages then the summary) and goes on from
there. Simulated vLLM replicas (`time_scale` scales their prefill and decode times; 40k KV blocks
of 16 tokens each, max_model_len 300k), default gateway config but for the index capacity.

Per session: the replicas its turns went to (`x-prefixgate-backend`), the tenant's breaks by
cause (GET /hygiene/tenants/<tenant>: a compaction is not a break), predicted vs engine cached
tokens over its turns (and how many turns differ), TTFT p50 / p95 per prompt bucket (client side,
to the first text delta). Two runs, each on fresh replicas: the default `routing.session_keys`, and
`session_keys: []`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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

SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "fe", "hi", "jo", "bu")
CHARS_PER_TOKEN = 1.74  # this text under the built-in tokenizer (29,002 chars: 16,634 tokens); sizing only


def prose(seed: int, tokens: int) -> str:
    rng = random.Random(seed)
    words, size = [], 0
    while size < tokens * CHARS_PER_TOKEN:
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)


SYSTEM = "You are an interactive CLI coding agent. Follow the repository's conventions.\n" + prose(1, 4000)
SUMMARY = "This session is being continued from a previous conversation that ran out of context. " \
          "The conversation is summarized below:\n"
NAMES = ["r0", "r1", "r2", "r3"]


@dataclass
class Turn:
    prompt: int
    cached: int
    ttft: float | None
    backend: str


@dataclass
class Session:
    name: str
    kind: str  # messages | responses
    turns: list[Turn] = field(default_factory=list)
    breaks: dict[str, int] = field(default_factory=dict)
    predicted: int = 0
    engine: int = 0
    mismatched: int = 0


def sse(resp: httpx.Response):
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def messages_turn(client: httpx.Client, tenant: str, sid: str, history: list[dict]) -> Turn:
    body = {"model": "sim", "max_tokens": 16, "stream": True, "system": SYSTEM, "messages": history,
            "tools": [{"name": f"tool_{i}", "description": f"tool {i}: " + prose(50 + i, 40),
                       "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
                      for i in range(12)],
            "metadata": {"user_id": json.dumps({"device_id": "d" * 16, "account_uuid": "", "session_id": sid})}}
    start, ttft, prompt, cached = time.perf_counter(), None, 0, 0
    with client.stream("POST", "/v1/messages", json=body, headers={"x-tenant-id": tenant}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {resp.read()[:300]!r}")
        backend = resp.headers.get("x-prefixgate-backend", "?")
        for event in sse(resp):
            if event.get("type") == "message_start":
                u = event["message"]["usage"]
                cached = u.get("cache_read_input_tokens") or 0
                prompt = u["input_tokens"] + cached + (u.get("cache_creation_input_tokens") or 0)
            elif event.get("type") == "content_block_delta" and ttft is None:
                ttft = time.perf_counter() - start
    return Turn(prompt, cached, ttft, backend)


def responses_turn(client: httpx.Client, tenant: str, sid: str, items: list[dict]) -> Turn:
    body = {"model": "sim", "max_output_tokens": 16, "stream": True, "store": False, "instructions": SYSTEM,
            "input": items, "prompt_cache_key": sid,
            "tools": [{"type": "function", "name": f"tool_{i}", "description": f"tool {i}: " + prose(50 + i, 40),
                       "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
                      for i in range(12)]}
    start, ttft, prompt, cached = time.perf_counter(), None, 0, 0
    with client.stream("POST", "/v1/responses", json=body, headers={"x-tenant-id": tenant}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {resp.read()[:300]!r}")
        backend = resp.headers.get("x-prefixgate-backend", "?")
        for event in sse(resp):
            if event.get("type") == "response.output_text.delta" and ttft is None:
                ttft = time.perf_counter() - start
            elif event.get("type") == "response.completed":
                u = event["response"]["usage"]
                prompt = u["input_tokens"]
                cached = (u.get("input_tokens_details") or {}).get("cached_tokens") or 0
    return Turn(prompt, cached, ttft, backend)


def run_session(url: str, s: Session, turns: int, step: int, seed: int, stage: Any) -> None:
    """One session's turns, each after the gateway processed the previous one's response."""
    sid = str(uuid.UUID(int=random.Random(seed).getrandbits(128)))
    history: list[dict] = []
    users: list[dict] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for n in range(turns):
            question = {"role": "user", "content": f"Step {n}: " + prose(seed * 1000 + n, 60)}
            if n == turns // 2:  # compaction: the history replaced by a summary of it
                summary = {"role": "user", "content": SUMMARY + prose(seed * 1000 + 500 + n, 1500)}
                history = [summary] if s.kind == "messages" else [*users, summary]
            if s.kind == "messages":
                history.append(question)
                if n and n != turns // 2:  # the previous turn's tool call came back
                    history[-1] = {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": f"toolu_{n - 1}",
                         "content": prose(seed * 1000 + 700 + n, step)},
                        {"type": "text", "text": question["content"]}]}
                turn = messages_turn(client, s.name, sid, history)
                history.append({"role": "assistant", "content": [
                    {"type": "text", "text": f"Looking at step {n}."},
                    {"type": "tool_use", "id": f"toolu_{n}", "name": "tool_1", "input": {"path": f"src/m{n}.py"}}]})
            else:
                msg = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question["content"]}]}
                users.append(msg)
                history.append(msg)
                turn = responses_turn(client, s.name, sid, history)
                history += [{"type": "function_call", "call_id": f"call_{n}", "name": "tool_1",
                             "arguments": json.dumps({"path": f"src/m{n}.py"})},
                            {"type": "function_call_output", "call_id": f"call_{n}",
                             "output": prose(seed * 1000 + 700 + n, step)}]
            s.turns.append(turn)
            deadline = time.monotonic() + 60
            while sum(1 for row in list(stage.predictions) if row[1] == s.name) < n + 1 and time.monotonic() < deadline:
                time.sleep(0.01)


def run(label: str, session_keys: list[str] | None, turns: int, step: int, time_scale: float) -> list[Session]:
    cluster = SimCluster(replicas=4, time_scale=time_scale, kv_blocks=40_000, max_model_len=300_000,
                         output_tokens=16).start()
    routing: dict[str, Any] = {"kv_blocks": 40_000}
    if session_keys is not None:
        routing["session_keys"] = session_keys
    app = create_app(Settings(backends=[{"url": u, "name": n} for u, n in zip(cluster.urls, NAMES, strict=True)],
                              routing=routing))
    server = ServerThread(app).start()
    stage = app.services.prefix
    sessions = [Session(f"{kind[:2]}{i}", kind) for i, kind in enumerate(["messages", "responses"] * 4)]
    try:
        with ThreadPoolExecutor(len(sessions)) as pool:
            for f in [pool.submit(run_session, server.url, s, turns, step, i + 1, stage)
                      for i, s in enumerate(sessions)]:
                f.result()
        deadline = time.monotonic() + 120
        while stage.processed < turns * len(sessions) and time.monotonic() < deadline:
            time.sleep(0.05)
        for s in sessions:
            report = httpx.get(f"{server.url}/hygiene/tenants/{s.name}", timeout=30).json()
            s.breaks = report.get("breaks_by_cause") or {}
            rows = [row for row in list(stage.predictions) if row[1] == s.name]
            s.predicted = sum(p for _, _, p, _ in rows)
            s.engine = sum(d or 0 for _, _, _, d in rows)
            s.mismatched = sum(1 for _, _, p, d in rows if p != d)
    finally:
        server.stop()
        cluster.stop()
    print(f"\n### {label}\n")
    print("| session | API | prompt tokens (first -> max) | replicas touched (turns each) | breaks by cause "
          "| predicted / engine cached (turns differing) | TTFT p50 / p95 by prompt bucket |")
    print("|---|---|---|---|---|---|---|")
    for s in sessions:
        touched = {}
        for t in s.turns:
            touched[t.backend] = touched.get(t.backend, 0) + 1
        buckets: dict[str, list[float]] = {}
        for t in s.turns:
            if t.ttft is not None:
                buckets.setdefault(prompt_bucket(t.prompt), []).append(t.ttft)
        ttft = "; ".join(f"{b}: {statistics.median(v):.2f} / {pct95(v):.2f} s (n={len(v)})"
                         for b, v in sorted(buckets.items(), key=lambda kv: bucket_order(kv[0])))
        breaks = ", ".join(f"{c} {n}" for c, n in sorted(s.breaks.items())) or "none"
        print(f"| {s.name} | {s.kind} | {s.turns[0].prompt:,} -> {max(t.prompt for t in s.turns):,} "
              f"| {len(touched)} ({', '.join(f'{k} {v}' for k, v in sorted(touched.items()))}) | {breaks} "
              f"| {s.predicted:,} / {s.engine:,} ({s.mismatched}/{len(s.turns)}) | {ttft} |")
    return sessions


def pct95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


def bucket_order(label: str) -> int:
    from app.telemetry.metrics import PROMPT_BUCKETS
    names = [b for b, _ in PROMPT_BUCKETS]
    return names.index(label) if label in names else len(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--step-tokens", type=int, default=57_000)
    ap.add_argument("--time-scale", type=float, default=0.5)
    args = ap.parse_args()
    print(f"command: python bench/agents_long.py --turns {args.turns} --step-tokens {args.step_tokens} "
          f"--time-scale {args.time_scale}")
    run("routing.session_keys: default", None, args.turns, args.step_tokens, args.time_scale)
    run("routing.session_keys: []", [], args.turns, args.step_tokens, args.time_scale)


if __name__ == "__main__":
    main()
