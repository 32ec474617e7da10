"""Every prefixgate metric, defined once. Names and labels are contracts (the README's Metrics section):
dashboards, alert rules and the Helm chart read them. Each app instance owns a registry so that
several proxies in one test process do not collide.

Privacy: no label ever carries prompt text. Tenant labels go through `TenantLabels`, which folds
tenants beyond the configured cap into `other` so cardinality stays bounded.

The `route` label: every metric a request records for itself (latency, tokens, hygiene, breaks,
predicted prefill) carries the API route it came through, one of `ROUTE_LABELS` (the values
`prefixgate_requests_total` has always used), so an agent API's TTFT or hit ratio reads apart from
chat's. Metrics about replicas (routing decisions, upstream errors, engine gauges), the reuse
funnel the router counts, and per-tenant state (continuity) have none.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from app.telemetry.prefill_model import PrefillModels

PROMPT_BUCKETS: tuple[tuple[str, int], ...] = (
    ("0-1k", 1_000),
    ("1k-4k", 4_000),
    ("4k-16k", 16_000),
    ("16k-64k", 64_000),
    ("64k-128k", 128_000),
    ("128k-256k", 256_000),
)
PROMPT_BUCKET_MAX = "256k+"
UNKNOWN_BUCKET = "unknown"

# Fine enough to read p95 anywhere from 10 ms to 60 s (and beyond, for 300k-token prefills).
TTFT_BUCKETS = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0,
)
# The TTFT ledger's parts: sub-millisecond (the gateway's own part) up to TTFT's range.
TTFT_PART_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, *TTFT_BUCKETS)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5, 10)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
PREFILL_TOKEN_BUCKETS = (0, 16, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
DECODE_RATE_BUCKETS = (1, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000)

OTHER_TENANT = "other"
# the values of the `route` label: the dialects' names (app/dialects/), passthrough for any other /v1 path
ROUTE_LABELS = ("chat", "completions", "responses", "messages", "passthrough")


def prompt_bucket(prompt_tokens: int | None) -> str:
    """The prompt-length bucket label for a token count (None -> `unknown`)."""
    if prompt_tokens is None:
        return UNKNOWN_BUCKET
    for label, upper in PROMPT_BUCKETS:
        if prompt_tokens < upper:
            return label
    return PROMPT_BUCKET_MAX


class TenantLabels:
    """Maps tenant ids to metric label values, capped: the first `cap` tenants seen keep their
    name, later ones become `other`. Bounded memory and bounded series count."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> str:
        if tenant in self._known:
            return tenant
        with self._lock:
            if tenant in self._known:
                return tenant
            if len(self._known) < self._cap:
                self._known.add(tenant)
                return tenant
        return OTHER_TENANT


