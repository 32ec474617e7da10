"""Continuing a stream whose replica broke mid-answer on another replica (docs/relay.md:
"Migration").

When the upstream of a streamed chat or completions answer breaks after its first byte
(connection lost, read timeout), the client has whole events only (app/proxy/observer.py). The
gateway reads what the client got (`read_partial`), asks another replica to continue that answer
(`continuation_body`: chat adds the text so far as a final assistant message with vLLM's
`continue_final_message: true, add_generation_prompt: false`; completions append it to the
prompt; the token budget shrinks by the tokens already sent) and relays the continuation as the
same stream (`Splicer`: no second role chunk, the original id/created/model, usage summed). The
`Migrator` does the I/O: it reaches the router and the upstream client the attempt loop
(app/proxy/forward.py) already holds, and feeds the continuation through the same stream
observer, so the client still gets whole events only and one end.

Tokens already sent: the engine's own count. A stream that may be continued is asked for usage on
every chunk (`stream_options.continuous_usage_stats`, vLLM and SGLang; app/pipeline/body.py), and
the `RecordingObserver` takes it out of the client's events again unless the client asked for it
(`drop_chunk_usage`). Counting events instead is only a lower bound: vLLM merges tokens into one
event when its output outruns the stream, speculative decoding sends several, and an answer
continued with too large a budget runs past the client's `max_tokens`. A stream without the
count (an engine that ignores the option) falls back to counting events with generated text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import orjson

from app.proxy.clock import StreamClock
from app.proxy.observer import StreamObserver
from app.proxy.openai_shape import drop_chunk_usage
from app.proxy.shape import StreamShape, count
from app.proxy.sse import SSEParser
from app.proxy.upstream import UpstreamError, classify_exception, let_go
from app.routing.base import NoReplicaAvailable, RouteDecision, RouteRequest

if TYPE_CHECKING:
    from app.config import MigrateMidstream
    from app.dialects.base import Dialect
    from app.proxy.context import RequestContext
    from app.proxy.upstream import Upstream
    from app.routing.base import Router
    from app.routing.health import HealthChecker
    from app.routing.load import ReplicaLoad
    from app.telemetry.metrics import Metrics

MAX_RECORDED_BYTES = 8 * 1024 * 1024  # a longer stream is not continued (what was sent is not kept)
_DONE = b"[DONE]"
_CHAT_EXTRA = ("reasoning", "reasoning_content")
_EMPTY: tuple[Any, ...] = (None, "", [], {})


@dataclass
class Partial:
    """What the client got of a broken stream."""

    text: str = ""  # choice 0's generated text
    tokens: int = 0  # generated tokens sent (see the module docstring)
    content_events: int = 0
    usage: dict[str, Any] | None = None  # the last usage the stream carried (continuous usage stats)
    ids: dict[str, Any] | None = None  # the original id / created / model / system_fingerprint
    blocker: str | None = None  # why it cannot be continued (a metric reason), None when it can


def read_partial(dialect: Dialect, sent: bytes) -> Partial:
    """Read the whole events the client got (chat or completions) into a `Partial`."""
    p = Partial()
    for event in SSEParser().feed(sent):
        data = event.data
        if data is None:
            continue
        if data == _DONE:
            p.blocker = "finished"
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            p.blocker = "not_json"
            continue
        if not isinstance(obj, dict):
            p.blocker = "not_json"
            continue
        if "error" in obj and "choices" not in obj:
            p.blocker = "error_event"
            continue
        if p.ids is None and "id" in obj:
            p.ids = {k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj}
        usage = obj.get("usage")
        if isinstance(usage, dict) and count(usage.get("completion_tokens")) is not None:
            p.usage = usage
        choices = obj.get("choices") or []
        if not isinstance(choices, list):  # no stream this gateway can read back, nor continue
            p.blocker = "not_json"
            continue
        for choice in choices:
            _read_choice(dialect.chat_choices, choice, p)
    if p.usage is not None:
        p.tokens = p.usage["completion_tokens"]
    else:
        p.tokens = p.content_events
    return p


def _read_choice(chat: bool, choice: Any, p: Partial) -> None:
    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
        p.blocker = "n"
        return
    if choice.get("finish_reason") is not None:
        p.blocker = "finished"
    if not chat:
        text = choice.get("text")
    else:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if delta.get("tool_calls"):
            p.blocker = "tool_calls"  # an engine continues text, not a half-written tool call
        if any(isinstance(delta.get(k), str) and delta.get(k) for k in _CHAT_EXTRA):
            p.blocker = "reasoning"  # the reasoning part cannot be handed back as the final message
        text = delta.get("content")
    if isinstance(text, str) and text:
        p.text += text
        p.content_events += 1


def continuation_body(dialect: Dialect, body: dict[str, Any], partial: Partial) -> tuple[dict[str, Any] | None, str]:
    """The request that continues `partial` on another replica, or (None, why not)."""
    if partial.blocker is not None:
        return None, partial.blocker
    out = dict(body)
    if partial.text and dialect.chat_choices:
        messages = list(body.get("messages") or [])
        last = messages[-1] if messages else None
        if (body.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant"
                and isinstance(last.get("content"), str)):  # the client continues a message itself
            messages[-1] = {**last, "content": last["content"] + partial.text}
        else:
            messages.append({"role": "assistant", "content": partial.text})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    elif partial.text:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or body.get("echo"):
            return None, "prompt_shape"  # token-id or batched prompts, echo: not continued
        out["prompt"] = prompt + partial.text
    for key in ("max_tokens", "max_completion_tokens"):
        limit = out.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - partial.tokens < 1:
                return None, "budget"
            out[key] = limit - partial.tokens
    min_tokens = out.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens > 0:
        out["min_tokens"] = max(0, min_tokens - partial.tokens)
    return out, ""


class Splicer:
    """The continuation's events, rewritten to continue the original stream: the role chunk
    dropped, the original id/created/model, usage summed over both attempts (prompt tokens of
    the first attempt: the continuation's prompt minus the partial answer's tokens, or the
    engine's own figure when the first attempt reported one; `prompt_tokens_details` dropped:
    the first attempt's cache hit is unknown)."""

    def __init__(self, dialect: Dialect, partial: Partial) -> None:
        self.chat = dialect.chat_choices
        self.partial = partial
        self.parser = SSEParser()
        self.events = 0  # events handed on

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for event in self.parser.feed(data):
            if event.data is None:
                continue
            rewritten = self.rewrite(event.data)
            if rewritten is not None:
                out.append(b"data: " + rewritten + b"\n\n")
        self.events += len(out)
        return b"".join(out)

    def rewrite(self, data: bytes) -> bytes | None:
        """One event's data, rewritten; None to drop it."""
        if data == _DONE:
            return data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(obj, dict) or ("error" in obj and "choices" not in obj):
            return data
        for key, value in (self.partial.ids or {}).items():
            if key in obj:
                obj[key] = value
        usage = obj.get("usage")
        if isinstance(usage, dict):
            obj["usage"] = self.summed(usage)
        if self.chat and not self._keep_chat(obj):
            return None
        return orjson.dumps(obj)

    def _keep_chat(self, obj: dict[str, Any]) -> bool:
        """Drop the continuation's role (the client had it); an event left with nothing goes (its
        per-chunk usage included: the next event carries the same count). An event whose text is
        empty but that carries anything else on a choice stays: vLLM sends a token whose bytes do
        not end a character as `"content": ""` with its `token_ids` (`return_token_ids`)."""
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return True
        keep = False
        for choice in choices:
            if not isinstance(choice, dict):
                return True
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)
                if any(v not in _EMPTY for v in delta.values()):
                    keep = True
            if any(v not in _EMPTY for k, v in choice.items() if k not in ("index", "delta")):
                keep = True
        return keep

    def summed(self, usage: dict[str, Any]) -> dict[str, Any]:
        sent = self.partial.tokens
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        first = self.partial.usage.get("prompt_tokens") if self.partial.usage is not None else None
        if count(first) is None:
            first = prompt - sent if count(prompt) is not None and prompt >= sent else None
        out = {k: v for k, v in usage.items() if k not in ("prompt_tokens_details", "prompt_tokens",
                                                             "completion_tokens", "total_tokens")}
        if first is not None:
            out["prompt_tokens"] = first
        if count(completion) is not None:
            out["completion_tokens"] = completion + sent
            if first is not None:
                out["total_tokens"] = first + completion + sent
        return out


