"""The simulated engine without HTTP: vLLM's hit formula, cache_salt, scheduling and accounting.

Runs at time_scale 0: no sleeps, but the virtual clock advances by each step's modelled time, so
timing assertions are exact and independent of CPU load.
"""

from __future__ import annotations

import pytest

from app.prefix.blocks import proxy_chain
from app.sim.engine import SimEngine
from app.sim.options import SimOptions
from app.sim.request import SimRequest


def make_engine(**kw) -> SimEngine:
    engine = SimEngine(SimOptions.from_kwargs(time_scale=0, **kw))
    engine.start()
    return engine


async def run(engine: SimEngine, prompt: list[int], max_tokens: int = 4, **kw) -> SimRequest:
    req = SimRequest(list(prompt), max_tokens, ignore_eos=kw.pop("ignore_eos", True), **kw)
    engine.prepare(req)
    engine.add(req)
    while not req.finished:
        await req.event.wait()
        req.event.clear()
    return req


def toks(n: int, start: int = 100) -> list[int]:
    return [start + (i % 3000) for i in range(n)]


@pytest.mark.parametrize("n,expected", [
    (10, 0),     # shorter than a block: nothing is ever cacheable
    (16, 0),     # one full block, but the last token is always recomputed: floor(15/16) = 0
    (17, 16),
    (32, 16),    # exact multiple: N - B
    (33, 32),
    (100, 96),
])
async def test_hit_formula_on_repeat(n, expected):
    engine = make_engine()
    try:
        first = await run(engine, toks(n))
        second = await run(engine, toks(n))
        assert first.num_cached_tokens == 0
        assert second.num_cached_tokens == expected == 16 * ((n - 1) // 16)
    finally:
        await engine.stop()


async def test_partial_prefix_hits_whole_blocks_only():
    engine = make_engine()
    try:
        await run(engine, toks(100))
        other = toks(40) + [7] * 60  # shares 40 tokens: 2 full blocks
        req = await run(engine, other)
        assert req.num_cached_tokens == 32
        assert (await run(engine, [1] + toks(99))).num_cached_tokens == 0  # first token differs
    finally:
        await engine.stop()


async def test_cache_salt_isolates_and_same_salt_shares():
    engine = make_engine()
    try:
        prompt = toks(64)
        assert (await run(engine, prompt, cache_salt="a")).num_cached_tokens == 0
        assert (await run(engine, prompt, cache_salt="b")).num_cached_tokens == 0
        assert (await run(engine, prompt)).num_cached_tokens == 0
        assert (await run(engine, prompt, cache_salt="a")).num_cached_tokens == 48
        assert (await run(engine, prompt)).num_cached_tokens == 48
    finally:
        await engine.stop()


async def test_counters_move_by_exact_token_counts_and_virtual_ttft_follows_uncached_length():
    engine = make_engine(prefill_tps=8000.0, max_batch_tokens=2048)
    try:
        cold = await run(engine, toks(4000), max_tokens=5)
        warm = await run(engine, toks(4000), max_tokens=5)
        c = engine.counters
        assert c["prefix_cache_queries"] == 8000
        assert c["prefix_cache_hits"] == warm.num_cached_tokens == 3984
        assert c["prompt_tokens"] == 8000
        assert c["generation_tokens"] == 10
        cold_ttft = cold.virtual_first_token - cold.virtual_arrival
        warm_ttft = warm.virtual_first_token - warm.virtual_arrival
        assert cold_ttft == pytest.approx(4000 / 8000)  # two chunks of <= 2048 tokens
        assert warm_ttft == pytest.approx(16 / 8000 + 3984 / 200_000)  # new tail + reading the prefix
        assert engine.state()["num_resident_blocks"] >= 4000 // 16
    finally:
        await engine.stop()


async def test_no_prefix_caching_never_queries_or_hits():
    engine = make_engine(prefix_caching=False)
    try:
        await run(engine, toks(200))
        again = await run(engine, toks(200))
        assert again.num_cached_tokens == 0
        assert engine.counters["prefix_cache_queries"] == 0 and engine.counters["prefix_cache_hits"] == 0
        assert engine.state()["num_resident_blocks"] == 0
        assert engine.counters["prompt_tokens"] == 400
    finally:
        await engine.stop()


async def test_generated_tokens_fill_cacheable_blocks():
    engine = make_engine()
    try:
        first = await run(engine, toks(16), max_tokens=30)
        assert len(first.output_ids) == 30
        # 46 tokens known, 45 computed -> blocks 0..1 (32 tokens) hold prompt + generated ids
        follow_up = first.all_ids[:40]
        assert (await run(engine, follow_up)).num_cached_tokens == 32
    finally:
        await engine.stop()


async def test_resident_chains_key_to_the_gateways_proxy_chain():
    """The state names resident blocks by their tokens and namespace (the simulator computes no
    gateway hash): keyed with the gateway's chain they are the prompt's salted blocks."""
    engine = make_engine()
    try:
        prompt = toks(80)
        await run(engine, prompt, max_tokens=1, cache_salt="t")
        resident = {proxy_chain(c["token_ids"], 16, salt=c["cache_salt"])[j]
                    for c in engine.state()["resident_chains"] for j in c["blocks"]}
        assert set(proxy_chain(prompt, 16, salt="t")) <= resident
        assert not set(proxy_chain(prompt, 16)) & resident
    finally:
        await engine.stop()


async def test_eos_min_tokens_and_max_tokens():
    engine = make_engine(output_tokens=5)
    try:
        natural = await run(engine, toks(20), max_tokens=100, ignore_eos=False)
        assert (len(natural.output_ids), natural.finish_reason) == (5, "stop")
        longer = await run(engine, toks(20), max_tokens=100, ignore_eos=False, min_tokens=9)
        assert (len(longer.output_ids), longer.finish_reason) == (9, "stop")
        capped = await run(engine, toks(20), max_tokens=3, ignore_eos=False)
        assert (len(capped.output_ids), capped.finish_reason) == (3, "length")
        forced = await run(engine, toks(20), max_tokens=12, ignore_eos=True)
        assert (len(forced.output_ids), forced.finish_reason) == (12, "length")
    finally:
        await engine.stop()


async def test_concurrent_requests_batch_and_preempt_when_the_pool_is_full():
    # 9 usable blocks; three requests of 3 blocks each that grow by 32 tokens must preempt.
    engine = make_engine(kv_blocks=10, max_batch_tokens=64)
    try:
        reqs = [SimRequest(toks(40, start=1000 * i), 40, ignore_eos=True) for i in range(1, 4)]
        for r in reqs:
            engine.prepare(r)
            engine.add(r)
        for r in reqs:
            while not r.finished:
                await r.event.wait()
                r.event.clear()
        assert [len(r.output_ids) for r in reqs] == [40, 40, 40]
        assert engine.counters["num_preemptions"] > 0
        # preempted re-admissions are not counted as new queries (vLLM keeps them separate)
        assert engine.counters["prefix_cache_queries"] == 120
        assert engine.pool.num_free == 9  # everything released
    finally:
        await engine.stop()


async def test_waiting_request_is_admitted_once_blocks_free_up():
    engine = make_engine(kv_blocks=8)  # 7 usable blocks = 112 tokens
    try:
        a = SimRequest(toks(90, start=10), 5, ignore_eos=True)
        b = SimRequest(toks(90, start=2000), 5, ignore_eos=True)
        for r in (a, b):
            engine.prepare(r)
            engine.add(r)
        while not b.finished:
            await b.event.wait()
            b.event.clear()
        assert a.finished and a.finish_reason == "length" and b.finish_reason == "length"
        assert b.virtual_arrival == a.virtual_arrival
        assert b.virtual_first_token > a.virtual_first_token  # b waited for a's blocks
    finally:
        await engine.stop()


async def test_spec_decode_mean_acceptance_length():
    engine = make_engine(spec_decode=2.5, spec_tokens=3)
    try:
        req = await run(engine, toks(20), max_tokens=3000)
        assert len(req.output_ids) == 3000
        m = engine.metrics
        drafts = m.drafts.labels(**m.labels)._value.get()
        accepted = m.accepted.labels(**m.labels)._value.get()
        assert 1 + accepted / drafts == pytest.approx(2.5, abs=0.1)
        assert engine.counters["generation_tokens"] == 3000
    finally:
        await engine.stop()


async def test_abort_frees_blocks():
    engine = make_engine()
    try:
        req = SimRequest(toks(500), 10_000, ignore_eos=True)
        engine.prepare(req)
        engine.add(req)
        await req.event.wait()
        engine.abort(req)
        assert req.finish_reason == "abort"
        assert engine.pool.num_free == engine.options.kv_blocks - 1
        assert engine.state()["running"] == 0
    finally:
        await engine.stop()


async def test_prompt_logprobs_skip_the_lookup_but_still_fill_the_cache():
    engine = make_engine()
    try:
        await run(engine, toks(64))
        skipped = await run(engine, toks(64), skip_prefix_cache=True)
        assert skipped.num_cached_tokens == 0
        assert engine.counters["prefix_cache_queries"] == 64  # only the first request looked up
        assert (await run(engine, toks(64))).num_cached_tokens == 48
    finally:
        await engine.stop()
