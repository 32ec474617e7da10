"""Prompt fingerprints: the chained block hashes of a request's prompt, computed in two steps.

`Fingerprinter.prepare()` runs on the hot path. It renders the template (app/prefix/prompt.py),
splits at special tokens, and walks a memo of chain states keyed by (parent state, segment)
(app/prefix/chain.py): a prompt whose segments were seen before (same system prompt, same history)
gets its block hashes from the memo without tokenising or re-hashing anything. A prompt that
continues a recent long one (the next turn of a conversation, app/prefix/resplit.py) starts its
walk where the earlier prompt's walk passed the end of the part they share (a `WalkRecord`
attached to the split memo's entry), not at the root: its cost follows the turn's new segments,
not the conversation's length. Small unknown
segments (a new user turn, under `prefix.inline_chars`) are encoded inline and at most
`prefix.inline_hash_tokens` new tokens are hashed inline, for text and token-id prompts alike; past
that budget the `Fingerprint` covers only the leading part (`state` says what is left).
`Fingerprinter.complete()` runs after the request was forwarded: it tokenises and hashes the rest
in the worker pool (or asks the engine's /tokenize, app/prefix/engine_tokenize.py) and fills in
the whole chain.

Invariant: for a complete fingerprint, `block_hashes == proxy_chain(prompt_ids, B, salt)` where
`prompt_ids` are exactly the ids the engine computes (render as transformers does, encode with
add_special_tokens=False for chat), so residency and continuity are in the engine's own units
(docs/engine-hashing.md).
"""

from __future__ import annotations

import asyncio
import enum
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import aiohttp

from app.prefix.budget import DEFAULT_BUDGET_MB, MemoryCaps
from app.prefix.chain import ChainMemo, ChainNode, extend_node, extend_reusing
from app.prefix.engine_tokenize import EngineTokenize, ReplicaSource
from app.prefix.pool import ColdPool, min_chars_for, spare_cores
from app.prefix.prompt import PromptInput, engine_payload, prompt_input, render_prompt
from app.prefix.resplit import Kept
from app.prefix.tokens import HEAD_CHARS, INCREMENTAL_MIN_CHARS, ApproxTokenizer, Ids, Reuse, SegmentTokenizer

__all__ = ["CHARS_PER_TOKEN", "Fingerprint", "FingerprintMode", "FingerprintState", "Fingerprinter",
           "PendingWork", "PromptInput", "prompt_input"]

FingerprintMode = Literal["exact", "engine", "approx"]  # local tokenizer | /tokenize | char blocks
CHARS_PER_TOKEN = 3.5  # estimate used before exact tokens exist
DEFAULT_CHAIN_MEMO_BYTES = MemoryCaps.from_budget(DEFAULT_BUDGET_MB).chain_memo_bytes
# A walk record's bytes: its packed hashes, 8 B a block (array('Q')), plus the record and the
# array's header. The node is the chain memo's (counted there) while the memo holds it.
WALK_BLOCK_BYTES = 8
WALK_RECORD_BYTES = 200


class FingerprintState(enum.Enum):
    """How far a fingerprint got on the hot path, and so what finishing it takes."""

    COMPLETE = "complete"  # block_hashes is the whole prompt's chain; num_tokens is exact
    SEGMENTS = "segments"  # leading segments hashed; the rest are tokenised in the worker pool
    IDS = "ids"  # a token-id prompt: leading ids hashed inline, the rest hashed in the worker pool
    ENGINE = "engine"  # engine mode, prompt not seen before: the ids come from /tokenize


