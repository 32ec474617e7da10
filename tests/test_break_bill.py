"""The bill for every break (docs/ttft-ledger.md): a diagnosed break's recomputed tokens and their
prefill seconds, per tenant and cause, in /metrics and the tenant report. Through the real path:
the gateway over loopback HTTP in front of a simulated vLLM.

The proof of the tokens: after each turn of a tenant with a timestamp on top of its system prompt,
the same turn is sent straight to the simulator with the previous turn's timestamp (what the
client would have sent without the break). What the simulator reads from its cache for that one,
minus what it read for the real turn, is what it recomputed because of the break; the bill must
equal it exactly. New conversations (and compactions: tests/test_prefix_compaction.py) are not
billed."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from app.prefix.bill import price_break, recomputed_blocks
from app.telemetry.prefill_model import PrefillFit

STATIC = "You are Acme's logistics assistant. Refunds within 30 days; shipping 3 to 5 days.\n" * 40

QUESTIONS = ("Where is parcel 17?", "Can I return a damaged lamp after two weeks?",
             "How long does shipping to Oslo take?", "Do you deliver on Sundays?")


def wait_processed(hook: Any, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def chat(client: httpx.Client, messages: list[dict], tenant: str | None = None,
         stream: bool = False) -> tuple[int, str]:
    """(cached tokens the engine reported, the reply) of one chat request (streamed: with usage,
    so the TTFT ledger and the prefill model see it)."""
    headers = {"x-tenant-id": tenant} if tenant else {}
    body: dict[str, Any] = {"model": "sim", "messages": messages, "max_tokens": 24}
    if not stream:
        r = client.post("/v1/chat/completions", headers=headers, json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        return out["usage"]["prompt_tokens_details"]["cached_tokens"], out["choices"][0]["message"]["content"]
    body.update(stream=True, stream_options={"include_usage": True})
    text, usage = [], None
    with client.stream("POST", "/v1/chat/completions", headers=headers, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                text += [(c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or []]
    assert usage is not None
    return usage["prompt_tokens_details"]["cached_tokens"], "".join(text)


def system(turn: int) -> dict[str, str]:
    return {"role": "system", "content": f"Current time: 2026-04-14T09:{10 + turn:02d}:{(7 * turn) % 60:02d}Z\n{STATIC}"}


def run_clock_tenant(proxy: Any, sim: Any, turns: int, start: int = 0, stream: bool = False) -> list[int]:
    """A conversation whose every turn rewrites the timestamp on top; the simulator's recomputed
    tokens of each turn after the first (see the module docstring)."""
    hook = proxy.services.prefix
    done = hook.processed
    history: list[dict] = []
    recomputed: list[int] = []
    with httpx.Client(base_url=proxy.url, timeout=30) as gw, httpx.Client(base_url=sim.urls[0], timeout=30) as direct:
        for turn in range(start, start + turns):
            history.append({"role": "user", "content": f"Where is parcel {turn}? Tracking code PX-{turn * 37}."})
            cached, reply = chat(gw, [system(turn), *history], "clock", stream)
            done += 1
            wait_processed(hook, done)
            if turn > start:  # the same turn, had the client kept the previous timestamp
                kept, _ = chat(direct, [system(turn - 1), *history])
                recomputed.append(kept - cached)
            history.append({"role": "assistant", "content": reply})
    return recomputed


def test_timestamp_on_top_bill_equals_the_simulators_recomputed_tokens(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000)  # no per-request metrics: no model
    proxy = proxy_factory(sim, names=["sim-0"])
    recomputed = run_clock_tenant(proxy, sim, 5)
    assert len(recomputed) == 4 and all(r > 500 for r in recomputed)  # the whole previous chain each time
    report = httpx.get(proxy.url + "/hygiene/tenants/clock", timeout=10).json()
    assert report["breaks_by_cause"] == {"dynamic_head": 4}
    assert [b["bill_tokens"] for b in report["last_breaks"]] == recomputed[::-1]  # newest first
    assert all("bill_s" not in b for b in report["last_breaks"])
    assert report["bill"] == {"dynamic_head": {"breaks": 4, "tokens": sum(recomputed), "timed": 0,
                                               "seconds": None, "added_ttft_s": None}}
    proxy.settle()
    assert proxy.sample("prefixgate_break_recomputed_tokens_total", tenant="clock",
                        cause="dynamic_head") == sum(recomputed)
    # the replica has no prefill model (the engine reports no prefill time): unknown, so absent
    assert "prefixgate_break_prefill_seconds_total{" not in proxy.metrics_text()


def test_new_conversations_are_not_billed(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim)
    hook = proxy.services.prefix
    with httpx.Client(base_url=proxy.url, timeout=30) as gw:
        for i, question in enumerate(QUESTIONS):  # a stateless client: each request a new conversation
            chat(gw, [{"role": "system", "content": STATIC}, {"role": "user", "content": question}], "fresh")
            wait_processed(hook, i + 1)
    report = httpx.get(proxy.url + "/hygiene/tenants/fresh", timeout=10).json()
    assert report["new_sessions"] == 3 and report["bill"] == {}
    proxy.settle()
    assert proxy.sample("prefixgate_prefix_breaks_total", route="chat", tenant="fresh", cause="new_session") == 3
    assert "prefixgate_break_recomputed_tokens_total{" not in proxy.metrics_text()


def test_seconds_come_from_the_replicas_prefill_model(sim_factory, proxy_factory) -> None:
    """With the engine reporting its prefill time the replica's model fits (app/telemetry/
    prefill_model.py); once it can price a break, the break's seconds are its prediction: about
    the simulator's configured cost of the recomputed tokens (prefill minus cached reading)."""
    sim = sim_factory(replicas=1, time_scale=1.0, prefill_tps=10_000.0, cached_tps=200_000.0, kv_blocks=200_000,
                      enable_per_request_metrics=True, max_batch_tokens=1 << 16)
    proxy = proxy_factory(sim, names=["sim-0"])
    hook = proxy.services.prefix
    history: list[dict] = [{"role": "system", "content": STATIC}]
    with httpx.Client(base_url=proxy.url, timeout=30) as gw:  # a clean conversation: samples with cached tokens
        for i in range(10):  # question lengths in no order: new tokens do not grow with the cached ones
            words = 8 * ((7 * i) % 10) + 1
            history.append({"role": "user", "content": f"Question {i}: " + "tell me about parcel rules. " * words})
            history.append({"role": "assistant", "content": chat(gw, history, "clean", stream=True)[1]})
            wait_processed(hook, i + 1)
    recomputed = run_clock_tenant(proxy, sim, 4, stream=True)
    report = httpx.get(proxy.url + "/hygiene/tenants/clock", timeout=10).json()
    bill = report["bill"]["dynamic_head"]
    assert bill["tokens"] == sum(recomputed) and bill["timed"] == 3
    modelled = sum(recomputed) * (1 / 10_000.0 - 1 / 200_000.0)
    assert 0.5 * modelled < bill["seconds"] < 2 * modelled  # wall-clock timings on a shared box: loose
    assert bill["added_ttft_s"] == pytest.approx(bill["seconds"] / 3)
    proxy.settle()
    assert proxy.sample("prefixgate_break_prefill_seconds_total", tenant="clock",
                        cause="dynamic_head") == pytest.approx(bill["seconds"])
    assert proxy.sample("prefixgate_tenant_prefill_seconds_total", tenant="clock") > bill["seconds"]
    # a non-streamed answer's engine prefill counts too (the alert's denominator covers both)
    with httpx.Client(base_url=proxy.url, timeout=30) as gw:
        chat(gw, [{"role": "user", "content": "Is parcel 5 late?"}], "solo")
    proxy.settle()
    assert proxy.sample("prefixgate_tenant_prefill_seconds_total", tenant="solo") > 0


