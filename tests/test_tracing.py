"""Tracing hook: spans reach a real OTLP/HTTP endpoint (in-test receiver), configured only by the
standard OTEL_* env, with GenAI and prefixgate attributes and W3C context propagated upstream."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from app.config import Settings
from app.dialects import CHAT
from app.pipeline.prefix_stage import PrefixStageState
from app.pipeline.tracing_stage import build_tracing_stage, response_attributes
from app.prefix.prompt import PromptInput
from app.proxy.context import Arrival, RequestContext, Timings
from app.routing.base import Replica, RouteDecision
from tests.otlp_receiver import OTLPReceiver

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


def make_ctx(headers: dict[str, str] | None = None) -> RequestContext:
    now = time.perf_counter()
    return RequestContext(Arrival(
        request_id="req-1", dialect=CHAT, path="/v1/chat/completions", tenant="team-a",
        headers=dict(headers or {}), body={"model": "m1", "max_tokens": 32, "messages": []},
        model="m1", stream=True), Timings(arrival=now - 0.25))


def finish(ctx: RequestContext) -> None:
    t = ctx.timings
    t.upstream_sent = t.arrival + 0.001
    t.first_byte = t.arrival + 0.05
    t.first_token = t.arrival + 0.08
    t.end = t.arrival + 0.2
    ctx.result.answered(200)
    ctx.decision = RouteDecision(replica=Replica(name="vllm-0", url="http://x", engine="vllm"),
                                 reason="prefix_hit", matched_blocks=12, available_blocks=14)
    ctx.result.observed({"prompt_tokens": 240, "completion_tokens": 17,
                         "prompt_tokens_details": {"cached_tokens": 192}})
    if ctx.prefix is None:
        ctx.prefix = fingerprinted()
    ctx.prefix.predicted_tokens = 176
    ctx.prefix.observation = SimpleNamespace(continuity=0.8,  # type: ignore[assignment]
                                             diagnosis=SimpleNamespace(cause="dynamic_head"))


def fingerprinted() -> PrefixStageState:
    """What the prefix stage leaves on a request it fingerprinted (its input is not read here)."""
    return PrefixStageState(PromptInput("chat"), routed_blocks=12, routed_complete=True)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch):
    with OTLPReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "gw-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        yield rx


def test_off_by_default() -> None:
    assert Settings().tracing.enabled is False
    assert build_tracing_stage(Settings()) is None


def test_otel_sdk_disabled_env_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert build_tracing_stage(Settings(tracing={"enabled": True})) is None


async def test_span_exported_over_otlp_http_with_attributes(receiver: OTLPReceiver) -> None:
    hook = build_tracing_stage(Settings(tracing={"enabled": True}))
    assert hook is not None
    try:
        ctx = make_ctx({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "x-tenant-id": "team-a"})
        await hook.before_route(ctx)
        # W3C context for the upstream: same trace, our span as parent, sampled
        version, trace_id, parent_id, flags = ctx.upstream_headers["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
        assert parent_id != CLIENT_SPAN
        finish(ctx)
        hook.after_response(ctx)
        assert ctx.trace is not None and ctx.trace.span is None
        (span,) = receiver.wait_for(1)
    finally:
        hook.shutdown()

    assert span["trace_id"] == CLIENT_TRACE
    assert span["parent_span_id"] == CLIENT_SPAN  # child of the client's span
    assert span["span_id"] == parent_id  # the upstream's parent is this span
    assert span["name"] == "chat m1"
    a = span["attributes"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "m1"
    assert a["gen_ai.usage.input_tokens"] == 240
    assert a["gen_ai.usage.output_tokens"] == 17
    assert a["gen_ai.provider.name"] == "vllm"
    assert a["prefixgate.tenant"] == "team-a"
    assert a["prefixgate.backend"] == "vllm-0"
    assert a["prefixgate.route_reason"] == "prefix_hit"
    assert a["prefixgate.cached_tokens"] == 192
    assert a["prefixgate.prefix.continuity"] == pytest.approx(0.8)
    assert a["prefixgate.prefix.break_cause"] == "dynamic_head"
    assert a["prefixgate.predicted_cached_tokens"] == 176
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.08, abs=1e-6)
    # the span covers arrival to end (back-dated to the request's arrival)
    assert (span["end_ns"] - span["start_ns"]) / 1e9 == pytest.approx(0.2, abs=0.01)
    assert receiver.resources[0]["service.name"] == "gw-test"


async def test_new_trace_without_client_context_and_error_status(receiver: OTLPReceiver) -> None:
    hook = build_tracing_stage(Settings(tracing={"enabled": True}))
    assert hook is not None
    try:
        ctx = make_ctx()
        await hook.before_route(ctx)
        assert ctx.upstream_headers["traceparent"].startswith("00-")
        ctx.result.answered(502)
        ctx.result.upstream_failed()
        ctx.timings.end = time.perf_counter()
        hook.after_response(ctx)
        hook.after_response(ctx)  # a second call must not export twice
        (span,) = receiver.wait_for(1)
    finally:
        hook.shutdown()
    assert span["parent_span_id"] == ""
    assert span["status_code"] == 2  # STATUS_CODE_ERROR
    assert span["attributes"]["prefixgate.outcome"] == "upstream_error"
    assert "gen_ai.usage.input_tokens" not in span["attributes"]
    assert len(receiver.spans) == 1


async def test_span_waits_for_the_prefix_observation(receiver: OTLPReceiver) -> None:
    """Continuity comes from the prefix hook's after-response task: the span ends once it is
    there, with the response's end time (waiting does not stretch the span)."""
    hook = build_tracing_stage(Settings(tracing={"enabled": True}))
    assert hook is not None
    try:
        ctx = make_ctx()
        ctx.prefix = fingerprinted()
        await hook.before_route(ctx)
        finish(ctx)
        observation, ctx.prefix.observation = ctx.prefix.observation, None
        hook.after_response(ctx)
        await asyncio.sleep(0.3)
        assert receiver.spans == []  # still waiting for the observation
        ctx.prefix.observation = observation
        await hook.drain()
        (span,) = receiver.wait_for(1)
    finally:
        hook.shutdown()
    assert span["attributes"]["prefixgate.prefix.continuity"] == pytest.approx(0.8)
    assert (span["end_ns"] - span["start_ns"]) / 1e9 == pytest.approx(0.2, abs=0.01)


