"""Settings: a YAML file, then `PREFIXGATE_<SECTION>__<KEY>` env, then CLI flags (highest), always.

The key names are a contract (docs/operations.md, the Helm chart's ConfigMap and the README use
them). Add keys freely; rename none. Every section forbids unknown keys and `load_settings` refuses
unknown `PREFIXGATE_*` variables, so a typo or a section this version lacks stops the start with
one line naming the key (`ConfigError`) instead of being silently ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from app.prefix.budget import DEFAULT_BUDGET_MB

TenantPolicy = Literal["observe", "warn", "rewrite", "reject"]
RoutingPolicy = Literal["round_robin", "least_load", "session", "prefix_affinity"]
EngineKind = Literal["auto", "vllm", "sglang"]

DEFAULT_BLOCK_SIZE = 16  # vLLM CacheConfig.DEFAULT_BLOCK_SIZE
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
ENV_PREFIX = "PREFIXGATE_"
# PREFIXGATE_* names the project's own tooling reads that are not settings (tests/, bench/)
TOOL_ENV = frozenset({"PREFIXGATE_REDIS_SERVER", "PREFIXGATE_VLLM_VENV", "PREFIXGATE_E2E_MODEL",
                      "PREFIXGATE_E2E_LOGS"})
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class ConfigError(ValueError):
    """A configuration the gateway must not start with; the message is one line naming the key."""


class Section(BaseModel):
    """Every config section: unknown keys are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


def check_url(url: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """`url` when it is scheme://host[:port][/path] with a valid port; ValueError otherwise."""
    if any(c.isspace() for c in url):
        raise ValueError(f"{url!r} contains whitespace")
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        raise ValueError(f"{url!r} is not a {'/'.join(schemes)} URL")
    if not parts.hostname or "@" in parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{url!r} is not scheme://host[:port][/path]")
    try:
        parts.port  # noqa: B018 -- raises on a non-numeric or out-of-range port
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    if ":" in parts.path or "//" in parts.path:
        raise ValueError(f"{url!r} is not scheme://host[:port][/path]")
    return url


def check_dns_name(name: str) -> str:
    """`name` when it is a valid DNS name (RFC 1123 labels); ValueError otherwise."""
    labels = name.rstrip(".").split(".")
    if not name or len(name) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{name!r} is not a valid DNS name")
    return name


class Listen(Section):
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)


class Backend(Section):
    url: str
    name: str | None = None
    engine: EngineKind = "auto"
    block_size: int | None = None  # None: from vllm:cache_config_info, else routing.block_size
    kv_blocks: int | None = None  # None: num_gpu_blocks from cache_config_info, else routing.kv_blocks

    @field_validator("url")
    @classmethod
    def _valid_url(cls, url: str) -> str:
        return check_url(url)

    def display_name(self) -> str:
        return self.name or self.url.split("://", 1)[-1].rstrip("/")


