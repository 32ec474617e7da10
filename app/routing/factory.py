"""Builds the configured routing policy (settings.routing.policy) and the residency owner."""

from __future__ import annotations

from app.config import RoutingWeights, Settings
from app.routing.base import Router
from app.routing.lanes import LongPrefillLane
from app.routing.least_load import LeastLoadRouter
from app.routing.prefill_cost import PrefillPrices
from app.routing.prefix_affinity import AffinityOptions, PrefixAffinityRouter
from app.routing.replicas import ReplicaSet
from app.routing.residency import ReplicaIndex
from app.routing.round_robin import RoundRobinRouter
from app.routing.scorers import ScoreWeights
from app.routing.session import SessionRouter
from app.state.base import Store
from app.telemetry.metrics import Metrics


def score_weights(w: RoutingWeights) -> ScoreWeights:
    return ScoreWeights(uncached=w.uncached, backlog=w.backlog, decode=w.decode,
                        waiting_request_tokens=w.waiting_request_tokens,
                        decode_tokens_per_running=w.decode_tokens_per_running)


def build_residency(settings: Settings, store: Store) -> ReplicaIndex:
    """With routing.kv_events the engines' events own what is resident; else routed requests do."""
    return ReplicaIndex(store, events_own_presence=settings.routing.kv_events)


def build_router(settings: Settings, replicas: ReplicaSet, store: Store, metrics: Metrics,
                 residency: ReplicaIndex | None = None) -> Router:
    """`residency` is the gateway's one index (shared with the KV-event subscriber and the
    after-response stage); built here from `store` when the caller has none."""
    routing = settings.routing
    weights = score_weights(routing.weights)
    prices = PrefillPrices(metrics.prefill_models)  # each replica's fitted prefill model prices its work
    if routing.policy == "round_robin":
        return RoundRobinRouter(replicas)
    if routing.policy == "least_load":
        return LeastLoadRouter(replicas, weights, prices)
    if routing.policy == "session":
        return SessionRouter(replicas, store, epsilon=routing.weights.load_epsilon)
    if routing.policy == "prefix_affinity":
        options = AffinityOptions(
            block_size=routing.block_size, weights=weights, epsilon=routing.weights.load_epsilon,
            cold_key_tokens=routing.weights.cold_key_tokens,
            cold_match_ratio=routing.weights.cold_match_ratio,
            cold_slack_tokens=routing.weights.cold_slack_tokens, default_kv_blocks=routing.kv_blocks)
        lane = LongPrefillLane.from_config(routing.lanes) if routing.lanes is not None else None
        return PrefixAffinityRouter(replicas, residency or build_residency(settings, store), options, lane, prices)
    raise ValueError(f"unknown routing policy {routing.policy!r}")
