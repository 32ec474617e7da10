"""Scorers: small pure functions that each put one number on a replica and say why.

Every scorer returns a `Score` in the same unit, **prefill-token equivalents**: the work a replica
must do before our request's first token, so the sum of a replica's scores is proportional to the
TTFT this request would see there (TTFT ~ (backlog + uncached) / prefill rate). A policy composes
them (llm-d's filters -> scorers -> picker shape, docs/routing.md); the lowest total wins.

- `uncached_prompt`: prompt tokens the replica would have to prefill (the engine's hit rule, docs/routing.md).
- `prefill_backlog`: prompt tokens already routed there and not yet past their first token
  (`replica.queued_prompt_tokens`, kept by the proxy), plus the engine's waiting requests that
  are not this gateway's (other gateway pods share the replica: `Replica.engine_foreign`).
- `decode_load`: running decodes slow every prefill step (chunked prefill shares the batch): this
  gateway's in flight plus the engine's running requests that are not its own.

This gateway's own requests (every worker's, app/routing/siblings.py) are counted live, the
others' from the last engine scrape: counted from the scrape, a request of its own that finished
since would keep weighing on the replica for up to a scrape interval and push the next request
away from its prefix.

The first two are priced by `PrefillPrices` (app/routing/prefill_cost.py): with a replica's fitted
prefill model, its work in reference tokens (a slower replica's token costs more); without one, the
token count itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.prefix.blocks import predicted_hit_tokens
from app.routing.base import Replica
from app.routing.prefill_cost import TOKEN_PRICES, PrefillPrices

# A waiting engine request we know nothing about costs about this many prefill tokens.
DEFAULT_WAITING_REQUEST_TOKENS = 2048
# One running decode stream slows a prefill step about as much as this many prompt tokens.
DEFAULT_DECODE_TOKENS_PER_RUNNING = 256


@dataclass(frozen=True)
class Score:
    name: str
    value: float  # prefill-token equivalents; lower is better
    why: str


@dataclass(frozen=True)
class ScoreWeights:
    """Multipliers per scorer (config routing.weights) and the conversion constants."""

    uncached: float = 1.0
    backlog: float = 1.0
    decode: float = 1.0
    waiting_request_tokens: float = DEFAULT_WAITING_REQUEST_TOKENS
    decode_tokens_per_running: float = DEFAULT_DECODE_TOKENS_PER_RUNNING


@dataclass(frozen=True)
class ReplicaCost:
    replica: Replica
    matched_blocks: int
    parts: tuple[Score, ...]

    @property
    def total(self) -> float:
        return sum(p.value for p in self.parts)

    def explain(self) -> str:
        return f"{self.replica.name}: {self.total:.0f} = " + " + ".join(f"{p.name} {p.why}" for p in self.parts)


def uncached_prompt(prompt_tokens: int, matched_blocks: int, block_size: int, weight: float = 1.0, *,
                    replica: str = "", prices: PrefillPrices = TOKEN_PRICES) -> Score:
    """The prompt's own prefill on `replica`: its uncached tokens after the predicted hit, priced
    by the replica's fitted model (which also counts the hit and the attention term) when it has one."""
    hit = predicted_hit_tokens(matched_blocks, prompt_tokens, block_size)
    uncached = max(0, prompt_tokens - hit)
    value, seconds = prices.prefill(replica, uncached, hit)
    fitted = f", fitted {seconds * 1000:.0f} ms" if seconds is not None else ""
    return Score("uncached", weight * value, f"{uncached} of {prompt_tokens} prompt tokens not resident{fitted}")


def prefill_backlog(replica: Replica, waiting_request_tokens: float, weight: float = 1.0, *,
                    prices: PrefillPrices = TOKEN_PRICES) -> Score:
    """Prompt tokens queued ahead of a new request: this gateway's own (live, every worker's) and, at
    `waiting_request_tokens` each, the engine's waiting requests that are not this gateway's."""
    own = float(replica.gateway_queued_tokens())
    foreign = replica.engine_foreign()[1]
    value = own + foreign * waiting_request_tokens
    why = f"{own:.0f} queued prompt tokens" + (f" + {foreign:g} others' waiting in engine" if foreign else "")
    priced = prices.backlog(replica.name, value)
    if priced != value:
        why += f" (x{priced / value:.2f} at its fitted rate)"
    return Score("backlog", weight * priced, why)


def decode_load(replica: Replica, tokens_per_running: float, weight: float = 1.0) -> Score:
    """This gateway's requests in flight (live, every worker's) and the engine's running ones that
    are not its own."""
    running = replica.gateway_inflight() + replica.engine_foreign()[0]
    return Score("decode", weight * running * tokens_per_running, f"{running:g} running")


def load_scores(replica: Replica, weights: ScoreWeights, prices: PrefillPrices = TOKEN_PRICES) -> tuple[Score, ...]:
    """The load part of the cost (everything but the prompt's own uncached tokens)."""
    return (
        prefill_backlog(replica, weights.waiting_request_tokens, weights.backlog, prices=prices),
        decode_load(replica, weights.decode_tokens_per_running, weights.decode),
    )


def replica_costs(
    replicas: Sequence[Replica],
    matched: dict[str, int],
    prompt_tokens: int,
    block_size: int,
    weights: ScoreWeights,
    prices: PrefillPrices = TOKEN_PRICES,
) -> list[ReplicaCost]:
    """Cost of sending a `prompt_tokens` request to each replica, given its leading resident blocks."""
    out = []
    for r in replicas:
        m = matched.get(r.name, 0)
        parts = (uncached_prompt(prompt_tokens, m, block_size, weights.uncached, replica=r.name, prices=prices),
                 *load_scores(r, weights, prices))
        out.append(ReplicaCost(r, m, parts))
    return out


def load_value(replica: Replica, weights: ScoreWeights, prices: PrefillPrices = TOKEN_PRICES) -> float:
    return sum(s.value for s in load_scores(replica, weights, prices))
