"""The longest prompt-length buckets: an agent's 234k-token prompt and a 300k-token one land in
`128k-256k` and `256k+` on the TTFT histogram, apart from a 100k-token one (`64k-128k`)."""

from __future__ import annotations

import httpx
from fake_upstream import FakeResponse, SeenRequest, sse

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def stream_reporting(prompt_tokens: int):
    """An upstream that streams one token and reports `prompt_tokens` in its usage chunk."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1}

    def script(req: SeenRequest) -> FakeResponse:
        return FakeResponse(chunks=[(0, sse({"choices": [{"index": 0, "delta": {"content": "a"}}]})),
                                    (0, sse({"choices": [], "usage": usage})), (0, sse(b"[DONE]"))])
    return script


def test_long_prompts_have_their_own_ttft_buckets(fake_upstream_factory, proxy_factory) -> None:
    expected = {100_000: "64k-128k", 128_000: "128k-256k", 234_000: "128k-256k", 256_000: "256k+",
                300_000: "256k+"}
    for prompt_tokens, bucket in expected.items():
        up = fake_upstream_factory(stream_reporting(prompt_tokens))
        proxy = proxy_factory([up.url], names=["fake-0"])
        with httpx.Client(timeout=30) as client:
            assert client.post(proxy.url + "/v1/chat/completions", json=CHAT).status_code == 200
        proxy.settle()
        assert proxy.sample("prefixgate_ttft_seconds_count", route="chat", model="fake", backend="fake-0",
                            prompt_bucket=bucket) == 1, (prompt_tokens, bucket)
        assert "128k+" not in proxy.metrics_text()
