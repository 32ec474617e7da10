"""The stream observer: the one place a relayed SSE stream is watched. One door: `feed` each
upstream read (returns the bytes to send the client), `finish` at the end, `end_after_failure`
for the terminal error event; the results (`done`, `error`, `usage`, `output_text`) and the
clock's stamps are read afterwards.

Whole events only (docs/relay.md): the client is only ever handed complete SSE events, so a
stream that breaks at any byte offset still decodes as every whole event, then the error event,
then the end marker. An incomplete tail is held back until its blank line arrives (free for vLLM
and SGLang, which write each event in one HTTP chunk).

Until the first generated token every event is parsed (TTFT must stop exactly there, at the
first event with generated text, never at the role chunk). After it, for a shape whose bytes can
be scanned exactly and a `\\n`-framed stream, nothing is parsed per event: whole events are
scanned as bytes for the inter-token clock and the usage chunk, and `StreamSummary` folds them in
batches (measured on an idle machine: a 34-read vLLM-shaped stream cost ~48 µs instead of ~71 µs
with per-event parsing). Holding back incomplete events adds nothing measurable: the usual read
ends with a blank line and is sent as is (`python bench/observer.py`, old and new observers
interleaved in one process on the busy 2-core dev box: 61 vs 64 µs per stream keeping the usage
chunk, 88 vs 82 µs dropping it). What the events mean is the stream shape's (app/proxy/shape.py).

vLLM's per-request metrics (the `metrics` object on the final usage chunk) are read here into
`engine_timing`, and taken out of the client's events unless it asked for them (`strip_metrics`,
app/engines/request_metrics.py). Only a read holding an event without generated text (vLLM puts
the object on the usage chunk) is searched for it: one bytes search, not a parse.
"""

from __future__ import annotations

from typing import Any

from app.engines.request_metrics import METRICS_KEY, EngineTiming, take_from_events
from app.proxy.clock import StreamClock
from app.proxy.shape import Chunk, StreamShape
from app.proxy.sse import SSEParser, WholeEvents, line_ends_before

MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # cap on the collected output text (RequestContext.output_text)
DECODE_BATCH_BYTES = 256 * 1024  # whole events folded at once after the first token; bounds memory


