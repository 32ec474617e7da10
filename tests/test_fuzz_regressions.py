"""Proxy bugs the fuzz suite (test_fuzz_proxy.py) found, each kept as a plain example."""

from __future__ import annotations

from typing import Any

import httpx
import pytest


def _nested(depth: int) -> bytes:
    return b"[" * depth + b'"x"' + b"]" * depth


@pytest.mark.parametrize("case", ["include_usage", "rewrite", "tools"])
def test_body_nested_deeper_than_the_proxy_can_reserialise_is_a_400(proxy_factory: Any, sim: Any, case: str) -> None:
    """orjson parses up to 1024 levels but serialises only up to 254: a body between the two got
    through validation, then every re-serialisation (splicing include_usage into a body that has
    stream_options, a hygiene rewrite, the tools signature) raised TypeError -> 500 internal_error."""
    tenants = {"default": {"policy": "rewrite"}} if case != "include_usage" else {}
    proxy = proxy_factory(sim, tenants=tenants)
    deep = _nested(300)
    extra = {
        "include_usage": b'"stream": true, "stream_options": {"continuous_usage_stats": false}, "metadata": ' + deep,
        "rewrite": (b'"tools": [{"type": "function", "function": {"name": "g"}}, {"type": "function", "function": '
                    b'{"name": "f"}}], "metadata": ' + deep),  # sort_tools rewrites the body
        "tools": b'"tools": [{"type": "function", "function": {"name": "f", "parameters": ' + deep + b"}}]",
    }[case]
    body = b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, ' + extra + b"}"
    resp = httpx.post(proxy.url + "/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_json" and "nested" in err["message"]
