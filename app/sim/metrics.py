"""The simulated engine's `/metrics`: vLLM 0.33 names and semantics, or SGLang 0.5 names.

These are not prefixgate's own metrics (those live in app/telemetry/metrics.py): they imitate an
engine's exposition so that the proxy's scraper, dashboards and the doctor can be tested against
it. Each replica owns a registry (several replicas share one test process).

vLLM facts reproduced (engine-facts C): counters without `_total` in the declared name (exposed
with it), labels `model_name` and `engine`, prefix-cache counters in tokens, `kv_cache_usage_perc`
in 0..1, `cache_config_info` with one label per CacheConfig field, spec-decode counters only when
speculative decoding is configured, TTFT buckets from vllm/v1/metrics/buckets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from app.sim.options import SimOptions

VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                     7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0)
VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480,
                        960, 1920, 7680)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)

Gauges = Callable[[], tuple[int, int, float]]  # running, waiting, kv usage


class SimMetrics:
    """Engine-side counters; gauges are read from the engine at scrape time."""

    def __init__(self, options: SimOptions, gauges: Gauges) -> None:
        self.options = options
        self.gauges = gauges
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, ...], Any] = {}
        if options.flavor == "sglang":
            self._init_sglang(options)
        else:
            self._init_vllm(options)

    # ------------------------------------------------------------------ vLLM
    def _init_vllm(self, o: SimOptions) -> None:
        r, names = self.registry, ["model_name", "engine"]
        self.labels = {"model_name": o.model, "engine": "0"}
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", names, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", names, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", names, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", names, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", names, registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"], registry=r)
        self.waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", [*names, "reason"], registry=r)
        sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping.", [*names, "sleep_state"], registry=r)
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(**self.labels, sleep_state=state).set(value)
        self.by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*names, "source"], registry=r)
        self.cached = Counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", names, registry=r)
        self.cached_by_source = Counter("vllm:prompt_tokens_cached_by_source", "Number of cached prompt tokens by source.", [*names, "source"], registry=r)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.by_source.labels(**self.labels, source=source)
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            self.cached_by_source.labels(**self.labels, source=source)
        for reason in ("stop", "length", "abort", "error", "repetition"):
            self.success.labels(**self.labels, finished_reason=reason)
        self.cached.labels(**self.labels)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", names, buckets=VLLM_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", names, buckets=VLLM_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", names, buckets=VLLM_LATENCY_BUCKETS, registry=r)
        info_labels = {**self._cache_config(o), "engine": "0"}
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info_labels), registry=r)
        info.labels(**info_labels).set(1)
        self.spec = o.spec_decode is not None
        if self.spec:
            self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", names, registry=r)
            self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", names, registry=r)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", names, registry=r)
            self.accepted_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", [*names, "position"], registry=r)
            for m in (self.drafts, self.draft_tokens, self.accepted):
                m.labels(**self.labels)
            for pos in range(o.spec_tokens):
                self.accepted_pos.labels(**self.labels, position=str(pos))
        # vLLM creates its series at start-up: a scraper sees 0, not an absent series.
        for m in (self.running, self.waiting, self.kv_usage, self.queries, self.hits, self.prompt_tokens,
                  self.generation_tokens, self.preemptions, self.ttft, self.itl, self.e2e):
            m.labels(**self.labels)

    @staticmethod
    def _cache_config(o: SimOptions) -> dict[str, str]:
        return {
            "block_size": str(o.block_size), "cache_dtype": "auto", "calculate_kv_scales": "False",
            "enable_prefix_caching": str(o.prefix_caching), "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None", "num_gpu_blocks": str(o.kv_blocks), "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": o.prefix_caching_hash_algo, "hash_block_size": str(o.block_size),
            "cache_hit_alignment_tokens": str(o.block_size), "sliding_window": "None",
            "_block_size_resolved": "True", "effective_attention_block_size": str(o.block_size),
            "user_specified_block_size": "True", "kv_cache_size_tokens": str(o.kv_blocks * o.block_size),
            "prefix_match_unit": "None", "mamba_cache_mode": "none", "is_attention_free": "False",
        }

    # ------------------------------------------------------------------ SGLang
    def _init_sglang(self, o: SimOptions) -> None:
        r = self.registry
        names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        self.labels = {"model_name": o.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                       "moe_ep_rank": "0"}
        self.running = Gauge("sglang:num_running_reqs", "The number of running requests.", names, registry=r)
        self.waiting = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", names, registry=r)
        self.kv_usage = Gauge("sglang:token_usage", "The token usage.", names, registry=r)
        page = Gauge("sglang:page_size", "The page size of the KV cache.", names, registry=r)
        page.labels(**self.labels).set(o.page_size)
        self.hit_rate = Gauge("sglang:cache_hit_rate", "The prefix cache hit rate of the latest prefill batch.", names, registry=r)
        self.effective = Counter("sglang:prefill_effective_tokens_total", "Prefill tokens by where their KV came from.", [*names, "mode"], registry=r)
        self.cached_total = Counter("sglang:cached_tokens_total", "Cached prompt tokens of finished requests.", [*names, "cache_source"], registry=r)
        token_names = ["model_name", "engine_type", "is_streaming"]
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", token_names, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", token_names, registry=r)
        self.requests = Counter("sglang:num_requests_total", "The number of requests.", ["model_name", "engine_type"], registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", token_names, buckets=SGLANG_TTFT_BUCKETS, registry=r)
        self.spec = o.spec_decode is not None
        if self.spec:
            self.accept_length = Gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", names, registry=r)
            self.verify_calls = Counter("sglang:spec_verify_calls_total", "Speculative verify forward calls.", ["model_name", "engine_type"], registry=r)
            self._spec_tokens = 0
            self._spec_forwards = 0
        for m in (self.running, self.waiting, self.kv_usage, self.hit_rate):
            m.labels(**self.labels)
        for mode in ("input", "device_hit", "host_hit", "storage_hit"):
            self.effective.labels(**self.labels, mode=mode)

    # ------------------------------------------------------------------ events from the engine
    def _child(self, metric: Any, **labels: str) -> Any:
        """The labelled child, memoised: `labels()` costs microseconds and runs per token."""
        key = (id(metric), *labels.values())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(**labels)
        return child

    def on_admitted(self, prompt_tokens: int, cached_tokens: int, lookup: bool) -> None:
        """A new request did its prefix-cache lookup (vLLM counts queries only when it looks up)."""
        if self.options.flavor == "sglang":
            self._child(self.effective, **self.labels, mode="input").inc(prompt_tokens - cached_tokens)
            self._child(self.effective, **self.labels, mode="device_hit").inc(cached_tokens)
            self._child(self.hit_rate, **self.labels).set(cached_tokens / prompt_tokens if prompt_tokens else 0.0)
        elif lookup:
            self._child(self.queries, **self.labels).inc(prompt_tokens)
            self._child(self.hits, **self.labels).inc(cached_tokens)

    def on_prompt_done(self, prompt_tokens: int, cached_tokens: int) -> None:
        """The prompt's split by source, counted when its first token is out (as vLLM does)."""
        if self.options.flavor == "vllm":
            self._child(self.by_source, **self.labels, source="local_compute").inc(prompt_tokens - cached_tokens)
            self._child(self.by_source, **self.labels, source="local_cache_hit").inc(cached_tokens)
            self._child(self.cached, **self.labels).inc(cached_tokens)
            self._child(self.cached_by_source, **self.labels, source="device").inc(cached_tokens)

    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None:
        if self.options.flavor == "sglang":
            s = {"model_name": self.options.model, "engine_type": "unified", "is_streaming": str(streaming)}
            self._child(self.ttft, **s).observe(ttft_s)
            self._child(self.prompt_tokens, **s).inc(prompt_tokens)
        else:
            self._child(self.ttft, **self.labels).observe(ttft_s)
            self._child(self.prompt_tokens, **self.labels).inc(prompt_tokens)

    def on_tokens(self, n: int, gap_s: float | None, streaming: bool) -> None:
        if self.options.flavor == "sglang":
            s = {"model_name": self.options.model, "engine_type": "unified", "is_streaming": str(streaming)}
            self._child(self.generation_tokens, **s).inc(n)
        else:
            self._child(self.generation_tokens, **self.labels).inc(n)
            if gap_s is not None:
                self._child(self.itl, **self.labels).observe(gap_s)

    def on_finished(self, reason: str, e2e_s: float, cached_tokens: int) -> None:
        if self.options.flavor == "sglang":
            self._child(self.requests, model_name=self.options.model, engine_type="unified").inc()
            self._child(self.cached_total, **self.labels, cache_source="device").inc(cached_tokens)
            self._child(self.cached_total, **self.labels, cache_source="total").inc(cached_tokens)
        else:
            self._child(self.success, **self.labels, finished_reason=reason).inc()
            self._child(self.e2e, **self.labels).observe(e2e_s)

    def on_preempted(self) -> None:
        if self.options.flavor == "vllm":
            self._child(self.preemptions, **self.labels).inc()

    def on_spec_step(self, draft_tokens: int, accepted: int) -> None:
        """One verify step of one sequence: `draft_tokens` proposed, the first `accepted` kept."""
        if not self.spec:
            return
        if self.options.flavor == "sglang":
            self._spec_forwards += 1
            self._spec_tokens += accepted + 1
            self._child(self.verify_calls, model_name=self.options.model, engine_type="unified").inc()
            self._child(self.accept_length, **self.labels).set(self._spec_tokens / self._spec_forwards)
            return
        self._child(self.drafts, **self.labels).inc()
        self._child(self.draft_tokens, **self.labels).inc(draft_tokens)
        self._child(self.accepted, **self.labels).inc(accepted)
        for pos in range(accepted):
            self._child(self.accepted_pos, **self.labels, position=str(pos)).inc()

    def render(self) -> tuple[bytes, str]:
        running, waiting, usage = self.gauges()
        self._child(self.running, **self.labels).set(running)
        self._child(self.waiting, **self.labels).set(waiting)
        if self.options.flavor == "vllm":
            self._child(self.waiting_by_reason, **self.labels, reason="capacity").set(waiting)
            self._child(self.waiting_by_reason, **self.labels, reason="deferred").set(0)
        self._child(self.kv_usage, **self.labels).set(usage)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
