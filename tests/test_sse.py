"""SSE parser and chunk classifier: split reads, line endings, comments, multi-line data."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.proxy.openai_shape import classify
from app.proxy.sse import SSEParser


def feed_all(parser: SSEParser, parts: list[bytes]) -> list:
    events = []
    for part in parts:
        events.extend(parser.feed(part))
    return events


def test_single_events_and_done() -> None:
    p = SSEParser()
    evs = p.feed(b'data: {"a":1}\n\ndata: [DONE]\n\n')
    assert [e.data for e in evs] == [b'{"a":1}', b"[DONE]"]
    assert evs[0].raw == b'data: {"a":1}\n\n'


def test_event_split_across_reads_byte_by_byte() -> None:
    stream = b'data: {"x": "hello"}\n\n: keepalive\n\ndata: [DONE]\n\n'
    evs = feed_all(SSEParser(), [bytes([b]) for b in stream])
    assert [e.data for e in evs] == [b'{"x": "hello"}', b"[DONE]"]


def test_crlf_and_cr_line_endings_split_between_reads() -> None:
    parts = [b"data: one\r", b"\n\r", b"\ndata: two\r\r", b"data: three\n\n"]
    evs = feed_all(SSEParser(), parts)
    assert [e.data for e in evs] == [b"one", b"two", b"three"]


def test_comments_event_field_and_multiline_data() -> None:
    evs = SSEParser().feed(b": comment\nevent: error\ndata: line1\ndata:line2\n\n")
    assert len(evs) == 1
    assert evs[0].data == b"line1\nline2"
    assert evs[0].event == "error"


def test_comment_only_blocks_are_not_events_unless_emit_all() -> None:
    assert SSEParser().feed(b": ping\n\n") == []
    evs = SSEParser(emit_all=True).feed(b": ping\n\n")
    assert len(evs) == 1 and evs[0].data is None and evs[0].raw == b": ping\n\n"


def test_incomplete_event_is_pending_until_blank_line() -> None:
    p = SSEParser()
    assert p.feed(b"data: partial") == []
    assert p.pending() == b"data: partial"
    assert [e.data for e in p.feed(b"\n\n")] == [b"partial"]


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=30),
                min_size=1, max_size=8),
       st.sampled_from([b"\n", b"\r\n", b"\r"]), st.lists(st.integers(1, 40), max_size=20))
def test_any_split_gives_same_events(payloads: list[str], eol: bytes, cuts: list[int]) -> None:
    stream = b"".join(b"data: " + p.encode() + eol + eol for p in payloads)
    whole = [e.data for e in SSEParser().feed(stream)]
    parts, pos = [], 0
    for cut in cuts:
        parts.append(stream[pos:pos + cut])
        pos += cut
    parts.append(stream[pos:])
    split = [e.data for e in feed_all(SSEParser(), parts)]
    assert split == whole
    assert whole == [p.encode() for p in payloads]  # only the one space after "data:" is stripped


def test_emit_all_raw_bytes_reassemble_the_stream() -> None:
    stream = b'data: {"a":1}\r\n\r\n: c\r\n\r\ndata: [DONE]\r\n\r\n'
    parser = SSEParser(emit_all=True)
    evs = feed_all(parser, [stream[i:i + 3] for i in range(0, len(stream), 3)])
    assert [e.data for e in evs if e.raw != b"\n"] == [b'{"a":1}', None, b"[DONE]"]
    # a "\n" completing a dispatching "\r" at the end of a read is handed on by itself
    assert b"".join(e.raw for e in evs) + parser.pending() == stream


def test_the_lf_of_a_dispatching_cr_in_the_next_read_is_handed_on_by_itself() -> None:
    """The CR of an event's closing CR LF ends one read and the LF is the next (the stream's last
    byte, or the first of a read whose event a relay drops): the LF is its own raw piece, neither
    held back forever (a relay lost the stream's last byte: found by
    tests/test_proxy_scan.py's property test in CI) nor glued to the next event."""
    parser = SSEParser(emit_all=True)
    first = parser.feed(b"data: x\r\n\r")
    assert [(e.data, e.raw) for e in first] == [(b"x", b"data: x\r\n\r")]
    assert [(e.data, e.raw) for e in parser.feed(b"\n")] == [(None, b"\n")]
    assert parser.pending() == b""
    nxt = parser.feed(b"\ndata: y\n\n")  # a blank line (its own raw piece), then an event: as before
    assert [(e.data, e.raw) for e in nxt] == [(None, b"\n"), (b"y", b"data: y\n\n")]
    inside = SSEParser(emit_all=True)  # a CR ending a line inside an event keeps its LF in that event
    assert inside.feed(b"data: a\r") == [] and [e.raw for e in inside.feed(b"\n\n")] == [b"data: a\r\n\n"]


def chat(delta: dict, **extra: object) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "delta": delta}], **extra})


def test_classify_role_and_empty_content_are_not_generated() -> None:
    assert not classify(chat({"role": "assistant"}), "chat").generated
    assert not classify(chat({"role": "assistant", "content": ""}), "chat").generated
    assert not classify(chat({"content": None}), "chat").generated


def test_classify_content_reasoning_and_tool_calls() -> None:
    c = classify(chat({"content": "Hi"}), "chat")
    assert c.generated and c.text == "Hi"
    assert classify(chat({"reasoning_content": "think"}), "chat").generated
    assert classify(chat({"reasoning": "think"}), "chat").generated
    tc = classify(chat({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), "chat")
    assert tc.generated and tc.text == ""


def test_classify_completions_text() -> None:
    assert classify(orjson.dumps({"choices": [{"index": 0, "text": "x"}]}), "completions").generated
    assert not classify(orjson.dumps({"choices": [{"index": 0, "text": ""}]}), "completions").generated


def test_classify_usage_done_error() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    u = classify(orjson.dumps({"choices": [], "usage": usage}), "chat")
    assert u.usage_only and u.usage == usage and not u.generated
    assert classify(b"[DONE]", "chat").done
    err = classify(orjson.dumps({"error": {"message": "boom", "code": 500}}), "chat")
    assert err.error == {"message": "boom", "code": 500}
    assert not classify(b"not json", "chat").parsed
