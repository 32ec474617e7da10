"""Per-tenant continuity: how much of each prompt continues what the tenant sent before.

Local, bounded index (one per gateway pod): per tenant, block hash -> the newest request that
contained it. Chained hashes identify whole prefixes, and requests are evicted oldest first
(a hash shared with a newer request survives), so each tenant's set stays prefix-closed and
"longest prefix of this chain seen before" is a binary search: O(log n) set lookups.
Memory, counted in the bytes really held (docs/memory.md): a global byte cap on the hashes across
tenants (the index entries, the per-request tuples and each tenant's containers; LRU tenants go
first, then the tenant's own oldest requests), a per-tenant cap (oldest requests dropped), and a
byte cap on the request sketches (rendered prompts) kept for diagnosis.

Shared, through the Store (several pods): one compact record per request (`history_append`,
with a sparse sample of the chain so another pod can still find a common prefix) and the report
counters (`counter_incr`); /hygiene reads only the Store.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import eq
from typing import Any

from app.prefix.breakview import break_view
from app.prefix.diagnose import Diagnosis, diagnose, fix_for, snippet
from app.prefix.sketch import RequestSketch, sketch_bytes

SAMPLE_POINTS = 24
INLINE_DIAGNOSE_CHARS = 64 * 1024  # larger prompt pairs are diagnosed in a worker thread
# Bytes held per unit, CPython 3.11 (sys.getsizeof): an index entry (dict slot ~52 B at its load
# factor + the 64-bit int key, 36 B), a slot of a request's hash tuple, a tenant's empty containers.
HASH_ENTRY_BYTES = 90
HASH_SLOT_BYTES = 8
TENANT_BYTES = 1024


@dataclass
class Observation:
    """What the tracker concluded about one request."""

    tenant: str
    seq: int
    total_blocks: int
    matched_blocks: int
    continuity: float | None  # matched / total full blocks; None for prompts under one block
    diagnosis: Diagnosis | None
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Tenant:
    hashes: dict[int, int] = field(default_factory=dict)  # block hash -> newest seq containing it
    # (seq, hashes) oldest first; tuples of ints, which the garbage collector stops tracking once
    # it has seen them (as lists, 25k references a request were walked again by every full collection)
    requests: deque[tuple[int, tuple[int, ...]]] = field(default_factory=deque)
    sketches: OrderedDict[int, RequestSketch] = field(default_factory=OrderedDict)
    last_seq: int = 0


def longest_known_prefix(chain: Sequence[int], known: dict[int, int] | set[int]) -> int:
    """Largest m with chain[:m] all known (binary search; `known` is prefix-closed)."""
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] in known:
            lo = mid
        else:
            hi = mid - 1
    return lo


def sample_chain(chain: Sequence[int], points: int = SAMPLE_POINTS) -> list[list[int]]:
    """[index, hash] at 0, 1, 3, 7, ... and evenly spaced, plus the last: a shareable sketch."""
    n = len(chain)
    idx: set[int] = set()
    i = 1
    while i - 1 < n and len(idx) < points // 2:
        idx.add(i - 1)
        i *= 2
    step = max(1, n // max(1, points // 2))
    idx.update(range(0, n, step))
    if n:
        idx.add(n - 1)
    return [[j, chain[j]] for j in sorted(idx)]


def sampled_prefix(chain: Sequence[int], sample: Sequence[Sequence[int]]) -> int:
    """A lower bound of the common prefix of `chain` and the chain behind `sample`."""
    best = 0
    for j, h in sample:
        if j < len(chain) and chain[j] == h:
            best = j + 1
        else:
            break
    return best


class TenantTracker:
    """Observe requests, answer continuity, diagnose breaks, write records and counters."""

    def __init__(self, store: Any, max_hashes: int = 1_000_000, tenant_max_hashes: int = 131_072,
                 texts_bytes: int = 64 * 1024 * 1024, texts_per_tenant: int = 4, max_tenants: int = 10_000,
                 show_text: bool = False, extra_patterns: Sequence[str] = (),
                 clock: Any = time.time, max_hash_bytes: int | None = None) -> None:
        self.store = store
        self.max_hashes = max_hashes
        self.max_hash_bytes = max_hash_bytes  # None: only the counts bound the hashes
        self.tenant_max_hashes = tenant_max_hashes
        self.texts_bytes = texts_bytes
        self.texts_per_tenant = texts_per_tenant
        self.max_tenants = max_tenants
        self.show_text = show_text
        self.extra_patterns = tuple(extra_patterns)
        self.clock = clock
        self.evictions = 0  # tenants or requests dropped from the bounded history
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()
        self._hash_count = 0
        self._slots = 0  # hash slots of every kept request's tuple (a shared head counts per request)
        self._text_bytes = 0

    @property
    def hash_count(self) -> int:
        return self._hash_count

    @property
    def hash_bytes(self) -> int:
        """Bytes held by the index, the kept requests' hash tuples and the tenants' containers."""
        return (self._hash_count * HASH_ENTRY_BYTES + self._slots * HASH_SLOT_BYTES
                + len(self._tenants) * TENANT_BYTES)

    @property
    def text_bytes(self) -> int:
        """Bytes held by the kept request sketches (sketch_bytes)."""
        return self._text_bytes

    # ------------------------------------------------------------------ observe
    async def observe(self, tenant: str, chain: Sequence[int], sketch: RequestSketch | None,
                      block_size: int, extra_chain: Sequence[int] = (),
                      facts: dict[str, Any] | None = None) -> Observation:
        """Match `chain` (a complete prompt chain) against the tenant's history, diagnose a break,
        then remember `chain` + `extra_chain` (blocks of generated tokens that follow it).
        `facts` (TTFT, prompt tokens) are stored with the request's record for the reports."""
        state = self._tenant(tenant)
        total = len(chain)
        matched = longest_known_prefix(chain, state.hashes)
        best_seq = state.hashes.get(chain[matched - 1]) if matched else None
        records: list[dict] | None = None
        if not state.requests:
            records = await self.store.history_recent(tenant, 8)
            for rec in records:
                matched = max(matched, sampled_prefix(chain, rec.get("sample") or []))
        continuity = (matched / total) if total else None
        diag: Diagnosis | None = None
        prev = self._best_sketch(state, best_seq)
        if sketch is not None and prev is not None and (total == 0 or matched < total):
            call = partial(diagnose, prev, sketch, material=max(64, 6 * block_size),
                           extra_patterns=self.extra_patterns)
            if len(sketch.text) + len(prev.text) > INLINE_DIAGNOSE_CHARS:
                diag = await asyncio.get_running_loop().run_in_executor(None, call)  # keep the loop free
            else:
                diag = call()
        seq = state.last_seq + 1
        state.last_seq = seq
        record = self._record(seq, tenant, total, matched, continuity, diag, sketch, chain, block_size, prev)
        record.update(facts or {})
        self._remember(tenant, state, seq, [*chain, *extra_chain] if extra_chain else list(chain), sketch)
        await self.store.history_append(tenant, record)
        await self.store.counter_incr(tenant, "requests")
        await self.store.counter_incr(tenant, "blocks", float(total))
        await self.store.counter_incr(tenant, "matched_blocks", float(matched))
        if diag is not None and diag.cause is not None:
            await self.store.counter_incr(tenant, "breaks")
            await self.store.counter_incr(tenant, f"breaks:{diag.cause}")
        return Observation(tenant, seq, total, matched, continuity, diag, record)

    def _record(self, seq: int, tenant: str, total: int, matched: int, continuity: float | None,
                diag: Diagnosis | None, sketch: RequestSketch | None, chain: Sequence[int],
                block_size: int, prev: RequestSketch | None = None) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "seq": seq, "ts": self.clock(), "blocks": total, "matched": matched,
            "continuity": continuity, "cause": None, "sample": sample_chain(chain),
        }
        if diag is not None and diag.cause is not None and sketch is not None:
            text = sketch.text
            rec.update({
                "cause": diag.cause,
                "block_index": matched,
                "token_offset": matched * block_size,
                "char_offset": diag.char_offset,
                "span_kinds": [s.kind for s in diag.spans],
                "span_offsets": [[s.start, s.end] for s in diag.spans],
                "spans": [s.text for s in diag.spans] if self.show_text else [],
                "snippet": snippet(text, diag.char_offset, diag.spans, self.show_text),
                "fix": fix_for(diag, text, self.show_text),
                "detail": diag.detail,
            })
            rec.update(break_view(prev, sketch, diag, self.show_text, self.extra_patterns))  # for /ui
        return rec

    # ------------------------------------------------------------------ bounded memory
    def _tenant(self, tenant: str) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
            while len(self._tenants) > self.max_tenants:
                self._drop_tenant(next(iter(self._tenants)))
        self._tenants.move_to_end(tenant)
        return state

    def _drop_tenant(self, tenant: str) -> None:
        state = self._tenants.pop(tenant)
        self._hash_count -= len(state.hashes)
        self._slots -= sum(len(hashes) for _, hashes in state.requests)
        for sk in state.sketches.values():
            self._text_bytes -= sketch_bytes(sk)
        self.evictions += 1

    def _best_sketch(self, state: _Tenant, seq: int | None) -> RequestSketch | None:
        if seq is not None and seq in state.sketches:
            return state.sketches[seq]
        return next(reversed(state.sketches.values()), None) if state.sketches else None

    def _remember(self, tenant: str, state: _Tenant, seq: int, hashes: list[int],
                  sketch: RequestSketch | None) -> None:
        # C-level bulk update (this runs on the event loop; a Python loop over a 1 MB prompt's
        # 25k hashes took ~2 ms): the dict's growth is the number of new hashes
        before = len(state.hashes)
        state.hashes.update(zip(hashes, repeat(seq)))
        self._hash_count += len(state.hashes) - before
        state.requests.append((seq, tuple(hashes)))
        self._slots += len(hashes)
        if sketch is not None:
            state.sketches[seq] = sketch
            self._text_bytes += sketch_bytes(sketch)
            while len(state.sketches) > self.texts_per_tenant:
                _, old = state.sketches.popitem(last=False)
                self._text_bytes -= sketch_bytes(old)
        while len(state.hashes) > self.tenant_max_hashes and len(state.requests) > 1:
            self._drop_oldest_request(state)
        while self._hash_count > self.max_hashes and len(self._tenants) > 1:
            victim = next(iter(self._tenants))
            if victim == tenant:
                break
            self._drop_tenant(victim)
        while self.max_hash_bytes is not None and self.hash_bytes > self.max_hash_bytes:
            victim = next(iter(self._tenants))
            if victim != tenant:
                self._drop_tenant(victim)
            elif len(state.requests) > 1:
                self._drop_oldest_request(state)
            else:
                break
        while self._text_bytes > self.texts_bytes:
            if not self._drop_oldest_text(tenant):
                break

    def _drop_oldest_request(self, state: _Tenant) -> None:
        seq, hashes = state.requests.popleft()
        # the hashes this request is still the newest holder of, found and deleted at C speed
        owned = list(dict.fromkeys(compress(hashes, map(eq, map(state.hashes.get, hashes), repeat(seq)))))
        deque(map(state.hashes.pop, owned, repeat(None)), maxlen=0)
        self._hash_count -= len(owned)
        self._slots -= len(hashes)
        self.evictions += 1

    def _drop_oldest_text(self, keep: str) -> bool:
        for name, state in self._tenants.items():
            if state.sketches and (name != keep or len(state.sketches) > 1):
                _, old = state.sketches.popitem(last=False)
                self._text_bytes -= sketch_bytes(old)
                return True
        return False