class StreamObserver:
    """Observer of one SSE response. `drop_usage`: the proxy added `include_usage`, so the
    usage-only event is observed but not sent. `collect_text`: keep choice 0's text (n == 1).
    `strip_metrics` (set by the relay): the engine's per-request metrics are not sent."""

    __slots__ = ("shape", "clock", "drop_usage", "summary", "parser", "framer", "saw_cr",
                 "strip_metrics", "engine_timing", "lf_owed")

    def __init__(self, shape: StreamShape, clock: StreamClock, drop_usage: bool, collect_text: bool) -> None:
        self.shape = shape
        self.clock = clock
        self.drop_usage = drop_usage
        self.summary = StreamSummary(shape, collect_text, MAX_OUTPUT_CHARS)
        self.parser = SSEParser(emit_all=True)  # every event, until the first generated token
        self.framer: WholeEvents | None = None  # afterwards: byte scans over whole events
        self.saw_cr = False
        self.strip_metrics = False
        self.engine_timing: EngineTiming | None = None  # the engine's own report (vLLM metrics)
        # a dropped event ended its read with the CR of its closing CR LF: the LF that opens the
        # next read is that event's too, and is dropped with it
        self.lf_owed = False

    @property
    def fast(self) -> bool:
        """Past the first generated token of a byte-scannable stream: events are no longer parsed."""
        return self.framer is not None

    def feed(self, data: bytes, now: float) -> bytes:
        """Observe one upstream read (arrived at `now`); returns the whole events to send."""
        if self.framer is None:
            return self._feed_until_fast(data, now)
        return self._feed_fast(data, now)

    def _feed_fast(self, data: bytes, now: float) -> bytes:
        """A read past the first generated token of a byte-scannable stream."""
        framer = self.framer
        assert framer is not None
        if not framer.held and framer.plain and data.endswith(b"\n\n"):
            events = data  # the usual read: whole events whatever the line ends (WholeEvents.push, inlined)
        else:
            events = framer.push(data)
            if not events:
                return b""
        if self.lf_owed:
            self.lf_owed = False
            events = events.removeprefix(b"\n")
        generated, count = self._generated_events(events)
        for _ in range(generated):
            self.clock.content(now)  # events read together: gaps of 0 between them, as in the parser
        if generated < count and METRICS_KEY in events:  # (an event with generated text has none)
            events = self._take_metrics(events)
        self.summary.add_events(events)
        if not self.drop_usage:
            return events
        kept = self.shape.drop_usage(events)
        self.lf_owed = kept is not events and events.endswith(b"\r") and not kept.endswith(b"\r")
        return kept

    def _generated_events(self, events: bytes) -> tuple[int, int]:
        """(How many of the whole `events` carry generated text, how many there are): a read that
        coalesced several is counted per event, as the parsed path counts them (content chunks,
        inter-token gaps)."""
        shape = self.shape
        if events.count(b"\n\n") <= 1 and b"\r" not in events:  # the usual read: one event
            return (1, 1) if shape.carries_generated(events) else (0, 1)
        if b"\r" in events:
            raws = [ev.raw for ev in SSEParser(emit_all=True).feed(events)]
        else:
            raws = events.split(b"\n\n")
        raws = [raw for raw in raws if raw]
        return sum(1 for raw in raws if shape.carries_generated(raw)), len(raws)

    def _feed_until_fast(self, data: bytes, now: float) -> bytes:
        """A read before the first generated token. A `\n`-framed read that coalesced events (an
        engine, or a busy loop, that wrote the whole answer at once) is parsed event by event up to
        the first generated token; the events after it take the byte scans: parsing all of them
        cost ~0.15 ms for a 32-token answer read at once. (The parser takes reads cut anywhere:
        cutting one at its blank lines changes no event it sees.)"""
        if not self.shape.byte_scans or self.saw_cr or b"\r" in data:
            return self._feed_parsed(data, now)
        sent: list[bytes] = []
        start = 0
        while self.framer is None:
            end = data.find(b"\n\n", start) + 2
            if end < 2 or end == len(data) or self.clock.timings.first_token is not None:
                sent.append(self._feed_parsed(data[start:] if start else data, now))  # the rest at once
                return b"".join(sent)
            sent.append(self._feed_parsed(data[start:end], now))  # one whole event (and blank lines)
            start = end
        sent.append(self._feed_fast(data[start:], now))  # not `feed`: a subclass's feed sees the read once
        return b"".join(sent)

    def _feed_parsed(self, data: bytes, now: float) -> bytes:
        if not self.saw_cr and b"\r" in data:
            self.saw_cr = True
        shape = self.shape
        kept: list[bytes] = []
        go_fast = False
        for ev in self.parser.feed(data):
            raw = ev.raw
            if self.lf_owed:
                self.lf_owed = False
                raw = raw.removeprefix(b"\n")
            if ev.data is None or shape.certainly_empty(ev.data):
                kept.append(raw)
                continue
            chunk = shape.classify(ev.data, ev.event)
            if chunk.generated:
                if self.clock.timings.first_token is None:
                    go_fast = shape.byte_scans and not self.saw_cr and shape.carries_generated(ev.data)
                self.clock.content(now, len(chunk.text))
            self.summary.take(chunk)
            raw = self._take_metrics(raw) if not chunk.generated and METRICS_KEY in ev.data else raw
            if not (self.drop_usage and chunk.usage_only):
                kept.append(raw)
            else:
                kept.append(line_ends_before(raw))  # not the dropped event's bytes (usually none)
                self.lf_owed = raw.endswith(b"\r")
        if go_fast:
            self.framer = WholeEvents(self.parser.pending())
        return kept[0] if len(kept) == 1 else b"".join(kept)

    def _take_metrics(self, events: bytes) -> bytes:
        """Whole events holding an engine `metrics` object: read it, and drop it unless kept."""
        events, timing = take_from_events(events, self.strip_metrics)
        if timing is not None:
            self.engine_timing = timing
        return events

    def finish(self) -> None:
        """The stream ended (or was abandoned): fold what the fast path retained. Bytes of an
        incomplete last event are never sent and never observed."""
        self.summary.finish()

    def drop_incomplete(self) -> None:
        """Forget the incomplete event a broken upstream left (it was never sent): another
        upstream's events follow (app/proxy/migrate.py)."""
        self.lf_owed = False  # the LF a dropped event's CR awaited will not come from another upstream
        if self.framer is not None:
            self.framer = WholeEvents()
        else:
            self.parser = SSEParser(emit_all=True)

    def end_after_failure(self, error: dict[str, Any]) -> bytes:
        """The bytes that end a stream the upstream broke (after `finish`)."""
        return self.shape.error_event(error)

    @property
    def done(self) -> bool:
        return self.summary.done

    @property
    def error(self) -> dict[str, Any] | None:
        return self.summary.error

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.summary.usage

    @property
    def response_id(self) -> str | None:
        return self.summary.response_id

    @property
    def collect_text(self) -> bool:
        return self.summary.collect_text

    @property
    def output_text(self) -> str:
        return self.summary.text


