"""The bill for a break: the prompt tokens a replica recomputed because a request did not continue
its tenant's previous chain, and their prefill seconds from the replica's fitted prefill model
(docs/ttft-ledger.md, "The bill for every break"). Pure arithmetic; no clock, no I/O.

Tokens are counted in whole blocks (the tracker's granularity): the blocks the previous chain held
past the break point, up to this prompt's length, never more than a cache could have saved.
Seconds are the model's prefill time of the request as it ran minus the same request with those
tokens read from the cache instead: only with a full fit (per-cached and attention terms known),
and absent, never zero, when the model cannot say or says something negative.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.telemetry.prefill_model import PrefillFit


@dataclass(frozen=True, slots=True)
class BreakBill:
    tokens: int  # prompt tokens recomputed because of the break
    seconds: float | None  # their prefill seconds; None: the replica's model cannot say (yet)


def recomputed_blocks(held_before: int, total: int, matched: int) -> int:
    """Blocks the previous chain (`held_before` blocks: its prompt and the generated blocks the
    engine kept) had past the break point (`matched`), up to this prompt's `total` full blocks."""
    return max(0, min(held_before, total) - matched)


def price_break(blocks: int, block_size: int, prompt_tokens: int, cached_tokens: int,
                fit: PrefillFit | None) -> BreakBill:
    """The bill of `blocks` recomputed blocks of a prompt of `prompt_tokens` of which the engine
    read `cached_tokens` from its cache. Capped at what a cache could have saved: vLLM's rule, at
    most the full blocks of the first N - 1 tokens are read (the last token is always computed)."""
    new = max(0, prompt_tokens - cached_tokens)
    cacheable = max(0, (prompt_tokens - 1) // block_size * block_size - cached_tokens)
    tokens = min(blocks * block_size, cacheable)
    if fit is None or fit.per_cached_token_s is None or fit.attention_s is None:
        return BreakBill(tokens, None)
    seconds = fit.predict(new, cached_tokens) - fit.predict(new - tokens, cached_tokens + tokens)
    return BreakBill(tokens, seconds if seconds >= 0 else None)
