"""The prefix stage (app/pipeline/prefix_stage.py): who waits for whose tokenisation."""

from __future__ import annotations

import time
from typing import Any

from app.config import Settings
from app.dialects import CHAT
from app.pipeline.prefix_stage import PrefixStage
from app.proxy.context import Arrival, RequestContext, Timings
from app.server import build_services

HUGE_A = "".join(f"{i}. a clause of client A's contract\n" for i in range(25_000))  # ~900 KB, cold
HUGE_B = "".join(f"{i}. a line of client B's log file\n" for i in range(25_000))


def _ctx(messages: list[dict[str, Any]], tenant: str = "default") -> RequestContext:
    body = {"model": "m", "messages": messages}
    return RequestContext(Arrival(request_id=f"r-{time.perf_counter_ns()}", dialect=CHAT, path="/v1/chat/completions",
                          tenant=tenant, headers={}, body=body, model="m", stream=False),
                          Timings(arrival=time.perf_counter()))


def _stage(**prefix: Any) -> PrefixStage:
    services = build_services(Settings(backends=[{"url": "http://127.0.0.1:9"}], prefix=prefix))
    stage = services.prefix
    assert isinstance(stage, PrefixStage)
    return stage


async def test_one_clients_cold_prompt_does_not_delay_another_in_the_same_tenant() -> None:
    """Both clients are tenant `default` (no tenant header). A's cold ~1 MB prompt is tokenised
    in the worker pool; B's unrelated requests (small, or another cold document) are fingerprinted
    and routed while A's work still runs. The wait is long (5 s) so that waiting would show."""
    stage = _stage(pending_wait_ms=5000)
    try:
        a = _ctx([{"role": "user", "content": HUGE_A}])
        await stage.before_route(a)
        assert a.fingerprint is not None and not a.fingerprint.complete
        assert a.prefix is not None and a.prefix.pending is not None
        work = a.prefix.pending

        small = _ctx([{"role": "user", "content": "Hello, an unrelated question."}])
        await stage.before_route(small)
        assert not work.done(), "B's small request waited for A's tokenisation"
        assert small.fingerprint is not None and small.fingerprint.complete

        other_cold = _ctx([{"role": "user", "content": HUGE_B}])
        await stage.before_route(other_cold)
        assert not work.done(), "B's cold request waited for A's tokenisation"
        assert other_cold.fingerprint is not None and not other_cold.fingerprint.complete
        await work
    finally:
        stage.shutdown()


async def test_the_same_conversations_next_turn_waits_and_continues_its_chain() -> None:
    """A's next turn (its prompt continues A's first one) does wait for that tokenisation, and its
    fingerprint is then complete on the hot path, through the chain A's work memoised. (The wait
    bound is set far above the tokenisation time, which a loaded CI machine stretches.)"""
    stage = _stage(pending_wait_ms=120_000)
    try:
        first = [{"role": "user", "content": HUGE_A}]
        a = _ctx(first)
        await stage.before_route(a)
        assert a.prefix is not None and a.prefix.pending is not None
        work = a.prefix.pending
        nxt = _ctx([*first, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Next?"}])
        await stage.before_route(nxt)
        assert work.done()
        assert nxt.fingerprint is not None and nxt.fingerprint.complete
        tip = work.result()
        assert tip is not None and nxt.fingerprint.block_hashes[:len(tip.hashes) - 1] == tip.hashes[:-1]
    finally:
        stage.shutdown()
