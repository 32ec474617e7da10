"""Incremental Server-Sent Events framing: the grammar every stream shape shares.

`SSEParser.feed` accepts arbitrary TCP reads (an event split across reads, `\\r\\n` or `\\r` line
ends, comments, multi-line `data:`) and returns the events completed by that read, each with its
raw bytes, so the observer (app/proxy/observer.py) can forward whole events byte-for-byte and leave
out the one it must drop. What an event *means* is the stream shape's business (app/proxy/shape.py).
"""

from __future__ import annotations

from dataclasses import dataclass

_LF = 0x0A


@dataclass(slots=True)
class SSEEvent:
    data: bytes | None  # data lines joined with b"\n"; None for a block without data (comments)
    event: str | None  # the `event:` field, when any
    raw: bytes  # the event's bytes as received, blank-line terminator included


class SSEParser:
    """Stateful, incremental SSE parser (the WHATWG event-stream grammar, minus `retry`/`id`).

    Invariant between feeds: `_line` holds an unterminated line, `_raw` the bytes of the current
    (not yet dispatched) event already consumed, `_data`/`_event` its fields so far.
    """

    __slots__ = ("_line", "_raw", "_data", "_event", "_has_data", "_pending_cr", "_emit_all")

    def __init__(self, emit_all: bool = False) -> None:
        """`emit_all`: also return blocks without data (comments, bare fields) as events with
        `data=None`, so a filtering relay can forward every byte it does not mean to drop."""
        self._emit_all = emit_all
        self._line = b""
        self._raw = bytearray()
        self._data: list[bytes] = []
        self._event: str | None = None
        self._has_data = False
        self._pending_cr = False  # the previous read ended in "\r": a following "\n" belongs to it

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not chunk:
            return events
        buf = chunk
        start = 0
        if self._pending_cr:
            self._pending_cr = False
            if buf[0] == _LF:
                start = 1
                if self._raw or self._has_data or self._event is not None:
                    self._raw += b"\n"  # the CR ended a line of the event still being read
                elif self._emit_all:
                    # the CR was the blank line that dispatched the last event: its LF is no part
                    # of the next one (which may be dropped, or never come: the stream's last byte)
                    events.append(SSEEvent(None, None, b"\n"))
        if self._line:
            buf = self._line + buf[start:]
            start = 0
            self._line = b""
        n = len(buf)
        pos = start
        raw_from = start  # bytes of buf not yet copied into _raw
        while pos < n:
            nl = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, nl if nl >= 0 else n)
            if cr >= 0:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == _LF else cr + 1
                else:
                    nxt = cr + 1
                    self._pending_cr = True
            elif nl >= 0:
                end, nxt = nl, nl + 1
            else:
                break
            line = buf[pos:end]
            pos = nxt
            if line:
                self._field(line)
                continue
            # blank line: dispatch
            self._raw += buf[raw_from:pos]
            raw_from = pos
            if self._has_data:
                events.append(SSEEvent(b"\n".join(self._data), self._event, bytes(self._raw)))
            elif self._emit_all and self._raw:
                events.append(SSEEvent(None, self._event, bytes(self._raw)))
            self._raw.clear()
            self._data = []
            self._event = None
            self._has_data = False
        self._raw += buf[raw_from:pos]
        self._line = buf[pos:]
        return events

    def _field(self, line: bytes) -> None:
        if line[0] == 0x3A:  # ":" comment
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")

    def pending(self) -> bytes:
        """Bytes received but not yet part of a dispatched event (for filtering relays)."""
        return bytes(self._raw) + self._line


class WholeEvents:
    """Cuts a byte stream into whole events: `push` returns the bytes of every event completed
    so far (byte-exact, blank-line terminators included) and holds back an incomplete tail.

    The usual read (`\\n` framing, as vLLM and SGLang write it) costs one `endswith`, or one
    `rfind(b"\\n\\n")` when a read ends inside an event; once a `\\r` shows up, the full parser
    finds the boundaries (`\\r\\n` and `\\r` line ends) from then on.
    """

    __slots__ = ("held", "plain", "_parser")

    def __init__(self, held: bytes = b"") -> None:
        self.held = held  # an incomplete event, `\\n` framing only
        self.plain = True  # still `\\n` framing (no `\\r` seen): boundaries found by byte search
        self._parser: SSEParser | None = None

    def push(self, data: bytes) -> bytes:
        if self._parser is None:
            if b"\r" not in data and b"\r" not in self.held:
                buf = self.held + data if self.held else data
                if buf.endswith(b"\n\n"):
                    self.held = b""
                    return buf
                end = buf.rfind(b"\n\n") + 2
                if end < 2:
                    self.held = buf
                    return b""
                self.held = buf[end:]
                return buf[:end]
            self._parser = SSEParser(emit_all=True)
            self.plain = False
            data, self.held = self.held + data, b""
        return b"".join([ev.raw for ev in self._parser.feed(data)])


def line_ends_before(raw: bytes) -> bytes:
    """The line ends a parsed event's raw bytes start with, which are not the event's: the LF of a
    CR LF whose CR ended the previous read, or blank lines. Dropping an event keeps them."""
    return raw[:len(raw) - len(raw.lstrip(b"\r\n"))]
