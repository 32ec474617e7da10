"""CPU per request of a growing agent conversation: the first turns against the last (issue 26).

    .venv/bin/python bench/agents_growth.py [--sessions 4] [--turns 40] [--new-kb 22]

Agents at the seeds' lengths: `--sessions` chat sessions of one tenant, each a system prompt and
tool definitions (~25 KB), growing by a tool call, its result (a file the agent read) and a short
reply each turn (~`--new-kb` KB new), to ~900 KB at turn 40. Turns are interleaved across sessions
(turn t of every session, then turn t + 1), as concurrent sessions arrive. Each request goes
through the gateway's own prefix stage and router in this process (prefix_affinity, two replicas
that are never contacted): fingerprint before routing, the router's residency lookup and write,
after the response the completion of the chain, prediction, residency and continuity, with the
reply as the generated text. The replicas' KV capacity is `--kv-blocks` (what a scrape of the
engine would set; below one conversation's length the residency index would evict each chain as
it is written, which no engine serving these prompts does). Measured per request: process CPU, every thread plus the
cold-prompt pool's processes (bench/fingerprint_cpu.py's `_tree_cpu`). Printed: CPU per request
at the first and the last five turns (mean and median), their ratio (the same new bytes each
turn), the share routed on an exact chain, RSS growth over the run, and the bytes the token memo,
the chain memo, the tracker and the residency index hold per cached token or block.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fingerprint_cpu import _tree_cpu  # noqa: E402

from app.config import Settings  # noqa: E402
from app.dialects import CHAT  # noqa: E402
from app.proxy.context import Arrival, RequestContext, Timings  # noqa: E402
from app.routing.base import RouteRequest  # noqa: E402
from app.server import build_services  # noqa: E402

WORDS = ("def class return import self value result index count buffer token block chain cache "
         "prefix replica request tenant segment memo parse render split hash route stream").split()


def _code(rng: random.Random, chars: int) -> str:
    """A file's text as a tool returns it: indented lines of identifiers."""
    lines: list[str] = []
    size = 0
    while size < chars:
        line = "    " * rng.randint(0, 3) + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _tools(rng: random.Random, chars: int) -> list[dict]:
    tools: list[dict] = []
    while len(json.dumps(tools)) < chars:
        name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{len(tools)}"
        tools.append({"type": "function", "function": {
            "name": name, "description": " ".join(rng.choice(WORDS) for _ in range(60)),
            "parameters": {"type": "object", "properties": {
                f"{rng.choice(WORDS)}_{i}": {"type": "string", "description": " ".join(rng.choice(WORDS) for _ in range(12))}
                for i in range(4)}, "required": []}}})
    return tools


class Session:
    def __init__(self, k: int, new_kb: int) -> None:
        self.rng = random.Random(100 + k)
        self.new = new_kb * 1000
        self.tools = _tools(self.rng, 20_000)
        self.messages: list[dict] = [{"role": "system", "content": f"You are coding agent {k}.\n" + _code(self.rng, 4000)},
                                     {"role": "user", "content": "Fix the failing test in the cache module."}]
        self.reply = ""

    def body(self) -> dict:
        return {"model": "m", "stream": True, "messages": list(self.messages), "tools": self.tools}

    def advance(self, turn: int) -> None:
        """What the next request adds: the reply, a tool call and its result, the next ask."""
        path = f"src/module_{turn}.py"
        self.messages += [
            {"role": "assistant", "content": self.reply + f"\nI will read {path}."},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": _code(self.rng, self.new - 400)},
            {"role": "user", "content": f"Now look at {path} and continue with step {turn}."},
        ]


def _bytes(services) -> dict[str, int]:
    stage = services.prefix
    parts = stage.memory_bytes()
    parts["residency"] = services.store.residency_bytes() if hasattr(services.store, "residency_bytes") else 0
    return parts


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def request(services, s: Session, seq: int) -> tuple[float, str, int]:
    """One turn through stage and router; returns (CPU seconds, routed mode, prompt tokens)."""
    stage, router = services.prefix, services.router
    body = orjson.loads(orjson.dumps(s.body()))  # fresh objects, as the gateway parses each body (outside the CPU counted)
    ctx = RequestContext(Arrival(request_id=f"r-{seq}", dialect=CHAT, path="/v1/chat/completions", tenant="agents",
                                 headers={}, body=body, model="m", stream=True),
                         Timings(arrival=time.perf_counter()))
    c0 = _tree_cpu(start=True)
    await stage.before_route(ctx)
    fp = ctx.fingerprint
    mode = "none" if fp is None else ("exact" if fp.complete else ("approx" if fp.mode == "approx" else "pending"))
    decision = await router.choose(RouteRequest("agents", "m", None, fp, fp.estimated_tokens if fp else 0))
    ctx.decision = decision
    ctx.timings.upstream_sent = time.perf_counter()
    ctx.result.answered(200)
    s.reply = " ".join(s.rng.choice(WORDS) for _ in range(60))
    n = fp.num_tokens if fp is not None and fp.num_tokens else 1
    ctx.result.observed({"prompt_tokens": n, "completion_tokens": len(stage.fingerprinter.encode_small(s.reply)),
                         "total_tokens": n}, s.reply)
    stage.after_response(ctx)
    await stage.drain()
    if hasattr(router, "writes"):
        await router.writes.drain()
    return _tree_cpu() - c0, mode, fp.num_tokens or 0 if fp is not None else 0