@dataclass
class PendingWork:
    """What an incomplete fingerprint still needs, from the chain state it stopped at."""

    node: ChainNode
    segments: list[str] = field(default_factory=list)  # SEGMENTS: still to tokenise, in order
    ids: Sequence[int] = ()  # IDS: the prompt's ids; ids[start:] are still to hash
    start: int = 0
    payload: dict[str, Any] | None = None  # ENGINE: the /tokenize request
    text: str = ""  # ENGINE: the rendered text (the memo key of the whole prompt)
    at: int = 0  # SEGMENTS: the prompt's index of segments[0]
    keep: Kept | None = None  # SEGMENTS: the split memo's entry for this prompt: the walk state at
    # the end of its segments is recorded there (`WalkRecord`) for the next turn to start from

    def mark(self) -> int:
        """How many of `segments` the walk takes before its state is recorded (0: never)."""
        return len(self.keep.segments) - self.at if self.keep is not None else 0

    def after(self, node: ChainNode, i: int) -> PendingWork:
        """The work left once the walk took `i` of `segments` and reached `node`."""
        return PendingWork(node, self.segments[i:], at=self.at + i, keep=self.keep)

    def key(self) -> tuple[int, str] | None:
        """Identifies this work by content: (chain state, next segment). Another request waits on
        it only when its own walk stops at the same state before the same segment, i.e. when its
        prompt continues this one (the same conversation); never for a tenant alone."""
        if self.segments:
            return (self.node.key, self.segments[0])
        if self.payload is not None:
            return (self.node.key, self.text)
        return None  # token ids: nothing memoised that another request could reuse


@dataclass
class Fingerprint:
    block_size: int
    # proxy_chain hashes of the leading full blocks known so far, packed (array('Q')): a 1 MB
    # prompt's ~14,000 blocks are copied at C speed, never made into Python ints per request
    block_hashes: array
    num_tokens: int | None = None  # exact prompt tokens when complete, else None
    state: FingerprintState = FingerprintState.COMPLETE
    mode: FingerprintMode = "exact"
    salt: str | None = None
    estimated_tokens: int = 0  # cheap estimate (chars / 3.5) for bucket/load before tokens exist
    # The rendered prompt, kept in memory for diagnosis only: never logged, never a label.
    text: str | None = field(default=None, repr=False, compare=False)
    # Complete: the chain state after the whole prompt (generated ids continue from it).
    node: ChainNode | None = field(default=None, repr=False, compare=False)
    pending: PendingWork | None = field(default=None, repr=False, compare=False)
    cold_reserved: bool = field(default=False, repr=False, compare=False)  # holds a cold-pool slot
    # What a full cold-prompt pool refused to tokenise before routing (`admit`): tried once more
    # after the response (`readmit`), so the chain the engine cached is still learned.
    deferred: PendingWork | None = field(default=None, repr=False, compare=False)

    @property
    def complete(self) -> bool:
        return self.state is FingerprintState.COMPLETE


@dataclass
class ChainTip:
    """A finished walk: the last chain state and every block hash from the root to it."""

    node: ChainNode
    hashes: array  # array('Q')


@dataclass(frozen=True)
class WalkRecord:
    """A walk's state at the end of a kept prompt's segments: what a walk over the same segments
    from the root reaches (chain states are content: the same tokens give the same node's hashes,
    tail and digest). `hashes` is never mutated: a walk starting here copies it."""

    node: ChainNode
    hashes: array  # array('Q')


