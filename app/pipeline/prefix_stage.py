"""The prefix stage: fingerprint on the hot path, prediction + residency + continuity after it.

The adapter between the request pipeline (RequestContext, Services) and the pure prefix core in
app/prefix/ (which knows nothing of either). What it keeps about one request lives in
`ctx.prefix` (PrefixStageState).

before_route: `Fingerprinter.prepare` (render, split, memo walk; salt = ctx.salt, which the
hygiene stage sets when cache isolation is on) -> ctx.fingerprint, read by the router, counted in
prefixgate_fingerprint_requests_total{mode=exact|pending|approx} (`routed_mode`). When the
walk stops where an in-flight tokenisation of the same conversation stopped (same chain state,
same next segment: this prompt continues that one), it waits up to `prefix.pending_wait_ms` for
that work and continues the walk through it. It waits likewise for the tokenisation of a request
whose prompt starts as this one does (`_head`) and whose response has ended (a served answer):
the engine holds those blocks, they reach the index only when that chain is finished, and a
request sent after that response ended must be predicted and routed with them. Otherwise it
never waits for another conversation of the same tenant, nor for the tenant `default` that every
anonymous client shares: where two requests overlap, which finds the other's blocks is the
engine's scheduling, not an order the client set. One more wait, for
its own tokenisation: when the walk knows too little of the prompt for the router to use the
residency index at all (a long conversation this process never walked: it restarted, or the
previous turn went through another gateway pod) and the index is shared with other processes
(Redis, `serve --workers`, KV events), the chain is finished in the worker pool before routing,
up to `prefix.blind_wait_ms`; otherwise the turn would be spread as cold while the index says
where its prefix is (docs/epp.md, "Several EPPs, restarts").

after_response (never blocks the loop; everything slow is a task or a worker thread):
1. prediction in the engine's rule, B * min(leading resident blocks, floor((N-1)/B)), on the chosen
   replica *before* this request's own blocks count: the router's lookup
   (`decision.matched_blocks`) when the routed chain covered it, else a lookup of the full chain;
   the reuse funnel (app/telemetry/funnel.py) counted once, on that same chain;
2. residency: the full prompt chain plus the blocks of generated tokens the engine keeps
   (it caches full blocks of the N + out - 1 tokens it computed), written right away so the
   tenant's next turn finds them (not in KV-event mode: there the engines' events own the index);
3. tenant continuity + diagnosis (app/prefix/tracker.py), then metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from app.dialects.base import strips_billing_header
from app.prefix.bill import BreakBill, price_break
from app.prefix.blocks import predicted_hit_tokens
from app.prefix.budget import RECENT_ENTRY_BYTES, MemoryCaps
from app.prefix.convert_messages import requires_system_first
from app.prefix.convert_responses import ResponseHistory, continued_history
from app.prefix.engine_tokenize import EngineTokenizeError
from app.prefix.fingerprint import ChainTip, Fingerprint, Fingerprinter
from app.prefix.namespace import request_namespace
from app.prefix.sketch import build_sketch
from app.prefix.template import TemplateError
from app.prefix.tool_dump import ToolDump
from app.prefix.tracker import HASH_ENTRY_BYTES, HASH_SLOT_BYTES, TenantTracker
from app.proxy.context import PrefixStageState, RequestContext
from app.state.memory import MemoryStore
from app.telemetry.child import child
from app.telemetry.funnel import count_reuse

if TYPE_CHECKING:
    from app.config import Settings
    from app.engines.kv_events import KVEventSubscriber
    from app.engines.scrape import EngineScraper
    from app.proxy.upstream import Upstream
    from app.routing.replicas import ReplicaSet
    from app.routing.residency import ReplicaIndex
    from app.state.base import Store
    from app.telemetry.metrics import Metrics

log = logging.getLogger("prefixgate.prefix")
MODES = ("exact", "engine", "approx")
# histories kept for previous_response_id, LRU by their JSON size; a fixed cap outside
# memory.budget_mb (docs/agents-responses.md)
RESPONSE_HISTORY_BYTES = 16 * 1024 * 1024
INLINE_OUTPUT_CHARS = 4096  # generated text encoded inside after_response (< 1 ms)
TOKENIZE_WARN_EVERY_S = 60.0  # an engine whose /tokenize fails: one log line a minute, every request counted


def routed_mode(fp: Fingerprint) -> str:
    """prefixgate_fingerprint_requests_total's label for a fingerprint as the router sees it."""
    if fp.mode == "approx":
        return "approx"
    return "exact" if fp.complete else "pending"