class RecordingObserver(StreamObserver):
    """A stream observer that keeps what it handed the client (to know what to continue; with the
    per-chunk usage the gateway asked for, to count the tokens sent) and when it last did (the
    client-visible pause). `strip_chunk_usage`: the client did not ask for per-chunk usage, so it
    is taken out of the events it is handed."""

    __slots__ = ("sent", "sent_len", "last_sent", "strip_chunk_usage")

    def __init__(self, shape: StreamShape, clock: StreamClock, drop_usage: bool, collect_text: bool, *,
                 strip_chunk_usage: bool = False) -> None:
        super().__init__(shape, clock, drop_usage, collect_text)
        self.sent: list[bytes] | None = []
        self.sent_len = 0
        self.last_sent: float | None = None
        self.strip_chunk_usage = strip_chunk_usage

    def feed(self, data: bytes, now: float) -> bytes:
        out = super().feed(data, now)
        if out:
            self.last_sent = now
            if self.sent is not None:
                self.sent.append(out)
                self.sent_len += len(out)
                if self.sent_len > MAX_RECORDED_BYTES:
                    self.sent = None
            if self.strip_chunk_usage:
                out = drop_chunk_usage(out)
        return out


class Forwarding(Protocol):
    """The parts of the forwarder (app/proxy/forward.py `Forwarder`) a continuation uses."""

    router: Router
    upstream: Upstream
    health: HealthChecker
    load: ReplicaLoad
    metrics: Metrics
    migrate: MigrateMidstream | None


