"""The simulated engine: vLLM V1's scheduler shape over the block pool, with a virtual clock.

One step (as vLLM's `Scheduler.schedule`):
1. running requests first, in order: a decoding one takes 1 token (+ the draft tokens with spec
   decode), a prefilling one the rest of its prompt up to the remaining budget. When the pool
   cannot hold a running request's next block, the last running request is preempted (blocks
   freed, recomputed later), as vLLM's RECOMPUTE preemption does;
2. then waiting requests, FCFS, while budget remains and nothing was preempted: prefix-cache
   lookup (hits = leading resident blocks, capped at floor((N-1)/P)), then blocks for the chunk;
   a request that does not fit stays waiting;
3. the step takes `prefill_tokens / prefill_tps` (+ `1/decode_tps` when it carries decodes,
   + `cached_tokens / cached_tps` for requests admitted with a cache hit: the attention term,
   + `attention_pair_s` x each prefill chunk's tokens x the tokens already in its context),
   scaled by `time_scale` (0: no sleep, same order and accounting);
4. a request whose known tokens are all computed samples its next token(s).
Blocks are cached as soon as they are allocated and full (vLLM caches optimistically), so
generated tokens fill cacheable blocks too.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from app.sim.metrics import SimMetrics
from app.sim.options import SimOptions
from app.sim.pool import Block, BlockPool, Origin
from app.sim.request import HashSpec, SimRequest
from app.sim.tokens import SimTokenizer, load_tokenizer
from app.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RECENT = 256  # finished-request summaries kept for /sim/state
MAX_CATCH_UP_S = 0.05  # step-pacing backlog the loop may catch up after overruns


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class SimEngine:
    def __init__(self, options: SimOptions, tokenizer: SimTokenizer | None = None,
                 event_sink: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.options = options
        self.page = options.page_size
        self.tokenizer = tokenizer or load_tokenizer(options.tokenizer)
        self.hash_spec: HashSpec | None = (
            HashSpec(self.page, options.flavor, options.prefix_caching_hash_algo,  # type: ignore[arg-type]
                     options.python_hash_seed) if options.prefix_caching else None)
        self.event_sink = event_sink
        self.pool = BlockPool(options.pool_blocks, on_event=self._pool_event, block_size=self.page)
        self.metrics = SimMetrics(options, lambda: (len(self.running), len(self.waiting), self.pool.usage()))
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.clock = 0.0  # virtual seconds (unscaled step times)
        self.slow_factor = 1.0
        self.dead = False
        self.steps = 0
        self._deadline = 0.0  # loop time the current step's sleep runs to (see _pace)
        self.counters = {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "prompt_tokens": 0,
                         "generation_tokens": 0, "num_preemptions": 0, "requests_finished": 0}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._rng = random.Random(options.seed)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending_events: list[dict[str, Any]] = []
        self._step_cached_tokens = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def prepare(self, req: SimRequest) -> SimRequest:
        """Hash the prompt's blocks (CPU-heavy for long prompts: call it in a worker thread)."""
        req.extend_hashes(self.hash_spec)
        return req

    def add(self, req: SimRequest) -> None:
        if self.dead and self._task is None:  # the loop crashed while this request was prepared
            req.error = "EngineCore encountered an issue."
            self._finish(req, "error")
            return
        req.status = "waiting"
        req.virtual_arrival = self.clock
        req.queued_time = time.monotonic()
        self.waiting.append(req)
        if self._wake is not None:
            self._wake.set()

    def abort(self, req: SimRequest) -> None:
        if req.finished:
            return
        if req.status == "waiting":
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        elif req in self.running:
            self.running.remove(req)
            self._free(req)
        self._finish(req, "abort")

    def reset_prefix_cache(self) -> bool:
        ok = self.pool.reset()
        self._flush_events()
        return ok

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        """The step loop. An exception in it is a simulator bug: like vLLM's EngineCore dying, the
        replica fails every request it holds and reports itself dead (health 500) rather than
        leaving them, and every later one, waiting on a loop that no longer runs."""
        try:
            await self._loop()
        except Exception:  # noqa: BLE001 - any bug; asyncio.CancelledError (stop) is not one
            log.exception("simulated engine loop crashed; the replica is now dead")
            self.dead = True
            self._task = None  # a cleared `dead` (POST /sim/faults clear) starts a fresh loop
            for req in [*self.running, *self.waiting]:
                req.error = "EngineCore encountered an issue. See stack trace (above) for the root cause."
                self._finish(req, "error")
            self.running.clear()
            self.waiting.clear()

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            scheduled = self._schedule()
            self._flush_events()
            if not scheduled:
                if not self.running and self.waiting:
                    # The head cannot fit even in an empty pool: fail it rather than spin.
                    req = self.waiting.popleft()
                    req.error = "prompt does not fit in the KV cache"
                    self._finish(req, "error")
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            step_s = self._step_time(scheduled)
            self.clock += step_s
            delay = step_s * self.options.time_scale * self.slow_factor
            await self._pace(delay)
            self._update(scheduled)
            self._flush_events()
            self.steps += 1

    async def _pace(self, delay: float) -> None:
        """Sleep to an absolute deadline, not for `delay`: each sleep overshoots by the event loop's
        wake-up latency (~1 ms on a loaded box), which would make every decode step slower than
        configured. Running to a deadline catches up; after an idle gap or a long stall the deadline
        restarts from now (at most MAX_CATCH_UP_S of backlog is caught up, never a burst)."""
        if delay <= 0:
            await asyncio.sleep(0)
            return
        now = asyncio.get_running_loop().time()
        if self._deadline < now - MAX_CATCH_UP_S:
            self._deadline = now
        self._deadline += delay
        await asyncio.sleep(max(0.0, self._deadline - now))

    def _step_time(self, scheduled: list[tuple[SimRequest, int, bool]]) -> float:
        o = self.options
        prefill = sum(n for _, n, decode in scheduled if not decode)
        decodes = any(decode for _, _, decode in scheduled)
        cached = self._step_cached_tokens / o.cached_tps if o.cached_tps > 0 else 0.0
        if o.attention_pair_s > 0:  # before _update: num_computed is the context the chunk attends to
            cached += o.attention_pair_s * sum(n * req.num_computed for req, n, decode in scheduled if not decode)
        return prefill / o.prefill_tps + (1.0 / o.decode_tps if decodes else 0.0) + cached

    # ------------------------------------------------------------------ scheduling
    def _lookahead(self, req: SimRequest) -> int:
        return self.options.spec_tokens if self.options.spec_decode is not None else 0

    def _schedule(self) -> list[tuple[SimRequest, int, bool]]:
        budget = self.options.max_batch_tokens
        self._step_cached_tokens = 0
        out: list[tuple[SimRequest, int, bool]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            todo = len(req.all_ids) - req.num_computed
            decode = todo == 1 and bool(req.output_ids)
            n = min(todo, budget)
            extra = self._lookahead(req) if decode else 0
            need = _ceil_div(req.num_computed + n + extra, self.page) - len(req.blocks)
            scheduled_self = True
            while need > 0 and need > self.pool.num_free:
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    scheduled_self = False
                    break
            if not scheduled_self:
                break
            if need > 0:
                req.blocks.extend(self.pool.allocate(need) or [])
            self._cache_blocks(req, req.num_computed + n)
            out.append((req, n, decode))
            budget -= n + extra
            i += 1
        while (self.waiting and budget > 0 and not preempted
               and len(self.running) < self.options.max_num_seqs):
            req = self.waiting[0]
            hits: list[Block] = []
            lookup = self.hash_spec is not None and not req.skip_prefix_cache
            if lookup:
                hits = self.pool.leading_hits(req.keys, (len(req.all_ids) - 1) // self.page)
            computed = len(hits) * self.page
            n = min(len(req.all_ids) - computed, budget)
            need = _ceil_div(computed + n, self.page) - len(hits)
            if need + sum(1 for b in hits if b.ref_cnt == 0) > self.pool.num_free:
                break
            self.waiting.popleft()
            self.pool.touch(hits)
            req.blocks = hits + (self.pool.allocate(need) or [])
            req.num_cached_blocks = len(hits)
            req.num_computed = computed
            self._step_cached_tokens += computed
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed
            if not req.preempted:
                if lookup:
                    self.counters["prefix_cache_queries"] += len(req.all_ids)
                    self.counters["prefix_cache_hits"] += computed
                self.metrics.on_admitted(len(req.all_ids), computed, lookup)
            req.status = "running"
            if req.scheduled_time is None:
                req.scheduled_time = time.monotonic()
            self.running.append(req)
            self._cache_blocks(req, computed + n)
            out.append((req, n, False))
            budget -= n
        return out

    def _preempt(self, req: SimRequest) -> None:
        self._free(req)
        req.num_computed = 0
        req.preempted = True
        req.status = "waiting"
        self.waiting.appendleft(req)
        self.counters["num_preemptions"] += 1
        self.metrics.on_preempted()

    def _free(self, req: SimRequest) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0

    def _cache_blocks(self, req: SimRequest, num_tokens: int) -> None:
        """Register the request's full blocks covering its first `num_tokens` tokens."""
        if self.hash_spec is None:
            return
        full = min(num_tokens // self.page, len(req.keys), len(req.blocks))
        start = req.num_cached_blocks
        if full <= start:
            return
        run: list[int] = []
        prompt_blocks = req.num_prompt_tokens // self.page
        for j in range(start, full):
            origin = Origin(req.all_ids, j, req.cache_salt, req.extra_key)
            if self.pool.cache(req.blocks[j], req.keys[j], origin):
                run.append(j)
                if j < prompt_blocks and not req.preempted:
                    req.created_cache_tokens += self.page
            elif run:
                self._stored(req, run)
                run = []
        if run:
            self._stored(req, run)
        req.num_cached_blocks = full

    # ------------------------------------------------------------------ after the step
    def _update(self, scheduled: list[tuple[SimRequest, int, bool]]) -> None:
        now = time.monotonic()
        spec = self.options.spec_decode
        for req, n, decode in scheduled:
            if req.finished or req.status != "running":
                continue
            accepted = 0
            if decode and spec is not None:
                k = self.options.spec_tokens
                accepted = min(k, int(spec - 1.0 + self._rng.random()))
                self.metrics.on_spec_step(k, accepted)
            req.num_computed += n + accepted
            if not decode and req.num_computed < len(req.all_ids):
                continue  # still prefilling: no output (vLLM streams nothing for partial prefills)
            self._emit(req, 1 + accepted, now)

    def _emit(self, req: SimRequest, count: int, now: float) -> None:
        gap = now - req.last_token_time if req.first_token_time is not None else None
        new = 0
        for _ in range(count):
            index = len(req.output_ids)
            token, text = self.tokenizer.output_token(req.output_offset + index)
            req.output_ids.append(token)
            req.output_text.append(text)
            req.all_ids.append(token)
            new += 1
            reason = self._stop_reason(req)
            if reason is not None:
                req.finish_reason = reason
                break
        if req.first_token_time is None:
            req.first_token_time = now
            req.virtual_first_token = self.clock
            self.metrics.on_first_token(now - req.arrival, req.num_prompt_tokens, req.streaming)
            self.metrics.on_prompt_done(req.num_prompt_tokens, max(req.num_cached_tokens, 0))
            self.counters["prompt_tokens"] += req.num_prompt_tokens
        req.last_token_time = now
        self.counters["generation_tokens"] += new
        self.metrics.on_tokens(new, gap, req.streaming)
        if req.finish_reason is not None:
            self.running.remove(req)
            self._free(req)
            self._finish(req, req.finish_reason)
        else:
            if self.hash_spec is not None and len(req.all_ids) // self.page > len(req.keys):
                req.extend_hashes(self.hash_spec)
            req.event.set()

    def _stop_reason(self, req: SimRequest) -> str | None:
        produced = len(req.output_ids)
        if len(req.all_ids) >= self.options.max_model_len:
            return "length"
        if produced >= req.max_tokens:
            return "length"
        natural = self.options.output_tokens - req.output_offset  # a continued answer ends where it would have
        if not req.ignore_eos and produced >= max(natural, req.min_tokens, 1):
            return "stop"
        return None

    def _finish(self, req: SimRequest, reason: str) -> None:
        req.status = "finished"
        req.finish_reason = reason
        self.counters["requests_finished"] += 1
        cached = max(req.num_cached_tokens, 0)
        if reason not in ("abort", "error"):
            self.metrics.on_finished(reason, time.monotonic() - req.arrival, cached)
        self.recent.append({
            "request_id": req.request_id, "prompt_tokens": req.num_prompt_tokens,
            "cached_tokens": cached, "completion_tokens": len(req.output_ids), "finish_reason": reason,
            "ttft_s": (req.first_token_time - req.arrival) if req.first_token_time else None,
            "virtual_ttft_s": (req.virtual_first_token - req.virtual_arrival)
            if req.virtual_first_token is not None else None,
        })
        req.event.set()

    # ------------------------------------------------------------------ KV events
    def _pool_event(self, event: dict[str, Any]) -> None:
        if self.event_sink is not None:
            self._pending_events.append(event)

    def _stored(self, req: SimRequest, run: list[int]) -> None:
        if self.event_sink is None:
            return
        first, last = run[0], run[-1]
        self._pending_events.append({
            "type": "BlockStored", "keys": [req.keys[j] for j in run],
            "parent": req.keys[first - 1] if first > 0 else None,
            "token_ids": req.all_ids[first * self.page:(last + 1) * self.page],
            "cache_salt": req.cache_salt if first == 0 else None, "salt": req.cache_salt,
        })

    def _flush_events(self) -> None:
        """One KV-event batch per engine step, as vLLM publishes them."""
        if self._pending_events and self.event_sink is not None:
            self.event_sink(self._pending_events)
        self._pending_events = []

    # ------------------------------------------------------------------ introspection
    def state(self) -> dict[str, Any]:
        o = self.options
        return {
            "model": o.model, "flavor": o.flavor, "block_size": self.page, "kv_block_size": o.block_size,
            "kv_blocks": o.pool_blocks, "num_free_blocks": self.pool.num_free,
            "num_resident_blocks": len(self.pool.cached), "kv_cache_usage": self.pool.usage(),
            "resident_chains": self.pool.resident_chains(),
            "running": len(self.running), "waiting": len(self.waiting), "prefix_caching": o.prefix_caching,
            "virtual_clock_s": self.clock, "steps": self.steps, "dead": self.dead,
            "slow_factor": self.slow_factor, "recent_requests": list(self.recent), **self.counters,
        }
