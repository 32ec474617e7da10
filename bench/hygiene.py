"""Hygiene: what `rewrite` buys over `observe`, and what it costs on the hot path (issue 7).

    .venv/bin/python bench/hygiene.py [--requests 16] [--replicas 2] [--time-scale 1] [--rounds 200]
    (or: prefixgate bench hygiene [...])

Workload: simulated vLLM replicas (prefill 8000 tok/s, 16-token blocks) behind the proxy with
prefix-affinity routing; three tenants send `--requests` streamed chats each, round-robin, one at
a time, each with a new question:
  (a) `Current time: …` (a new second every request) on the first line of a ~3k-token system prompt;
  (b) a short system prompt and ~3k tokens of tools, shuffled on every request;
  (c) a clean ~3k-token system prompt.
Per tenant and policy: engine hit ratio = sum(usage.prompt_tokens_details.cached_tokens) /
sum(usage.prompt_tokens) over all its requests (the first, cold one included), and the client's
TTFT p50/p95 (to the first content chunk). Each policy runs on fresh replicas.
Target: (a) and (b) < 10% with observe -> >= 80% with rewrite; (c) unchanged.

Overhead: the hook on a ~1 MB chat body (timestamp line + 1 MB system prompt + 24 shuffled tools),
new timestamp and order every round, in-process: observe (scan only) vs rewrite (scan + move +
sort) plus the body re-serialisation the proxy then does. Target: rewrite adds <= 1 ms p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402

from app.config import Settings  # noqa: E402
from app.dialects import CHAT  # noqa: E402
from app.pipeline.hygiene_stage import build_hygiene_stage  # noqa: E402
from app.proxy.context import Arrival, RequestContext, Timings  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402
from app.telemetry.metrics import Metrics  # noqa: E402

POLICIES = ("observe", "rewrite")
TENANTS = ("a_timestamp", "b_tool_order", "c_clean")
LONG_SYSTEM = "".join(f"Rule {i}: answer from the handbook, cite the section, never guess about order status.\n"
                      for i in range(1, 190))
TOOL_NAMES = ["cancel_order", "check_stock", "create_ticket", "escalate", "find_customer", "get_invoice",
              "list_orders", "lookup_order", "refund", "reset_password", "schedule_call", "search_docs",
              "send_email", "track_parcel", "update_address", "verify_identity"]


def make_tool(name: str) -> dict[str, Any]:
    props = {f"{name}_arg{j}": {"type": "string", "description": f"argument {j} of {name}, see the handbook"}
             for j in range(6)}
    return {"type": "function", "function": {"name": name, "description": f"{name.replace('_', ' ')} for a customer",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": list(props)[:2]}}}


TOOLS = [make_tool(n) for n in TOOL_NAMES]


def body_for(tenant: str, i: int, rng: random.Random) -> dict[str, Any]:
    question = {"role": "user", "content": f"Question {i}: where is parcel {1000 + i * 37}?"}
    body: dict[str, Any] = {"model": "sim", "max_tokens": 4, "stream": True,
                            "stream_options": {"include_usage": True}}
    if tenant == "a_timestamp":
        clock = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_776_000_000 + 7 * i))
        system = f"Current time: {clock}\nYou are Acme's support assistant.\n{LONG_SYSTEM}"
        body["messages"] = [{"role": "system", "content": system}, question]
    elif tenant == "b_tool_order":
        tools = TOOLS[:]
        rng.shuffle(tools)
        body["messages"] = [{"role": "system", "content": "You are the support assistant."}, question]
        body["tools"] = tools
    else:
        body["messages"] = [{"role": "system", "content": f"You are Globex's support assistant.\n{LONG_SYSTEM}"},
                            question]
    return body


def stream_once(client: httpx.Client, tenant: str, body: dict[str, Any]) -> tuple[float, int, int]:
    """(TTFT s, prompt tokens, cached tokens) of one streamed chat."""
    start = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-tenant-id": tenant}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ttft or float("nan"), int(usage.get("prompt_tokens") or 0), int(cached)


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with SimCluster(replicas=args.replicas, time_scale=args.time_scale, kv_blocks=20_000) as sim:
        settings = Settings(backends=[{"url": u} for u in sim.urls], tenants={"default": {"policy": policy}})
        app = create_app(settings)
        server = ServerThread(app).start()
        try:
            rng = random.Random(7)
            samples: dict[str, list[tuple[float, int, int]]] = {t: [] for t in TENANTS}
            with httpx.Client(base_url=server.url, timeout=120) as client:
                for i in range(args.requests):
                    for tenant in TENANTS:
                        samples[tenant].append(stream_once(client, tenant, body_for(tenant, i, rng)))
        finally:
            server.stop()
    for tenant, rows in samples.items():
        ttfts = sorted(r[0] for r in rows)
        out[tenant] = {"hit": sum(r[2] for r in rows) / max(1, sum(r[1] for r in rows)),
                       "p50": statistics.median(ttfts), "p95": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
                       "tokens": statistics.mean(r[1] for r in rows)}
    return out


def big_body(i: int, rng: random.Random, text: str) -> dict[str, Any]:
    tools = TOOLS[:]
    rng.shuffle(tools)
    clock = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_776_000_000 + i))
    return {"model": "sim", "tools": tools,
            "messages": [{"role": "system", "content": f"Current time: {clock}\n{text}"},
                         {"role": "user", "content": "Summarise section 4."}]}


def corpus(chars: int) -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for path in sorted(stdlib.glob("*.py")):
        parts.append(path.read_text(errors="ignore"))
        size += len(parts[-1])
        if size >= chars:
            break
    return "".join(parts)[:chars]


async def overhead(rounds: int) -> dict[str, list[float]]:
    text = corpus(1_000_000)
    times: dict[str, list[float]] = {"observe": [], "rewrite": [], "reserialise": [], "total": []}
    for policy in POLICIES:
        settings = Settings(tenants={"default": {"policy": policy}})
        hook = build_hygiene_stage(settings, Metrics())
        rng = random.Random(3)
        for i in range(rounds + 5):
            body = big_body(i, rng, text)
            ctx = RequestContext(Arrival(request_id=str(i), dialect=CHAT, path="/v1/chat/completions", tenant="bench",
                                 headers={}, body=body, model="sim", stream=False),
                                 Timings(arrival=time.perf_counter()))
            t0 = time.perf_counter()
            await hook.before_route(ctx)
            t1 = time.perf_counter()
            if ctx.body_changed:
                orjson.dumps(ctx.body)
            t2 = time.perf_counter()
            if i < 5:
                continue  # warm-up (regex compilation, first sight of the static lines)
            times[policy].append(t1 - t0)
            if policy == "rewrite":
                assert ctx.body_changed, "the rewrite bench must rewrite"
                times["reserialise"].append(t2 - t1)
                times["total"].append(t2 - t0)
    return times


def ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=16, help="requests per tenant and policy")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulated delays x this")
    parser.add_argument("--rounds", type=int, default=200, help="overhead rounds on the 1 MB body")
    args = parser.parse_args(argv)
    results = {p: run_policy(p, args) for p in POLICIES}
    cost = asyncio.run(overhead(args.rounds))
    cmd = "  ".join(["$", ".venv/bin/python bench/hygiene.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"\nHygiene: observe vs rewrite, {args.requests} streamed requests per tenant, {args.replicas} "
          f"simulated replicas (time scale {args.time_scale}), prefix-affinity routing\n{cmd}\n")
    print(f"| {'tenant':<14} | {'prompt tok':>10} | {'hit observe':>11} | {'hit rewrite':>11} | "
          f"{'TTFT p50 obs / rw':>21} | {'TTFT p95 obs / rw':>21} | target |")
    print(f"|{'-' * 16}|{'-' * 12}|{'-' * 13}|{'-' * 13}|{'-' * 23}|{'-' * 23}|--------|")
    for tenant in TENANTS:
        o, r = results["observe"][tenant], results["rewrite"][tenant]
        target = "unchanged" if tenant == "c_clean" else "<10% -> >=80%"
        print(f"| {tenant:<14} | {o['tokens']:>10.0f} | {o['hit']:>10.1%} | {r['hit']:>10.1%} | "
              f"{ms(o['p50']):>9} / {ms(r['p50']):>9} | {ms(o['p95']):>9} / {ms(r['p95']):>9} | {target} |")
    print(f"\nHot-path cost on a ~1 MB chat body (timestamp line + 1 MB system prompt + {len(TOOLS)} shuffled "
          f"tools), {args.rounds} rounds\n")
    print(f"| {'measure':<48} | {'p50':>10} | {'p99':>10} | target |")
    print(f"|{'-' * 50}|{'-' * 12}|{'-' * 12}|--------|")
    rows = [("hook, observe (scan only)", cost["observe"], ""),
            ("hook, rewrite (scan + move_dynamic + sort_tools)", cost["rewrite"], ""),
            ("re-serialise the rewritten body (orjson)", cost["reserialise"], ""),
            ("rewrite total added before forwarding", cost["total"], "<= 1 ms")]
    for name, xs, target in rows:
        xs = sorted(xs)
        print(f"| {name:<48} | {ms(statistics.median(xs)):>10} | {ms(xs[int(0.99 * (len(xs) - 1))]):>10} | {target:<6} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
