"""KV-event mode against real vLLM: the routing index follows the engine's own ZMQ events.

vLLM publishes BlockStored (with the ids it really cached: prompt *and sampled* tokens) and
AllBlocksCleared (POST /reset_prefix_cache; observed: it leaves with the batch of the engine's
next step, so a reset on an idle engine is published only when the next request runs). With the index fed by those events, the proxy's
prediction is exact even when the engine's replies are fed back (the case where re-tokenised text
cannot tell which generated blocks really match), and a cache reset empties the index.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from app.engines.kv_events import KVEventSubscriber
from app.prefix.fingerprint import prompt_input
from tests.e2e.workload import SEQUENCE, Record, run_sequence, table, wait_processed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
QUIET_S = 0.5  # no new event batch for this long after a response: the engine published its blocks


def _subscriber(proxy: Any) -> KVEventSubscriber:
    found = [c for c in proxy.services.background if isinstance(c, KVEventSubscriber)]
    assert found, "routing.kv_events with an endpoint did not start a KVEventSubscriber"
    return found[0]


def _probe(replica: Any, n: int) -> None:
    """A small request with a prompt of its own: vLLM publishes queued events (AllBlocksCleared
    included) only with the batch of its next engine step, so something has to run."""
    body = {"model": "tiny", "prompt": f"probe {n} " * 24, "max_tokens": 1}
    httpx.post(replica.url + "/v1/completions", json=body, timeout=60).raise_for_status()


def _connect(replica: Any, sub: KVEventSubscriber, timeout: float = 30.0) -> None:
    """A SUB socket misses what is published before it joined: probe until one batch arrives."""
    deadline = time.monotonic() + timeout
    n = 0
    while sub.streams[replica.name].batches == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("no KV event batch arrived from vLLM")
        n += 1
        _probe(replica, n)
        t = time.monotonic()
        while sub.streams[replica.name].batches == 0 and time.monotonic() - t < 1.0:
            time.sleep(0.05)


def _settle(sub: KVEventSubscriber, name: str, before: int, timeout: float = 20.0) -> None:
    """Until at least one new batch arrived and the stream then stayed quiet for QUIET_S."""
    deadline = time.monotonic() + timeout
    last, since = sub.streams[name].batches, time.monotonic()
    while True:
        now = time.monotonic()
        count = sub.streams[name].batches
        if count != last:
            last, since = count, now
        if count > before and now - since >= QUIET_S:
            return
        if now > deadline:
            raise TimeoutError(f"KV events from {name} did not settle ({count} batches)")
        time.sleep(0.05)


def _resident_blocks(proxy: Any, body: dict[str, Any], name: str, salt: str | None = None) -> tuple[int, int]:
    """(leading blocks of this prompt's chain (under `salt`) resident for `name`, blocks in the chain)."""
    hook = proxy.services.prefix
    b = proxy.services.replicas.all()[0].block_size
    fp = hook.fingerprinter.complete_sync(hook.fingerprinter.prepare(prompt_input("chat", body), b, salt))
    lookup = asyncio.run_coroutine_threadsafe(
        proxy.services.store.residency_lookup(fp.block_hashes, [name]), proxy.server.loop).result(10)
    return lookup.get(name, 0), len(fp.block_hashes)


def _kv_proxy(e2e_proxy: Any, replica: Any, **sections: Any) -> tuple[Any, KVEventSubscriber]:
    proxy = e2e_proxy([replica], routing={"kv_events": True,
                                          "kv_events_endpoints": {replica.name: replica.kv_endpoint}}, **sections)
    sub = _subscriber(proxy)
    _connect(replica, sub)
    return proxy, sub


def _run_settled(proxy: Any, sub: KVEventSubscriber, name: str, *, echo: bool, tag: str,
                 steps: Any = None) -> list[Record]:
    seen = {"batches": sub.streams[name].batches}

    def after_each(rec: Record) -> None:
        _settle(sub, name, seen["batches"])
        seen["batches"] = sub.streams[name].batches

    kwargs = {"steps": steps} if steps is not None else {}
    with httpx.Client(timeout=120) as client:
        return run_sequence(client, proxy.url, echo=echo, max_tokens=40, tag=tag, after_each=after_each, **kwargs)


def test_predictions_exact_with_vllm_events_even_for_echoed_replies(e2e_proxy: Any, vllm_b32: Any) -> None:
    name = vllm_b32.name
    proxy, sub = _kv_proxy(e2e_proxy, vllm_b32)
    records = _run_settled(proxy, sub, name, echo=True, tag="kv")
    hook = proxy.services.prefix
    wait_processed(hook, len(records))
    predicted = {rid: p for rid, _t, p, _d in hook.predictions}
    rows = [(r.request_id, r.step.label, r.prompt_tokens, r.cached_tokens, predicted.get(r.request_id))
            for r in records]
    equal = sum(1 for r in records if predicted.get(r.request_id) == r.cached_tokens)
    print(f"\nKV-event mode, echo, b32: {equal}/{len(records)} equal\n"
          + table(rows, ("request", "step", "prompt", "vllm cached", "predicted")))
    assert (proxy.sample("prefixgate_kv_events_total", backend=name, kind="stored") or 0) > 0
    assert [predicted.get(r.request_id) for r in records] == [r.cached_tokens for r in records]


def test_index_holds_what_vllm_stored_and_reset_clears_it(e2e_proxy: Any, vllm_b32: Any) -> None:
    name = vllm_b32.name
    proxy, sub = _kv_proxy(e2e_proxy, vllm_b32)
    records = _run_settled(proxy, sub, name, echo=False, tag="kv-reset", steps=SEQUENCE[:3])
    stored = proxy.sample("prefixgate_kv_events_total", backend=name, kind="stored") or 0
    assert stored >= sum((r.prompt_tokens or 0) // 32 for r in records) - records[2].cached_tokens // 32
    for rec in records:  # every prompt is resident block for block, as vLLM stored it
        resident, total = _resident_blocks(proxy, rec.body, name)
        assert total == (rec.prompt_tokens or 0) // 32 and resident == total, rec.step.label

    cleared = proxy.sample("prefixgate_kv_events_total", backend=name, kind="cleared") or 0
    before = sub.streams[name].batches
    vllm_b32.reset_prefix_cache()
    _probe(vllm_b32, 0)  # carries the AllBlocksCleared out
    _settle(sub, name, before)
    assert (proxy.sample("prefixgate_kv_events_total", backend=name, kind="cleared") or 0) == cleared + 1
    for rec in records:
        assert _resident_blocks(proxy, rec.body, name)[0] == 0, rec.step.label
