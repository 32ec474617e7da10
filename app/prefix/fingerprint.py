"""Prompt fingerprints: the chained block hashes of a request's prompt, computed in two steps.

`Fingerprinter.prepare()` runs on the hot path. It renders the template, splits at special tokens,
and walks a memo of chain states keyed by (parent state, segment): a prompt whose segments were
seen before (same system prompt, same history) gets its block hashes from the memo without
tokenising or re-hashing anything. Small unknown segments (a new user turn, under
`prefix.inline_chars`) are encoded inline; a big miss stops the walk, and the `Fingerprint` covers
only the leading known segments (`complete` False). `Fingerprinter.complete()` runs after the
request was forwarded, tokenises the rest in a worker thread and fills in the whole chain.

Invariant: for a complete fingerprint, `block_hashes == proxy_chain(prompt_ids, B, salt)` where
`prompt_ids` are exactly the ids the engine computes (render as transformers does, encode with
add_special_tokens=False for chat), so residency and continuity are in the engine's own units.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from app.prefix.blocks import proxy_chain, proxy_digest
from app.prefix.tokens import SegmentTokenizer

FingerprintMode = str  # "exact" (local tokenizer) | "engine" (/tokenize) | "approx" (char blocks)
CHARS_PER_TOKEN = 3.5  # estimate used before exact tokens exist
APPROX_CHARS = 4  # approx mode: one pseudo-token per 4 characters
POLITE_BLOCKS = 512  # blocks hashed between two GIL releases in a worker thread (~0.6 ms)
POLITE_PAUSE_S = 0.0001


@dataclass
class Fingerprint:
    block_size: int
    block_hashes: list[int]  # proxy_chain hashes of leading full blocks known so far
    num_tokens: int | None  # exact prompt tokens when complete, else None
    complete: bool
    mode: FingerprintMode = "exact"
    salt: str | None = None
    estimated_tokens: int = 0  # cheap estimate (chars / 3.5) for bucket/load before tokens exist
    # Opaque material the tracker/diagnosis needs later (segments, rendered text offsets...)
    extra: dict = field(default_factory=dict)
    # The rendered prompt, kept in memory for diagnosis only: never logged, never a label.
    text: str | None = field(default=None, repr=False, compare=False)
    # Internal progress of the chain (ChainNode + pending segments); None once complete.
    state: Any = field(default=None, repr=False, compare=False)

    @property
    def total_blocks(self) -> int:
        return len(self.block_hashes) if self.complete else 0


@dataclass(eq=False)
class ChainNode:
    """The chain after some leading segments: block hashes added by the last segment, the tokens
    after the last full block (`tail`, < B), and the digest to continue from."""

    key: int
    parent: ChainNode | None
    hashes: tuple[int, ...]  # a tuple: untracked by the garbage collector once it has seen it
    tail: array
    digest: bytes | None  # None: still at the root (salted) digest
    salt: str | None
    block_size: int
    num_tokens: int
    num_blocks: int

    def chain(self) -> list[int]:
        """Every block hash from the root to here."""
        nodes: list[ChainNode] = []
        node: ChainNode | None = self
        while node is not None:
            if node.hashes:
                nodes.append(node)
            node = node.parent
        out: list[int] = []
        for n in reversed(nodes):
            out.extend(n.hashes)
        return out


_keys = itertools.count(1)


def root_node(salt: str | None, block_size: int) -> ChainNode:
    return ChainNode(0, None, (), array("I"), None, salt, block_size, 0, 0)


def extend_node(node: ChainNode, ids: Sequence[int], polite: bool = False) -> ChainNode:
    """The chain after appending `ids` to `node` (pure; hashes only the new full blocks).

    `polite` (worker threads): hash in slices of POLITE_BLOCKS with a short sleep between them.
    The hash loop is Python code, so a worker thread running it keeps the GIL for a whole switch
    interval (5 ms) whenever the event loop asks for it. A sleep(0) is not enough: on a machine
    with idle cores the worker takes the GIL back before the woken loop thread runs (measured:
    loop stalls of 15-60 ms blamed on this loop with two workers hashing). A pause of
    POLITE_PAUSE_S lets a waiting thread in; it costs ~15% of the hashing time, off the loop."""
    tokens = node.tail + array("I", ids) if node.tail else array("I", ids)
    b = node.block_size
    if not polite or len(tokens) <= POLITE_BLOCKS * b:
        hashes = tuple(proxy_chain(tokens, b, salt=node.salt, parent=node.digest))
    else:
        out: list[int] = []
        digest = node.digest
        for start in range(0, len(tokens) // b, POLITE_BLOCKS):
            part = proxy_chain(tokens[start * b:(start + POLITE_BLOCKS) * b], b, salt=node.salt, parent=digest)
            out.extend(part)
            digest = proxy_digest(part[-1])
            time.sleep(POLITE_PAUSE_S)  # releases the GIL long enough for a waiting event loop
        hashes = tuple(out)
    used = len(hashes) * node.block_size
    digest = proxy_digest(hashes[-1]) if hashes else node.digest
    return ChainNode(next(_keys), node, hashes, tokens[used:], digest, node.salt, node.block_size,
                     node.num_tokens + len(ids), node.num_blocks + len(hashes))


class ChainMemo:
    """LRU (parent node key, segment) -> ChainNode, bounded in bytes; roots per (salt, B)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[tuple[int, str], ChainNode] = OrderedDict()
        self._roots: OrderedDict[tuple[str | None, int], ChainNode] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _cost(segment: str, node: ChainNode) -> int:
        return len(segment) + 40 * len(node.hashes) + 4 * len(node.tail) + 160  # int objects + list slots

    def root(self, salt: str | None, block_size: int) -> ChainNode:
        key = (salt, block_size)
        with self._lock:
            node = self._roots.get(key)
            if node is None:
                node = self._roots[key] = root_node(salt, block_size)
                node.key = next(_keys)
                while len(self._roots) > 4096:
                    self._roots.popitem(last=False)
            else:
                self._roots.move_to_end(key)
            return node

    def get(self, parent: ChainNode, segment: str) -> ChainNode | None:
        key = (parent.key, segment)
        with self._lock:
            node = self._data.get(key)
            if node is not None:
                self._data.move_to_end(key)
            return node

    def put(self, parent: ChainNode, segment: str, node: ChainNode) -> None:
        cost = self._cost(segment, node)
        if cost > self.max_bytes:
            return
        with self._lock:
            key = (parent.key, segment)
            if key in self._data:
                return
            self._data[key] = node
            self.bytes += cost
            while self.bytes > self.max_bytes and self._data:
                (_, seg), old = self._data.popitem(last=False)
                self.bytes -= self._cost(seg, old)