async def test_shutdown_ends_spans_still_waiting(receiver: OTLPReceiver) -> None:
    hook = build_tracing_stage(Settings(tracing={"enabled": True}))
    assert hook is not None
    ctx = make_ctx()
    ctx.prefix = fingerprinted()
    await hook.before_route(ctx)
    finish(ctx)
    ctx.prefix.observation = None
    hook.after_response(ctx)
    hook.shutdown()  # flushes: the waiting span is exported without continuity
    (span,) = receiver.wait_for(1)
    assert "prefixgate.prefix.continuity" not in span["attributes"]
    assert span["attributes"]["prefixgate.backend"] == "vllm-0"


def test_hygiene_finding_kinds_are_span_attributes() -> None:
    from app.hygiene.findings import DYNAMIC_HEAD, TOOL_ORDER, Finding

    ctx = make_ctx()
    finish(ctx)
    assert "prefixgate.hygiene.findings" not in response_attributes(ctx)
    ctx.hygiene.findings = [Finding(TOOL_ORDER, "tools", "order"), Finding(DYNAMIC_HEAD, "messages[0] line 1", "timestamp"),
                            Finding(DYNAMIC_HEAD, "messages[1] line 2", "uuid")]
    assert response_attributes(ctx)["prefixgate.hygiene.findings"] == ["dynamic_head", "tool_order"]


def test_response_attributes_never_carry_prompt_text() -> None:
    ctx = make_ctx()
    ctx.body["messages"] = [{"role": "user", "content": "SECRET PROMPT"}]
    finish(ctx)
    values = [str(v) for v in response_attributes(ctx).values()]
    assert not any("SECRET" in v for v in values)


def test_through_the_proxy_span_per_request_and_traceparent_upstream(receiver: OTLPReceiver) -> None:
    """The real proxy (tracing.enabled) in front of a simulated vLLM that records the headers it
    receives: one span per request, the engine sees our span as its parent."""
    import httpx

    from app.server import create_app
    from app.serving import ServerThread
    from app.sim.options import SimOptions
    from app.sim.server import SimApp

    seen: list[dict[str, str]] = []
    sim = SimApp(SimOptions.from_kwargs(time_scale=0))

    async def recording(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["path"].startswith("/v1/chat"):
            seen.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await sim(scope, receive, send)

    with ServerThread(recording) as engine:
        settings = Settings(backends=[{"url": engine.url, "name": "sim-0"}], tracing={"enabled": True})
        app = create_app(settings)
        with ServerThread(app) as proxy:
            body = {"model": "sim", "stream": True, "max_tokens": 4,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "system", "content": "You are terse. " * 40},
                                 {"role": "user", "content": "hello"}]}
            headers = {"x-tenant-id": "team-b", "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
            r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30, headers=headers)
            assert r.status_code == 200
            (span,) = receiver.wait_for(1)
            # the same prompt again: the tenant's second request continues all of the first
            r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30, headers=headers)
            assert r.status_code == 200
            _, again = receiver.wait_for(2)
    assert len(seen) == 2
    _, trace_id, parent, _ = seen[0]["traceparent"].split("-")
    assert trace_id == CLIENT_TRACE and parent == span["span_id"]
    a = span["attributes"]
    assert span["parent_span_id"] == CLIENT_SPAN
    assert a["prefixgate.tenant"] == "team-b"
    assert a["prefixgate.backend"] == "sim-0"
    assert a["gen_ai.request.model"] == "sim"
    assert a["gen_ai.usage.output_tokens"] > 0
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert "prefixgate.route_reason" in a
    # the prefix stage's observation arrived before each span ended: a tenant's first request
    # continues nothing and is predicted cold; the repeat continues every block and is predicted
    # to hit every full block but the one holding the last prompt token
    assert a["prefixgate.prefix.continuity"] == 0.0
    assert a["prefixgate.predicted_cached_tokens"] == 0
    b = again["attributes"]
    assert b["prefixgate.prefix.continuity"] == 1.0
    prompt = b["gen_ai.usage.input_tokens"]
    assert b["prefixgate.predicted_cached_tokens"] == (prompt - 1) // 16 * 16
