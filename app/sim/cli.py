"""`prefixgate sim`: N simulated vLLM-compatible replicas on ports BASE..BASE+N-1."""

from __future__ import annotations

import argparse
import re
import signal
import threading
from typing import Any

from app.sim.options import DEFAULT_CACHED_TPS, DEFAULT_DECODE_TPS, DEFAULT_PREFILL_TPS, SimOptions
from app.sim.testing import SimCluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=1, help="number of replicas (default 1)")
    p.add_argument("--port", type=int, default=8000, help="first port; replica i listens on PORT+i")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="sim", help="served model name")
    p.add_argument("--tokenizer", default=None, help="Hugging Face tokenizer directory (default: built-in)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=4096, help="KV blocks per replica (num_gpu_blocks)")
    p.add_argument("--prefill-tps", type=float, default=DEFAULT_PREFILL_TPS, help="prefill tokens/s")
    p.add_argument("--decode-tps", type=float, default=DEFAULT_DECODE_TPS, help="decode tokens/s per sequence")
    p.add_argument("--cached-tps", type=float, default=DEFAULT_CACHED_TPS,
                   help="cached prefix tokens read per second (the attention term; 0 = free)")
    p.add_argument("--max-batch-tokens", type=int, default=2048, help="token budget per engine step")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    p.add_argument("--deltas-per-chunk", type=int, default=1, help="tokens batched per SSE event")
    p.add_argument("--role-chunk-early", action="store_true", help="send the role chunk at arrival")
    p.add_argument("--time-scale", type=float, default=1.0, help="0 = no sleeps (same order/accounting)")
    p.add_argument("--flavor", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--sglang-page-size", type=int, default=1,
                   help="SGLang flavour: the engine's --page-size (radix matches floored to whole pages)")
    p.add_argument("--spec-decode", type=float, default=None, metavar="MEAN_ACCEPT",
                   help="speculative decoding with this mean acceptance length (bonus token included)")
    p.add_argument("--spec-tokens", type=int, default=3, help="draft tokens per step with --spec-decode")
    p.add_argument("--kv-events", default=None, metavar="ENDPOINT",
                   help="publish ZMQ KV events (bound; replica i uses port+i), e.g. tcp://*:5557")
    p.add_argument("--kv-events-topic", default="")
    p.add_argument("--kv-events-replay", default=None, metavar="ENDPOINT",
                   help="replay ROUTER endpoint (replica i uses port+i; default: a free loopback port)")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--disable-prompt-tokens-details", dest="enable_prompt_tokens_details",
                   action="store_false", help="omit usage.prompt_tokens_details.cached_tokens")
    p.add_argument("--enable-force-include-usage", dest="include_usage_always", action="store_true")
    p.add_argument("--attention-pair-s", type=float, default=0.0,
                   help="prefill seconds per (new token x token already in context)")
    p.add_argument("--enable-per-request-metrics", action="store_true",
                   help="a `metrics` object per answer, as vLLM's flag (timing in ms)")
    p.add_argument("--prefix-caching-hash-algo", choices=["sha256", "sha256_cbor"], default="sha256")
    p.add_argument("--output-tokens", type=int, default=32, help="natural completion length (EOS)")
    p.add_argument("--reasoning-tokens", type=int, default=0, help="first N output tokens are reasoning")
    p.add_argument("--crash-above-tokens", type=int, default=None,
                   help="a longer prompt crashes the engine (500, then /health 500)")
    p.add_argument("--no-strip-billing-header", dest="strip_billing_header", action="store_false",
                   help="keep Claude Code's billing header (as SGLang) instead of dropping it (as vLLM 0.32)")


def _endpoint_for(endpoint: str, i: int) -> str:
    """Replica i's KV-event endpoint: the TCP port offset by i, like vLLM's DP ranks."""
    m = re.match(r"^(tcp://[^:]+:)(\d+)$", endpoint)
    if not m or i == 0:
        return endpoint
    return f"{m.group(1)}{int(m.group(2)) + i}"


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    names = {f for f in SimOptions.__dataclass_fields__} - {"kv_events", "kv_events_replay"}
    return {k: v for k, v in vars(args).items() if k in names}


def run(args: argparse.Namespace) -> int:
    base = options_from_args(args)
    clusters: list[SimCluster] = []
    # before the replicas answer: a SIGTERM sent once they are up (a test, a pod's stop) must find
    # the handler, not the default action (the process killed, exit status -15)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for i in range(args.replicas):
            kv = _endpoint_for(args.kv_events, i) if args.kv_events else False
            replay = _endpoint_for(args.kv_events_replay, i) if args.kv_events_replay else None
            clusters.append(SimCluster(1, host=args.host, ports=[args.port + i], kv_events=kv,
                                       kv_events_replay=replay, **base).start())
        for i, c in enumerate(clusters):
            events = (f"  kv-events {c.kv_event_endpoints[0]} (replay {c.kv_replay_endpoints[0]})"
                      if c.kv_event_endpoints else "")
            print(f"replica {i}: {c.urls[0]}/v1  ({args.flavor}, block {args.block_size}, "
                  f"{args.kv_blocks} blocks){events}", flush=True)
        stop.wait()
    finally:
        for c in clusters:
            c.stop()
    return 0