@dataclass
class PromptInput:
    """What a request asks the engine to tokenise: chat messages (+tools) or a completion prompt."""

    kind: str  # "chat" | "completions" | "ids"
    messages: list[Mapping[str, Any]] = field(default_factory=list)
    tools: list[Any] | None = None
    prompt: str = ""
    ids: list[int] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    body: Mapping[str, Any] | None = None  # the request body (engine mode sends it to /tokenize)


def prompt_input(route: str, body: Mapping[str, Any]) -> PromptInput | None:
    """Extract the prompt from an OpenAI request body (None when there is nothing to fingerprint)."""
    if route == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        kwargs: dict[str, Any] = {}
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, Mapping):
            kwargs.update(extra)
        for key in ("documents", "continue_final_message", "reasoning_effort"):
            if body.get(key) is not None:
                kwargs[key] = body[key]
        kwargs["add_generation_prompt"] = bool(body.get("add_generation_prompt", True))
        tools = body.get("tools")
        return PromptInput("chat", messages=messages, tools=tools if tools else None, template_kwargs=kwargs,
                           model=body.get("model"), body=body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return PromptInput("completions", prompt=prompt, model=body.get("model"), body=body)
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
        return PromptInput("ids", ids=list(prompt))
    return None


class ApproxTokenizer(SegmentTokenizer):
    """Character-block pseudo-tokens (one per 4 chars, crc32): the last-resort mode when no
    tokenizer matches the engine. Consistent with itself only; predictions are approximate."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.segmented = True  # consistent with itself by construction

    def encode(self, text: str) -> array:
        return array("I", (zlib.crc32(text[i:i + APPROX_CHARS].encode()) for i in
                           range(0, len(text), APPROX_CHARS)))

    def encode_many(self, texts: list[str]) -> list[array]:
        return [self.encode(t) for t in texts]


class EngineTokenize:
    """`POST /tokenize` on a healthy replica (vLLM and SGLang both serve it): the engine's own ids
    for a whole request, when no local tokenizer matches the engine."""

    def __init__(self, replicas: Any, timeout_s: float = 10.0) -> None:
        self.replicas = replicas
        self.timeout_s = timeout_s
        self._client: Any = None

    def _url(self) -> str:
        healthy = [r for r in self.replicas.all() if r.healthy] or self.replicas.all()
        if not healthy:
            raise RuntimeError("no replica to ask for /tokenize")
        return healthy[0].url.rstrip("/") + "/tokenize"

    async def tokenize(self, payload: Mapping[str, Any]) -> list[int]:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        resp = await self._client.post(self._url(), json=dict(payload))
        resp.raise_for_status()
        tokens = resp.json().get("tokens")
        if not isinstance(tokens, list):
            raise ValueError("/tokenize returned no tokens")
        return [int(t) for t in tokens]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


_ENGINE_KEYS = ("messages", "tools", "add_generation_prompt", "chat_template_kwargs", "documents",
                "continue_final_message", "prompt", "add_special_tokens", "model")


def engine_payload(inp: PromptInput) -> dict[str, Any]:
    """The /tokenize request for a chat or completion body (only the keys that shape the ids)."""
    body = inp.body or {}
    return {k: body[k] for k in _ENGINE_KEYS if body.get(k) is not None}


class Fingerprinter:
    """Hot-path `prepare` and off-path `complete` over one tokenizer (see module docstring)."""

    def __init__(self, tokenizer: SegmentTokenizer, mode: FingerprintMode = "exact",
                 memo_bytes: int = 128 * 1024 * 1024, inline_chars: int = 2048,
                 inline_hash_tokens: int = 16_384, engine: EngineTokenize | None = None) -> None:
        self.tokenizer = tokenizer
        self.mode = mode
        self.engine = engine if mode == "engine" else None
        self.inline_chars = inline_chars
        self.inline_hash_tokens = inline_hash_tokens
        self.chains = ChainMemo(memo_bytes)

    @classmethod
    def from_settings(cls, settings: Any, replicas: Any = None) -> Fingerprinter:
        """exact with settings.tokenizer (None = built-in default); approx when it cannot load;
        engine (ids from the replicas' /tokenize; the local template renders text for diagnosis)."""
        opts = settings.prefix
        memo = opts.memo_mb * 1024 * 1024
        mode = opts.mode
        tokenizer: SegmentTokenizer
        if mode == "engine":
            if replicas is None:
                raise ValueError("engine mode needs the replica set")
            try:
                tokenizer = SegmentTokenizer.load(settings.tokenizer, memo, opts.workers)
            except Exception:  # noqa: BLE001 - text for diagnosis only: the default template will do
                tokenizer = SegmentTokenizer.load(None, memo, opts.workers)
            return cls(tokenizer, "engine", memo, opts.inline_chars, opts.inline_hash_tokens,
                       EngineTokenize(replicas, settings.limits.connect_timeout_s + 5.0))
        if mode in ("auto", "exact"):
            try:
                tokenizer = SegmentTokenizer.load(settings.tokenizer, memo, opts.workers)
                mode = "exact" if mode == "auto" else mode
            except Exception:  # noqa: BLE001 - any load failure (missing dir, bad json) means approx
                if mode == "exact":
                    raise
                tokenizer = ApproxTokenizer.load(None, memo, opts.workers)
                mode = "approx"
        else:
            tokenizer = ApproxTokenizer.load(None, memo, opts.workers)
        return cls(tokenizer, mode, memo, opts.inline_chars, opts.inline_hash_tokens)

    def close(self) -> None:
        self.tokenizer.close()
        if self.engine is not None and self.engine._client is not None:
            client, self.engine._client = self.engine._client, None
            try:
                asyncio.get_running_loop().create_task(client.aclose())
            except RuntimeError:
                pass

    # ------------------------------------------------------------------ rendering
    def render(self, inp: PromptInput) -> str:
        if inp.kind == "chat":
            template = self.tokenizer.template
            if template is None:
                raise ValueError("tokenizer has no chat template")
            kwargs = dict(inp.template_kwargs)
            agp = kwargs.pop("add_generation_prompt", True)
            return template.render(inp.messages, tools=inp.tools, add_generation_prompt=agp, **kwargs)
        return inp.prompt

    # ------------------------------------------------------------------ hot path
    def prepare(self, inp: PromptInput, block_size: int, salt: str | None = None) -> Fingerprint:
        """Render + split + memo walk; never tokenises more than `inline_chars` of new text."""
        if inp.kind == "ids":
            ids = inp.ids or []
            node = extend_node(self.chains.root(salt, block_size), ids)
            return Fingerprint(block_size, node.chain(), len(ids), True, self.mode, salt, len(ids),
                               extra={"segments": 0})
        text = self.render(inp)
        if self.engine is not None:
            return self._prepare_engine(inp, text, block_size, salt)
        segments = self.tokenizer.split(text)
        node = self.chains.root(salt, block_size)
        i = 0
        while i < len(segments):
            child = self.chains.get(node, segments[i])
            if child is None:
                break
            node = child
            i += 1
        if i < len(segments):
            node, i = self._extend_inline(node, segments, i)
        fp = Fingerprint(block_size, node.chain(), None, False, self.mode, salt,
                         int(len(text) / CHARS_PER_TOKEN), extra={"segments": len(segments),
                                                                   "known_segments": i,
                                                                   "chars": len(text)},
                         text=text)
        if i == len(segments):
            self._finish(fp, node)
        else:
            fp.state = (node, segments[i:])
        return fp

    def _prepare_engine(self, inp: PromptInput, text: str, block_size: int, salt: str | None) -> Fingerprint:
        """Engine mode: a seen request is complete from the memo (keyed by its rendered text);
        anything else waits for /tokenize in `complete`."""
        root = self.chains.root(salt, block_size)
        fp = Fingerprint(block_size, [], None, False, "engine", salt, int(len(text) / CHARS_PER_TOKEN),
                         extra={"segments": 1, "chars": len(text)}, text=text)
        node = self.chains.get(root, text)
        if node is not None:
            self._finish(fp, node)
        else:
            fp.state = ("engine", root, text, engine_payload(inp))
        return fp

    def _extend_inline(self, node: ChainNode, segments: list[str], i: int) -> tuple[ChainNode, int]:
        """Extend with memoised ids (if cheap to hash) or small segments encoded now."""
        budget = self.inline_chars
        hash_budget = self.inline_hash_tokens
        while i < len(segments):
            seg = segments[i]
            ids = self.tokenizer.lookup(seg)
            if ids is None:
                if len(seg) > budget:
                    break
                budget -= len(seg)
                ids = self.tokenizer.encode_segment(seg)
            if len(ids) > hash_budget:
                break
            hash_budget -= len(ids)
            child = extend_node(node, ids)
            self.chains.put(node, seg, child)
            node = child
            i += 1
        return node, i

    def _finish(self, fp: Fingerprint, node: ChainNode) -> None:
        fp.block_hashes = node.chain()
        fp.num_tokens = node.num_tokens
        fp.estimated_tokens = node.num_tokens
        fp.complete = True
        fp.state = None
        fp.extra["node"] = node

    # ------------------------------------------------------------------ off the hot path
    def rest_sync(self, fp: Fingerprint) -> ChainNode | None:
        """Tokenise the pending segments and extend the chain (worker thread). Fills the memos
        but leaves `fp` alone (the router may still be reading it); None when nothing is pending."""
        if fp.complete or fp.state is None or fp.state[:1] == ("engine",):
            return None
        node, pending = fp.state
        ids_list = self.tokenizer.encode_segments(pending)
        for seg, ids in zip(pending, ids_list, strict=True):
            child = self.chains.get(node, seg)
            if child is None:
                child = extend_node(node, ids, polite=True)
                self.chains.put(node, seg, child)
            node = child
        return node

    def complete_sync(self, fp: Fingerprint) -> Fingerprint:
        """Finish `fp` in this thread (offline use: lint, benchmarks)."""
        node = self.rest_sync(fp)
        if node is not None:
            self._finish(fp, node)
        return fp

    async def rest(self, fp: Fingerprint) -> ChainNode | None:
        """The final chain node of an incomplete `fp` (worker pool or /tokenize); memos filled."""
        if self.engine is not None and isinstance(fp.state, tuple) and fp.state[:1] == ("engine",):
            _, root, text, payload = fp.state
            ids = await self.engine.tokenize(payload)
            # hashing a long prompt is ~1 ms per 1k blocks of Python: never on the event loop
            node = await asyncio.get_running_loop().run_in_executor(
                self.tokenizer.pool, partial(extend_node, root, ids, True))
            self.chains.put(root, text, node)
            return node
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.tokenizer.pool, self.rest_sync, fp)

    def start(self, fp: Fingerprint) -> asyncio.Task[ChainNode | None] | None:
        """Begin the off-path work now (a task; the tokenisation runs in the worker pool, without
        the GIL) so the memos know this prompt as early as possible, e.g. for the next turn."""
        if fp.complete:
            return None
        task = asyncio.get_running_loop().create_task(self.rest(fp))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "never retrieved"
        return task

    async def complete(self, fp: Fingerprint,
                       started: asyncio.Task[ChainNode | None] | None = None) -> Fingerprint:
        """Finish `fp` (awaiting `started` when given); the event loop never tokenises."""
        if fp.complete:
            return fp
        node = None
        if started is not None:
            try:
                node = await started
            except Exception:  # noqa: BLE001 - retried below
                node = None
        if node is None and not fp.complete:
            node = await self.rest(fp)
        if node is not None and not fp.complete:
            self._finish(fp, node)
        return fp

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

    def extend_with_output(self, fp: Fingerprint, output_ids: Sequence[int]) -> list[int]:
        """Block hashes of prompt + generated ids (full blocks), continuing the prompt's chain."""
        node = fp.extra.get("node")
        if not isinstance(node, ChainNode):
            return list(fp.block_hashes)
        return extend_node(node, output_ids).chain()

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
            out.extend(ids if ids is not None else self.tokenizer.encode(segment))
        return out
