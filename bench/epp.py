"""The Endpoint Picker against `prefixgate serve`: same workload, same decisions? and what it adds.

    .venv/bin/python bench/epp.py [--tenants 6] [--turns 4] [--big 8] [--pair]

One multi-tenant agent-style workload (each tenant a growing conversation, streamed, usage asked)
is sent twice, each time into fresh simulated replicas (time scale 0): through `prefixgate serve`
(HTTP) and through `prefixgate epp` driven by the test data plane (tests/epp_dataplane.py: ext_proc
over gRPC + TLS on loopback, as Envoy would). Printed: the routing decisions (per request, and by
reason), the TTFT observations, engine cached tokens and per-tenant continuity on each path; then
the EPP's added latency as the data plane sees it: per request (request body's end -> the pick and
the body back; the prompt crosses gRPC twice), and per response chunk (chunk written -> its answer
read), for the workload and for `--big` requests with ~1 MB prompts.

`--pair`: every run keeps its state in a private redis-server (tests/redis_server.py, one
namespace per run), and a third run sends the workload through two EPPs active-active on one
namespace, the data plane alternating between them request by request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from typing import Any

import httpx
import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from app.config import Settings  # noqa: E402
from app.epp.server import create_epp_app  # noqa: E402
from app.server import create_app  # noqa: E402
from app.serving import ServerThread  # noqa: E402
from app.sim.testing import SimCluster  # noqa: E402
from tests.chat_history import growing_history, words  # noqa: E402
from tests.epp_dataplane import DataPlane  # noqa: E402

NAMES = ["r0", "r1", "r2", "r3"]


def workload(tenants: int, turns: int) -> list[tuple[str, dict[str, Any]]]:
    """Turn by turn, tenants interleaved: (tenant, body)."""
    out = []
    for turn in range(turns):
        for t in range(tenants):
            system = {"role": "system", "content": f"tenant {t} tools and documents: " + words(t, 1500)}
            history = growing_history(system, [f"step {k}: " + words(t * 100 + k, 80) for k in range(turns)],
                                      ["done " + words(t + k, 30) for k in range(turns)])
            out.append((f"t{t}", {"model": "sim", "messages": history[turn], "max_tokens": 8, "stream": True,
                                  "stream_options": {"include_usage": True}}))
    return out


def settings_for(urls: list[str], **extra: Any) -> Settings:
    return Settings(backends=[{"url": u, "name": n} for u, n in zip(urls, NAMES, strict=True)], **extra)


def usage_of(body: bytes) -> dict[str, Any]:
    usage: dict[str, Any] = {}
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            usage = orjson.loads(line[6:]).get("usage") or usage
    return usage


def summary(services: Any, backends: list[str], cached: int) -> dict[str, Any]:
    reg = services.metrics.registry
    samples = [s for fam in reg.collect() for s in fam.samples]
    reasons: dict[str, float] = {}
    for s in samples:
        if s.name == "prefixgate_route_decisions_total":
            reasons[s.labels["reason"]] = reasons.get(s.labels["reason"], 0) + s.value
    ttft = [s.value for s in samples if s.name == "prefixgate_ttft_seconds_count"]
    continuity = {s.labels["tenant"]: round(s.value, 3) for s in samples if s.name == "prefixgate_prefix_continuity_ratio"}
    return {"backends": backends, "reasons": dict(sorted(reasons.items())), "ttft_count": sum(ttft),
            "cached": cached, "continuity": dict(sorted(continuity.items()))}


def via_serve(work: list[tuple[str, dict[str, Any]]], state: dict[str, Any]) -> dict[str, Any]:
    with SimCluster(replicas=4, time_scale=0.0) as sim:
        app = create_app(settings_for(sim.urls, **state))
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
            backends, cached = [], 0
            for tenant, body in work:
                r = client.post("/v1/chat/completions", json=body, headers={"x-tenant-id": tenant})
                backends.append(r.headers["x-prefixgate-backend"])
                cached += (usage_of(r.content).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                while app.openai.active:
                    time.sleep(0.001)
                asyncio.run_coroutine_threadsafe(written(app.services), server.loop).result(30)
            return summary(app.services, backends, cached)


async def written(services: Any) -> None:
    """A finished request's post-response work done and its shared-state writes sent (the next
    turn may reach another EPP at once)."""
    await services.prefix.drain()
    flush = getattr(services.store, "flush", None)
    if flush is not None:
        await flush()


def merged(summaries: list[dict[str, Any]], backends: list[str], cached: int) -> dict[str, Any]:
    """Several EPPs' figures as one: decisions and TTFT observations summed; continuity (each
    EPP reads it from the shared history) is the last writer's per tenant."""
    reasons: dict[str, float] = {}
    continuity: dict[str, float] = {}
    for one in summaries:
        for k, v in one["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
        continuity.update(one["continuity"])
    return {"backends": backends, "reasons": dict(sorted(reasons.items())),
            "ttft_count": sum(one["ttft_count"] for one in summaries), "cached": cached,
            "continuity": dict(sorted(continuity.items()))}


def via_epp(work: list[tuple[str, dict[str, Any]]], big: int, state: dict[str, Any],
            count: int = 1) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The workload through `count` EPPs (request i to EPP i % count), then `big` ~1 MB prompts."""
    with SimCluster(replicas=4, time_scale=0.0) as sim, contextlib.ExitStack() as stack:
        epps = []
        for _ in range(count):
            app, epp = create_epp_app(settings_for(sim.urls, epp={"host": "127.0.0.1", "grpc_port": 0,
                                                                  "health_port": 0}, **state))
            epps.append((app, epp, stack.enter_context(ServerThread(app))))

        def settle(app: Any, epp: Any, server: Any) -> None:
            while epp.processor.active:
                time.sleep(0.001)
            asyncio.run_coroutine_threadsafe(written(app.services), server.loop).result(30)

        async def drive() -> tuple[dict[str, Any], dict[str, list[float]]]:
            planes = [DataPlane(f"127.0.0.1:{epp.grpc_port}", epp.certificate) for _, epp, _ in epps]
            lat: dict[str, list[float]] = {"request": [], "chunk": [], "big_request": [], "big_chunk": []}
            backends: list[str] = []
            cached = 0
            try:
                for i, (tenant, body) in enumerate(work):
                    r = await planes[i % count].request("/v1/chat/completions", body, {"x-tenant-id": tenant})
                    backends.append(r.headers["x-prefixgate-backend"])
                    cached += (usage_of(r.body).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    lat["request"].append(r.pick_s or 0.0)
                    lat["chunk"] += r.chunk_answer_s
                    settle(*epps[i % count])
                out = merged([summary(app.services, [], 0) for app, _, _ in epps], backends, cached)
                for i in range(big):  # the workload's figures are taken: now the big prompts
                    prompt = f"big {i} " + "x" * (1 << 20)
                    r = await planes[0].request("/v1/chat/completions", {
                        "model": "sim", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
                        "stream": True}, {"x-tenant-id": "big"})
                    lat["big_request"].append(r.pick_s or 0.0)
                    lat["big_chunk"] += r.chunk_answer_s
            finally:
                for plane in planes:
                    await plane.close()
            return out, lat

        return asyncio.run(drive())


def ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--big", type=int, default=8, help="requests with ~1 MB prompts (EPP latency only)")
    parser.add_argument("--pair", action="store_true", help="state in Redis, plus two EPPs active-active")
    args = parser.parse_args()
    work = workload(args.tenants, args.turns)
    with contextlib.ExitStack() as stack:
        states = [{}, {}, {}]
        if args.pair:
            from tests.redis_server import RedisServer

            redis = stack.enter_context(RedisServer())
            states = [{"state": redis.url, "state_options": {"namespace": f"bench{i}", "redis_timeout_s": 1.0}}
                      for i in range(3)]
        runs = {"serve": via_serve(work, states[0])}
        runs["epp"], lat = via_epp(work, args.big, states[1])
        if args.pair:
            runs["2 EPPs"], _ = via_epp(work, 0, states[2], count=2)
    serve = runs["serve"]
    names = list(runs)
    state = "redis" if args.pair else "memory"
    print(f"workload: {args.tenants} tenants x {args.turns} turns, 4 simulated replicas, state {state}\n")
    print("| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    same = [f"{sum(a == b for a, b in zip(serve['backends'], r['backends'], strict=True))}/{len(work)}"
            for r in runs.values()]
    print("| same replica as serve, per request | " + " | ".join(same) + " |")
    for key, label in (("reasons", "decisions by reason"), ("ttft_count", "TTFT observations"),
                       ("cached", "engine cached tokens"), ("continuity", "continuity per tenant")):
        cells = [f"{r[key]:.0f}" if isinstance(r[key], float) else str(r[key]) for r in runs.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nEPP added latency (ms, as the data plane sees it; loopback gRPC + TLS)\n")
    print("| | n | p50 | p99 |\n|---|---|---|---|")
    for key, label in (("request", "per request: body end -> pick + body back"),
                       ("chunk", "per response chunk: write -> answer"),
                       ("big_request", "per request, ~1 MB prompt"), ("big_chunk", "per chunk, ~1 MB prompt")):
        print(f"| {label} | {len(lat[key])} | {ms(lat[key], 0.5)} | {ms(lat[key], 0.99)} |")
    if lat["chunk"]:
        print(f"\nmean per chunk: {statistics.fmean(lat['chunk']) * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
