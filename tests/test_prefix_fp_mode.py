"""prefixgate_fingerprint_requests_total{mode}: how each request's chain was known when routed."""

from __future__ import annotations

import time
from typing import Any

from app.config import Settings
from app.dialects import CHAT
from app.pipeline.prefix_stage import PrefixStage
from app.proxy.context import Arrival, RequestContext, Timings
from app.server import build_services

DOC = "".join(f"{i}. a clause of the contract, numbered\n" for i in range(3_000))  # ~110 KB


def _ctx(content: str) -> RequestContext:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return RequestContext(Arrival(request_id=f"r-{time.perf_counter_ns()}", dialect=CHAT, path="/v1/chat/completions",
                          tenant="default", headers={}, body=body, model="m", stream=False),
                          Timings(arrival=time.perf_counter()))


def _stage(**prefix: Any) -> PrefixStage:
    services = build_services(Settings(backends=[{"url": "http://127.0.0.1:9"}], prefix=prefix))
    assert isinstance(services.prefix, PrefixStage)
    return services.prefix


def _count(stage: PrefixStage, mode: str) -> float:
    return stage.metrics.fingerprint_requests.labels(mode)._value.get()


async def test_cold_is_pending_then_a_changed_last_line_is_exact() -> None:
    stage = _stage()
    try:
        cold = _ctx(f"{DOC}\nQuestion: what is clause 7?")
        await stage.before_route(cold)
        assert _count(stage, "pending") == 1 and _count(stage, "exact") == 0
        assert cold.prefix is not None and cold.prefix.pending is not None
        await cold.prefix.pending
        nxt = _ctx(f"{DOC}\nQuestion: and clause 9?")  # the same document, a new last line
        await stage.before_route(nxt)
        assert nxt.fingerprint is not None and nxt.fingerprint.complete
        assert _count(stage, "exact") == 1 and _count(stage, "pending") == 1
        assert _count(stage, "approx") == 0
    finally:
        stage.shutdown()


async def test_approx_mode_says_so() -> None:
    stage = _stage(mode="approx")
    try:
        await stage.before_route(_ctx("hello"))
        assert _count(stage, "approx") == 1 and _count(stage, "exact") == 0
    finally:
        stage.shutdown()


async def test_the_same_cold_document_twice_at_once_is_tokenised_once() -> None:
    from app.prefix.blocks import proxy_chain

    stage = _stage(cold_pool_workers=1, cold_pool_min_chars=10_000)
    pool = stage.fingerprinter.tokenizer.cold
    try:
        first, second = _ctx(f"{DOC}\nQuestion: one?"), _ctx(f"{DOC}\nQuestion: two?")
        await stage.before_route(first)
        await stage.before_route(second)  # while the first is still being tokenised
        assert first.prefix is not None and second.prefix is not None
        assert first.prefix.pending is not None and second.prefix.pending is not None
        assert pool.admitted == 1  # the second takes no cold-pool slot: it waits for the first
        tips = [await first.prefix.pending, await second.prefix.pending]
        assert pool.encoded == 1  # one pool tokenisation; the second encoded only its tail
        tok = stage.fingerprinter.tokenizer
        for ctx, tip in zip((first, second), tips, strict=True):
            ids = tok.encode(ctx.fingerprint.text or "")
            assert tip is not None and list(tip.hashes) == proxy_chain(ids, 16)
        assert _count(stage, "pending") == 2 and _count(stage, "approx") == 0
    finally:
        stage.shutdown()