class Fingerprinter:
    """Hot-path `prepare` and off-path `complete` over one tokenizer (see module docstring)."""

    def __init__(self, tokenizer: SegmentTokenizer, mode: FingerprintMode = "exact",
                 chain_memo_bytes: int = DEFAULT_CHAIN_MEMO_BYTES, inline_chars: int = 2048,
                 inline_hash_tokens: int = 16_384, engine: EngineTokenize | None = None) -> None:
        self.tokenizer = tokenizer
        self.mode = mode
        self._release_lock = threading.Lock()
        self.engine = engine if mode == "engine" else None
        self.inline_chars = inline_chars
        self.inline_hash_tokens = inline_hash_tokens
        self.chains = ChainMemo(chain_memo_bytes)

    @classmethod
    def from_settings(cls, settings: Any, replicas: ReplicaSource | None = None,
                      session: Callable[[], aiohttp.ClientSession | None] | None = None,
                      token_memo_bytes: int | None = None, chain_memo_bytes: int | None = None) -> Fingerprinter:
        """exact with settings.tokenizer (None = built-in default); approx when it cannot load;
        engine (ids from the replicas' /tokenize over `session`, the proxy's upstream session; the
        local template renders text for diagnosis). The memos' byte caps default to their shares
        of `memory.budget_mb` (app/prefix/budget.py)."""
        opts = settings.prefix
        caps = MemoryCaps.from_budget(settings.memory.budget_mb)
        memo = token_memo_bytes if token_memo_bytes is not None else caps.token_memo_bytes
        chains = chain_memo_bytes if chain_memo_bytes is not None else caps.chain_memo_bytes
        mode = opts.mode
        tokenizer: SegmentTokenizer
        if mode == "engine":
            if replicas is None or session is None:
                raise ValueError("engine mode needs the replica set and the upstream session")
            try:
                tokenizer = SegmentTokenizer.load(settings.tokenizer, memo, opts.workers, caps.split_memo_bytes)
            except Exception:  # noqa: BLE001 - text for diagnosis only: the default template will do
                tokenizer = SegmentTokenizer.load(None, memo, opts.workers, caps.split_memo_bytes)
            return cls(tokenizer, "engine", chains, opts.inline_chars, opts.inline_hash_tokens,
                       EngineTokenize(replicas, session, settings.limits.connect_timeout_s + 5.0))
        if mode in ("auto", "exact"):
            try:
                tokenizer = SegmentTokenizer.load(settings.tokenizer, memo, opts.workers, caps.split_memo_bytes)
                mode = "exact"
            except Exception:  # noqa: BLE001 - any load failure (missing dir, bad json) means approx
                if opts.mode == "exact":
                    raise
                tokenizer = ApproxTokenizer.load(None, memo, opts.workers, caps.split_memo_bytes)
                mode = "approx"
        else:
            tokenizer = ApproxTokenizer.load(None, memo, opts.workers, caps.split_memo_bytes)
        if mode == "exact" and tokenizer.tokenizer_json is not None:
            size = opts.cold_pool_workers
            workers = spare_cores() if size == "auto" else int(size)
            if workers > 0:
                fast = list(tokenizer.splitter.specials) if tokenizer.fast is not None else None
                tokenizer.cold = ColdPool(tokenizer.tokenizer_json, workers, opts.cold_pool_inflight,
                                          min_chars_for(opts.cold_pool_min_chars, fast is not None),
                                          fast_split_at=fast, defer_s=opts.cold_pool_defer_s)
        return cls(tokenizer, mode, chains, opts.inline_chars, opts.inline_hash_tokens)

    def close(self) -> None:
        self.tokenizer.close()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held by each memo, as the memos count them (docs/memory.md)."""
        return {"token_memo": self.tokenizer.memo.bytes, "split_memo": self.tokenizer.resplit.bytes,
                "chain_memo": self.chains.bytes}

    def render(self, inp: PromptInput) -> str:
        return render_prompt(self.tokenizer.template, inp)

    # ------------------------------------------------------------------ hot path
    def prepare(self, inp: PromptInput, block_size: int, salt: str | None = None) -> Fingerprint:
        """Render + split + memo walk; never tokenises more than `inline_chars` of new text nor
        hashes more than `inline_hash_tokens` new tokens."""
        if inp.kind == "ids":
            return self._prepare_ids(inp.ids or [], block_size, salt)
        text = self.render(inp)
        estimate = int(len(text) / CHARS_PER_TOKEN)
        if self.engine is not None:
            return self._prepare_engine(inp, text, block_size, salt, estimate)
        segments, continued, keep = self.tokenizer.split_walk(text)
        work = PendingWork(self.chains.root(salt, block_size), segments, keep=keep)
        hashes = array("Q")
        record = self.tokenizer.resplit.attached(continued, (salt, block_size)) if continued is not None else None
        if isinstance(record, WalkRecord) and continued is not None:  # the shared part, walked by an earlier turn
            n = len(continued.segments)
            work = PendingWork(record.node, segments[n:], at=n, keep=keep)
            hashes = record.hashes[:]
        fp = Fingerprint(block_size, hashes, None, FingerprintState.SEGMENTS, self.mode, salt, estimate, text=text,
                         pending=work)
        self.advance(fp)
        return fp

    def _record(self, work: PendingWork, node: ChainNode, hashes: array) -> None:
        """The walk took the kept entry's segments: attach its state there for the next turn."""
        if work.keep is not None:
            self.tokenizer.resplit.attach(work.keep, (node.salt, node.block_size), WalkRecord(node, hashes[:]),
                                          WALK_BLOCK_BYTES * len(hashes) + WALK_RECORD_BYTES)

    def advance(self, fp: Fingerprint) -> None:
        """Continue an incomplete SEGMENTS fingerprint from where it stopped: through the memo
        (which a finished tokenisation of the same conversation may have filled meanwhile), then
        inline within the budgets. Hot path; only before the fingerprint is routed."""
        work = fp.pending
        if fp.state is not FingerprintState.SEGMENTS or work is None:
            return
        node, segments, hashes = work.node, work.segments, fp.block_hashes
        mark = work.mark()
        i = 0
        while i < len(segments):
            child = self.chains.get(node, segments[i])
            if child is None:
                break
            hashes.extend(child.hashes)
            node = child
            i += 1
            if i == mark:
                self._record(work, node, hashes)
        if i < len(segments):
            node, i = self._extend_inline(node, work, i, hashes)
        if i == len(segments):
            self._finish(fp, ChainTip(node, hashes))
        else:
            fp.pending = work.after(node, i)

    def _prepare_ids(self, ids: Sequence[int], block_size: int, salt: str | None) -> Fingerprint:
        """Token-id prompts: the first `inline_hash_tokens` ids hashed now, the rest off the loop."""
        root = self.chains.root(salt, block_size)
        budget = self.inline_hash_tokens - self.inline_hash_tokens % block_size  # whole blocks
        node = extend_node(root, ids[:budget] if len(ids) > budget else ids)
        fp = Fingerprint(block_size, node.hashes[:], None, FingerprintState.IDS, self.mode, salt, len(ids))
        if len(ids) <= budget:
            self._finish(fp, ChainTip(node, fp.block_hashes))
        else:
            fp.pending = PendingWork(node, ids=ids, start=budget)
        return fp

    def _prepare_engine(self, inp: PromptInput, text: str, block_size: int, salt: str | None,
                        estimate: int) -> Fingerprint:
        """Engine mode: a seen request is complete from the memo (keyed by its rendered text);
        anything else waits for /tokenize in `complete`."""
        root = self.chains.root(salt, block_size)
        fp = Fingerprint(block_size, array("Q"), None, FingerprintState.ENGINE, "engine", salt, estimate, text=text)
        node = self.chains.get(root, text)
        if node is not None:
            self._finish(fp, ChainTip(node, node.hashes[:]))
        else:
            fp.pending = PendingWork(root, payload=engine_payload(inp), text=text)
        return fp

    def _extend_inline(self, node: ChainNode, work: PendingWork, i: int,
                       hashes: array) -> tuple[ChainNode, int]:
        """Extend with memoised ids (if cheap to hash) or segments encoded now: small ones whole,
        long ones past the prefix they share with a memoised segment (only the tail's chars count
        against `inline_chars`, only blocks not already in that segment's chain against
        `inline_hash_tokens`)."""
        budget = self.inline_chars
        hash_budget = self.inline_hash_tokens
        segments, mark = work.segments, work.mark()
        while i < len(segments):
            seg = segments[i]
            ids = self.tokenizer.lookup(seg)
            reuse: Reuse | None = None
            if ids is None:
                if len(seg) > budget:
                    reuse = self.tokenizer.reuse(seg)
                cost = len(seg) - (reuse.chars if reuse is not None else 0)
                if cost > budget:
                    break
                budget -= cost
                ids = self.tokenizer.encode_segment(seg, reuse)
            elif len(ids) > hash_budget:
                reuse = self.tokenizer.reuse(seg)
            grown = self._extend_segment(node, seg, ids, reuse, hash_budget)
            if grown is None:
                break
            child, hashed = grown
            hash_budget -= hashed
            self.chains.put(node, seg, child)
            self._supersede(node, reuse)
            hashes.extend(child.hashes)
            node = child
            i += 1
            if i == mark:
                self._record(work, node, hashes)
        return node, i

    def _supersede(self, parent: ChainNode, reuse: Reuse | None) -> None:
        """Once both memos hold a segment encoded from `reuse`, drop the segment it superseded
        (SegmentTokenizer.supersedes): one entry per document in each memo, not one per request."""
        if reuse is not None and self.tokenizer.supersedes(reuse):
            self.tokenizer.memo.discard(reuse.prev)
            self.chains.discard(parent, reuse.prev)

    def _extend_segment(self, node: ChainNode, seg: str, ids: Ids, reuse: Reuse | None,
                        hash_budget: int | None = None, polite: bool = False) -> tuple[ChainNode, int] | None:
        """The chain after `seg` (ids `ids`) and how many tokens were hashed for it, reusing the
        blocks of `reuse.prev`'s chain under the same parent when it is memoised; None when more
        than `hash_budget` tokens would need hashing."""
        known = self.chains.get(node, reuse.prev) if reuse is not None else None
        shared = reuse.toks if reuse is not None and known is not None else 0
        if hash_budget is not None and len(ids) - shared > hash_budget:
            return None
        if known is not None:
            return extend_reusing(node, known, ids, shared, polite), len(ids) - shared
        return extend_node(node, ids, polite), len(ids)

    # ------------------------------------------------------------------ the cold-prompt budget
    def admit(self, fp: Fingerprint) -> bool:
        """Before routing an incomplete `fp`: when what is left needs tokenising (at least the
        pool's `min_chars` new characters) and there is a cold-prompt pool, take one of its slots; when it is full, give up the rest of the chain
        (`mode` "approx": routed on the exact leading blocks, never tokenised) and return False.
        Never waits (app/prefix/pool.py)."""
        pool = self.tokenizer.cold
        work = fp.pending
        if pool is None or fp.complete or work is None or fp.state is not FingerprintState.SEGMENTS:
            return True
        if self.tokenizer.new_chars(work.segments) < pool.min_chars:
            return True  # little or nothing to tokenise: a worker thread
        if pool.try_reserve():
            fp.cold_reserved = True
            return True
        fp.mode = "approx"
        fp.deferred, fp.pending = work, None
        return False

    async def readmit(self, fp: Fingerprint) -> bool:
        """After the response, the work `admit` refused: a cold-pool slot for it (the burst that
        filled the pool has usually passed by then; else it waits, `ColdPool.reserve_deferred`),
        making it pending again. The request stays `mode` "approx" (it was routed so); only its
        chain is learned. False, and the work dropped, when no slot came."""
        work, fp.deferred = fp.deferred, None
        pool = self.tokenizer.cold
        if work is None or pool is None or fp.complete or not await pool.reserve_deferred():
            return False
        fp.pending, fp.cold_reserved = work, True
        return True

    def cold_head(self, fp: Fingerprint) -> str | None:
        """The head (first HEAD_CHARS) of the first long segment `fp` still has to tokenise: a
        request with the same head while that is in flight would reuse it once it is done."""
        work = fp.pending
        if fp.complete or work is None or not self.tokenizer.incremental:
            return None
        for seg in work.segments:
            if not self.tokenizer.known(seg):
                return seg[:HEAD_CHARS] if len(seg) >= INCREMENTAL_MIN_CHARS else None
        return None

    def release(self, fp: Fingerprint) -> None:
        """Give back `fp`'s cold-pool slot (its tokenisation ended, however). Called by the worker
        thread once the pool has encoded (the slot bounds the pool's work, not the hashing after
        it) and again when the request's chain task ends: the first call gives it back."""
        with self._release_lock:
            reserved, fp.cold_reserved = fp.cold_reserved, False
        if reserved and self.tokenizer.cold is not None:
            self.tokenizer.cold.release()

    @staticmethod
    def _finish(fp: Fingerprint, tip: ChainTip) -> None:
        fp.block_hashes = tip.hashes
        fp.num_tokens = tip.node.num_tokens
        fp.estimated_tokens = tip.node.num_tokens
        fp.state = FingerprintState.COMPLETE
        fp.node = tip.node
        fp.pending = None

    # ------------------------------------------------------------------ off the hot path
    def rest_sync(self, fp: Fingerprint) -> ChainTip | None:
        """Tokenise/hash what is pending and extend the chain (worker thread). Fills the memos but
        leaves `fp` alone (the router may still be reading it); None when nothing is pending
        here (complete, or engine mode: see `rest`)."""
        work = fp.pending
        if fp.complete or work is None or fp.state is FingerprintState.ENGINE:
            return None
        hashes = fp.block_hashes[:]
        if fp.state is FingerprintState.IDS:
            node = extend_node(work.node, work.ids[work.start:], polite=True)
            hashes.extend(node.hashes)
            return ChainTip(node, hashes)
        node = work.node
        encoded = self.tokenizer.encode_segments(work.segments)
        self.release(fp)  # the pool's part is done
        mark = work.mark()
        for i, (seg, ids) in enumerate(zip(work.segments, encoded, strict=True), 1):
            child = self.chains.get(node, seg)
            if child is None:
                reuse = self.tokenizer.reuse(seg)
                grown = self._extend_segment(node, seg, ids, reuse, polite=True)
                assert grown is not None  # no budget off the loop
                child = grown[0]
                self.chains.put(node, seg, child)
                self._supersede(node, reuse)
            hashes.extend(child.hashes)
            node = child
            if i == mark:
                self._record(work, node, hashes)
        return ChainTip(node, hashes)

    def complete_sync(self, fp: Fingerprint) -> Fingerprint:
        """Finish `fp` in this thread (offline use: lint, benchmarks)."""
        tip = self.rest_sync(fp)
        if tip is not None:
            self._finish(fp, tip)
        return fp

    async def rest(self, fp: Fingerprint) -> ChainTip | None:
        """The finished chain of an incomplete `fp` (worker pool or /tokenize); memos filled."""
        work = fp.pending
        loop = asyncio.get_running_loop()
        if self.engine is not None and fp.state is FingerprintState.ENGINE and work is not None:
            ids = await self.engine.tokenize(work.payload or {})
            # hashing a long prompt is ~1 ms per 1k blocks of Python: never on the event loop
            node = await loop.run_in_executor(self.tokenizer.pool, partial(extend_node, work.node, ids, True))
            self.chains.put(work.node, work.text, node)
            return ChainTip(node, node.hashes[:])
        return await loop.run_in_executor(self.tokenizer.pool, self.rest_sync, fp)

    async def complete(self, fp: Fingerprint,
                       started: asyncio.Task[ChainTip | None] | None = None) -> Fingerprint:
        """Finish `fp` (awaiting `started`, an earlier `rest(fp)`, when given); the event loop
        never tokenises."""
        if fp.complete:
            return fp
        tip = None
        if started is not None:
            try:
                tip = await started
            except Exception:  # noqa: BLE001 - retried below
                tip = None
        if tip is None and not fp.complete:
            tip = await self.rest(fp)
        if tip is not None and not fp.complete:
            self._finish(fp, tip)
        return fp

    # ------------------------------------------------------------------ generated output
    async def encode_output(self, text: str) -> list[int] | array:
        """Ids of generated text as the engine would re-tokenise it (worker thread or /tokenize)."""
        if not text:
            return []
        if self.engine is not None:
            return await self.engine.tokenize({"prompt": text, "add_special_tokens": False})
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.tokenizer.pool, self.encode_text, text)

    def prompt_ids(self, fp: Fingerprint) -> array:
        """The prompt's token ids (complete fingerprints; re-reads the memo, encodes misses)."""
        if fp.text is None:
            return array("I")
        out = array("I")
        for ids in self.tokenizer.encode_segments(self.tokenizer.split(fp.text)):
            out.extend(ids)
        return out

    def extend_with_output(self, fp: Fingerprint, output_ids: Sequence[int]) -> array:
        """Block hashes of prompt + generated ids (full blocks), continuing the prompt's chain."""
        if fp.node is None:
            return fp.block_hashes[:]
        return fp.block_hashes + extend_node(fp.node, output_ids).hashes

    def encode_text(self, text: str) -> array:
        """Ids of free text (generated output), as the engine re-tokenises it in the next turn."""
        return self.tokenizer.encode_text(text)

    def encode_small(self, text: str) -> array:
        """`encode_text` for a short text on the event loop: the same ids, from one plain encode
        per segment in this thread. (`encode_text` batches, and the tokenizers thread pool that
        serves a batch may be busy with a worker's 1 MB prompt: a 100-char reply then waited
        15-40 ms for it, on the loop.)"""
        out = array("I")
        for segment in self.tokenizer.split(text):
            ids = self.tokenizer.lookup(segment)
            out.extend(ids if ids is not None else self.tokenizer.encode_plain(segment))
        return out
