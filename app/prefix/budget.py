"""One memory budget, and every cap on what the gateway keeps between requests derived from it.

`memory.budget_mb` bounds the structures that grow with traffic rather than with one request: the
segment -> token ids memo, the chain-state memo, the continuity tracker's block hashes and its
rendered prompts kept for diagnosis, and the recent-predictions ring. Each gets a fixed share;
each counts the bytes its entries really hold (estimated per entry from sys.getsizeof, not entry
counts) and evicts at its share, so their sum stays within the budget. The shares, the reasons for
them and what is deliberately outside the budget (in-flight requests, the residency index, which
mirrors the engines' own KV capacity) are in docs/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024 * 1024
DEFAULT_BUDGET_MB = 256  # memory.budget_mb's default (app/config.py): 512Mi Helm request - base

# Shares of the budget. The memos make the hot path cheap (a hit skips tokenising and hashing);
# the tracker's hashes make continuity exact over a tenant's recent history; texts only feed
# diagnosis, which needs the last few prompts per tenant. The tracker's hashes sit in packed
# arrays (8 bytes a block, app/prefix/runs.py): 15 % holds ~4.8M blocks at the default budget, so
# the memos get the rest (32 distinct 1 MB heads fit in both at the default budget, docs/memory.md).
TOKEN_MEMO_SHARE = 0.37
SPLIT_MEMO_SHARE = 0.05  # recent long prompts' segments and walk records, one entry per conversation (resplit.py)
CHAIN_MEMO_SHARE = 0.23
TRACKER_HASHES_SHARE = 0.15
TRACKER_TEXTS_SHARE = 0.15
RECENT_SHARE = 0.05  # the ring of recent (request, predicted, delivered) tuples
TENANT_HASHES_FRACTION = 8  # one tenant may hold at most 1/8 of the tracker's hash bytes

RECENT_ENTRY_BYTES = 300  # (id str ~70 B, tenant str ~60 B, two ints, tuple 80 B, ring slot)
RECENT_MAX = 4096


@dataclass(frozen=True)
class MemoryCaps:
    """Byte caps, each a share of `budget_bytes` (their sum never exceeds it)."""

    budget_bytes: int
    token_memo_bytes: int
    split_memo_bytes: int
    chain_memo_bytes: int
    tracker_hash_bytes: int
    tracker_tenant_hash_bytes: int
    tracker_text_bytes: int
    recent_predictions: int  # entries of the recent-predictions ring

    @classmethod
    def from_budget(cls, budget_mb: int) -> MemoryCaps:
        budget = int(budget_mb) * MB
        hashes = int(budget * TRACKER_HASHES_SHARE)
        return cls(
            budget_bytes=budget,
            token_memo_bytes=int(budget * TOKEN_MEMO_SHARE),
            split_memo_bytes=int(budget * SPLIT_MEMO_SHARE),
            chain_memo_bytes=int(budget * CHAIN_MEMO_SHARE),
            tracker_hash_bytes=hashes,
            tracker_tenant_hash_bytes=hashes // TENANT_HASHES_FRACTION,
            tracker_text_bytes=int(budget * TRACKER_TEXTS_SHARE),
            recent_predictions=max(16, min(RECENT_MAX, int(budget * RECENT_SHARE) // RECENT_ENTRY_BYTES)),
        )