class StreamSummary:
    """What a stream said: usage, the end marker, the last error event and choice 0's text
    (bounded by `max_chars`). Parsed events come in one by one (`take`); whole events from the
    fast path in bytes (`add_events`), folded a batch at a time. Stream order throughout."""

    __slots__ = ("shape", "collect_text", "max_chars", "text_parts", "text_len", "usage", "done", "error",
                 "_buf", "_buf_len", "_parser", "response_id")

    def __init__(self, shape: StreamShape, collect_text: bool, max_chars: int) -> None:
        self.shape = shape
        self.collect_text = collect_text
        self.max_chars = max_chars
        self.text_parts: list[str] = []
        self.text_len = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self._buf: list[bytes] = []
        self._buf_len = 0
        self._parser: SSEParser | None = None  # set once a batch needed the full parser
        self.response_id: str | None = None

    def take(self, chunk: Chunk) -> None:
        if chunk.done:
            self.done = True
        if chunk.error is not None:  # (an Anthropic error event is also the stream's end)
            self.error = chunk.error
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.response_id is not None:
            self.response_id = chunk.response_id
        if chunk.text and self.collect_text and self.text_len < self.max_chars:
            self.text_parts.append(chunk.text)
            self.text_len += len(chunk.text)

    def add_events(self, events: bytes) -> None:
        """Whole events; folded once `DECODE_BATCH_BYTES` have gathered."""
        self._buf.append(events)
        self._buf_len += len(events)
        if self._buf_len >= DECODE_BATCH_BYTES:
            self._fold()

    def finish(self) -> None:
        self._fold()

    @property
    def text(self) -> str:
        return "".join(self.text_parts)[:self.max_chars]

    def _fold(self) -> None:
        if not self._buf:
            return
        blob = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf.clear()
        self._buf_len = 0
        if self._parser is None:
            if b"\r" not in blob:
                folded = self.shape.fold(blob, self.collect_text and self.text_len < self.max_chars)
                if folded is not None:
                    self.take(folded)
                    return
                parser = SSEParser()  # plain events the scan declined (comments, errors): parse this batch
            else:
                parser = self._parser = SSEParser()  # the framing itself needs the parser, from here on
        else:
            parser = self._parser
        for event in parser.feed(blob):
            if event.data is not None:
                self.take(self.shape.classify(event.data, event.event))