async def run(sessions: int, turns: int, new_kb: int, kv_blocks: int = 65_536) -> dict:
    # each replica's KV capacity as its engine would report it (never contacted here)
    services = build_services(Settings(backends=[{"url": "http://127.0.0.1:9", "kv_blocks": kv_blocks},
                                                 {"url": "http://127.0.0.1:10", "kv_blocks": kv_blocks}]))
    await services.store.start()
    group = [Session(k, new_kb) for k in range(sessions)]
    cpu: dict[int, list[float]] = {}
    modes: dict[str, int] = {}
    sizes: dict[int, int] = {}
    rss0 = _rss()
    seq = 0
    try:
        for turn in range(1, turns + 1):
            for s in group:
                seq += 1
                spent, mode, tokens = await request(services, s, seq)
                cpu.setdefault(turn, []).append(spent)
                modes[mode] = modes.get(mode, 0) + 1
                sizes[turn] = max(sizes.get(turn, 0), len(json.dumps(s.body())))
                s.advance(turn)
        parts = _bytes(services)
        fpr = services.prefix.fingerprinter
        memo = fpr.tokenizer.memo
        memo_tokens = sum(len(ids) for _, ids in memo._data.values())
        chain_blocks = sum(len(n.hashes) for _, n in fpr.chains._data.values())
        res_blocks = sum(services.store.residency_size(r.name) for r in services.replicas.all())
        tracker = services.prefix.tracker
        split_entries = len(fpr.tokenizer.resplit._entries)
    finally:
        services.prefix.shutdown()
        await services.store.close()
    return {"cpu": cpu, "modes": modes, "sizes": sizes, "rss": (rss0, _rss()), "parts": parts,
            "memo_tokens": memo_tokens, "chain_blocks": chain_blocks, "res_blocks": res_blocks,
            "tracker_blocks": tracker.hash_count, "block": services.prefix.block_size(),
            "split_entries": split_entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--new-kb", type=int, default=22)
    ap.add_argument("--kv-blocks", type=int, default=65_536,
                    help="each replica's KV capacity in blocks, as its engine would report it (default: ~1M "
                         "tokens, an 8B model on a 141 GB GPU holds ~0.84M)")
    a = ap.parse_args(argv)
    r = asyncio.run(run(a.sessions, a.turns, a.new_kb, a.kv_blocks))
    cpu, sizes = r["cpu"], r["sizes"]
    first = [x for t in range(1, 6) for x in cpu[t]]
    last = [x for t in range(a.turns - 4, a.turns + 1) for x in cpu[t]]
    total = sum(r["modes"].values())
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    print("| turns | prompt size | CPU / request, mean | median |")
    print("|---|---:|---:|---:|")
    for label, turns_, xs in (("1-5", range(1, 6), first), (f"{a.turns - 4}-{a.turns}", range(a.turns - 4, a.turns + 1), last)):
        lo, hi = sizes[turns_[0]], sizes[turns_[-1]]
        print(f"| {label} | {lo / 1000:.0f}-{hi / 1000:.0f} KB | {1000 * statistics.mean(xs):.2f} ms "
              f"| {1000 * statistics.median(xs):.2f} ms |")
    print(f"\nlast 5 / first 5 turns (mean): {statistics.mean(last) / statistics.mean(first):.2f}x; "
          f"routed exact: {100.0 * r['modes'].get('exact', 0) / total:.0f}% of {total} requests "
          f"({', '.join(f'{k} {v}' for k, v in sorted(r['modes'].items()))})")
    rss0, rss1 = r["rss"]
    parts = r["parts"]
    print(f"RSS {rss0 / 2**20:.0f} MB -> {rss1 / 2**20:.0f} MB (+{(rss1 - rss0) / 2**20:.0f} MB)\n")
    print("| part | bytes held | per |")
    print("|---|---:|---:|")
    print(f"| token memo | {parts['token_memo'] / 2**20:.1f} MB | {parts['token_memo'] / max(1, r['memo_tokens']):.1f} B a memoised token |")
    print(f"| split memo | {parts['split_memo'] / 2**20:.1f} MB | {r['split_entries']} conversations kept |")
    print(f"| chain memo | {parts['chain_memo'] / 2**20:.1f} MB | {parts['chain_memo'] / max(1, r['chain_blocks'] * r['block']):.2f} B a token of its blocks |")
    print(f"| tracker hashes | {parts['tracker_hashes'] / 2**20:.2f} MB | {parts['tracker_hashes'] / max(1, r['tracker_blocks']):.1f} B a block |")
    print(f"| residency index | {parts['residency'] / 2**20:.2f} MB | {parts['residency'] / max(1, r['res_blocks']):.1f} B a block |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
