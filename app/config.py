"""Settings: a YAML file, then `PREFIXGATE_<SECTION>__<KEY>` env, then CLI flags (highest).

The key names are a contract (ARCHITECTURE.md, the Helm chart's ConfigMap and the docs use them).
Add keys freely; rename none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.prefix.budget import DEFAULT_BUDGET_MB

TenantPolicy = Literal["observe", "warn", "rewrite", "reject"]
RoutingPolicy = Literal["round_robin", "least_load", "session", "prefix_affinity"]
EngineKind = Literal["auto", "vllm", "sglang"]

DEFAULT_BLOCK_SIZE = 16  # vLLM CacheConfig.DEFAULT_BLOCK_SIZE
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class Listen(BaseModel):
    host: str = "0.0.0.0"
    port: int = 8080


class Backend(BaseModel):
    url: str
    name: str | None = None
    engine: EngineKind = "auto"
    block_size: int | None = None  # None: from vllm:cache_config_info, else routing.block_size
    kv_blocks: int | None = None  # None: num_gpu_blocks from cache_config_info, else routing.kv_blocks

    def display_name(self) -> str:
        return self.name or self.url.split("://", 1)[-1].rstrip("/")


class Discovery(BaseModel):
    dns: str
    port: int = 8000
    scheme: str = "http"
    interval_s: float = 10.0


class RoutingWeights(BaseModel):
    """prefix_affinity / least_load cost terms (app/routing/scorers.py); units: prefill tokens."""

    uncached: float = 1.0  # multiplier on the prompt tokens a replica would have to prefill
    backlog: float = 1.0  # multiplier on the replica's queued prompt tokens
    decode: float = 1.0  # multiplier on the decode-load term
    waiting_request_tokens: float = 2048.0  # an engine-reported waiting request, in prompt tokens
    decode_tokens_per_running: float = 256.0  # one running decode, in prompt tokens
    load_epsilon: float = 0.25  # bounded-load hashing slack (cold spread, session)
    cold_key_tokens: int = 4096  # cold prefixes hash on the chain over this many leading tokens
    cold_match_ratio: float = 0.25  # best fleet match below this share of the prompt = cold
    cold_slack_tokens: float = 2048.0  # cold placement: replicas within this of the least loaded


class Routing(BaseModel):
    policy: RoutingPolicy = "prefix_affinity"
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_blocks: int = 4096  # residency-index capacity per replica when the engine does not say
    index_ttl_s: float = 3600.0
    session_header: str = "x-session-id"
    kv_events: bool = False  # subscribe to the replicas' ZMQ KV events (precise residency)
    kv_events_endpoints: dict[str, str] = Field(default_factory=dict)  # backend name -> tcp://host:port
    health_interval_s: float = 5.0
    max_retries: int = 2  # other replicas tried when one fails before the first byte
    weights: RoutingWeights = Field(default_factory=RoutingWeights)


class CacheSalt(BaseModel):
    enabled: bool = False
    secret_env: str = "PREFIXGATE_SALT_SECRET"
    client_salt: Literal["replace", "reject"] = "replace"


class TenantOverride(BaseModel):
    policy: TenantPolicy = "observe"


class Tenants(BaseModel):
    header: str = "x-tenant-id"
    api_keys: dict[str, str] = Field(default_factory=dict)  # key -> tenant; non-empty = keys required
    default: TenantOverride = Field(default_factory=TenantOverride)
    overrides: dict[str, TenantOverride] = Field(default_factory=dict)
    cache_salt: CacheSalt = Field(default_factory=CacheSalt)
    max_tenants: int = 10_000  # tracked tenants (LRU)

    def policy_for(self, tenant: str) -> TenantPolicy:
        override = self.overrides.get(tenant)
        return override.policy if override else self.default.policy


class Metrics(BaseModel):
    tenant_label_cap: int = 100


class Rewrites(BaseModel):
    move_dynamic: bool = True
    sort_tools: bool = True
    canonical_json: bool = False
    move_target: Literal["last_user", "system_end"] = "last_user"
    max_moved_lines: int = 8


class Hygiene(BaseModel):
    show_text: bool = False
    rewrites: Rewrites = Field(default_factory=Rewrites)
    dynamic_patterns: list[str] = Field(default_factory=list)  # extra regexes for the detector
    flag_unsorted_tools: bool = False  # unsorted tools are a finding even when their order is stable


class Limits(BaseModel):
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0  # between two upstream reads
    first_byte_timeout_s: float = 600.0


class Upstream(BaseModel):
    api_key: str | None = None  # when set, replaces the client's Authorization upstream


class Scrape(BaseModel):
    interval_s: float = 5.0
    timeout_s: float = 2.0
    window_s: float = 60.0  # engine hit ratio / acceptance length / prediction fidelity window
    jitter: float = 0.2  # each interval is interval_s * uniform(1 - jitter, 1 + jitter)
    max_bytes: int = 8 * 1024 * 1024  # a larger /metrics body is refused (counts as a failed scrape)


class StateOptions(BaseModel):
    redis_timeout_s: float = 0.05  # budget for the one pre-forward round trip
    redis_timeout_per_1k_blocks_s: float = 0.002  # the lookup's budget grows with the chain sent
    key_ttl_s: float = 3600.0
    namespace: str = "prefixgate"  # keys are <namespace>:v1:...; gateways sharing a Redis may differ
    control_timeout_s: float = 1.0  # budget for batched writes, hygiene reads and reconnect probes
    flush_interval_s: float = 0.0  # extra wait to gather writes; 0: writes queued while a batch is in flight form the next one
    max_pending_writes: int = 1_000_000  # queued write weight (ops + blocks) kept through an outage
    stall_s: float = 0.5  # after an over-budget call, a PING unanswered this long: local-only mode
    reconnect_backoff_s: float = 0.1  # first reconnect delay; doubles up to reconnect_backoff_max_s
    reconnect_backoff_max_s: float = 5.0


class Prefix(BaseModel):
    """Fingerprints (app/prefix/fingerprint.py) and the per-tenant continuity tracker; what they
    may keep in memory is a share of `memory.budget_mb` (app/prefix/budget.py)."""

    mode: Literal["auto", "exact", "engine", "approx"] = "auto"  # auto: exact, approx if no tokenizer
    inline_chars: int = 2048  # missing segments up to this size are encoded on the hot path
    inline_hash_tokens: int = 16_384  # known segments up to this many tokens are hashed inline
    workers: int = 2  # tokenisation worker threads
    pending_wait_ms: float = 50.0  # a prompt continuing one still being tokenised waits at most this for it
    tracker_texts_per_tenant: int = 4  # (the bytes all tenants' texts may hold: memory.budget_mb)
    window: int = 64  # requests per tenant the /hygiene continuity is computed over
    last_breaks: int = 5  # breaks listed per tenant in /hygiene


class Memory(BaseModel):
    """One bound on what the gateway keeps between requests (docs/memory.md, app/prefix/budget.py)."""

    # 512Mi Helm request = this + a fixed base (~100 MB interpreter, libraries, tokenizer) + headroom
    budget_mb: int = Field(default=DEFAULT_BUDGET_MB, ge=8)


class Tracing(BaseModel):
    enabled: bool = False  # exporter configured by the standard OTEL_* env


class Ui(BaseModel):
    """The hygiene explorer page at /ui (docs/ui.md)."""

    grafana_url: str | None = None  # http(s) link to the Grafana dashboards, shown in the page header
    refresh_s: float = 5.0  # the page re-reads its JSON this often (0: no auto-refresh)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PREFIXGATE_", env_nested_delimiter="__", extra="ignore")

    listen: Listen = Field(default_factory=Listen)
    backends: list[Backend] = Field(default_factory=list)
    discovery: Discovery | None = None
    routing: Routing = Field(default_factory=Routing)
    tenants: Tenants = Field(default_factory=Tenants)
    tokenizer: str | None = None  # Hugging Face tokenizer dir; None = the built-in default
    state: str = "memory"  # or redis://host:6379/0
    state_options: StateOptions = Field(default_factory=StateOptions)
    metrics: Metrics = Field(default_factory=Metrics)
    hygiene: Hygiene = Field(default_factory=Hygiene)
    limits: Limits = Field(default_factory=Limits)
    upstream: Upstream = Field(default_factory=Upstream)
    scrape: Scrape = Field(default_factory=Scrape)
    tracing: Tracing = Field(default_factory=Tracing)
    prefix: Prefix = Field(default_factory=Prefix)
    memory: Memory = Field(default_factory=Memory)
    ui: Ui = Field(default_factory=Ui)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init (CLI flags and the YAML file, merged by load_settings) wins over env
        return (init_settings, env_settings)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, nested mappings merged key by key (neither input is modified): a file's
    `routing: {policy: x}` keeps the env's other routing keys; the test helpers build settings the same way."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """File < env < explicit overrides (CLI flags). `None` overrides are ignored."""
    data: dict[str, Any] = {}
    if config_file:
        loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{config_file}: top level must be a mapping")
        data = loaded
    env_only = Settings()  # env applied onto defaults
    env_data = env_only.model_dump(exclude_defaults=True)
    merged = deep_merge(data, env_data)
    merged = deep_merge(merged, {k: v for k, v in overrides.items() if v is not None})
    return Settings(**merged)
