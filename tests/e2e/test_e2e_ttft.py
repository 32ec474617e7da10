"""Client-side TTFT against real vLLM: stamped at the first chunk carrying text, not at the
`{"role": "assistant", "content": ""}` chunk nor at the `{"content": ""}` chunks vLLM streams for
tokens that detokenise to nothing (special tokens; steered here with `logit_bias`).

The proxy's own `send` calls are tapped (same process, same perf_counter clock), so the assertion
is about order, not duration: every relayed read before the first text chunk was sent before the
TTFT stamp, and the read carrying it was sent after.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.proxy_handle import SendTap, first_send_with, metric_sum
from tests.e2e.workload import chat_body, stream_chat

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SPECIALS = {"0": 8, "1": 8}  # <|endoftext|>, <|im_start|>: skipped on detokenisation -> content ""
PROMPT = [{"role": "user", "content": "Tell me about prefix caches and why the first token matters."}]


def _content_pattern(result: Any) -> list[str]:
    """E: content "" (role chunk included), T: text, N: no content key."""
    return ["N" if c is None else ("E" if c == "" else "T") for _, c in result.contents()]


def _first_text_send(sends: list[tuple[float, bytes]]) -> int:
    """Index of the send that completes the first event with non-empty choice-0 content."""
    def text(_name: str | None, event: Any) -> bool:
        choices = (event or {}).get("choices") or []
        return bool(choices and (choices[0].get("delta") or {}).get("content"))

    return first_send_with(sends, text)


def assert_ttft_at_first_text(proxy: Any, tap: SendTap, rid: str, pattern: list[str], before: float,
                              label: str = "stream") -> None:
    """The request's TTFT stamp lies after every read before the first text and no later than the
    read carrying it, after the first byte; one content chunk per text event; one TTFT observed.
    Shared by the vLLM and SGLang tiers."""
    ctx = proxy.recorder.contexts[rid]
    t = ctx.timings
    assert t.first_byte is not None and t.first_token is not None
    first = _first_text_send(tap.sends)
    print(f"\n{label} {''.join(pattern)}; relayed in {len(tap.sends)} reads, first text in read {first}; "
          f"first byte {1000 * (t.first_byte - t.arrival):.1f} ms, TTFT {1000 * (t.first_token - t.arrival):.1f} ms")
    assert all(sent <= t.first_token for sent, _ in tap.sends[:first]), "TTFT stamped before the text arrived"
    assert t.first_token <= tap.sends[first][0]
    assert t.first_byte < t.first_token
    assert ctx.content_chunks == pattern.count("T")
    assert metric_sum(proxy, "prefixgate_ttft_seconds_count") == before + 1


def test_ttft_stamped_at_first_text_chunk_not_role_or_empty_chunks(e2e_proxy: Any, vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_b32])
    tap = SendTap(proxy.app.openai)
    proxy.app.openai = tap
    # seeded sampling with special tokens favoured: find a stream that opens with the role chunk and
    # an empty content chunk before any text (seeds are not portable between a cold and a warm
    # prefix cache, nor between runs, so the search runs through the proxy itself)
    found = None
    with httpx.Client(timeout=60) as client:
        for seed in range(48):
            tap.sends.clear()
            before = metric_sum(proxy, "prefixgate_ttft_seconds_count")
            rid = f"ttft-mixed-{seed}"
            body = chat_body(PROMPT, 12, temperature=1.0, seed=seed, logit_bias=SPECIALS)
            result = stream_chat(client, proxy.url, body, {"x-request-id": rid})
            proxy.settle()
            pattern = _content_pattern(result)
            # ... and that reached the proxy in more than one read (a lagging API server can
            # coalesce several deltas into one write: then there is nothing to tell apart)
            if "T" in pattern and pattern.index("T") >= 2 and _first_text_send(tap.sends) >= 1:
                found = (rid, pattern, before, result)
                break
    assert found is not None, "no seed gave an empty content chunk, relayed apart, before text"
    rid, pattern, before, result = found
    assert_ttft_at_first_text(proxy, tap, rid, pattern, before)


def test_stream_of_only_empty_chunks_has_no_ttft(e2e_proxy: Any, vllm_b32: Any) -> None:
    proxy = e2e_proxy([vllm_b32])
    body = chat_body(PROMPT, 6, logit_bias={"1": 100})
    ttft_before = metric_sum(proxy, "prefixgate_ttft_seconds_count")
    first_byte_before = metric_sum(proxy, "prefixgate_upstream_first_byte_seconds_count")
    with httpx.Client(timeout=60) as client:
        result = stream_chat(client, proxy.url, body, {"x-request-id": "ttft-empty"})
    proxy.settle()
    pattern = _content_pattern(result)
    # role chunk + the 6 special tokens' empty deltas (a lagging API server merges deltas: >= 1 chunk)
    assert len(pattern) >= 2 and set(pattern) == {"E"}, pattern
    assert result.usage.get("completion_tokens") == 6
    ctx = proxy.recorder.contexts["ttft-empty"]
    assert ctx.timings.first_byte is not None and ctx.timings.first_token is None
    assert ctx.content_chunks == 0
    assert metric_sum(proxy, "prefixgate_ttft_seconds_count") == ttft_before
    assert metric_sum(proxy, "prefixgate_upstream_first_byte_seconds_count") == first_byte_before + 1
