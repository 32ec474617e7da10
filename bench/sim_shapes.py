"""Does the simulator reproduce the seeds' shape? Cold vs warm TTFT at 2k / 16k / 128k tokens.

    .venv/bin/python bench/sim_shapes.py [--sizes 2000,16000,128000] [--time-scale 1]

One replica with the default rates (prefill 8000 tokens/s, decode 60 tokens/s per sequence,
cached prefix read at 200k tokens/s, 2048-token steps), `--kv-blocks 16384` so that a 128k prompt fits (the default 4096 blocks hold
65,536 tokens). For each size: a fresh chat prompt of about that many tokens is streamed twice
(cold, then warm) with the `openai`-style SSE over loopback; TTFT is measured by the client as the
time to the first non-empty content delta, so it includes HTTP, chat-template rendering and
tokenisation (the sim tokenises long prompts in a worker thread, as a real server does).
`engine cold/warm` is the simulator's modelled prefill time (its virtual clock), i.e. what the
client would see with free tokenisation.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
import time

import httpx
import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.sim.testing import SimCluster  # noqa: E402
from app.sim.tokens import load_tokenizer  # noqa: E402

WORDS = ("cache prefix block token engine replica router tenant prompt stream latency budget "
         "schedule chunk decode prefill memory evict hash chain salt policy gauge metric window").split()


def make_text(tokens: int, seed: int) -> str:
    """A prompt body of about `tokens` tokens (checked against the tokenizer, then trimmed)."""
    rng = random.Random(seed)
    tok = load_tokenizer()
    words = [f"{rng.choice(WORDS)}{rng.randrange(1000)}" for _ in range(tokens)]
    text = " ".join(words)
    ids = tok.encode(text)
    return tok.decode(ids[:tokens])


def stream_ttft(client: httpx.Client, url: str, text: str) -> tuple[float, dict]:
    body = {"model": "sim", "stream": True, "max_tokens": 2, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Summarise."}]}
    t0 = time.perf_counter()
    ttft = None
    usage: dict = {}
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = orjson.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if ttft is None and choice.get("delta", {}).get("content"):
                    ttft = time.perf_counter() - t0
    assert ttft is not None
    return ttft, usage


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2000,16000,128000")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--kv-blocks", type=int, default=16384)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with SimCluster(time_scale=args.time_scale, kv_blocks=args.kv_blocks) as sim, httpx.Client() as client:
        url = sim.urls[0]
        for i, size in enumerate(sizes):
            text = make_text(size, seed=i)
            cold, cold_usage = stream_ttft(client, url, text)
            warm, warm_usage = stream_ttft(client, url, text)
            recent = client.get(url + "/sim/state").json()["recent_requests"][-2:]
            rows.append((cold_usage["prompt_tokens"], cold, warm,
                         warm_usage["prompt_tokens_details"]["cached_tokens"],
                         recent[0]["virtual_ttft_s"], recent[1]["virtual_ttft_s"]))
    command = "python bench/sim_shapes.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# {command}")
    print("# prefill 8000 tok/s, decode 60 tok/s, cached read 200k tok/s, 2048-token steps, block 16, "
          f"{args.kv_blocks} KV blocks, time scale {args.time_scale}")
    print("| prompt tokens | cold TTFT | warm TTFT | warm cached tokens | cold/warm | engine cold | engine warm |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, cold, warm, cached, v_cold, v_warm in rows:
        print(f"| {n:,} | {fmt(cold)} | {fmt(warm)} | {cached:,} | {cold / warm:.0f}x | "
              f"{fmt(v_cold)} | {fmt(v_warm)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