def _output_text(ctx: RequestContext) -> str:
    return ctx.output_text or ""  # the relay's copy of the generated text


class PrefixStage:
    def __init__(self, settings: Settings, metrics: Metrics, replicas: ReplicaSet, residency: ReplicaIndex,
                 scraper: EngineScraper, fingerprinter: Fingerprinter, tracker: TenantTracker, *,
                 shared_index: bool, kv_events: KVEventSubscriber | None = None, recent: int = 4096) -> None:
        """`shared_index`: the residency index is shared with other processes (Redis, `serve
        --workers`, KV events); `kv_events`: the subscriber, in KV-event mode."""
        self.settings = settings
        self._tokenize_warned = -TOKENIZE_WARN_EVERY_S
        self.metrics = metrics
        self.replicas = replicas
        self.residency = residency
        self.scraper = scraper
        self.kv_events = kv_events
        self.fingerprinter = fingerprinter
        self.tracker = tracker
        # prefix_affinity reads the residency index at choose time and writes the routed chain;
        # the other policies do neither
        self.router_looks_up = settings.routing.policy == "prefix_affinity"
        # with KV events the engines' own events are the only writer of the residency index
        self.writes_residency = not settings.routing.kv_events
        self._tasks: set[asyncio.Task[Any]] = set()
        # in-flight tokenisations by the work they do (PendingWork.key): a conversation's next
        # request finds its predecessor's here; entries leave when their task ends
        self._pending: dict[Hashable, asyncio.Task[ChainTip | None]] = {}
        # in-flight tokenisations of a long segment, by its head (Fingerprinter.cold_head)
        self._cold: dict[str, asyncio.Task[ChainTip | None]] = {}
        # in-flight chain tasks by their prompt's head (`_head`), with their request: one whose
        # response has ended holds blocks in the engine that the index learns only when it ends
        self._learning: dict[Hashable, dict[asyncio.Task[ChainTip | None], RequestContext]] = {}
        self.pending_wait_s = settings.prefix.pending_wait_ms / 1000.0
        # the index may hold chains this process never walked: their next turns must not route blind
        self.blind_wait_s = settings.prefix.blind_wait_ms / 1000.0 if shared_index and self.router_looks_up else 0.0
        self._seen: dict[str, float] = {}  # the tracker's running totals as last published (`_grown`)
        # their counters' children, bound once (each outcome and site reads 0 from the start)
        self._diagnosis_outcomes = {o: metrics.diagnoses.labels(o) for o in tracker.diagnosis_outcomes}
        self._diagnosis_cpu = {w: metrics.diagnosis_cpu.labels(w) for w in tracker.diagnosis_cpu_s}
        self._system_first: bool | None = None  # system_first(), once probed
        self.processed = 0  # requests fully processed after their response (tests poll it)
        # (request id, tenant, predicted, engine-reported) of recent requests: for audits and tests
        self.response_history = ResponseHistory(RESPONSE_HISTORY_BYTES)  # Responses previous_response_id
        self.predictions: deque[tuple[str, str, int, int | None]] = deque(maxlen=recent)
        for mode in MODES:
            self.metrics.fingerprint_mode.labels(mode).set(1 if mode == fingerprinter.mode else 0)

    @property
    def mode(self) -> str:
        return self.fingerprinter.mode

    def block_size(self) -> int:
        """The fleet's block size: the first replica that reported one, else routing.block_size."""
        for replica in self.replicas.all():
            if replica.block_size:
                return int(replica.block_size)
        return int(self.settings.routing.block_size)

    def system_first(self) -> bool:
        """Whether the chat template needs system-first ordering (vLLM then merges a Messages
        body's inline system messages into the leading one); probed once, as vLLM does."""
        if self._system_first is None:
            tokenizer = getattr(self.fingerprinter, "tokenizer", None)
            self._system_first = requires_system_first(getattr(tokenizer, "template", None))
        return self._system_first

    def engine_strips_billing(self) -> bool:
        """Whether the engine drops Claude Code's billing header before tokenising
        (`strips_billing_header`); `auto` reads the replicas' engine kinds (a fleet of SGLang only:
        no)."""
        choice = self.settings.prefix.billing_header
        if choice != "auto":
            return choice == "strip"
        return strips_billing_header(self.engine_tool_dump())

    def engine_tool_dump(self) -> ToolDump:
        """Whose request model the chat `tools` are dumped with before rendering (vLLM: fixed
        member order; SGLang: the client's; app/prefix/tool_dump.py): SGLang for a fleet of
        SGLang only, else vLLM."""
        return "sglang" if self._sglang_only() else "vllm"

    def _sglang_only(self) -> bool:
        kinds = {r.engine for r in self.replicas.all() if r.engine in ("vllm", "sglang")}
        return kinds == {"sglang"}

    def memory_bytes(self) -> dict[str, int]:
        """Bytes each budgeted part holds now (prefixgate_memory_used_bytes{part})."""
        return {**self.fingerprinter.memory_bytes(), "tracker_hashes": self.tracker.hash_bytes,
                "tracker_texts": self.tracker.text_bytes,
                "recent": len(self.predictions) * RECENT_ENTRY_BYTES}

    # ------------------------------------------------------------------ hot path
    async def before_route(self, ctx: RequestContext) -> None:
        inp = ctx.dialect.prompt_input(ctx.body, self)  # as the engine renders it (app/dialects/)
        if inp is None:
            return
        try:
            namespace = request_namespace(ctx.dialect.sglang_salts, self.engine_tool_dump(), ctx.salt,
                                          ctx.body.get("extra_key"))
            fp = self.fingerprinter.prepare(inp, self.block_size(), namespace)
        except TemplateError as exc:
            log.debug("no fingerprint for %s: %s", ctx.request_id, type(exc).__name__)
            return
        except Exception:  # a malformed body is the proxy core's business, never ours to fail
            log.debug("no fingerprint for %s", ctx.request_id, exc_info=True)
            return
        prompt_head = _head(fp)
        await self._wait_for_predecessor(fp, prompt_head)
        head = self.fingerprinter.cold_head(fp)
        leader = self._cold.get(head) if head is not None else None
        if leader is None or leader.done():
            leader = None
            self.fingerprinter.admit(fp)  # a cold prompt past the pool's budget: approx, not queued
        task = None
        if not fp.complete and fp.pending is not None:
            # big misses: tokenise in the worker pool while the request is forwarded
            key = fp.pending.key()
            task = asyncio.get_running_loop().create_task(self._early(ctx, fp, leader))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            task.add_done_callback(lambda _t: self.fingerprinter.release(fp))
            if head is not None and leader is None:  # the first of its head: others wait and reuse it
                self._cold[head] = task
                task.add_done_callback(lambda t, h=head: self._cold.get(h) is t and self._cold.pop(h, None))
            if key is not None:
                self._pending[key] = task
                task.add_done_callback(lambda t, k=key: self._pending.get(k) is t and self._pending.pop(k, None))
            if prompt_head is not None:
                self._learning.setdefault(prompt_head, {})[task] = ctx
                task.add_done_callback(lambda t, k=prompt_head: self._learned(k, t))
            if self._blind(fp):
                await self._finish_before_routing(fp, task)
        ctx.fingerprint = fp
        child(self.metrics.fingerprint_requests, routed_mode(fp)).inc()
        state = ctx.prefix = PrefixStageState(inp, len(fp.block_hashes), fp.complete)
        if not fp.complete:
            state.pending = task

    def _blind(self, fp: Fingerprint) -> bool:
        """The known leading chain is below the router's cold share of the prompt: routed now, the
        residency index could not matter (app/routing/prefix_affinity.py, `cold_match_ratio`)."""
        if self.blind_wait_s <= 0:
            return False
        known = len(fp.block_hashes) * fp.block_size
        return known < self.settings.routing.weights.cold_match_ratio * fp.estimated_tokens

    async def _finish_before_routing(self, fp: Fingerprint, task: asyncio.Task[ChainTip | None]) -> None:
        """Wait up to `blind_wait_s` for `task` (this request's own tokenisation, in the worker
        pool: the loop keeps serving) and complete `fp` with its chain; past the bound the request
        is routed on what is known, as before."""
        done, _ = await asyncio.wait({task}, timeout=self.blind_wait_s)
        if done and not task.cancelled() and task.exception() is None and task.result() is not None:
            await self.fingerprinter.complete(fp, task)

    async def _wait_for_predecessor(self, fp: Fingerprint, prompt_head: Hashable | None) -> None:
        """Wait up to `pending_wait_s` for the in-flight tokenisations this request depends on, then
        continue its walk through what they memoised: the one this prompt continues (same chain
        state, same next segment: the conversation's previous turn, whose response may already
        have ended), and those of requests with the same head (`prompt_head`: `_head(fp)`) whose
        response has ended. The engine holds their blocks, and a request routed before their
        chains reach the index is predicted and routed as if it did not (real vLLM, a loop
        stalled ~80 ms under load: the next tenant's request over a shared system prompt was
        routed in that gap, predicted 0 cached tokens where the engine served 1408)."""
        if self.pending_wait_s <= 0:
            return
        key = fp.pending.key() if fp.pending is not None else None
        previous = self._pending.get(key) if key is not None else None
        waits = {previous} if previous is not None and not previous.done() else set()
        same_head = self._learning.get(prompt_head) if prompt_head is not None else None
        if same_head:
            waits.update(t for t, owner in same_head.items()
                         if owner.timings.end is not None and owner.timings.first_byte is not None and not t.done())
        if not waits:
            return
        await asyncio.wait(waits, timeout=self.pending_wait_s)  # never raises their errors, never cancels them
        self.fingerprinter.advance(fp)

    def _learned(self, key: Hashable, task: asyncio.Task[ChainTip | None]) -> None:
        tasks = self._learning.get(key)
        if tasks is not None:
            tasks.pop(task, None)
            if not tasks:
                del self._learning[key]

    async def _early(self, ctx: RequestContext, fp: Fingerprint,
                     leader: asyncio.Task[ChainTip | None] | None = None) -> ChainTip | None:
        """Finish the chain while the request is in flight and, once it was routed, write the
        prompt's blocks to the residency index right away (the engine caches them during prefill,
        and the tenant's next turn may arrive as soon as this response ends). After `leader`, the
        in-flight tokenisation of a segment with the same head, when there is one: then only the
        tail after what they share is tokenised (the same document sent twice at once is not
        tokenised twice, nor takes a second cold-pool slot)."""
        if leader is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(leader)
        tip = await self.fingerprinter.rest(fp)
        if tip is None or ctx.decision is None or ctx.prefix is None:
            return tip
        replica = ctx.decision.replica.name
        # KV-event mode too: after the response the engine's own BlockStored events for this
        # request are in the index, and a lookup then counts them (real vLLM: a cold 1145-token
        # prompt "predicted" 1120 cached; tests/e2e/test_e2e_kv_events.py)
        ctx.prefix.matched, ctx.prefix.available = await self._matched(ctx, tip.hashes)
        await self.residency.learn_completed(replica, tip.hashes)  # a no-op in KV-event mode
        return tip

    async def _matched(self, ctx: RequestContext, chain: list[int]) -> tuple[int, int]:
        """Leading blocks of `chain` resident on the chosen replica before this request's own
        blocks count (see the module docstring), and the most resident on any replica in the
        same lookup (the funnel's `available`; at least the first)."""
        index = self.residency
        decision = ctx.decision
        assert decision is not None
        replica = decision.replica.name
        routed = ctx.prefix.routed_blocks if ctx.prefix is not None else 0
        if self.router_looks_up:
            # the router looked up the routed chain before inserting it: exact for that part
            matched, available = decision.matched_blocks, decision.available_blocks
            if available >= routed and routed < len(chain):  # the chain goes on past what was routed
                lookup = await index.lookup(chain, self.replicas.names())
                if matched >= routed:  # else the lookup would count this request's own routed blocks
                    matched = max(matched, lookup.get(replica, 0))
                available = max([available] + [v for r, v in lookup.items() if r != replica])
            matched = self._resident_when_sent(ctx, replica, chain, matched)
            return matched, max(available, matched)
        # other policies neither read nor write the index: look up before our own insert
        lookup = await index.lookup(chain, self.replicas.names())
        matched = self._resident_when_sent(ctx, replica, chain, lookup.get(replica, 0))
        return matched, max(max(lookup.values(), default=0), matched)

    def _resident_when_sent(self, ctx: RequestContext, replica: str, chain: list[int], matched: int) -> int:
        """In KV-event mode the engine may report this request's own blocks before the lookup
        runs (the chain of a cold prompt is finished in a worker while the engine prefills):
        count only blocks whose BlockStored arrived before the request was sent upstream."""
        events = self.kv_events
        sent = ctx.timings.upstream_sent
        if self.writes_residency or events is None or sent is None or matched == 0:
            return matched
        return events.resident_before(replica, chain[:matched], sent)

    # ------------------------------------------------------------------ after the response
    def after_response(self, ctx: RequestContext) -> None:
        fp = ctx.fingerprint
        if fp is None or ctx.decision is None or ctx.outcome != "ok" or (ctx.status or 200) >= 400:
            return
        if ctx.dialect.stores_responses and ctx.response_id is not None and ctx.prefix is not None:
            # what a request continuing this response gets prepended by the engine
            self.response_history.put(ctx.response_id, continued_history(
                list(ctx.prefix.input.messages), ctx.output_text))  # type: ignore[arg-type]
        output_ids = None
        text = _output_text(ctx)
        if fp.complete and len(text) <= INLINE_OUTPUT_CHARS and self.fingerprinter.engine is None:
            output_ids = self.fingerprinter.encode_small(text) if text else []
        task = asyncio.get_running_loop().create_task(self._after(ctx, fp, output_ids))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for pending after-response work (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def shutdown(self) -> None:
        self.fingerprinter.close()

    async def _after(self, ctx: RequestContext, fp: Fingerprint, output_ids: Any) -> None:
        try:
            await self._process(ctx, fp, output_ids)
        except EngineTokenizeError as exc:  # the engine's fault, not ours: counted, logged once a minute
            self.metrics.engine_tokenize_failures.inc()
            now = time.monotonic()
            if now - self._tokenize_warned >= TOKENIZE_WARN_EVERY_S:
                self._tokenize_warned = now
                log.warning("prefix tracking lost: %s (prefixgate_engine_tokenize_failures_total counts them)", exc)
        except Exception:  # observability must never take the proxy down
            log.exception("prefix after_response failed")
            self.metrics.observation_errors.labels("prefix").inc()

    async def _process(self, ctx: RequestContext, fp: Fingerprint, output_ids: Any) -> None:
        state = ctx.prefix
        replica = ctx.decision.replica.name  # type: ignore[union-attr]
        if fp.deferred is not None:  # refused by a full pool before routing
            outcome = "dropped"
            if await self.fingerprinter.readmit(fp):
                try:
                    fp = await self.fingerprinter.complete(fp)
                finally:
                    self.fingerprinter.release(fp)
                outcome = "completed" if fp.complete else "dropped"
            child(self.metrics.fingerprint_deferred, outcome).inc()
        fp = await self.fingerprinter.complete(fp, state.pending if state is not None else None)
        n = fp.num_tokens or 0
        if not fp.complete and fp.mode == "approx":  # a cold prompt past the pool's budget
            n = ctx.prompt_tokens if isinstance(ctx.prompt_tokens, int) else fp.estimated_tokens
        b = fp.block_size
        chain = fp.block_hashes
        matched = state.matched if state is not None else None
        available = state.available if state is not None else None
        if matched is None or available is None:
            matched, available = await self._matched(ctx, chain)
        if output_ids is None:
            output_ids = await self.fingerprinter.encode_output(_output_text(ctx))
        usage = ctx.usage or {}
        produced = usage.get("completion_tokens")
        produced = int(produced) if isinstance(produced, int) else len(output_ids)
        resident = (n + produced - 1) // b if n else 0
        # The engine caches the ids it *sampled*; the proxy only sees their text. Re-tokenising
        # that text gives other ids often enough (a random or odd-output model: merges across
        # token boundaries, skipped special tokens), and trusting them over-predicts the next
        # turn by the blocks they span (real vLLM, tests/e2e). A different count means different
        # ids: then only the prompt's blocks are taken as resident.
        stable = len(output_ids) == produced
        full = self.fingerprinter.extend_with_output(fp, output_ids) if output_ids and stable else chain
        resident_chain = full[:max(len(chain), min(resident, len(full)))]
        # vLLM leaves the block its last computed token (prompt + output - 1) only partly fills
        # uncached in its free queue (ReplicaIndex.learn_completed); SGLang frees such a page at once
        partial = bool(n) and (n + produced - 1) % b != 0 and ctx.decision.replica.engine == "vllm"  # type: ignore[union-attr]
        await self.residency.learn_completed(replica, resident_chain, anonymous_tail=partial)  # no-op with KV events

        predicted = predicted_hit_tokens(matched, n, b)
        delivered = ctx.engine_cached_tokens
        model = ctx.model or "unknown"
        tenant = self.metrics.tenant_label(ctx.tenant)
        child(self.metrics.cached_tokens, ctx.route, model, tenant, "predicted").inc(predicted)
        reported = delivered if isinstance(delivered, int) and delivered >= 0 else None
        count_reuse(self.metrics.reuse_tokens, predicted_hit_tokens(available, n, b), predicted, reported)
        if reported is not None:
            self.scraper.record_prediction(replica, predicted, reported)
        if state is not None:
            state.predicted_tokens = predicted
        self.predictions.append((ctx.request_id, ctx.tenant, predicted,
                                 delivered if isinstance(delivered, int) else None))

        await asyncio.sleep(0)  # a slice boundary: what follows is O(messages) + C-level bulk updates
        sketch = build_sketch(state.input if state is not None else None, fp.text) if fp.text is not None else None
        t = ctx.timings  # client-side TTFT and engine prompt tokens: /hygiene's TTFT by prompt bucket
        facts = {"ttft_s": None if t.first_token is None else t.first_token - t.arrival,
                 "prompt_tokens": ctx.prompt_tokens}
        prompt_tokens = ctx.prompt_tokens if isinstance(ctx.prompt_tokens, int) else n
        obs = await self.tracker.observe(ctx.tenant, chain, sketch, b,
                                         extra_chain=resident_chain[len(chain):], facts=facts,
                                         price=self._pricer(replica, b, prompt_tokens,
                                                            predicted if reported is None else reported))
        if obs.continuity is not None:
            child(self.metrics.continuity, tenant).set(obs.continuity)
        if obs.diagnosis is not None and obs.diagnosis.cause is not None:
            child(self.metrics.breaks, ctx.route, tenant, obs.diagnosis.cause).inc()
            if obs.bill is not None:
                child(self.metrics.break_recomputed_tokens, tenant, obs.diagnosis.cause).inc(obs.bill.tokens)
                if obs.bill.seconds is not None:
                    child(self.metrics.break_prefill_seconds, tenant, obs.diagnosis.cause).inc(obs.bill.seconds)
        self._publish_tracker_totals()
        if state is not None:
            state.observation = obs
        self.processed += 1

    def _publish_tracker_totals(self) -> None:
        """The tracker's running totals (evictions, diagnoses and their CPU) into their counters:
        what each grew by since the last request published them."""
        tracker, metrics = self.tracker, self.metrics
        if (n := self._grown("evictions", tracker.evictions)) > 0:
            metrics.tenant_evictions.inc(n)
        if (n := self._grown("failed", tracker.diagnoses_failed)) > 0:  # a bug of ours, logged where it raised
            metrics.observation_errors.labels("diagnosis").inc(n)
        for outcome, total in tracker.diagnosis_outcomes.items():
            if (n := self._grown(outcome, total)) > 0:
                self._diagnosis_outcomes[outcome].inc(n)
        for where, seconds in tracker.diagnosis_cpu_s.items():
            if (spent := self._grown("cpu:" + where, seconds)) > 0:
                self._diagnosis_cpu[where].inc(spent)

    def _grown(self, name: str, total: float) -> float:
        """How much the running total `name` grew since it was last read here."""
        grown = total - self._seen.get(name, 0)
        self._seen[name] = total
        return grown

    def _pricer(self, replica: str, block_size: int, prompt_tokens: int,
                cached_tokens: int) -> Callable[[int], BreakBill]:
        """The tracker's `price` for this request: its break's recomputed blocks -> the bill, with
        the serving replica's prefill model as it stands (solved only when a break is billed)."""
        def price(blocks: int) -> BreakBill:
            return price_break(blocks, block_size, prompt_tokens, cached_tokens,
                               self.metrics.prefill_models.fit_of(replica))
        return price


def build_prefix_stage(settings: Settings, metrics: Metrics, replicas: ReplicaSet, store: Store,
                       residency: ReplicaIndex, scraper: EngineScraper, upstream: Upstream,
                       kv_events: KVEventSubscriber | None = None) -> PrefixStage:
    """The fingerprint + continuity stage and its tracker (also mounted for /hygiene), each cap a
    share of `memory.budget_mb` (app/prefix/budget.py), exported as gauges."""
    caps = MemoryCaps.from_budget(settings.memory.budget_mb)
    fingerprinter = Fingerprinter.from_settings(
        settings, replicas, session=lambda: upstream.session,
        token_memo_bytes=caps.token_memo_bytes, chain_memo_bytes=caps.chain_memo_bytes)
    tracker = TenantTracker(
        store, max_hashes=caps.tracker_hash_bytes // HASH_ENTRY_BYTES,
        tenant_max_hashes=caps.tracker_tenant_hash_bytes // (HASH_ENTRY_BYTES + HASH_SLOT_BYTES),
        texts_bytes=caps.tracker_text_bytes, texts_per_tenant=settings.prefix.tracker_texts_per_tenant,
        max_tenants=settings.tenants.max_tenants, show_text=settings.hygiene.show_text,
        extra_patterns=settings.hygiene.dynamic_patterns, max_hash_bytes=caps.tracker_hash_bytes,
        diagnosis_cpu_share=settings.prefix.diagnosis_cpu_share)
    shared_index = settings.routing.kv_events or not isinstance(store, MemoryStore)
    stage = PrefixStage(settings, metrics, replicas, residency, scraper, fingerprinter, tracker,
                        shared_index=shared_index, kv_events=kv_events, recent=caps.recent_predictions)
    metrics.memory_budget.set(caps.budget_bytes)
    for part in stage.memory_bytes():
        metrics.memory_used.labels(part).set_function(lambda part=part: stage.memory_bytes()[part])
    return stage


def _head(fp: Fingerprint) -> Hashable | None:
    """What two prompts that share a block have in common: their namespace, block size and first
    `block_size` characters (a token covers at least one character, except the pieces of a
    character split across tokens). None for token-id prompts, which have no text."""
    if fp.text is None:
        return None
    return fp.salt, fp.block_size, fp.text[:fp.block_size]
