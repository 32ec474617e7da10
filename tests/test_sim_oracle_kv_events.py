"""The gateway's KV-event index against an SGLang-flavour simulator that publishes what SGLang does.

The simulator's SGLang flavour namespaces its radix cache by the request's `extra_key` and
`cache_salt` and publishes, per page, a `BlockStored` with the page's token ids and the request's
`cache_salt` (SGLang does not publish the `extra_key`). Its resident blocks are read from
`GET /sim/state` as tokens + namespace and keyed with the gateway's own chain (rooted, as the
gateway's fingerprints are, at `cache_namespace(cache_salt, extra_key)`); the gateway's index,
fed only by the events, must hold exactly those keys. Before the simulator was independent it
published the gateway's combined namespace string as `cache_salt`, which hid the `extra_key`
case below (docs/testing-oracles.md).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from app.prefix.blocks import proxy_chain
from app.prefix.namespace import cache_namespace
from tests.chat_history import words


def _resident(state: dict[str, Any]) -> set[int]:
    return {proxy_chain(c["token_ids"], state["block_size"], salt=cache_namespace(c["cache_salt"], c["extra_key"]))[j]
            for c in state["resident_chains"] for j in c["blocks"]}


def _index_equals_engine(sim_factory: Any, proxy_factory: Any, extra: dict[str, Any]) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, flavor="sglang", kv_events=True, kv_blocks=4000)
    proxy = proxy_factory(sim, names=["r0"], routing={"kv_events": True, "kv_events_endpoints":
                                                      {"r0": sim.kv_event_endpoints[0]}, "kv_blocks": 4000})
    from app.engines.kv_events import KVEventSubscriber

    sub = next(c for c in proxy.services.background if isinstance(c, KVEventSubscriber))
    deadline = time.monotonic() + 10
    while sum(s.batches for s in sub.streams.values()) < 1 and time.monotonic() < deadline:
        httpx.post(sim.urls[0] + "/v1/completions", json={"model": "sim", "prompt": words(1, 40), "max_tokens": 1})
        time.sleep(0.05)
    assert httpx.post(sim.urls[0] + "/flush_cache").json()["success"]
    body = {"model": "sim", "max_tokens": 2, "cache_salt": "tenant-a", **extra,
            "messages": [{"role": "system", "content": words(7, 300)}, {"role": "user", "content": "q"}]}
    assert httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    deadline = time.monotonic() + 10
    while True:
        engine = _resident(httpx.get(sim.urls[0] + "/sim/state").json())
        index = proxy.services.store.residency_hashes("r0")
        if (engine and index == engine) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert engine
    assert index == engine


def test_sglang_index_equals_the_engine_for_a_salted_request(sim_factory: Any, proxy_factory: Any) -> None:
    _index_equals_engine(sim_factory, proxy_factory, {})


@pytest.mark.xfail(strict=True, reason="finding for the lead: SGLang's BlockStored carries cache_salt but not "
                   "extra_key, so the gateway's KV-event index (rooted at the event's salt, "
                   "app/engines/kv_event_decode.py salt_of) cannot hold the blocks of a request its fingerprints "
                   "root at cache_namespace(cache_salt, extra_key) (app/pipeline/prefix_stage.py)")
def test_sglang_index_equals_the_engine_for_a_request_with_extra_key(sim_factory: Any, proxy_factory: Any) -> None:
    _index_equals_engine(sim_factory, proxy_factory, {"extra_key": "team-1"})
