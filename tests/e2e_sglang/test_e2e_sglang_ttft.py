"""Client-side TTFT against real SGLang: its first chat event is `delta: {"reasoning_content": null,
"role": "assistant", "content": ""}`, which carries no text, so the clock stops at the next event
(the first with text), not at the first byte. SGLang writes the role event and the first token's
event back to back (serving_chat.py yields both in one loop turn), so they often reach the proxy in
one read; the test sends until a stream arrives with them in separate reads, where stamping at
the role event would show. The proxy's own `send` calls are tapped (same process, same clock), so
the assertion is about order, not duration."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.proxy_handle import metric_sum
from tests.e2e.test_e2e_ttft import (
    PROMPT,
    SendTap,
    _content_pattern,
    _first_text_send,
    assert_ttft_at_first_text,
)
from tests.e2e.workload import chat_body, stream_chat

pytestmark = [pytest.mark.e2e_sglang, pytest.mark.timeout(600)]
ATTEMPTS = 40


def test_ttft_stamped_at_first_text_chunk_not_role_chunk(e2e_proxy: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_radix])
    tap = SendTap(proxy.app.openai)
    proxy.app.openai = tap
    found = None
    with httpx.Client(timeout=120) as client:
        for attempt in range(ATTEMPTS):
            tap.sends.clear()
            before = metric_sum(proxy, "prefixgate_ttft_seconds_count")
            rid = f"sg-ttft-{attempt}"
            result = stream_chat(client, proxy.url, chat_body(PROMPT, 12), {"x-request-id": rid})
            proxy.settle()
            first_event = result.events[0][1]["choices"][0]["delta"]
            assert first_event == {"reasoning_content": None, "role": "assistant", "content": ""}, first_event
            pattern = _content_pattern(result)
            assert pattern[0] == "E" and "T" in pattern, pattern
            if _first_text_send(tap.sends) >= 1:
                found = (rid, before, result, pattern, attempt)
                break
    assert found is not None, f"in {ATTEMPTS} streams the role event never reached the proxy apart from the first text"
    rid, before, result, pattern, attempt = found
    assert_ttft_at_first_text(proxy, tap, rid, pattern, before, label=f"SGLang stream (attempt {attempt})")
