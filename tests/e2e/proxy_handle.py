"""The proxy both real-engine tiers (vLLM: tests/e2e, SGLang: tests/e2e_sglang) put in front of
their replicas, and the hook that keeps what it measured."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class RecordingHook:
    """A RequestHook appended after the others: keeps every finished RequestContext by request id
    (timings, outcome, usage) so tests can look at what the proxy itself measured."""

    def __init__(self) -> None:
        self.contexts: dict[str, Any] = {}

    async def before_route(self, ctx: Any) -> None:
        return None

    def after_response(self, ctx: Any) -> None:
        self.contexts[ctx.request_id] = ctx



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