class Metrics:
    """The registry and every metric prefixgate exports."""

    def __init__(self, tenant_label_cap: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_label = TenantLabels(tenant_label_cap)
        r = self.registry

        # --- client-side latency (the proxy's own clock) ---
        self.ttft = Histogram(
            "prefixgate_ttft_seconds",
            "Client-side time to first token: request arrival at the proxy to the first chunk "
            "carrying generated text (role-only and empty chunks excluded).",
            ["route", "model", "backend", "prompt_bucket"], buckets=TTFT_BUCKETS, registry=r)
        self.first_byte = Histogram(
            "prefixgate_upstream_first_byte_seconds",
            "Arrival to the first response body byte from the replica that answered (status < 400; "
            "streams: the role chunk, about the engine's first token). Includes failed attempts.",
            ["route", "model", "backend"], buckets=TTFT_BUCKETS, registry=r)
        self.request_duration = Histogram(
            "prefixgate_request_duration_seconds",
            "End-to-end request time at the proxy, by outcome.",
            ["route", "model", "backend", "status"], buckets=DURATION_BUCKETS, registry=r)
        self.inter_token = Histogram(
            "prefixgate_inter_token_seconds",
            "Gaps between consecutive content chunks of a stream.",
            ["route", "model", "backend"], buckets=ITL_BUCKETS, registry=r)
        self.decode_rate = Histogram(
            "prefixgate_decode_tokens_per_second",
            "Per-request decode rate: usage.completion_tokens over the decode span "
            "(first to last content chunk); immune to servers that batch deltas.",
            ["route", "model", "backend"], buckets=DECODE_RATE_BUCKETS, registry=r)
        self.proxy_overhead = Histogram(
            "prefixgate_proxy_overhead_seconds",
            "The gateway's own time before the request went out: arrival to the last attempt's send, "
            "minus the time failed attempts spent on their replicas.",
            ["route"], buckets=OVERHEAD_BUCKETS, registry=r)
        self.ttft_part = Histogram(
            "prefixgate_ttft_part_seconds",
            "Where a streamed request's client TTFT went (docs/ttft-ledger.md): part=gateway (arrival to "
            "request written upstream), retries (failed attempts), queue and prefill (the engine's own "
            "report: vLLM --enable-per-request-metrics), rest (TTFT minus the others). A part that was not "
            "measured is not observed.",
            ["part", "prompt_bucket", "route"], buckets=TTFT_PART_BUCKETS, registry=r)
        self.requests = Counter(
            "prefixgate_requests_total", "Requests received, by route and HTTP status.",
            ["route", "status"], registry=r)

        # --- tokens and prefix reuse ---
        self.prompt_tokens = Counter(
            "prefixgate_prompt_tokens_total", "Prompt tokens (engine usage).",
            ["route", "model", "tenant"], registry=r)
        self.cached_tokens = Counter(
            "prefixgate_cached_tokens_total",
            "Prompt tokens served from the prefix cache: source=engine (usage.cached_tokens) "
            "or predicted (the proxy's own block model).",
            ["route", "model", "tenant", "source"], registry=r)
        self.reuse_tokens = Counter(
            "prefixgate_prefix_reuse_tokens_total",
            "Reusable prompt tokens of answered requests, each counted once on its full chain "
            "(app/telemetry/funnel.py): available (resident anywhere in the fleet), captured "
            "(predicted resident on the chosen replica), delivered (reported cached by the engine, "
            "up to available), beyond_available (reported past available).",
            ["stage"], registry=r)
        self.continuity = Gauge(
            "prefixgate_prefix_continuity_ratio",
            "Share of a tenant's last prompt's full blocks that continue an earlier prompt.",
            ["tenant"], registry=r)
        self.breaks = Counter(
            "prefixgate_prefix_breaks_total",
            "Prefix chain breaks by diagnosed cause "
            "(dynamic_head, tool_order, front_trim, template_change, history_edit, question_first; "
            "new_session counts new conversations and compaction agents' compacted histories, not breaks).",
            ["route", "tenant", "cause"], registry=r)
        self.tenant_evictions = Counter(
            "prefixgate_tenant_history_evictions_total",
            "Tenants or chains dropped from the bounded continuity history.", registry=r)
        self.diagnoses = Counter(
            "prefixgate_diagnoses_total",
            "Requests the tenant tracker diagnosed because they did not continue their "
            "conversation's latest request in full, by outcome: diagnosed (a cause was looked for; "
            "none is one outcome); recorded undiagnosed: skipped (the diagnosis queue was full), "
            "over_budget (the diagnoses' share of a core, prefix.diagnosis_cpu_share, was spent). "
            "A diagnosis that raised counts in prefixgate_observation_errors_total{stage=\"diagnosis\"}.",
            ["outcome"], registry=r)
        self.diagnosis_cpu = Counter(
            "prefixgate_diagnosis_cpu_seconds_total",
            "CPU seconds the diagnoses took, each on the clock of the thread it ran in: where="
            "event_loop (a small prompt pair, inline) or diagnosis_thread.",
            ["where"], registry=r)
        self.fingerprint_mode = Gauge(
            "prefixgate_fingerprint_mode",
            "1 for the active fingerprint mode: exact (local tokenizer), engine (/tokenize), approx.",
            ["mode"], registry=r)
        self.fingerprint_requests = Counter(
            "prefixgate_fingerprint_requests_total",
            "Requests by how their prompt's chain was known when routed: exact (the whole chain, "
            "exact), pending (an exact leading part; the rest finished off the event loop, so "
            "tracking is exact), approx (the exact leading blocks only, the cold-prompt pool being "
            "full; or character blocks, `prefix.mode` approx). Exact share = "
            "exact / all.", ["mode"], registry=r)
        self.fingerprint_deferred = Counter(
            "prefixgate_fingerprint_deferred_total",
            "Requests routed `approx` because the cold-prompt pool was full, by what became of "
            "their chain after the response: completed (the pool had room by then: prediction and "
            "tracking exact) or dropped (still full: tracked on the leading blocks only). Exact in "
            "the end = (all - approx + completed) / all.", ["outcome"], registry=r)
        self.engine_tokenize_failures = Counter(
            "prefixgate_engine_tokenize_failures_total",
            "Requests whose prompt ids the engine's /tokenize did not give (`prefix.mode` engine): "
            "unreachable, an HTTP error, or no list of token ids. The request was served; its "
            "prediction, residency and continuity were not recorded.", registry=r)
        self.memory_budget = Gauge(
            "prefixgate_memory_budget_bytes",
            "memory.budget_mb in bytes: the bound on what the gateway keeps between requests "
            "(memos, tenant history); every such cap is a share of it (docs/memory.md).", registry=r)
        self.memory_used = Gauge(
            "prefixgate_memory_used_bytes",
            "Bytes held now by each budgeted part (part=token_memo, split_memo, chain_memo, "
            "tracker_hashes, tracker_texts, recent), as each part counts its entries (docs/memory.md).",
            ["part"], registry=r)

        # --- engine (scraped from replicas' /metrics) ---
        self.engine_hit_ratio = Gauge(
            "prefixgate_engine_prefix_cache_hit_ratio",
            "Engine prefix-cache hit ratio over the last scrape window (tokens hit / tokens queried).",
            ["backend"], registry=r)
        self.engine_caching_enabled = Gauge(
            "prefixgate_engine_prefix_caching_enabled",
            "1 when the engine's prefix cache is on (its config says so, or it queried the cache), 0 when "
            "off (config says so, or prompts flow with zero cache queries); absent while unknown.",
            ["backend"], registry=r)
        self.engine_spec_acceptance = Gauge(
            "prefixgate_engine_spec_acceptance_length",
            "Speculative decoding mean acceptance length (tokens per verify step, bonus included).",
            ["backend"], registry=r)
        self.engine_waiting = Gauge(
            "prefixgate_engine_requests_waiting", "Requests queued in the engine.", ["backend"], registry=r)
        self.engine_running = Gauge(
            "prefixgate_engine_requests_running", "Requests running in the engine.", ["backend"], registry=r)
        self.engine_kv_usage = Gauge(
            "prefixgate_engine_kv_usage_ratio", "Engine KV-cache usage, 0..1.", ["backend"], registry=r)
        self.engine_block_size = Gauge(
            "prefixgate_engine_block_size_tokens", "Engine prefix-cache block (page) size.",
            ["backend"], registry=r)
        self.engine_kv_blocks = Gauge(
            "prefixgate_engine_kv_capacity_blocks", "Engine KV capacity in blocks (num_gpu_blocks).",
            ["backend"], registry=r)
        self.engine_stale = Gauge(
            "prefixgate_engine_metrics_stale", "1 when the last scrape of the backend failed.",
            ["backend"], registry=r)
        self.prediction_fidelity = Gauge(
            "prefixgate_prediction_fidelity_ratio",
            "Engine-delivered / proxy-predicted cached tokens over the window; well below 1 means "
            "eviction pressure or a wrong block model.", ["backend"], registry=r)

        # --- routing, upstream, hygiene, state ---
        self.route_decisions = Counter(
            "prefixgate_route_decisions_total", "Routing decisions by backend and reason.",
            ["backend", "reason"], registry=r)
        self.kv_events = Counter(
            "prefixgate_kv_events_total",
            "Engine KV-cache events applied to the residency index, by kind (stored, removed, "
            "cleared; orphan = a stored block whose parent was unknown, skipped; malformed = a "
            "message that was no valid batch, dropped).",
            ["backend", "kind"], registry=r)
        self.kv_event_gaps = Counter(
            "prefixgate_kv_event_gaps_total",
            "Sequence gaps (or a seq going back: an engine restart) in a replica's KV event stream; "
            "the replica's index was replayed or cleared and rebuilt, so predictions undercount "
            "until it refills.", ["backend"], registry=r)
        self.upstream_errors = Counter(
            "prefixgate_upstream_errors_total",
            "Upstream failures by kind (connect, status_5xx, timeout, midstream, ...).",
            ["backend", "kind"], registry=r)
        self.observation_errors = Counter(
            "prefixgate_observation_errors_total",
            "Requests served whose after-response work raised (logged with its traceback), so "
            "what it would have recorded is missing: stage=prefix (fingerprint, residency, "
            "continuity, diagnosis), tracing, hook, metrics.", ["stage"], registry=r)
        self.migrations = Counter(
            "prefixgate_migrations_total",
            "Streams whose replica broke mid-answer, by what the gateway did: outcome=continued (the "
            "continuation reached its end marker), failed (it ended with an error event), skipped "
            "(not continued; reason says why: tool_calls, reasoning, finished, no_replica, refused, ...).",
            ["route", "reason", "outcome"], registry=r)
        self.migration_pause = Histogram(
            "prefixgate_migration_pause_seconds",
            "Client-visible pause of a continued stream: the broken replica's last relayed event (or its "
            "failure) to the continuation's first relayed event.",
            ["route"], buckets=WAIT_BUCKETS, registry=r)
        self.backend_healthy = Gauge(
            "prefixgate_backend_healthy", "1 when the backend passes health checks.", ["backend"], registry=r)
        self.backend_inflight = Gauge(
            "prefixgate_backend_inflight_requests", "Requests the proxy has in flight per backend.",
            ["backend"], registry=r)
        self.rewrites = Counter(
            "prefixgate_rewrites_total", "Hygiene rewrites applied, by kind.", ["route", "tenant", "kind"], registry=r)
        self.rejections = Counter(
            "prefixgate_rejections_total", "Requests rejected by hygiene or auth, by reason.",
            ["route", "tenant", "reason"], registry=r)
        self.hygiene_findings = Counter(
            "prefixgate_hygiene_findings_total", "Hygiene findings by kind (any policy).",
            ["route", "tenant", "kind"], registry=r)
        self.state_backend_up = Gauge(
            "prefixgate_state_backend_up", "1 when the shared state backend (Redis) is reachable; "
            "1 for the in-memory store.", registry=r)
        self.state_fallbacks = Counter(
            "prefixgate_state_fallbacks_total",
            "Shared-state reads answered from the gateway's local state because Redis was down "
            "(reason=down), over its time budget (timeout) or failed (error). Routing still works; "
            "it just sees only this pod's view.", ["op", "reason"], registry=r)
        self.state_pending_writes = Gauge(
            "prefixgate_state_pending_writes",
            "Shared-state writes queued for Redis (batched; replayed after an outage).", registry=r)
        self.state_dropped_writes = Counter(
            "prefixgate_state_dropped_writes_total",
            "Shared-state writes dropped: the queue hit its bound during a long Redis outage, or "
            "Redis refused them (maxmemory); other pods miss them until the data is written again.",
            registry=r)

        # --- lifecycle (SIGTERM drain, app/serving.py) ---
        self.draining = Gauge(
            "prefixgate_draining",
            "1 from SIGTERM until exit: /readyz answers 503 and in-flight requests run to their end.",
            registry=r)
        self.shutdown_cut = Counter(
            "prefixgate_shutdown_cut_requests_total",
            "/v1 requests still open at the shutdown.grace_s deadline and ended by the gateway: a "
            "stream gets its route's error event and [DONE]. Non-zero: raise shutdown.grace_s "
            "(and the pod's terminationGracePeriodSeconds with it).", registry=r)

        # --- prefill cost and admission (app/admission/, docs/admission.md) ---
        self.prefill_tokens = Histogram(
            "prefixgate_prefill_tokens",
            "Predicted uncached prompt tokens of each routed request (prompt minus the prefix "
            "predicted resident on the chosen replica; the size estimate while the fingerprint is "
            "pending): the prefill the engine has to do.",
            ["route", "tenant"], buckets=PREFILL_TOKEN_BUCKETS, registry=r)
        self.admission_rejections = Counter(
            "prefixgate_admission_rejections_total",
            "Requests refused by admission: reason=requests_per_s | prompt_tokens_per_min | "
            "concurrent (429), queue_full | queue_ttl (503).", ["tenant", "reason"], registry=r)
        self.admission_queue_depth = Gauge(
            "prefixgate_admission_queue_depth",
            "Requests waiting in this pod's gateway queue because every eligible replica is saturated.",
            registry=r)
        self.admission_wait = Histogram(
            "prefixgate_admission_wait_seconds",
            "Time a request spent in the gateway queue before it was forwarded or shed (queued requests only).",
            buckets=WAIT_BUCKETS, registry=r)

        # --- the bill for every break (docs/ttft-ledger.md) ---
        self.break_recomputed_tokens = Counter(
            "prefixgate_break_recomputed_tokens_total",
            "Prompt tokens replicas recomputed because a request broke its tenant's previous chain: the "
            "blocks that chain held past the break point, up to the prompt's length, in whole blocks, at "
            "most the tokens the engine computed. Diagnosed breaks only; compactions and new sessions "
            "are not billed.", ["tenant", "cause"], registry=r)
        self.break_prefill_seconds = Counter(
            "prefixgate_break_prefill_seconds_total",
            "Prefill seconds those recomputed tokens took, by the serving replica's fitted prefill model "
            "(prefixgate_prefill_model_*). A break whose replica has no full fit yet adds nothing here.",
            ["tenant", "cause"], registry=r)
        self.tenant_prefill_seconds = Counter(
            "prefixgate_tenant_prefill_seconds_total",
            "The engine's own prefill seconds (the TTFT ledger's prefill part: vLLM "
            "--enable-per-request-metrics) of each tenant's requests, streamed or not. Requests without the "
            "engine's report add nothing.", ["tenant"], registry=r)

        # --- the prefill model per replica, learned from the TTFT ledger (docs/ttft-ledger.md) ---
        self.prefill_models = PrefillModels()
        r.register(PrefillModelCollector(self.prefill_models))

    def render(self) -> tuple[bytes, str]:
        """Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class PrefillModelCollector:
    """Each replica's fitted prefill model (app/telemetry/prefill_model.py), solved at scrape time.
    A replica without enough samples has no series; the attention coefficient appears once it is
    identifiable (samples that read cached tokens)."""

    def __init__(self, models: PrefillModels) -> None:
        self.models = models

    def describe(self) -> list[Metric]:
        return []  # series appear with data: nothing to check against at registration

    def collect(self) -> Iterator[Metric]:
        rate = GaugeMetricFamily(
            "prefixgate_prefill_model_cold_tokens_per_second",
            "Fitted cold prefill rate of a replica: 1 / the per-new-token cost of the engine's own "
            "prefill time (vLLM per-request metrics), prefill = fixed + new/rate + cached x per_cached "
            "+ attention x new x cached.", labels=["backend"])
        attention = GaugeMetricFamily(
            "prefixgate_prefill_model_attention_seconds",
            "Fitted attention coefficient of a replica: prefill seconds per (new token x cached token).",
            labels=["backend"])
        samples = GaugeMetricFamily(
            "prefixgate_prefill_model_samples",
            "Requests behind a replica's prefill model (exponentially forgotten weight).", labels=["backend"])
        for name, (weight, fit) in sorted(self.models.snapshot().items()):
            samples.add_metric([name], weight)
            if fit is not None and fit.cold_tokens_per_second is not None:
                rate.add_metric([name], fit.cold_tokens_per_second)
            if fit is not None and fit.attention_s is not None:
                attention.add_metric([name], fit.attention_s)
        yield from (rate, attention, samples)
