"""The proxy both real-engine tiers (vLLM: tests/e2e, SGLang: tests/e2e_sglang) put in front of
their replicas, and the hook that keeps what it measured."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson


class RecordingHook:
    """A RequestHook appended after the others: keeps every finished RequestContext by request id
    (timings, outcome, usage) so tests can look at what the proxy itself measured."""

    def __init__(self) -> None:
        self.contexts: dict[str, Any] = {}

    async def before_route(self, ctx: Any) -> None:
        return None

    def after_response(self, ctx: Any) -> None:
        self.contexts[ctx.request_id] = ctx


class SendTap:
    """Wraps the proxy's /v1 handler (`proxy.app.openai`) to stamp every response body message it
    sends, on the proxy's own perf_counter clock: TTFT tests assert the stamp's order against
    the reads that carried each event, not durations."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sends: list[tuple[float, bytes]] = []

    @property
    def active(self) -> int:
        return self.inner.active

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def tapped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                self.sends.append((time.perf_counter(), message["body"]))
            await send(message)

        await self.inner(scope, receive, tapped)


def sse_events(data: bytes) -> list[tuple[str | None, Any, int]]:
    """(event name, parsed data, end offset in `data`) of every whole `event:`/`data:` SSE event."""
    out: list[tuple[str | None, Any, int]] = []
    offset = 0
    for raw in data.split(b"\n\n"):
        offset += len(raw) + 2
        name, payload = None, None
        for line in raw.strip().splitlines():
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                payload = orjson.loads(line[5:])
        if name is not None or payload is not None:
            out.append((name, payload, offset - 2))
    return out


def first_send_with(sends: list[tuple[float, bytes]], match: Callable[[str | None, Any], bool]) -> int:
    """Index of the send that completes the first SSE event for which `match(name, data)` holds."""
    end = next((e for name, payload, e in sse_events(b"".join(b for _, b in sends)) if match(name, payload)), None)
    assert end is not None, "no such event was relayed"
    total = 0
    for i, (_, body) in enumerate(sends):
        total += len(body)
        if total >= end:
            return i
    raise AssertionError("unreachable")


def metric_sum(proxy: Any, name: str, **labels: str) -> float:
    """Sum of the proxy's samples named `name` whose labels include `labels` (others summed over,
    so a label added later, e.g. `route`, does not change what a test reads)."""
    proxy.settle()
    return sum(s.value for m in proxy.services.metrics.registry.collect() for s in m.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def make_e2e_proxy(proxy_factory: Callable[..., Any], model_dir: Path) -> Callable[..., Any]:
    """`e2e_proxy(replicas, **sections)` -> a started ProxyHandle in front of real replicas, with
    the model's tokenizer, fast scrapes and health checks, a `RecordingHook` at `.recorder`, and
    every replica's block size already learnt from its /metrics (the scraper ran once)."""

    def make(replicas: list[Any], **sections: Any) -> Any:
        merged: dict[str, Any] = {"tokenizer": str(model_dir), "scrape": {"interval_s": 0.5, "jitter": 0.0},
                                  "routing": {"health_interval_s": 0.5}}
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        handle = proxy_factory([r.url for r in replicas], names=[r.name for r in replicas], **merged)
        handle.recorder = RecordingHook()
        handle.services.hooks.append(handle.recorder)
        deadline = time.monotonic() + 30
        while not all(r.block_size for r in handle.services.replicas.all()):
            if time.monotonic() > deadline:
                raise TimeoutError("the engine scraper never reported a block size")
            time.sleep(0.05)
        return handle

    return make

