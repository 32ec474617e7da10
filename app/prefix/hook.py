"""The prefix hook: fingerprint on the hot path, prediction + residency + continuity after it.

before_route: `Fingerprinter.prepare` (render, split, memo walk; salt = ctx.salt, which the
hygiene hook sets when cache isolation is on) -> ctx.fingerprint, read by the router.

after_response (never blocks the loop; everything slow is a task or a worker thread):
1. prediction in the engine's rule, B * min(leading resident blocks, floor((N-1)/B)), on the chosen
   replica *before* this request's own blocks count: the router's lookup
   (`decision.matched_blocks`) when the routed chain covered it, else a lookup of the full chain;
2. residency: the full prompt chain plus the blocks of generated tokens the engine keeps
   (it caches full blocks of the N + out - 1 tokens it computed), written right away so the
   tenant's next turn finds them (not in KV-event mode: there the engines' events own the index);
3. tenant continuity + diagnosis (app/prefix/tracker.py), then metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from app.prefix.blocks import predicted_hit_tokens
from app.prefix.fingerprint import ChainNode, Fingerprint, Fingerprinter, PromptInput, prompt_input
from app.prefix.sketch import build_sketch
from app.prefix.template import TemplateError
from app.prefix.tracker import TenantTracker
from app.proxy.context import RequestContext

if TYPE_CHECKING:
    from app.config import Settings
    from app.services import Services

log = logging.getLogger("prefixgate.prefix")
MODES = ("exact", "engine", "approx")
INLINE_OUTPUT_CHARS = 4096  # generated text encoded inside after_response (< 1 ms)
RECENT_PREDICTIONS = 4096


class PrefixHook:
    def __init__(self, settings: Settings, services: Services, fingerprinter: Fingerprinter,
                 tracker: TenantTracker) -> None:
        self.settings = settings
        self.services = services
        self.fingerprinter = fingerprinter
        self.tracker = tracker
        self.metrics = services.metrics
        # prefix_affinity reads the residency index at choose time and writes the routed chain
        # (and emits the available/captured reuse split); the other policies do neither
        self.router_looks_up = settings.routing.policy == "prefix_affinity"
        # with KV events the engines' own events are the only writer of the residency index
        self.writes_residency = not settings.routing.kv_events
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: dict[str, asyncio.Task[Any]] = {}  # tenant -> its latest in-flight completion
        self.pending_wait_s = settings.prefix.pending_wait_ms / 1000.0
        self._evictions_seen = 0
        self.processed = 0  # requests fully processed after their response (tests poll it)
        # (request id, tenant, predicted, engine-reported) of recent requests: for audits and tests
        self.predictions: deque[tuple[str, str, int, int | None]] = deque(maxlen=RECENT_PREDICTIONS)
        for mode in MODES:
            self.metrics.fingerprint_mode.labels(mode).set(1 if mode == fingerprinter.mode else 0)

    @property
    def mode(self) -> str:
        return self.fingerprinter.mode

    def block_size(self) -> int:
        """The fleet's block size: the first replica that reported one, else routing.block_size."""
        for replica in self.services.replicas.all():
            if replica.block_size:
                return int(replica.block_size)
        return int(self.settings.routing.block_size)

    # ------------------------------------------------------------------ hot path
    async def before_route(self, ctx: RequestContext) -> None:
        inp = prompt_input(ctx.route, ctx.body)
        if inp is None:
            return
        previous = self._pending.get(ctx.tenant)
        if previous is not None and not previous.done() and self.pending_wait_s > 0:
            # the tenant's previous prompt is still being tokenised (its response already ended if
            # this is the next turn): a short, bounded wait lets this prompt reuse its chain
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(previous), self.pending_wait_s)
        try:
            fp = self.fingerprinter.prepare(inp, self.block_size(), ctx.salt)
        except TemplateError as exc:
            log.debug("no fingerprint for %s: %s", ctx.request_id, type(exc).__name__)
            return
        except Exception:  # a malformed body is the proxy core's business, never ours to fail
            log.debug("no fingerprint for %s", ctx.request_id, exc_info=True)
            return
        ctx.fingerprint = fp
        ctx.attrs["prefix_input"] = inp
        ctx.attrs["prefix_routed_blocks"] = len(fp.block_hashes)
        ctx.attrs["prefix_routed_complete"] = fp.complete
        if not fp.complete:  # big misses: tokenise in the worker pool while the request is forwarded
            task = asyncio.get_running_loop().create_task(self._early(ctx, fp))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            ctx.attrs["prefix_pending"] = task
            self._pending[ctx.tenant] = task
            task.add_done_callback(lambda t, tenant=ctx.tenant: self._pending.get(tenant) is t
                                   and self._pending.pop(tenant, None))

    async def _early(self, ctx: RequestContext, fp: Fingerprint) -> ChainNode | None:
        """Finish the chain while the request is in flight and, once it was routed, write the
        prompt's blocks to the residency index right away (the engine caches them during prefill,
        and the tenant's next turn may arrive as soon as this response ends)."""
        node = await self.fingerprinter.rest(fp)
        if node is None or ctx.decision is None:
            return node
        chain = node.chain()
        replica = ctx.decision.replica.name
        # KV-event mode too: after the response the engine's own BlockStored events for this
        # request are in the index, and a lookup then counts them (real vLLM: a cold 1145-token
        # prompt "predicted" 1120 cached; tests/e2e/test_e2e_kv_events.py)
        ctx.attrs["prefix_matched"] = await self._matched(ctx, chain, node.num_tokens, fp.block_size)
        if self.writes_residency:
            await self.services.store.residency_add(replica, chain)
        return node

    async def _matched(self, ctx: RequestContext, chain: list[int], n: int, b: int) -> int:
        """Leading blocks of `chain` resident on the chosen replica before this request's own
        blocks count (see the module docstring)."""
        store = self.services.store
        decision = ctx.decision
        assert decision is not None
        replica = decision.replica.name
        routed = int(ctx.attrs.get("prefix_routed_blocks", 0))
        if self.router_looks_up:
            # the router looked up the routed chain before inserting it: exact for that part
            matched = decision.matched_blocks
            if matched >= routed and routed < len(chain):
                lookup = await store.residency_lookup(chain, [replica])
                matched = max(matched, lookup.get(replica, 0))
            return self._resident_when_sent(ctx, replica, chain, matched)
        # other policies neither read nor write the index: look up before our own insert
        lookup = await store.residency_lookup(chain, self.services.replicas.names())
        matched = self._resident_when_sent(ctx, replica, chain, lookup.get(replica, 0))
        available = max(lookup.values(), default=0)
        self.metrics.reuse_tokens.labels(stage="available").inc(predicted_hit_tokens(available, n, b))
        self.metrics.reuse_tokens.labels(stage="captured").inc(predicted_hit_tokens(matched, n, b))
        return matched

    def _resident_when_sent(self, ctx: RequestContext, replica: str, chain: list[int], matched: int) -> int:
        """In KV-event mode the engine may report this request's own blocks before the lookup
        runs (the chain of a cold prompt is finished in a worker while the engine prefills):
        count only blocks whose BlockStored arrived before the request was sent upstream."""
        events = self.services.kv_events
        sent = ctx.timings.upstream_sent
        if self.writes_residency or events is None or sent is None or matched == 0:
            return matched
        return events.resident_before(replica, chain[:matched], sent)

    # ------------------------------------------------------------------ after the response
    def after_response(self, ctx: RequestContext) -> None:
        fp = ctx.fingerprint
        if fp is None or ctx.decision is None or ctx.outcome != "ok" or (ctx.status or 200) >= 400:
            return
        output_ids = None
        text = ctx.attrs.get("output_text") or ""
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
        except Exception:  # observability must never take the proxy down
            log.exception("prefix after_response failed")

    async def _process(self, ctx: RequestContext, fp: Fingerprint, output_ids: Any) -> None:
        store = self.services.store
        replica = ctx.decision.replica.name  # type: ignore[union-attr]
        fp = await self.fingerprinter.complete(fp, ctx.attrs.get("prefix_pending"))
        n = fp.num_tokens or 0
        b = fp.block_size
        chain = fp.block_hashes
        matched = ctx.attrs.get("prefix_matched")
        if not isinstance(matched, int):
            matched = await self._matched(ctx, chain, n, b)
        if output_ids is None:
            output_ids = await self.fingerprinter.encode_output(ctx.attrs.get("output_text") or "")
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
        full = self.fingerprinter.extend_with_output(fp, output_ids) if output_ids and stable else list(chain)
        resident_chain = full[:max(len(chain), min(resident, len(full)))]
        if self.writes_residency:
            await store.residency_add(replica, resident_chain)

        predicted = predicted_hit_tokens(matched, n, b)
        delivered = ctx.engine_cached_tokens
        model = ctx.model or "unknown"
        tenant = self.metrics.tenant_label(ctx.tenant)
        self.metrics.cached_tokens.labels(model, tenant, "predicted").inc(predicted)
        if isinstance(delivered, int) and delivered >= 0:
            self.metrics.reuse_tokens.labels(stage="delivered").inc(delivered)
            self.services.scraper.record_prediction(replica, predicted, delivered)
        ctx.attrs["prefix_predicted_tokens"] = predicted
        self.predictions.append((ctx.request_id, ctx.tenant, predicted,
                                 delivered if isinstance(delivered, int) else None))

        await asyncio.sleep(0)  # a slice boundary: what follows is O(messages) + C-level bulk updates
        inp: PromptInput | None = ctx.attrs.get("prefix_input")
        sketch = build_sketch(inp, fp.text) if fp.text is not None else None
        obs = await self.tracker.observe(ctx.tenant, chain, sketch, b,
                                         extra_chain=resident_chain[len(chain):])
        if obs.continuity is not None:
            self.metrics.continuity.labels(tenant).set(obs.continuity)
        if obs.diagnosis is not None and obs.diagnosis.cause is not None:
            self.metrics.breaks.labels(tenant, obs.diagnosis.cause).inc()
        evicted = self.tracker.evictions - self._evictions_seen
        if evicted > 0:
            self.metrics.tenant_evictions.inc(evicted)
            self._evictions_seen += evicted
        ctx.attrs["prefix_observation"] = obs
        self.processed += 1


def build_prefix_hook(settings: Settings, services: Services) -> PrefixHook:
    """The fingerprint + continuity hook, and its tracker (also mounted for /hygiene)."""
    opts = settings.prefix
    fingerprinter = Fingerprinter.from_settings(settings, services.replicas)
    tracker = TenantTracker(
        services.store, max_hashes=opts.tracker_max_hashes, tenant_max_hashes=opts.tracker_tenant_max_hashes,
        texts_bytes=opts.tracker_texts_mb * 1024 * 1024, texts_per_tenant=opts.tracker_texts_per_tenant,
        max_tenants=settings.tenants.max_tenants, show_text=settings.hygiene.show_text,
        extra_patterns=settings.hygiene.dynamic_patterns)
    return PrefixHook(settings, services, fingerprinter, tracker)