def test_price_arithmetic() -> None:
    assert recomputed_blocks(held_before=40, total=60, matched=1) == 39
    assert recomputed_blocks(held_before=40, total=30, matched=1) == 29  # up to this prompt's length
    assert recomputed_blocks(held_before=3, total=60, matched=5) == 0
    fit = PrefillFit(0.01, 1e-4, 1e-6, 2e-9, 50)
    bill = price_break(10, 16, prompt_tokens=1000, cached_tokens=16, fit=fit)
    assert bill.tokens == 160
    assert bill.seconds == pytest.approx(fit.predict(984, 16) - fit.predict(824, 176))
    assert price_break(10, 16, 1000, 16, None).seconds is None  # no fit: unknown
    assert price_break(10, 16, 1000, 16, PrefillFit(0.01, 1e-4, None, None, 9)).seconds is None  # cold fit only
    assert price_break(70, 16, 1024, 0, fit).tokens == 1008  # the last token is always computed
    assert price_break(10, 16, 1000, 16, PrefillFit(0.01, -1e-4, 1e-6, 0.0, 9)).seconds is None  # negative: unknown


async def test_a_pod_that_never_saw_the_previous_request_bills_from_its_record() -> None:
    """Two gateway pods on one Store: pod b diagnoses against pod a's record (its digest) and bills
    what that record says the previous chain held (prompt and generated blocks)."""
    from app.prefix.bill import BreakBill
    from app.prefix.tracker import TenantTracker
    from app.state.memory import MemoryStore
    from tests.test_prefix_tracker import POLICY, _chat_sketch

    store = MemoryStore()
    pod_a, pod_b = TenantTracker(store), TenantTracker(store)
    turns = ["Where is my parcel?", "It left the depot.", "When will it arrive?"]
    priced: list[int] = []

    def price(blocks: int) -> BreakBill:
        priced.append(blocks)
        return BreakBill(blocks * 16, None)

    await pod_a.observe("t", [1] * 30, _chat_sketch("Heute ist der 14.04.2026.\n" + POLICY, turns[0]), 16,
                        extra_chain=[2, 3], price=price)  # 30 prompt blocks + 2 generated
    obs = await pod_b.observe("t", [9] * 40, _chat_sketch("Heute ist der 15.04.2026.\n" + POLICY, *turns), 16,
                              price=price)
    assert obs.diagnosis is not None and obs.diagnosis.cause == "dynamic_head"
    assert priced == [32] and obs.bill == BreakBill(512, None)