# ---------------------------------------------------------------------- reports

async def tenant_report(store: Any, tenant: str, window: int = 64, last_breaks: int = 5) -> dict[str, Any]:
    """Continuity over the last `window` requests, breaks by cause, the last few breaks."""
    records = await store.history_recent(tenant, window)
    counters = await store.counters(tenant)
    blocks = sum(int(r.get("blocks") or 0) for r in records)
    matched = sum(int(r.get("matched") or 0) for r in records)
    breaks = [r for r in records if r.get("cause")]
    by_cause = {k.split(":", 1)[1]: int(v) for k, v in counters.items() if k.startswith("breaks:")}
    keys = ("seq", "ts", "cause", "block_index", "token_offset", "char_offset", "blocks", "matched",
            "span_kinds", "spans", "snippet", "fix", "detail", "pod", "line", "message", "structure", "view")
    return {
        "tenant": tenant,
        "requests": int(counters.get("requests", 0)),
        "window": len(records),
        "continuity": (matched / blocks) if blocks else None,
        "continuity_total": (counters.get("matched_blocks", 0.0) / counters["blocks"]) if counters.get("blocks") else None,
        "breaks": int(counters.get("breaks", 0)),
        "breaks_by_cause": by_cause,
        "last_breaks": [{k: r.get(k) for k in keys if k in r} for r in breaks[-last_breaks:]][::-1],
        "recent": [{k: r.get(k) for k in ("seq", "continuity", "cause", "ttft_s", "prompt_tokens")} for r in records],
    }