class Migrator:
    """Continues one streamed request's broken answer elsewhere (bounded attempts), with the
    forwarder's own router, upstream, health, load owner and metrics."""

    def __init__(self, forwarder: Forwarding, ctx: RequestContext, request: RouteRequest, body: bytes,
                 headers: dict[str, str], method: str, path: str, tried: set[str]) -> None:
        self.fw = forwarder
        self.ctx = ctx
        self.request = request
        self.body = body
        self.headers = headers
        self.method = method
        self.path = path
        self.tried = tried

    def _count(self, reason: str, outcome: str) -> None:
        self.fw.metrics.migrations.labels(self.ctx.route, reason, outcome).inc()

    async def carry_on(self, failure: UpstreamError, observer: RecordingObserver, send_more: Any) -> UpstreamError | None:
        """Continue the stream after `failure`; None once a continuation reached its end marker,
        else the failure to end the stream with, as without migration (the caller counts that
        one in prefixgate_upstream_errors_total; the failures continued past are counted here)."""
        dialect = self.ctx.dialect
        assert self.fw.migrate is not None
        attempts = self.fw.migrate.max_attempts
        for _ in range(attempts):
            cause = "timeout" if failure.kind == "timeout" else "midstream"
            if observer.sent is None or not observer.collect_text:
                self._count("too_long" if observer.sent is None else "n", "skipped")
                return failure
            partial = read_partial(dialect, b"".join(observer.sent))
            body, why = self._body(partial)
            if body is None:
                self._count(why, "skipped")
                return failure
            try:
                decision = await self.fw.router.choose(self.request, frozenset(self.tried))
            except NoReplicaAvailable:
                self._count("no_replica", "skipped")
                return failure
            outcome = await self._attempt(decision, orjson.dumps(body), partial, observer, send_more)
            if isinstance(outcome, str):  # nothing relayed: the stream ends on `failure`
                self._count(outcome, "failed")
                return failure
            self.fw.metrics.upstream_errors.labels(failure.backend, failure.kind).inc()
            if outcome is None:
                self._count(cause, "continued")
                return None
            self._count(cause, "failed")
            failure = outcome
        self._count("attempts", "skipped")
        return failure

    def _body(self, partial: Partial) -> tuple[dict[str, Any] | None, str]:
        try:
            original = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            original = None
        if not isinstance(original, dict):
            return None, "not_json"
        return continuation_body(self.ctx.dialect, original, partial)

    async def _attempt(self, decision: RouteDecision, body: bytes, partial: Partial, observer: RecordingObserver,
                       send_more: Any) -> UpstreamError | str | None:
        """One continuation on `decision`'s replica: None when it reached its end marker, its
        failure when it broke mid-stream, or why it produced nothing ("refused", "connect", ...)."""
        fw, ctx = self.fw, self.ctx
        metrics = fw.metrics
        replica = decision.replica
        self.tried.add(replica.name)
        hold = fw.load.hold(decision)  # inflight + prefill backlog, until first byte / end
        resp = None
        ok = routed = False
        try:
            try:
                resp = await fw.upstream.open(replica, self.method, self.path, body, self.headers)
                if resp.status != 200:
                    return "refused"  # e.g. an engine that cannot continue the message: 400
                first = await fw.upstream.first_chunk(replica, resp)
            except UpstreamError as exc:
                metrics.upstream_errors.labels(replica.name, exc.kind).inc()
                fw.health.mark_failure(replica, exc.kind)
                return exc.kind
            hold.prefill_done()
            fw.router.on_routed(self.request, decision)
            routed = True
            splicer = Splicer(ctx.dialect, partial)
            observer.drop_incomplete()
            broke_at = observer.last_sent
            data = first
            while data:
                out = observer.feed(splicer.feed(data), time.perf_counter())
                if out:
                    if broke_at is not None:
                        metrics.migration_pause.labels(ctx.route).observe(time.perf_counter() - broke_at)
                        broke_at = None
                    await send_more({"type": "http.response.body", "body": out, "more_body": True})
                try:
                    data = await resp.content.readany()
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    kind = "timeout" if classify_exception(exc) == "timeout" else "midstream"
                    observer.finish()
                    return UpstreamError(kind, replica.name, f"upstream failed mid-stream ({type(exc).__name__})")
            observer.finish()
            ok = observer.done
            if not ok:
                return UpstreamError("midstream", replica.name, "upstream closed the stream before its end marker")
            return None
        finally:
            if resp is not None:
                let_go(resp, ok)
            hold.release()
            if routed:
                fw.router.on_finished(self.request, decision, ok)
