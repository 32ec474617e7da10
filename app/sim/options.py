"""Options of one simulated replica. Field names are the `prefixgate sim` flag names with
underscores, so `SimCluster(**options)`, the CLI and `/sim/state` all speak the same words."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Literal

Flavor = Literal["vllm", "sglang"]

# Defaults chosen to reproduce the seeds' shape: a 128k-token cold prefill takes ~16 s at
# 8000 tokens/s, a warm one (all but the last block cached) a few milliseconds.
DEFAULT_PREFILL_TPS = 8000.0
DEFAULT_DECODE_TPS = 60.0
# Reading the cached prefix is not free: the new tokens attend to it (the seeds' "attention term";
# 234k tokens went 15.3 s -> 1.1 s, not to zero). 200k cached tokens/s puts a warm 128k prompt
# at ~0.64 s against ~16 s cold.
DEFAULT_CACHED_TPS = 200_000.0


@dataclass
class SimOptions:
    model: str = "sim"
    tokenizer: str | None = None
    block_size: int = 16
    kv_blocks: int = 4096
    prefill_tps: float = DEFAULT_PREFILL_TPS
    decode_tps: float = DEFAULT_DECODE_TPS
    cached_tps: float = DEFAULT_CACHED_TPS  # 0 = reading cached tokens costs nothing
    # seconds per (prefilled token x token already in context): attention that grows with new x cached
    attention_pair_s: float = 0.0
    max_batch_tokens: int = 2048
    max_num_seqs: int = 256
    prefix_caching: bool = True
    deltas_per_chunk: int = 1
    role_chunk_early: bool = False
    time_scale: float = 1.0
    flavor: Flavor = "vllm"
    sglang_page_size: int = 1  # SGLang flavour: its --page-size (radix matches floored to whole pages)
    spec_decode: float | None = None  # mean acceptance length (bonus token included)
    spec_tokens: int = 3  # draft tokens proposed per step when spec_decode is set
    kv_events: bool | str = False  # True: a free tcp port; a string: the endpoint to bind
    kv_events_topic: str = ""
    kv_events_replay: str | None = None  # replay ROUTER endpoint (None: a free loopback port)
    max_model_len: int = 131072
    enable_prompt_tokens_details: bool = True
    include_usage_always: bool = False
    prefix_caching_hash_algo: str = "sha256"
    python_hash_seed: str | None = None  # default: the PYTHONHASHSEED env var, as vLLM reads it
    output_tokens: int = 32  # natural completion length (EOS) when the request does not ignore it
    reasoning_tokens: int = 0  # first N generated tokens are streamed as reasoning
    crash_above_tokens: int | None = None
    # drop Claude Code's billing header as vLLM 0.32 does (the system block on /v1/messages, a
    # system text's first line on every route); False: keep it, as SGLang does (docs/agents-apis.md)
    strip_billing_header: bool = True
    seed: int = 0
    enable_per_request_metrics: bool = False  # vLLM's flag: a `metrics` object per answer (vLLM flavour only)
    responses_store: bool = True  # keep /v1/responses answers (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1)

    def __post_init__(self) -> None:
        if self.flavor not in ("vllm", "sglang"):
            raise ValueError(f"flavor must be vllm or sglang, not {self.flavor!r}")
        if self.prefix_caching_hash_algo not in ("sha256", "sha256_cbor"):
            raise ValueError("prefix_caching_hash_algo must be sha256 or sha256_cbor")
        if self.block_size < 1 or self.kv_blocks < 2 or self.max_batch_tokens < 1:
            raise ValueError("block_size >= 1, kv_blocks >= 2 and max_batch_tokens >= 1 are required")
        if self.sglang_page_size < 1:
            raise ValueError("sglang_page_size must be >= 1")
        if self.deltas_per_chunk < 1:
            raise ValueError("deltas_per_chunk must be >= 1")
        if self.spec_decode is not None and not 1.0 <= self.spec_decode <= 1 + self.spec_tokens:
            raise ValueError(f"spec_decode (mean acceptance length) must be in [1, {1 + self.spec_tokens}]")
        if self.python_hash_seed is None:
            self.python_hash_seed = os.environ.get("PYTHONHASHSEED")

    @property
    def page_size(self) -> int:
        """Matching granularity: vLLM's block size; SGLang's page size (1 by default: its radix cache
        then matches per token; with --page-size P a match is floored to whole pages)."""
        return self.sglang_page_size if self.flavor == "sglang" else self.block_size

    @property
    def pool_blocks(self) -> int:
        """Blocks in the pool, in units of `page_size` (SGLang: the same KV memory in tokens)."""
        return self.kv_blocks * self.block_size // self.page_size

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SimOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown simulator options: {sorted(unknown)}")
        return cls(**kwargs)
