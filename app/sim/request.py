"""One request inside the simulated engine: its token ids, block hashes, blocks and output."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from app.sim.hashing import sglang_namespace_seed, sglang_page_keys, vllm_block_keys
from app.sim.pool import Block

_ids = itertools.count()


@dataclass
class HashSpec:
    """How a replica keys blocks (app/sim/hashing.py): vLLM digests under its algo/seed, or
    SGLang's namespaced page chain."""

    page_size: int
    flavor: str = "vllm"
    algo: str = "sha256"
    python_hash_seed: str | None = None


@dataclass(eq=False)
class SimRequest:
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    cache_salt: str | None = None
    extra_key: str | None = None  # SGLang's radix namespace (the vLLM flavour has none)
    streaming: bool = True
    skip_prefix_cache: bool = False  # no lookup (prompt logprobs); its blocks are still cached
    output_offset: int = 0  # a continued answer: filler tokens already in the prompt (tokens.continued_tokens)
    request_id: str = field(default_factory=lambda: f"sim-{next(_ids)}")
    arrival: float = field(default_factory=time.monotonic)

    all_ids: list[int] = field(init=False)
    keys: list[bytes] = field(init=False, default_factory=list)  # engine key per full block
    blocks: list[Block] = field(init=False, default_factory=list)
    num_cached_blocks: int = 0  # leading blocks of `blocks` registered in the pool's cache
    num_computed: int = 0
    num_cached_tokens: int = -1  # set at first scheduling (vLLM semantics)
    created_cache_tokens: int = 0  # prompt tokens in blocks this request newly cached
    output_ids: list[int] = field(init=False, default_factory=list)
    output_text: list[str] = field(init=False, default_factory=list)
    reasoning_tokens: int = 0
    status: str = "new"  # new | waiting | running | finished
    preempted: bool = False
    finish_reason: str | None = None
    error: str | None = None
    queued_time: float | None = None  # monotonic: entered the engine's waiting queue (vLLM queued_ts)
    scheduled_time: float | None = None  # monotonic: first scheduled (vLLM scheduled_ts; preemptions ignored)
    first_token_time: float | None = None
    last_token_time: float = 0.0
    virtual_arrival: float = 0.0
    virtual_first_token: float | None = None
    event: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.all_ids = list(self.prompt_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def extend_hashes(self, spec: HashSpec | None) -> None:
        """Key the full blocks of `all_ids` not keyed yet (once per block, never per step)."""
        if spec is None or len(self.all_ids) // spec.page_size <= len(self.keys):
            return
        first = len(self.keys)
        parent = self.keys[-1] if self.keys else None
        if spec.flavor == "sglang":
            namespace = sglang_namespace_seed(self.extra_key, self.cache_salt)
            self.keys.extend(sglang_page_keys(self.all_ids, spec.page_size, first=first, parent=parent,
                                              namespace=namespace))
        else:
            self.keys.extend(vllm_block_keys(self.all_ids, spec.page_size, first=first, parent=parent,
                                             algo=spec.algo, python_hash_seed=spec.python_hash_seed,
                                             cache_salt=self.cache_salt))