class Discovery(Section):
    dns: str
    port: int = Field(default=8000, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(default=10.0, gt=0)

    @field_validator("dns")
    @classmethod
    def _valid_dns(cls, name: str) -> str:
        return check_dns_name(name)


class RoutingWeights(Section):
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


class Lanes(Section):
    """The long-prefill lane (app/routing/lanes.py, docs/admission.md): requests predicted to
    prefill more than `long_prefill_tokens` go to `replicas` (names) when set; otherwise the
    fleet is shared and long prefills may hold at most `max_share` of the replicas at once.
    `auto` (the default) derives each from the predicted prefill of the last `window` requests."""

    long_prefill_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    replicas: list[str] = Field(default_factory=list)
    max_share: Annotated[float, Field(gt=0, le=1)] | Literal["auto"] = "auto"
    window: int = Field(default=512, ge=16)  # recent requests the `auto` values are derived from
    # `auto` never calls a prefill long below this: one engine step (max_num_batched_tokens) of it
    # is done within a step and holds no replica long
    min_long_prefill_tokens: int = Field(default=2048, ge=1)



# where a session id may come from (app/routing/session_keys.py reads each; docs/routing.md)
SessionKeySource = Literal["header", "prompt_cache_key", "session_id_header", "claude_code_header",
                           "metadata_user_id"]
DEFAULT_SESSION_KEYS: tuple[SessionKeySource, ...] = (
    "header", "prompt_cache_key", "session_id_header", "claude_code_header", "metadata_user_id")


class MigrateMidstream(Section):
    """Continue a stream whose replica broke mid-answer on another replica (app/proxy/migrate.py,
    docs/relay.md). Off by default: it needs engines that continue a final assistant message
    (vLLM's `continue_final_message`); a stream that may be continued is asked for usage on every
    chunk (`continuous_usage_stats`, the count of tokens already sent), which the client does not
    see unless it asked for it."""

    enabled: bool = False
    max_attempts: int = Field(default=2, ge=1, le=8)  # continuations per request, each on a fresh replica


class Routing(Section):
    migrate_midstream: MigrateMidstream = Field(default_factory=MigrateMidstream)
    lanes: Lanes | None = None  # None: no long-prefill lane
    policy: RoutingPolicy = "prefix_affinity"
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_blocks: int = 4096  # residency-index capacity per replica when the engine does not say
    index_ttl_s: float = 3600.0
    session_header: str = "x-session-id"
    # where a session id may come from, first found wins (app/routing/session_keys.py,
    # docs/routing.md); empty: no session affinity under prefix_affinity
    session_keys: list[SessionKeySource] = Field(default_factory=lambda: list(DEFAULT_SESSION_KEYS))
    kv_events: bool = False  # subscribe to the replicas' ZMQ KV events (precise residency)
    kv_events_endpoints: dict[str, str] = Field(default_factory=dict)  # backend name -> tcp://host:port
    health_interval_s: float = 5.0
    max_retries: int = 2  # other replicas tried when one fails before the first byte
    weights: RoutingWeights = Field(default_factory=RoutingWeights)

    @field_validator("kv_events_endpoints")
    @classmethod
    def _valid_endpoints(cls, endpoints: dict[str, str]) -> dict[str, str]:
        for url in endpoints.values():
            check_url(url, ("tcp",))
        return endpoints


class CacheSalt(Section):
    enabled: bool = False
    secret_env: str = "PREFIXGATE_SALT_SECRET"
    client_salt: Literal["replace", "reject"] = "replace"


class TenantLimits(Section):
    """Admission limits (app/admission/): None = no limit of that kind. Global across gateway
    pods when `state` is Redis; each pod's share of it when Redis is unreachable."""

    requests_per_s: float | None = Field(default=None, gt=0)
    prompt_tokens_per_min: int | None = Field(default=None, gt=0)
    concurrent: int | None = Field(default=None, gt=0)


class TenantOverride(Section):
    policy: TenantPolicy = "observe"
    limits: TenantLimits = Field(default_factory=TenantLimits)
    priority: int = 0  # higher is served first within a tenant's queue share (header overrides)
    weight: float = Field(default=1.0, gt=0)  # weighted fair share of the gateway queue


class Tenants(Section):
    header: str = "x-tenant-id"
    api_keys: dict[str, str] = Field(default_factory=dict)  # key -> tenant; non-empty = keys required
    default: TenantOverride = Field(default_factory=TenantOverride)
    overrides: dict[str, TenantOverride] = Field(default_factory=dict)
    cache_salt: CacheSalt = Field(default_factory=CacheSalt)
    max_tenants: int = 10_000  # tracked tenants (LRU)

    def policy_for(self, tenant: str) -> TenantPolicy:
        override = self.overrides.get(tenant)
        return override.policy if override else self.default.policy

    def config_for(self, tenant: str) -> TenantOverride:
        return self.overrides.get(tenant) or self.default


class Metrics(Section):
    tenant_label_cap: int = 100


class Rewrites(Section):
    move_dynamic: bool = True
    sort_tools: bool = True
    canonical_json: bool = False
    move_target: Literal["last_user", "system_end"] = "last_user"
    max_moved_lines: int = 8
    strip_billing_header: bool = True  # drop Claude Code's billing-header block (docs/agents-apis.md)


class Hygiene(Section):
    show_text: bool = False
    rewrites: Rewrites = Field(default_factory=Rewrites)
    dynamic_patterns: list[str] = Field(default_factory=list)  # extra regexes for the detector
    flag_unsorted_tools: bool = False  # unsorted tools are a finding even when their order is stable


class Limits(Section):
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0  # between two upstream reads
    first_byte_timeout_s: float = 600.0


class Upstream(Section):
    api_key: str | None = None  # when set, replaces the client's Authorization upstream


class Scrape(Section):
    interval_s: float = 5.0
    timeout_s: float = 2.0
    window_s: float = 60.0  # engine hit ratio / acceptance length / prediction fidelity window
    jitter: float = 0.2  # each interval is interval_s * uniform(1 - jitter, 1 + jitter)
    max_bytes: int = 8 * 1024 * 1024  # a larger /metrics body is refused (counts as a failed scrape)


class StateOptions(Section):
    redis_timeout_s: float = 0.05  # budget for the one pre-forward round trip
    redis_timeout_per_1k_blocks_s: float = 0.002  # the lookup's budget grows with the chain sent
    key_ttl_s: float = 3600.0
    # an add to a replica's residency set in Redis does not rewrite the head of a chain used within
    # this many seconds, only the blocks after it: recency exact to this much, a write per new block
    # rather than per block (docs/routing.md, "The Redis set"); 0: every add rewrites the whole chain
    residency_refresh_s: float = Field(default=1.0, ge=0)
    namespace: str = "prefixgate"  # keys are <namespace>:v1:...; gateways sharing a Redis may differ
    control_timeout_s: float = 1.0  # budget for batched writes, hygiene reads and reconnect probes
    flush_interval_s: float = 0.0  # extra wait to gather writes; 0: writes queued while a batch is in flight form the next one
    max_pending_writes: int = 1_000_000  # queued write weight (ops + blocks) kept through an outage
    stall_s: float = 0.5  # after an over-budget call, a PING unanswered this long: local-only mode
    reconnect_backoff_s: float = 0.1  # first reconnect delay; doubles up to reconnect_backoff_max_s
    reconnect_backoff_max_s: float = 5.0


class Prefix(Section):
    """Fingerprints (app/prefix/fingerprint.py) and the per-tenant continuity tracker; what they
    may keep in memory is a share of `memory.budget_mb` (app/prefix/budget.py)."""

    mode: Literal["auto", "exact", "engine", "approx"] = "auto"  # auto: exact, approx if no tokenizer
    inline_chars: int = 2048  # missing segments up to this size are encoded on the hot path
    inline_hash_tokens: int = 16_384  # known segments up to this many tokens are hashed inline
    workers: int = 2  # tokenisation worker threads
    # cold prompts (nothing memoised to reuse) are tokenised in this many processes; auto: the
    # cores the serving processes leave spare (app/prefix/pool.py); 0: in the worker threads
    cold_pool_workers: int | Literal["auto"] = "auto"
    cold_pool_inflight: int = Field(default=2, ge=1)  # admitted per process; past it: approx
    # a request routed approx (the pool was full) waits after its response at most this for a slot,
    # so that the chain the engine cached is still learned; 0: one try (app/prefix/pool.py)
    cold_pool_defer_s: float = Field(default=30.0, ge=0)
    # smaller cold work stays in the worker threads; auto: 256 KiB with the fast BPE encoder, which
    # holds the GIL ~1 ms per 100 KB, else 64 KiB (app/prefix/pool.py)
    cold_pool_min_chars: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    # a prompt waits at most this for a tokenisation it depends on: the one it continues, or that of a
    # request with the same head whose response has ended (app/pipeline/prefix_stage.py, `_wait_for_predecessor`)
    pending_wait_ms: float = 50.0
    # a prompt the hot path could not fingerprint far enough to route (a long conversation this
    # process never walked) waits at most this for its tokenisation when the residency index is
    # shared (Redis, serve --workers, KV events): another process may have placed its prefix
    blind_wait_ms: float = Field(default=250.0, ge=0)
    tracker_texts_per_tenant: int = 4  # (the bytes all tenants' texts may hold: memory.budget_mb)
    # the share of one core (per process) the diagnoses of breaks may take on average; past it a break
    # is recorded undiagnosed until the share is back (app/cpu_budget.py); 0: none is diagnosed
    diagnosis_cpu_share: float = Field(default=0.5, ge=0, le=1)
    window: int = 64  # requests per tenant the /hygiene continuity is computed over
    last_breaks: int = 5  # breaks listed per tenant in /hygiene
    # Claude Code's billing-header system block on /v1/messages: does the engine drop it before
    # tokenising (docs/agents-apis.md)? auto: yes, unless every replica of a known engine is SGLang
    billing_header: Literal["auto", "strip", "keep"] = "auto"


class Memory(Section):
    """One bound on what the gateway keeps between requests (docs/memory.md, app/prefix/budget.py)."""

    # 512Mi Helm request = this + a fixed base (~100 MB interpreter, libraries, tokenizer) + headroom
    budget_mb: int = Field(default=DEFAULT_BUDGET_MB, ge=8)


class Ui(Section):
    """The hygiene explorer page at /ui (docs/ui.md)."""

    grafana_url: str | None = None  # http(s) link to the Grafana dashboards, shown in the page header
    refresh_s: float = 5.0  # the page re-reads its JSON this often (0: no auto-refresh)


class AdmissionQueue(Section):
    max_depth: int = Field(default=256, ge=0)  # 0: no queue, a saturated fleet answers 503 at once
    ttl_s: float = Field(default=10.0, gt=0)


class Admission(Section):
    """Per-tenant limits and the gateway queue (app/admission/, docs/admission.md)."""

    enabled: bool = True  # limits apply only where tenants.*.limits set them
    queue: AdmissionQueue = Field(default_factory=AdmissionQueue)
    # a replica is saturated when its engine reports more than this many waiting requests, or
    # (no scrape yet) the gateway has more than `saturated_inflight` requests in flight on it
    saturated_waiting: int = Field(default=8, ge=0)
    saturated_inflight: int = Field(default=64, ge=1)
    # or its prefill backlog routed from this pod (prompt tokens before their first token) exceeds
    # this; None: not a criterion. Queued requests then leave cheapest predicted prefill first
    saturated_prefill_tokens: int | None = Field(default=None, ge=0)  # 0: any prefill not yet started
    priority_header: str = "x-priority"
    pods: int = Field(default=1, ge=1)  # gateway pods sharing the limits: a pod's share when Redis is down
    lease_ttl_s: float = Field(default=30.0, gt=0)  # concurrency lease, renewed while the stream runs


class Tracing(Section):
    enabled: bool = False  # exporter configured by the standard OTEL_* env


class AdminListen(Section):
    host: str = "0.0.0.0"
    port: int = Field(ge=1, le=65535)


class Admin(Section):
    """The operator surface (/metrics, /hygiene/*, /ui and the other control-plane JSON; not the
    probes /healthz, /health, /readyz, nor /v1/models). With `listen` set it is served only on that
    port and the data port answers 404 for it; otherwise it shares the data port and, when
    tenants.api_keys is set (or a token is), needs `Authorization: Bearer <token>` from `token_env`."""

    listen: AdminListen | None = None
    token_env: str = "PREFIXGATE_ADMIN_TOKEN"  # the variable holding the admin token (never the file)


class Shutdown(Section):
    """SIGTERM drains (docs/operations.md): /readyz answers 503 at once, new connections are
    accepted for `accept_s` (while the endpoints drop the pod), in-flight requests run to their end
    until `grace_s` after the signal; what is still open then is ended with its route's error."""

    accept_s: float = Field(default=5.0, ge=0)
    grace_s: float = Field(default=600.0, gt=0)  # agent streams run for minutes


class Epp(Section):
    """`prefixgate epp` (docs/epp.md): the ext_proc gRPC port (TLS: the given certificate, else a
    self-signed one made at start; `tls: false` for plaintext), and the gRPC health port."""

    grpc_port: int = Field(default=9002, ge=0, le=65535)
    health_port: int = Field(default=9003, ge=0, le=65535)
    host: str = "0.0.0.0"
    tls: bool = True
    cert_file: str | None = None
    key_file: str | None = None
    pool: str | None = None  # an InferencePool's name: its pods become the backends (app/epp/pool.py)
    pool_namespace: str | None = None  # default: the pod's own namespace (service account)
    kube_api: str | None = None  # default: the in-cluster API server (service account token and CA)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid")

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
    admin: Admin = Field(default_factory=Admin)
    shutdown: Shutdown = Field(default_factory=Shutdown)
    epp: Epp = Field(default_factory=Epp)
    admission: Admission = Field(default_factory=Admission)

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


class _Explicit(Settings):
    """Settings from explicit values only (no env source): `load_settings` reads each source itself
    so that it can name the source of an error and apply the precedence without guessing."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _explicit(data: dict[str, Any], source: str, env: bool = False) -> Settings:
    try:
        return _Explicit(**data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, source, env)) from None


def _one_line(exc: ValidationError, source: str, env: bool) -> str:
    errors = exc.errors()
    loc = [str(p) for p in errors[0]["loc"]]
    if env:
        key = ENV_PREFIX + "__".join(p.upper() for p in loc)
    else:
        key = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc).lstrip(".")
    if errors[0]["type"] == "extra_forbidden":
        message = "unknown key"
    else:
        message = " ".join(str(errors[0]["msg"]).removeprefix("Value error, ").split())
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {key}: {message}{more}"


def _env_data() -> dict[str, Any]:
    """The settings given as PREFIXGATE_* variables, exactly those (a value equal to the default
    still counts). A variable naming no section is a ConfigError, except the names the project's
    tooling reads and the names `*_env` settings point at (secrets)."""
    referenced = set(_env_references(Settings.model_construct()))
    for name in os.environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in TOOL_ENV or upper in referenced:
            continue
        section = upper[len(ENV_PREFIX):].split("__", 1)[0].lower()
        if section not in Settings.model_fields:
            raise ConfigError(f"environment: {name}: unknown key")
    return EnvSettingsSource(Settings)()


def _env_references(model: BaseModel) -> list[str]:
    """Values of every `*_env` field (names of variables holding secrets), nested sections included."""
    out: list[str] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if name.endswith("_env") and isinstance(value, str):
            out.append(value.upper())
        elif isinstance(value, BaseModel):
            out.extend(_env_references(value))
    return out


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """File < env < explicit overrides (CLI flags), always; `None` overrides are ignored. Each source
    is checked on its own first, so an error names its key and where it came from."""
    data: dict[str, Any] = {}
    if config_file:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{config_file}: {' '.join(str(exc).split())}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_file}: top level must be a mapping")
        data = loaded
        _explicit(data, str(config_file))
    env_data = _env_data()
    _explicit(env_data, "environment", env=True)
    flags = {k: v for k, v in overrides.items() if v is not None}
    _explicit(flags, "command line")
    merged = _explicit(deep_merge(deep_merge(data, env_data), flags), "configuration")
    return Settings.model_validate(merged.model_dump())
