"""Capacity: more distinct prefixes than the pool holds -> LRU eviction -> hits drop."""

from __future__ import annotations

import httpx

from app.sim.testing import SimCluster


def hit_ratio(url: str, prefixes: int, rounds: int = 2) -> float:
    hits = queries = 0
    for r in range(rounds):
        for p in range(prefixes):
            prompt = [10_000 * (p + 1) + j for j in range(160)]  # 10 blocks each
            usage = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()["usage"]
            if r > 0:
                hits += usage["prompt_tokens_details"]["cached_tokens"]
                queries += usage["prompt_tokens"]
    return hits / queries


def test_more_prefixes_than_the_pool_holds_drops_hits():
    with SimCluster(time_scale=0, kv_blocks=61) as sim:  # 60 usable blocks = 6 prefixes of 10 blocks
        url = sim.urls[0]
        fits = hit_ratio(url, prefixes=4)
        httpx.post(url + "/reset_prefix_cache")
        overflows = hit_ratio(url, prefixes=12)  # cyclic access over an LRU twice its size
        state = httpx.get(url + "/sim/state").json()
    assert fits == 144 / 160  # every prompt hits all but its last block (floor(159/16) = 9)
    assert overflows < 0.1
    assert state["num_resident_blocks"] <= 60 and state["kv_blocks"] == 61
