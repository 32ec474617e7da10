"""Per-tenant continuity: how much of each prompt continues what the tenant sent before.

Local, bounded index (one per gateway pod): per tenant, the chains it sent as a tree of runs
(app/prefix/runs.py, the structure the residency index keeps too), each run stamped with the
newest request through it. Continuity is the depth of the longest match of a request against that
tree: a step per run on its path, never a step per block it shares with earlier requests, and
remembering a request costs its new blocks. Diagnosis runs only when that match says the request
may have lost something (`_continues_known`: it does not continue, in full, the latest request of
its conversation); a large prompt pair in a diagnosis thread with a bounded queue.
Memory, counted in the bytes really held (docs/memory.md): a global byte cap on the trees across
tenants (8 bytes a block, a run's overhead, each tenant's containers; LRU tenants go first, then
the tenant's own least recent blocks, tail first), a per-tenant cap in blocks, and a byte cap on
the request sketches (rendered prompts) kept for diagnosis.

Shared, through the Store (several pods): one compact, text-free record per request
(`history_append`: a sparse sample of the chain so another pod can still find a common prefix,
the conversation and system keys, and the request's digest, app/prefix/digest.py) and the report
counters (`counter_incr`). Every request reads the tenant's recent records, so whichever pod gets
it diagnoses it against the same request (docs/diagnosis.md); /hygiene reads only the Store.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from app.cpu_budget import CpuBudget
from app.offloop import OffLoop
from app.prefix.bill import BreakBill, recomputed_blocks
from app.prefix.breakview import break_view
from app.prefix.conversation import TenantPast, continues, last_turn_key, system_key, turn_keys
from app.prefix.diagnose import NOT_A_PROBLEM, Diagnosis, diagnose, fix_for, snippet
from app.prefix.digest import RequestDigest, diagnose_digest
from app.prefix.history_shape import compacted
from app.prefix.runs import RUN_BYTES, RunTree, joined
from app.prefix.sketch import RequestSketch, sketch_bytes

log = logging.getLogger("prefixgate.prefix")

SAMPLE_POINTS = 24
PAST_RECORDS = 16  # Store records read per request: the tenant's recent conversations, from every pod
PAST_KEYS = 256  # per tenant, conversation keys kept locally
DIAGNOSE_QUEUE = 8  # diagnoses queued or running at once; past it a break is recorded undiagnosed
# Smaller prompt pairs are diagnosed inline: under the GIL a thread does not run them in parallel,
# and its hand-off costs more CPU than the diagnosis (measured: +0.15 ms a 200 B request).
INLINE_DIAGNOSE_CHARS = 64 * 1024
# Where a diagnosis runs (`TenantTracker.diagnosis_cpu_s`, prefixgate_diagnosis_cpu_seconds_total)
ON_LOOP, IN_THREAD = "event_loop", "diagnosis_thread"
# A request continues an earlier one when its chain holds every full block of that one's prompt
# (then what differs is in the earlier prompt's last partial block, under B tokens: less than
# diagnosis's `material`, and a value changed there is no break). Any slack here lets a value
# changed near a prompt's end, followed by static text, pass undiagnosed.
CONTINUE_SLACK_BLOCKS = 0
# Bytes held per unit, CPython 3.11 (sys.getsizeof): a block hash in a run's packed array (the
# runs' own overhead is RUN_BYTES each, counted apart); no request holds a copy of its hashes any
# more (HASH_SLOT_BYTES, kept for the callers' cap arithmetic); a tenant's empty containers.
HASH_ENTRY_BYTES = 8
HASH_SLOT_BYTES = 0
TENANT_BYTES = 1024
KEY_ENTRY_BYTES = 200  # an entry of a tenant's turns/systems/prompts (key, value, ordered-dict slot)


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
    bill: BreakBill | None = None  # a break's recomputed tokens and seconds (not a compaction, new session)


@dataclass
class _Tenant:
    tree: RunTree  # the tenant's chains; each run stamped with the newest request (seq) through it
    sketches: OrderedDict[int, RequestSketch] = field(default_factory=OrderedDict)
    last_seq: int = 0
    # stable keys of the last user turn (-> the newest request with it) and system prompt of recent
    # requests (bounded, oldest first)
    turns: OrderedDict[str, int] = field(default_factory=OrderedDict)
    systems: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # seq -> (its prompt's blocks, its last user turn's key, the blocks remembered with it: prompt
    # and generated) of recent requests
    prompts: OrderedDict[int, tuple[int, str | None, int]] = field(default_factory=OrderedDict)


def _never() -> float:
    return 0.0  # the tenant trees' clock: their runs never expire (LRU and the caps bound them)


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


# the members of a Store record the tracker reads, and their types (absent or null: unknown)
_READ_MEMBERS = (("sample", list), ("turn", str), ("sys", str), ("edit", str), ("rid", str), ("digest", dict))


def readable(rec: Any) -> bool:
    """A record whose members the tracker reads have their types. Records come from every pod,
    maybe of another version (or a bug): one that does not is not read, as if absent. The
    sample's pairs are checked where they are read (`sampled_prefix`, under `_sample_match`)."""
    if type(rec) is not dict:
        return False
    for key, kind in _READ_MEMBERS:
        value = rec.get(key)
        if value is not None and type(value) is not kind:
            return False
    return True


