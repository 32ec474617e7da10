"""The proxy's own clock for one streamed response: client-side TTFT and what follows it.

Pure bookkeeping over `time.perf_counter()` stamps handed in by the relay, so it is unit-testable
with synthetic times. TTFT stops at the first chunk that carries generated text, not at the first
upstream byte (the role chunk vLLM/SGLang send first, docs/sse.md). What each stamp and the proxy
overhead mean precisely: docs/relay.md, "Latency stamps".

The decode rate is `usage.completion_tokens` over the decode span (first to last content chunk),
never tokens-per-chunk arithmetic: servers that batch several deltas per chunk (vLLM
`--stream-interval`, speculative decoding) make per-chunk counts meaningless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.proxy.context import Timings

MAX_GAPS = 16_384  # inter-chunk gaps kept per request (a bound, not a sample)


def overhead_of(t: Timings) -> float | None:
    """The gateway's own time before the upstream request went out: arrival -> the last
    attempt's send, minus the time earlier attempts spent on replicas that failed (waiting for a
    connection, a 5xx, a first byte that never came). What the gateway itself added: parsing,
    hooks, routing, retry bookkeeping (README, metrics)."""
    if t.upstream_sent is None:
        return None
    return t.upstream_sent - t.arrival - t.failed_attempts


@dataclass
class StreamClock:
    timings: Timings
    gaps: list[float] = field(default_factory=list)
    content_chunks: int = 0
    first_chunk_chars: int = 0  # characters of text in the first content chunk (choice 0)
    _failed_at: float | None = None  # when the latest attempt failed, until the next one is sent

    def upstream_sent(self, now: float) -> None:
        """An attempt's request is handed to the upstream client (stamped per attempt). A
        previous attempt that failed is then known to have been retried: the time it spent on
        its replica (send -> failure) is not the gateway's own."""
        t = self.timings
        if self._failed_at is not None and t.upstream_sent is not None:
            t.failed_attempts += self._failed_at - t.upstream_sent
        self._failed_at = None
        t.upstream_sent = now

    def attempt_failed(self, now: float) -> None:
        """The latest attempt failed at `now` (before its first byte reached the client)."""
        self._failed_at = now

    def first_byte(self, now: float) -> None:
        if self.timings.first_byte is None:
            self.timings.first_byte = now

    def content(self, now: float, chars: int = 0) -> None:
        """A chunk carrying generated text arrived (and is being relayed) at `now`."""
        t = self.timings
        if t.first_token is None:
            t.first_token = now
            self.first_chunk_chars = chars
        elif t.last_token is not None and len(self.gaps) < MAX_GAPS:
            self.gaps.append(now - t.last_token)
        t.last_token = now
        self.content_chunks += 1

    def end(self, now: float) -> None:
        self.timings.end = now

    # ------------------------------------------------------------ derived values
    @property
    def ttft(self) -> float | None:
        t = self.timings
        return None if t.first_token is None else t.first_token - t.arrival

    @property
    def first_byte_latency(self) -> float | None:
        t = self.timings
        return None if t.first_byte is None else t.first_byte - t.arrival

    @property
    def overhead(self) -> float | None:
        return overhead_of(self.timings)

    @property
    def duration(self) -> float | None:
        t = self.timings
        return None if t.end is None else t.end - t.arrival

    def decode_rate(self, completion_tokens: int | None, total_chars: int | None = None) -> float | None:
        """Tokens per second generated after the first content chunk.

        The tokens that arrived *with* the first chunk are not part of the span: they are
        estimated from its share of the output characters when the text is known (exact for
        uniform batching), else taken as one token.
        """
        t = self.timings
        if not completion_tokens or t.first_token is None or t.last_token is None:
            return None
        span = t.last_token - t.first_token
        if span <= 0 or self.content_chunks < 2:
            return None
        if total_chars and self.first_chunk_chars:
            first_tokens = completion_tokens * self.first_chunk_chars / total_chars
        else:
            first_tokens = 1.0
        tokens = completion_tokens - first_tokens
        return tokens / span if tokens > 0 else None
