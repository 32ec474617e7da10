"""The doctor's procedure: quiet gate → calibrate → same prompt N times → two-point → ladder.

I/O lives here and in probe/metrics; every judgement is delegated to `verdict` (pure). The result
is one `CheckResult` that the report renders as a table or as one JSON object.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Protocol

import httpx

from app.doctor import document, verdict
from app.doctor.metrics import EngineSnapshot, counters_delta, read_metrics
from app.doctor.probe import (
    Endpoint,
    ProbeError,
    ProbeResult,
    health,
    list_models,
    stream_chat,
    tokenize_count,
)

# Two small first requests: tokens-per-word of this endpoint's tokenizer and the fixed overhead
# (chat template, header and question lines), fitted as a line.
CALIBRATION_TOKENS = (256, 1024)
SIZING_ROUNDS = 4  # /tokenize corrections per document
SIZING_TOLERANCE = 0.005  # a sized document lands within 0.5% under its target
TOKENIZE_AGREEMENT = 0.02  # /tokenize vs usage.prompt_tokens for the same document
PROBE_MAX_TOKENS = 8  # the repeated-prompt calls only need a first token
LADDER_MAX_TOKENS = 8
LADDER_CAP_MARGIN = 0.01  # calibration error seen on 8k-32k documents: well under 0.5%
LADDER_RETRY_SHRINK = 0.03  # the top rung's one retry without /tokenize
LADDER_DETAIL_CHARS = 160
LADDER_NO_LIMIT_CAP = 1 << 20  # climb until something fails when nobody says where the limit is


class ProgressSink(Protocol):
    def stage(self, label: str, total: int) -> None: ...

    def advance(self) -> None: ...


class NullProgress:
    def stage(self, label: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass


@dataclass
class CheckOptions:
    url: str
    model: str | None = None
    api_key: str | None = None
    prompt_tokens: int = 8000
    repeats: int = 3  # sends of the identical prompt: 1 cold + (repeats-1) warm
    warmups: int = 3  # per two-point point
    measurements: int = 5  # per two-point point
    short_tokens: int = 64
    long_tokens: int = 320
    two_point: bool = True
    ladder: bool = False
    ladder_max_tokens: int | None = None
    ladder_factor: float = 2.0
    force: bool = False
    timeout_s: float = 1200.0


# The TTFT ledger's queue and prefill parts need them (docs/ttft-ledger.md).
PER_REQUEST_METRICS_HINT = ("vLLM reports no per-request metrics: start it with --enable-per-request-metrics "
                            "(and without --disable-log-stats) for the TTFT ledger's queue and prefill parts")


@dataclass
class CheckResult:
    url: str
    model: str | None = None
    engine: str | None = None
    measured: bool = False
    refused: str | None = None  # why nothing was measured
    max_model_len: int | None = None
    block_size: int | None = None
    prefix_caching_enabled: bool | None = None
    prompt_tokens: int | None = None  # the probe document as the engine counted it
    ttfts: list[float] = field(default_factory=list)
    cached_tokens: list[int | None] = field(default_factory=list)
    per_request_metrics: bool | None = None  # the answers carried vLLM's `metrics` object
    cache: verdict.CacheVerdict | None = None
    counters: verdict.CacheCounters | None = None
    decode: verdict.TwoPoint | None = None
    naive_decode_tps: float | None = None
    ladder_steps: list[verdict.LadderStep] = field(default_factory=list)
    ladder: verdict.LadderSummary | None = None
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return verdict.exit_code(self.measured, self.problems)


async def run_check(opts: CheckOptions, progress: ProgressSink | None = None,
                    transport: httpx.AsyncBaseTransport | None = None) -> CheckResult:
    """The whole check. `transport` lets tests stand in for the endpoint (httpx.MockTransport)."""
    sink = progress or NullProgress()
    endpoint = Endpoint.from_url(opts.url, opts.api_key)
    result = CheckResult(url=endpoint.root)
    timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
        try:
            await _run(client, endpoint, opts, result, sink)
        except ProbeError as exc:
            result.measured = False
            result.refused = result.refused or f"could not measure: {exc.message}"
    return result


async def _run(client: httpx.AsyncClient, endpoint: Endpoint, opts: CheckOptions, result: CheckResult,
               sink: ProgressSink) -> None:
    await _pick_model(client, endpoint, opts, result)
    assert result.model is not None
    model = result.model

    snapshot = await read_metrics(client, endpoint.root, endpoint.headers)
    _describe_engine(result, snapshot)
    if snapshot is not None and snapshot.busy and not opts.force:
        result.refused = (
            f"the engine is busy (running={snapshot.running or 0:.0f}, waiting={snapshot.waiting or 0:.0f}): "
            "measuring on top of other traffic measures the queue, not the model; retry when idle or --force"
        )
        return
    if snapshot is not None and snapshot.busy:
        result.warnings.append("measured on a busy engine (--force): timings include queueing")

    sizer = Sizer(client, endpoint, model)
    await sizer.calibrate(opts.prompt_tokens)

    # 1. the same prompt, several times
    doc, words = await sizer.document(opts.prompt_tokens, document.new_nonce())
    sink.stage(f"same prompt x{opts.repeats} (~{opts.prompt_tokens} tokens)", opts.repeats)
    before = await read_metrics(client, endpoint.root, endpoint.headers)
    probes: list[ProbeResult] = []
    for _ in range(opts.repeats):
        probes.append(await stream_chat(client, endpoint, model, doc, PROBE_MAX_TOKENS))
        sink.advance()
    after = await read_metrics(client, endpoint.root, endpoint.headers)
    _record_cache(result, probes, before, after)
    if not sizer.agrees_with_usage(result.prompt_tokens):
        result.warnings.append("/tokenize disagrees with usage.prompt_tokens: sizing by calibration instead")
    sizer.calibration.observe(words, result.prompt_tokens)

    # 2. two-point prefill/decode on the (now warm) same prompt
    if opts.two_point:
        try:
            await _two_point(client, endpoint, model, doc, opts, result, sink)
        except ProbeError as exc:  # the cache verdict above still stands
            result.problems.append(f"two-point measurement failed: {exc.message}")

    # 3. the length ladder
    if opts.ladder:
        await _ladder(client, endpoint, model, opts, result, sizer, sink)

    result.measured = True
    _collect_problems(result)


async def _pick_model(client: httpx.AsyncClient, endpoint: Endpoint, opts: CheckOptions,
                      result: CheckResult) -> None:
    try:
        models = await list_models(client, endpoint)
    except ProbeError:
        if not opts.model:
            raise
        models = []
    chosen = next((m for m in models if m.id == opts.model), None) if opts.model else (models[0] if models else None)
    if chosen is None and not opts.model:
        raise ProbeError("GET /v1/models listed no model; pass --model")
    result.model = opts.model or (chosen.id if chosen else None)
    result.max_model_len = chosen.max_model_len if chosen else None


def _describe_engine(result: CheckResult, snapshot: EngineSnapshot | None) -> None:
    if snapshot is None:
        result.engine = "unknown"
        result.warnings.append("no /metrics: cannot check the engine is idle nor read its cache counters")
        return
    result.engine = snapshot.engine
    result.block_size = snapshot.block_size
    result.prefix_caching_enabled = snapshot.prefix_caching_enabled


class Sizer:
    """Builds probe documents of a target token length for this endpoint's (unknown) tokenizer.

    With the engine's POST /tokenize (vLLM, SGLang) a document is corrected until it lands just
    under the target — the ladder's top rung must not overshoot max_model_len. Without it the
    calibration line (fitted from usage.prompt_tokens) sizes documents to within a few percent.
    """

    def __init__(self, client: httpx.AsyncClient, endpoint: Endpoint, model: str) -> None:
        self.client, self.endpoint, self.model = client, endpoint, model
        self.calibration = document.Calibration()
        self.tokenize_works: bool | None = None
        self.last_count: int | None = None

    async def count(self, text: str) -> int | None:
        if self.tokenize_works is False:
            return None
        count = await tokenize_count(self.client, self.endpoint, self.model, text)
        words = len(text.split())
        # An endpoint whose /tokenize ignores chat messages answers something implausible: stop asking.
        self.tokenize_works = count is not None and words / 4 <= count <= words * 4 + 64
        self.last_count = count if self.tokenize_works else None
        return self.last_count

    def agrees_with_usage(self, prompt_tokens: int | None) -> bool:
        """After a real request: /tokenize must have counted what the engine then prefilled."""
        if self.last_count is None or not prompt_tokens:
            return True
        if abs(self.last_count - prompt_tokens) > TOKENIZE_AGREEMENT * prompt_tokens:
            self.tokenize_works = False
            return False
        return True

    async def calibrate(self, prompt_tokens: int) -> None:
        """Two small documents (fresh nonces, so the probe's prefix stays cold) fit the line."""
        small, large = CALIBRATION_TOKENS
        for tokens in (min(small, max(32, prompt_tokens // 4)), min(large, max(128, prompt_tokens))):
            words = document.Calibration().words_for(tokens)
            text = document.build_document(words, document.new_nonce())
            count = await self.count(text)
            if count is None:
                count = (await stream_chat(self.client, self.endpoint, self.model, text, 1)).prompt_tokens
            self.calibration.observe(words, count)

    async def document(self, target: int, nonce: str) -> tuple[str, int]:
        """(text, words) of about `target` tokens; at most `target` when /tokenize is available."""
        words = self.calibration.words_for(target)
        text = document.build_document(words, nonce)
        for _ in range(SIZING_ROUNDS):
            count = await self.count(text)
            if count is None:
                break
            if target * (1 - SIZING_TOLERANCE) <= count <= target:
                break
            per_word, _ = self.calibration.line()
            # Same nonce, more words extends the same word stream: a local correction converges.
            words = max(1, words + int((target - count) / per_word) - (1 if count > target else 0))
            text = document.build_document(words, nonce)
        return text, words


def _record_cache(result: CheckResult, probes: list[ProbeResult], before: EngineSnapshot | None,
                  after: EngineSnapshot | None) -> None:
    result.ttfts = [p.ttft_s if p.ttft_s is not None else p.total_s for p in probes]
    result.cached_tokens = [p.cached_tokens for p in probes]
    result.per_request_metrics = any(p.engine_timing is not None for p in probes)
    result.prompt_tokens = probes[0].prompt_tokens
    counters = counters_delta(before, after)
    if counters is None and all(c is not None for c in result.cached_tokens) and probes[0].prompt_tokens:
        # No engine counters, but the engine reports cached tokens per request: the same evidence.
        counters = verdict.CacheCounters(
            queries=float(sum(p.prompt_tokens or 0 for p in probes)),
            hits=float(sum(c or 0 for c in result.cached_tokens)),
        )
    result.counters = counters
    if after is not None and after.prefix_caching_enabled is not None:
        result.prefix_caching_enabled = after.prefix_caching_enabled
    result.cache = verdict.cache_verdict(result.ttfts, counters, result.prefix_caching_enabled)


async def _two_point(client: httpx.AsyncClient, endpoint: Endpoint, model: str, doc: str, opts: CheckOptions,
                     result: CheckResult, sink: ProgressSink) -> None:
    points = []
    naive: list[float] = []
    for max_tokens in (opts.short_tokens, opts.long_tokens):
        sink.stage(f"two-point: max_tokens={max_tokens}", opts.warmups + opts.measurements)
        for _ in range(opts.warmups):
            await stream_chat(client, endpoint, model, doc, max_tokens)
            sink.advance()
        samples: list[tuple[float, int | None]] = []
        for _ in range(opts.measurements):
            probe = await stream_chat(client, endpoint, model, doc, max_tokens)
            samples.append((probe.total_s, probe.completion_tokens))
            if max_tokens == opts.long_tokens:
                rate = verdict.naive_decode_tps(probe.text_event_times)
                if rate is not None:
                    naive.append(rate)
            sink.advance()
        points.append(verdict.point_stats(max_tokens, samples))
    result.decode = verdict.two_point(points[0], points[1])
    result.naive_decode_tps = statistics.median(naive) if naive else None


def ladder_cap(opts: CheckOptions, max_model_len: int | None) -> int:
    """Highest prompt length to try: the model's context minus room for the answer, or
    --max-tokens-ladder; never past LADDER_NO_LIMIT_CAP unless --max-tokens-ladder says so (an
    endpoint that claims a context of 10**30 tokens and accepts anything must not make the check
    build documents without end)."""
    if opts.ladder_max_tokens:
        limits = [opts.ladder_max_tokens]
    else:
        limits = [LADDER_NO_LIMIT_CAP]
    if max_model_len:
        # Aim a little under the hard limit: the document is sized by calibration, and a rung that
        # overshoots by a handful of tokens would be rejected and hide the real ceiling.
        limits.append(int((max_model_len - LADDER_MAX_TOKENS) * (1 - LADDER_CAP_MARGIN)))
    return min(limits)


async def _ladder(client: httpx.AsyncClient, endpoint: Endpoint, model: str, opts: CheckOptions,
                  result: CheckResult, sizer: Sizer, sink: ProgressSink) -> None:
    cap = ladder_cap(opts, result.max_model_len)
    rungs = verdict.ladder_lengths(opts.prompt_tokens, cap, opts.ladder_factor)
    sink.stage(f"length ladder up to {cap} tokens", len(rungs))
    for target in rungs:
        step = await _sized_ladder_step(client, endpoint, model, sizer, target)
        if step.outcome == "rejected" and target == cap and sizer.tokenize_works is False:
            # Sized by calibration alone, the top rung may overshoot the limit by a few percent:
            # one retry a little lower, so the ceiling is not reported a whole rung too low.
            first = step
            step = await _sized_ladder_step(client, endpoint, model, sizer, int(target * (1 - LADDER_RETRY_SHRINK)))
            step = replace(step, detail=f"{step.detail} (retried lower after: {first.detail})".strip())
        result.ladder_steps.append(step)
        sink.advance()
        if step.outcome != "ok":
            break
    result.ladder = verdict.summarize_ladder(result.ladder_steps, cap)


async def _sized_ladder_step(client: httpx.AsyncClient, endpoint: Endpoint, model: str, sizer: Sizer,
                             target: int) -> verdict.LadderStep:
    # A fresh nonce per rung: each rung pays its full prefill instead of reusing the previous one.
    text, words = await sizer.document(target, document.new_nonce())
    step = await _ladder_step(client, endpoint, model, text, target)
    sizer.calibration.observe(words, step.prompt_tokens)
    return step


async def _ladder_step(client: httpx.AsyncClient, endpoint: Endpoint, model: str, text: str,
                       target: int) -> verdict.LadderStep:
    try:
        probe = await stream_chat(client, endpoint, model, text, LADDER_MAX_TOKENS)
    except ProbeError as exc:
        detail = exc.message[:LADDER_DETAIL_CHARS]
        alive = await health(client, endpoint)
        if alive is False:
            return verdict.LadderStep(target, None, "unhealthy", detail)
        if exc.status is not None and 400 <= exc.status < 500:
            return verdict.LadderStep(target, None, "rejected", detail)
        return verdict.LadderStep(target, None, "failed", detail)
    if await health(client, endpoint) is False:
        return verdict.LadderStep(target, probe.prompt_tokens, "unhealthy", "request passed, /health failed after",
                                  probe.total_s)
    return verdict.LadderStep(target, probe.prompt_tokens, "ok", "", probe.total_s)


def _collect_problems(result: CheckResult) -> None:
    if result.per_request_metrics is False and result.engine == "vllm":
        result.warnings.append(PER_REQUEST_METRICS_HINT)
    if result.cache is not None and result.cache.verdict == "off":
        result.problems.append("prefix caching is OFF")
    elif result.cache is not None and result.cache.verdict == "unclear":
        result.problems.append("prefix caching could not be confirmed (unclear)")
    if result.decode is not None:
        result.warnings.extend(result.decode.warnings)
        if not (result.decode.short.consistent and result.decode.long.consistent):
            result.problems.append("completion token counts differ across repeats (ignore_eos not honoured?)")
    if result.ladder is not None and result.ladder.problem:
        result.problems.append(f"length ladder: {result.ladder.stopped}")
