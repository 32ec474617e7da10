"""One request inside the simulated engine: its token ids, block hashes, blocks and output."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

from app.prefix.blocks import HashAlgo, proxy_chain, proxy_digest, vllm_chain_from
from app.sim.pool import Block

_ids = itertools.count()


@dataclass
class HashSpec:
    """How a replica hashes blocks: vLLM digests keyed by its algo/seed, or (SGLang flavor,
    page size 1) the proxy chain itself as the radix key."""

    page_size: int
    flavor: str = "vllm"
    algo: HashAlgo = "sha256"
    python_hash_seed: str | None = None


@dataclass(eq=False)
class SimRequest:
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    cache_salt: str | None = None
    streaming: bool = True
    skip_prefix_cache: bool = False  # no lookup (prompt logprobs); its blocks are still cached
    request_id: str = field(default_factory=lambda: f"sim-{next(_ids)}")
    arrival: float = field(default_factory=time.monotonic)

    all_ids: list[int] = field(init=False)
    keys: list[Hashable] = field(init=False, default_factory=list)
    proxy_hashes: list[int] = field(init=False, default_factory=list)
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
        """Hash the full blocks of `all_ids` not hashed yet (once per block, never per step)."""
        if spec is None:
            return
        page = spec.page_size
        start = len(self.proxy_hashes)
        if (len(self.all_ids) // page) <= start:
            return
        parent = proxy_digest(self.proxy_hashes[-1]) if self.proxy_hashes else None
        new_proxy = proxy_chain(self.all_ids, page, salt=self.cache_salt, parent=parent, start_block=start)
        self.proxy_hashes.extend(new_proxy)
        if spec.flavor == "sglang":
            self.keys.extend(new_proxy)
        else:
            prev = self.keys[-1] if self.keys else None
            self.keys.extend(vllm_chain_from(
                self.all_ids, page, parent=prev, start_block=start, algo=spec.algo,  # type: ignore[arg-type]
                python_hash_seed=spec.python_hash_seed, cache_salt=self.cache_salt))