def _sample_match(chain: Sequence[int], sample: Sequence[Sequence[int]]) -> int:
    try:
        return sampled_prefix(chain, sample)
    except (TypeError, ValueError):  # pairs that are not [index, hash]: no match known
        return 0


class TenantTracker:
    """Observe requests, answer continuity, diagnose breaks, write records and counters."""

    def __init__(self, store: Any, max_hashes: int = 1_000_000, tenant_max_hashes: int = 131_072,
                 texts_bytes: int = 64 * 1024 * 1024, texts_per_tenant: int = 4, max_tenants: int = 10_000,
                 show_text: bool = False, extra_patterns: Sequence[str] = (),
                 clock: Any = time.time, max_hash_bytes: int | None = None,
                 diagnosis_cpu_share: float | None = None) -> None:
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
        self._hash_count = 0  # blocks held in every tenant's tree
        self._runs = 0  # runs of every tenant's tree
        self._keys = 0  # entries of every tenant's turns, systems and prompts
        self._text_bytes = 0
        self._diagnose_thread = OffLoop("prefixgate-diagnose")
        self._diagnosing = 0  # diagnoses queued or running (DIAGNOSE_QUEUE)
        self.diagnoses = 0  # diagnoses run
        self.diagnoses_skipped = 0  # breaks recorded undiagnosed: the queue was full
        self.diagnoses_failed = 0  # breaks recorded undiagnosed: the diagnosis raised (a bug of ours)
        self.diagnoses_over_budget = 0  # breaks recorded undiagnosed: the CPU budget was spent
        # the share of a core diagnoses may take (`prefix.diagnosis_cpu_share`); past it, undiagnosed.
        # None: no bound (`prefixgate lint`, the diagnosis benchmark: every break diagnosed)
        self._cpu_budget = CpuBudget(diagnosis_cpu_share) if diagnosis_cpu_share is not None else None
        # CPU seconds diagnoses took (each measured on the clock of the thread it ran in), by where
        self.diagnosis_cpu_s = {ON_LOOP: 0.0, IN_THREAD: 0.0}
        self.pod = secrets.token_hex(4)  # names this tracker's records, so it knows which it holds texts of

    @property
    def diagnosis_outcomes(self) -> dict[str, int]:
        """Requests taken up for diagnosis so far, by outcome (prefixgate_diagnoses_total): run, and
        recorded undiagnosed for a full queue or a spent budget (failures: `diagnoses_failed`)."""
        return {"diagnosed": self.diagnoses, "skipped": self.diagnoses_skipped,
                "over_budget": self.diagnoses_over_budget}

    @property
    def hash_count(self) -> int:
        return self._hash_count

    @property
    def hash_bytes(self) -> int:
        """Bytes held by the tenants' trees (blocks and runs) and their containers."""
        return (self._hash_count * HASH_ENTRY_BYTES + self._runs * RUN_BYTES + len(self._tenants) * TENANT_BYTES
                + self._keys * KEY_ENTRY_BYTES)

    @property
    def text_bytes(self) -> int:
        """Bytes held by the kept request sketches (sketch_bytes)."""
        return self._text_bytes

    # ------------------------------------------------------------------ observe
    async def observe(self, tenant: str, chain: Sequence[int], sketch: RequestSketch | None,
                      block_size: int, extra_chain: Sequence[int] = (),
                      facts: dict[str, Any] | None = None,
                      price: Callable[[int], BreakBill] | None = None) -> Observation:
        """Match `chain` (a complete prompt chain) against the tenant's history, diagnose a break,
        then remember `chain` + `extra_chain` (blocks of generated tokens that follow it).
        `facts` (TTFT, prompt tokens) are stored with the request's record for the reports.
        `price` turns a diagnosed break's recomputed blocks into its bill (app/prefix/bill.py)."""
        state = self._tenant(tenant)
        total = len(chain)
        matched, run = state.tree.match(chain)  # a step per run on the path, not per block
        local = matched
        best_seq = run.stamp if run is not None else None
        # every request reads the tenant's recent records (written by every pod): a pod that did not
        # see the previous turns still knows the tenant's conversations and a lower bound of the match
        records = [r for r in await self.store.history_recent(tenant, PAST_RECORDS) if readable(r)]
        for rec in records:
            matched = max(matched, _sample_match(chain, rec.get("sample") or []))
        continuity = (matched / total) if total else None
        diag: Diagnosis | None = None
        fields: dict[str, Any] = {}
        prev: RequestSketch | None = None
        call: partial | None = None
        if sketch is not None and not self._continues_known(state, sketch, local, best_seq, records):
            past = self._past(state, records)
            call = self._diagnosis(state, sketch, best_seq, past, records, max(64, 6 * block_size))
            # None: a digest
            prev = call.args[0] if call is not None and isinstance(call.args[0], RequestSketch) else None
            if call is not None:  # also when only the last partial block changed
                done = await self._run_diagnosis(call, sketch, matched, block_size, prev)
                if done is None:
                    fields["diagnosed"] = False
                else:
                    diag, fields = done
        bill = None
        if price is not None and diag is not None and diag.cause is not None and diag.cause not in NOT_A_PROBLEM:
            bill = self._bill(state, call.args[0] if call is not None else None, records, total, matched, price)
            if bill is not None:
                fields["bill_tokens"] = bill.tokens
                if bill.seconds is not None:
                    fields["bill_s"] = bill.seconds
        seq = state.last_seq + 1
        state.last_seq = seq
        record = self._record(seq, tenant, total, matched, continuity, diag, sketch, chain)
        record.update(fields)
        record.update(facts or {})
        record["held"] = total + len(extra_chain)
        self._remember(tenant, state, seq, joined(chain, extra_chain) if extra_chain else chain, sketch)
        self._remember_keys(state, record, seq, total, record["held"])
        await self.store.history_append(tenant, record)
        await self.store.counter_incr(tenant, "requests")
        await self.store.counter_incr(tenant, "blocks", float(total))
        await self.store.counter_incr(tenant, "matched_blocks", float(matched))
        if diag is not None and diag.cause is not None:
            await self.store.counter_incr(tenant, "breaks")
            await self.store.counter_incr(tenant, f"breaks:{diag.cause}")
            reason = diag.cause if diag.cause in NOT_A_PROBLEM else "break"
            await self.store.counter_incr(tenant, f"unmatched:{reason}", float(total - matched))
        if bill is not None and diag is not None:
            await self._count_bill(tenant, str(diag.cause), bill)
        return Observation(tenant, seq, total, matched, continuity, diag, record, bill)

    def _bill(self, state: _Tenant, against: Any, records: list[dict], total: int, matched: int,
              price: Callable[[int], BreakBill]) -> BreakBill | None:
        """The bill of a break diagnosed against `against` (a sketch held here, or the digest of
        another pod's record): what that request's chain held past the break point, up to this
        prompt's length. None when how much it held is not known (a record from an older pod)."""
        held: Any = None
        if isinstance(against, RequestSketch):
            seq = next((s for s, sk in state.sketches.items() if sk is against), None)
            known = state.prompts.get(seq) if seq is not None else None
            held = known[2] if known is not None else None
        elif isinstance(against, RequestDigest):
            wanted = against.to_record()
            rec = next((r for r in reversed(records) if r.get("digest") == wanted), None)
            held = rec.get("held") if rec is not None else None
        if not isinstance(held, int) or isinstance(held, bool):
            return None
        return price(recomputed_blocks(held, total, matched))

    async def _count_bill(self, tenant: str, cause: str, bill: BreakBill) -> None:
        """The explorer's "cost so far" (tenant_report's `bill`): tokens and seconds per cause."""
        await self.store.counter_incr(tenant, f"bill_breaks:{cause}")
        await self.store.counter_incr(tenant, f"bill_tokens:{cause}", float(bill.tokens))
        if bill.seconds is not None:
            await self.store.counter_incr(tenant, f"bill_timed:{cause}")
            await self.store.counter_incr(tenant, f"bill_s:{cause}", bill.seconds)

    def _continues_known(self, state: _Tenant, sketch: RequestSketch, matched: int,
                         best_seq: int | None, records: list[dict]) -> bool:
        """Nothing can have been lost, so there is nothing to diagnose: the request's match in the
        tree reaches the last blocks of the request it continues (`best_seq`), it holds that
        request's last user turn (the same conversation; without turns, that request is the
        tenant's newest), and no later request of its conversation exists here or in the records
        of other pods. O(runs + turns): the turn keys hash 1 KB per user turn."""
        known = state.prompts.get(best_seq) if best_seq is not None else None
        if known is None or best_seq is None or matched < known[0] - CONTINUE_SLACK_BLOCKS:
            return False
        turn = known[1]
        if turn is None:
            newest = records[-1] if records else None
            return best_seq == state.last_seq and (newest is None or newest.get("rid") == f"{self.pod}:{best_seq}")
        keys = set(turn_keys(sketch))
        if turn not in keys or any(state.turns.get(k, 0) > best_seq for k in keys):
            return False  # another conversation, or a later request of this one: diagnosed against it
        newest = next((r for r in reversed(records) if r.get("turn") in keys), None)
        if newest is None:
            return True
        pod, _, seq = str(newest.get("rid") or "").partition(":")
        return pod == self.pod and seq.isdecimal() and int(seq) <= best_seq

    async def _run_diagnosis(self, call: partial, sketch: RequestSketch, matched: int, block_size: int,
                             prev: RequestSketch | None) -> tuple[Diagnosis, dict[str, Any]] | None:
        """The diagnosis and the record fields of a break: inline for a small prompt pair, else in
        the diagnosis thread (off the event loop); None when the diagnoses' share of a core is spent
        (`prefix.diagnosis_cpu_share`), when DIAGNOSE_QUEUE diagnoses are already waiting in the
        thread (each counted, not queued), or when the diagnosis raised: the request is still
        recorded (its continuity and chain kept), undiagnosed."""
        if self._cpu_budget is not None and not self._cpu_budget.allows():
            self.diagnoses_over_budget += 1
            return None
        try:
            if len(sketch.text) + (len(prev.text) if prev is not None else 0) <= INLINE_DIAGNOSE_CHARS:
                return self._diagnose_and_describe(call, sketch, matched, block_size, prev, ON_LOOP)
            if self._diagnosing >= DIAGNOSE_QUEUE:
                self.diagnoses_skipped += 1
                return None
            self._diagnosing += 1
            try:
                return await self._diagnose_thread.run(
                    self._diagnose_and_describe, call, sketch, matched, block_size, prev, IN_THREAD)
            finally:
                self._diagnosing -= 1
        except Exception as exc:  # noqa: BLE001 - a diagnosis bug must not lose the request's record
            self.diagnoses_failed += 1
            frame = traceback.extract_tb(exc.__traceback__)[-1]  # where, never the message (it may quote the prompt)
            log.error("diagnosis failed: %s at %s:%s; the request is recorded undiagnosed",
                      type(exc).__name__, os.path.basename(frame.filename), frame.lineno)
            return None

    def _diagnose_and_describe(self, call: partial, sketch: RequestSketch, matched: int, block_size: int,
                               prev: RequestSketch | None, where: str) -> tuple[Diagnosis, dict[str, Any]]:
        """The diagnosis and its record fields; its CPU (raised or not) is added to
        `diagnosis_cpu_s[where]`, read on this thread's own clock."""
        started = time.thread_time()
        try:
            return self._describe(call(), sketch, matched, block_size, prev)
        finally:
            spent = time.thread_time() - started
            self.diagnosis_cpu_s[where] += spent
            if self._cpu_budget is not None:
                self._cpu_budget.charge(spent)

    def _describe(self, diag: Diagnosis, sketch: RequestSketch, matched: int, block_size: int,
                  prev: RequestSketch | None) -> tuple[Diagnosis, dict[str, Any]]:
        self.diagnoses += 1
        if diag.cause is None:
            return diag, {}
        text = sketch.text
        fields = {
            "cause": diag.cause,
            "block_index": matched,
            "token_offset": matched * block_size,
            "char_offset": diag.char_offset,
            "span_kinds": [s.kind for s in diag.spans],
            "span_offsets": [[s.start, s.end] for s in diag.spans],
            "secondary": [{"cause": f.cause, "char_offset": f.char_offset,
                           "span_kinds": [s.kind for s in f.spans],
                           "spans": [s.text for s in f.spans] if self.show_text else []}
                          for f in diag.secondary],
            "spans": [s.text for s in diag.spans] if self.show_text else [],
            "snippet": snippet(text, diag.char_offset, diag.spans, self.show_text),
            "fix": fix_for(diag, text, self.show_text),
            "detail": diag.detail,
        }
        if diag.edit_at is not None:  # where one token changed (a key, no text): `TenantPast.edits`
            fields["edit"] = diag.edit_at
        if diag.cause not in NOT_A_PROBLEM:  # the /ui view of a break (tenant_report's `last_breaks` only)
            fields.update(break_view(prev, sketch, diag, self.show_text, self.extra_patterns))
        return diag, fields

    def _diagnosis(self, state: _Tenant, sketch: RequestSketch | None, best_seq: int | None,
                   past: TenantPast, records: list[dict], material: int) -> partial | None:
        """The diagnosis to run: against the request `_compare_with` picks when this pod holds its
        text, else against the digest of the newest such request another pod recorded."""
        if sketch is None:
            return None
        kw = {"material": material, "extra_patterns": self.extra_patterns, "past": past}
        target = self._target_record(state, sketch, past, records, best_seq)
        if target is not None:
            rid = str(target.get("rid") or "")
            pod, _, seq = rid.partition(":")
            local = state.sketches.get(int(seq)) if pod == self.pod and seq.isdecimal() else None
            if local is not None:
                return partial(diagnose, local, sketch, **kw)
            digest = RequestDigest.from_record(target.get("digest"))  # parsed only when needed
            if digest is not None:
                return partial(diagnose_digest, digest, sketch, **kw)
        prev, own = self._compare_with(state, sketch, best_seq, past)
        return partial(diagnose, prev, sketch, **kw, own_conversation=own) if prev is not None else None

    def _target_record(self, state: _Tenant, sketch: RequestSketch, past: TenantPast, records: list[dict],
                       best_seq: int | None) -> dict | None:
        """The newest record of the conversation `sketch` continues, or the tenant's newest one.
        A compaction is compared with the request it compacted: the tenant's newest one or the
        newest through the tree's match (`best_seq`, this conversation's latest here), when this
        pod holds it and `compacted` says so. A Codex-shaped compacted history starts like its
        conversation's first request (the same first user message) and would otherwise be
        compared with that one, and found to continue it. O(records + messages)."""
        if not records:
            return None
        newest = records[-1]
        if not continues(sketch, past):
            return newest
        turns = set(turn_keys(sketch))
        found = next((r for r in reversed(records) if r.get("turn") in turns), None)
        if found is newest:
            return found
        through_match = f"{self.pod}:{best_seq}"
        candidates = [newest, *(r for r in records if r is not newest and r.get("rid") == through_match)]
        for rec in candidates:
            pod, _, seq = str(rec.get("rid") or "").partition(":")
            prev = state.sketches.get(int(seq)) if pod == self.pod and seq.isdecimal() else None
            if prev is not None and compacted(prev, sketch):
                return rec
        return found

    def _compare_with(self, state: _Tenant, sketch: RequestSketch | None, best_seq: int | None,
                      past: TenantPast) -> tuple[RequestSketch | None, bool]:
        """The request a new one is diagnosed against: what changed since the last time.
        - It continues a conversation: that conversation's newest request kept here (it holds that
          request's last user turn), even when an older one shares a longer prefix (tools flipped
          back, a date rolled over): a break is what the conversation lost against its own latest
          state. Else the request sharing the longest prefix, else the newest.
        - It starts one (a stateless client, a new chat): the tenant's newest request, so that a
          flag flipping back to an earlier value is still seen as the change it is.
        The flag says whether the request returned is of the same conversation (or the right one
        for a new conversation); when not (many users on one tenant, the conversation's last
        request no longer held), only its head can be compared."""
        if sketch is None or not state.sketches:
            return None, False
        newest = next(reversed(state.sketches.values()))
        if not continues(sketch, past):
            return newest, True
        turns = set(turn_keys(sketch))
        for prev in reversed(state.sketches.values()):
            key = last_turn_key(prev)
            if key is not None and key in turns:
                return prev, True
        return self._best_sketch(state, best_seq), False

    @staticmethod
    def _past(state: _Tenant, records: list[dict]) -> TenantPast:
        """A snapshot (a diagnosis in the thread reads it while the loop goes on), copied through
        the dicts' own key views: iterating an OrderedDict's linked list cost twice as much."""
        past = TenantPast(set(dict.keys(state.turns)), set(dict.keys(state.systems)))
        past.last_turns.update(filter(None, [rec.get("turn") for rec in records]))
        past.systems.update(filter(None, [rec.get("sys") for rec in records]))
        past.edits.update(filter(None, [rec.get("edit") for rec in records]))
        return past

    def _remember_keys(self, state: _Tenant, record: dict[str, Any], seq: int, blocks: int, held: int) -> None:
        before = len(state.turns) + len(state.systems) + len(state.prompts)
        for keys, key, value in ((state.turns, record.get("turn"), seq), (state.systems, record.get("sys"), None),
                                 (state.prompts, seq, (blocks, record.get("turn"), held))):
            if key:
                keys[key] = value
                keys.move_to_end(key)
                while len(keys) > PAST_KEYS:
                    keys.popitem(last=False)
        self._keys += len(state.turns) + len(state.systems) + len(state.prompts) - before

    def _record(self, seq: int, tenant: str, total: int, matched: int, continuity: float | None,
                diag: Diagnosis | None, sketch: RequestSketch | None, chain: Sequence[int]) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "seq": seq, "ts": self.clock(), "blocks": total, "matched": matched,
            "continuity": continuity, "cause": None, "sample": sample_chain(chain),
            "rid": f"{self.pod}:{seq}",
        }
        if sketch is not None:  # keys, no text: which conversation and agent, and the prompt's shape
            rec["turn"] = last_turn_key(sketch)
            rec["sys"] = system_key(sketch)
            rec["digest"] = RequestDigest.of(sketch).to_record()
        return rec

    # ------------------------------------------------------------------ bounded memory
    def _tenant(self, tenant: str) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(RunTree(self.tenant_max_hashes, math.inf, _never))
            while len(self._tenants) > self.max_tenants:
                self._drop_tenant(next(iter(self._tenants)))
        self._tenants.move_to_end(tenant)
        return state

    def _drop_tenant(self, tenant: str) -> None:
        state = self._tenants.pop(tenant)
        self._hash_count -= state.tree.size
        self._runs -= state.tree.runs
        self._keys -= len(state.turns) + len(state.systems) + len(state.prompts)
        for sk in state.sketches.values():
            self._text_bytes -= sketch_bytes(sk)
        self.evictions += 1

    def _best_sketch(self, state: _Tenant, seq: int | None) -> RequestSketch | None:
        if seq is not None and seq in state.sketches:
            return state.sketches[seq]
        return next(reversed(state.sketches.values()), None) if state.sketches else None

    def _remember(self, tenant: str, state: _Tenant, seq: int, hashes: Sequence[int],
                  sketch: RequestSketch | None) -> None:
        tree = state.tree
        size, runs = tree.size, tree.runs
        if tree.add(hashes, stamp=seq):  # past the tenant's cap: its least recent blocks went
            self.evictions += 1
        self._hash_count += tree.size - size
        self._runs += tree.runs - runs
        if sketch is not None:
            state.sketches[seq] = sketch
            self._text_bytes += sketch_bytes(sketch)
            while len(state.sketches) > self.texts_per_tenant:
                _, old = state.sketches.popitem(last=False)
                self._text_bytes -= sketch_bytes(old)
        while self._hash_count > self.max_hashes and len(self._tenants) > 1:
            victim = next(iter(self._tenants))
            if victim == tenant:
                break
            self._drop_tenant(victim)
        while self.max_hash_bytes is not None and self.hash_bytes > self.max_hash_bytes:
            victim = next(iter(self._tenants))
            if victim != tenant:
                self._drop_tenant(victim)
                continue
            excess = self.hash_bytes - self.max_hash_bytes
            size, runs = tree.size, tree.runs
            if not tree.evict(max(1, -(-excess // HASH_ENTRY_BYTES))):
                break
            self.evictions += 1
            self._hash_count += tree.size - size
            self._runs += tree.runs - runs
        while self._text_bytes > self.texts_bytes:
            if not self._drop_oldest_text(tenant):
                break

    def _drop_oldest_text(self, keep: str) -> bool:
        for name, state in self._tenants.items():
            if state.sketches and (name != keep or len(state.sketches) > 1):
                _, old = state.sketches.popitem(last=False)
                self._text_bytes -= sketch_bytes(old)
                return True
        return False


# ---------------------------------------------------------------------- reports

async def tenant_report(store: Any, tenant: str, window: int = 64, last_breaks: int = 5) -> dict[str, Any]:
    """Continuity over the last `window` requests, breaks by cause, the last few breaks.

    A new conversation (`new_session`) is not a break: `breaks` and `last_breaks` count only the
    causes someone can fix, `new_sessions` counts new conversations, and `unmatched_blocks` splits
    the blocks that did not continue earlier requests into those lost to a break and those of new
    conversations (so a hit ratio that is only the system prompt's share reads as what it is).
    A compaction (`compaction`) is not a break either: `compactions` counts them, and their
    unmatched blocks (the one cold turn) are `unmatched_blocks.compaction`.
    `breaks_by_cause` lists every diagnosed cause, `new_session` and `compaction` included.
    `bill` is each cause's cost so far (bill_by_cause); compactions and new sessions have none."""
    records = [_plain(r) for r in await store.history_recent(tenant, window) if type(r) is dict]
    counters = await store.counters(tenant)
    blocks = sum(_whole(r.get("blocks")) for r in records)
    matched = sum(_whole(r.get("matched")) for r in records)
    breaks = [r for r in records if type(r.get("cause")) is str and r["cause"] not in NOT_A_PROBLEM]
    by_cause = {k.split(":", 1)[1]: int(v) for k, v in counters.items() if k.startswith("breaks:")}
    not_breaks = sum(v for k, v in by_cause.items() if k in NOT_A_PROBLEM)
    keys = ("seq", "ts", "cause", "block_index", "token_offset", "char_offset", "blocks", "matched",
            "span_kinds", "spans", "snippet", "fix", "detail", "pod", "line", "message", "structure", "view", "secondary",
            "bill_tokens", "bill_s")
    return {
        "tenant": tenant,
        "requests": int(counters.get("requests", 0)),
        "window": len(records),
        "continuity": (matched / blocks) if blocks else None,
        "continuity_total": (counters.get("matched_blocks", 0.0) / counters["blocks"]) if counters.get("blocks") else None,
        "breaks": int(counters.get("breaks", 0)) - not_breaks,
        "new_sessions": by_cause.get("new_session", 0),
        "compactions": by_cause.get("compaction", 0),
        "breaks_by_cause": by_cause,
        "unmatched_blocks": {reason: int(counters.get(f"unmatched:{reason}", 0))
                             for reason in ("break", "new_session", "compaction")},
        "bill": bill_by_cause(counters),
        "last_breaks": [{k: r.get(k) for k in keys if k in r} for r in breaks[-last_breaks:]][::-1],
        "recent": [{k: r.get(k) for k in ("seq", "continuity", "cause", "ttft_s", "prompt_tokens")} for r in records],
    }


def _whole(value: Any) -> int:
    """A record's block count, 0 when it holds none (or something else: another pod's bent record)."""
    return int(value) if type(value) in (int, float) and math.isfinite(value) and value >= 0 else 0


def _plain(value: Any, depth: int = 8) -> Any:
    """`value` as strict JSON can hold it (the report is served as JSON): a NaN or an infinity, a
    key that is not a string, or nesting past `depth` is None."""
    if value is None or type(value) in (str, bool, int):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else None
    if depth <= 0:
        return None
    if type(value) is list:
        return [_plain(v, depth - 1) for v in value]
    if type(value) is dict:
        return {k: _plain(v, depth - 1) for k, v in value.items() if type(k) is str}
    return None


def bill_by_cause(counters: dict[str, float]) -> dict[str, dict[str, Any]]:
    """cause -> the cost so far of a tenant's billed breaks: `breaks` billed, `tokens` recomputed,
    `seconds` of prefill they took by the serving replicas' models, and `added_ttft_s`, the mean
    seconds one break added to its request's first token. Seconds cover only the `timed` breaks
    (a replica's model could price them): None, not 0, when none could."""
    out: dict[str, dict[str, Any]] = {}
    for key, count in counters.items():
        if not key.startswith("bill_breaks:"):
            continue
        cause = key.split(":", 1)[1]
        timed = int(counters.get(f"bill_timed:{cause}", 0))
        seconds = counters.get(f"bill_s:{cause}") if timed else None
        out[cause] = {"breaks": int(count), "tokens": int(counters.get(f"bill_tokens:{cause}", 0)),
                      "timed": timed, "seconds": seconds,
                      "added_ttft_s": (seconds / timed) if seconds is not None else None}
    return out
