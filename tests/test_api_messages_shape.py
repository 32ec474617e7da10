"""The Messages stream shape, the Messages -> chat conversion and the billing-header hygiene,
without a server (the end-to-end tests are tests/test_api_messages.py)."""

from __future__ import annotations

import json

import orjson
import pytest

from app.dialects import CHAT, MESSAGES
from app.hygiene.findings import BILLING_HEADER, DYNAMIC_HEAD, billing_block_finding, billing_header_finding
from app.prefix.convert_messages import chat_view, convert_messages, convert_tools, strip_billing_lines
from app.proxy.anthropic_shape import AnthropicShape, openai_usage
from app.proxy.clock import StreamClock
from app.proxy.context import Timings
from app.proxy.observer import StreamObserver

BILLING = "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch=0f3a9;"


def ev(name: str, obj: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


START = ev("message_start", {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m",
    "usage": {"input_tokens": 40, "output_tokens": 0, "cache_read_input_tokens": 960,
              "cache_creation_input_tokens": 16}}})
BLOCK = ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}})
PING = ev("ping", {"type": "ping"})


def delta(kind: str, field: str, value: str) -> bytes:
    return ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": kind, field: value}})


END = (ev("content_block_stop", {"type": "content_block_stop", "index": 0})
       + ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                              "usage": {"input_tokens": 40, "output_tokens": 7, "cache_read_input_tokens": 960,
                                        "cache_creation_input_tokens": 16}})
       + ev("message_stop", {"type": "message_stop"}))


def observer() -> StreamObserver:
    return StreamObserver(AnthropicShape(), StreamClock(Timings(arrival=0.0)), drop_usage=False, collect_text=True)


@pytest.mark.parametrize("first", [delta("text_delta", "text", "Hi"), delta("thinking_delta", "thinking", "hmm"),
                                   delta("input_json_delta", "partial_json", '{"p')])
def test_ttft_stops_at_the_first_delta_with_text(first: bytes) -> None:
    obs = observer()
    out = [obs.feed(START, 1.0), obs.feed(BLOCK + PING, 2.0),
           obs.feed(delta("text_delta", "text", ""), 3.0),  # an empty delta carries nothing
           obs.feed(first, 4.0), obs.feed(delta("text_delta", "text", " there"), 5.0), obs.feed(END, 6.0)]
    obs.finish()
    assert obs.clock.timings.first_token == 4.0
    assert obs.clock.timings.last_token == 5.0
    assert b"".join(out) == START + BLOCK + PING + delta("text_delta", "text", "") + first \
        + delta("text_delta", "text", " there") + END  # relayed byte for byte
    assert obs.done and obs.error is None
    # Anthropic's input_tokens excludes cache reads and writes: the prompt is the sum
    assert obs.usage == {"prompt_tokens": 1016, "prompt_tokens_details": {"cached_tokens": 960},
                         "completion_tokens": 7}
    assert obs.output_text.endswith(" there")


def test_usage_from_message_start_survives_a_delta_without_it() -> None:
    shape = AnthropicShape()
    shape.classify(START[START.index(b"data: ") + 6:-2])
    chunk = shape.classify(b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}')
    assert chunk.usage == {"prompt_tokens": 1016, "prompt_tokens_details": {"cached_tokens": 960},
                           "completion_tokens": 3}


def test_unknown_cache_counts_stay_absent() -> None:
    assert openai_usage({"input_tokens": 12, "output_tokens": 2}) == {"prompt_tokens": 12, "completion_tokens": 2}
    assert openai_usage({"output_tokens": 2}) == {"completion_tokens": 2}
    assert openai_usage(None) is None


def test_an_upstream_error_event_ends_the_stream_as_an_error() -> None:
    obs = observer()
    obs.feed(START + BLOCK + delta("text_delta", "text", "a"), 1.0)
    obs.feed(ev("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}), 2.0)
    obs.finish()
    assert obs.done and obs.error == {"type": "overloaded_error", "message": "busy"}


def test_the_proxy_error_event_is_anthropic_shaped() -> None:
    tail = AnthropicShape().error_event({"message": "upstream closed the stream", "type": "server_error",
                                         "code": "upstream_midstream"})
    assert tail == (b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
                    b'"message":"upstream closed the stream"}}\n\n')


def test_conversion_follows_the_engine() -> None:
    body = {
        "system": [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are helpful."},
                   {"type": "text", "text": ""}, {"type": "text", "text": " Be brief."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan"},
                                              {"type": "text", "text": "Reading."},
                                              {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": "a"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "l1"}, {"type": "text", "text": "l2"}]},
                {"type": "text", "text": "go on"}]},
            {"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Reminder."}]},
            {"role": "system", "content": BILLING},
            {"role": "ctx", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "ok"}]},
        ],
        "tools": [{"name": "read", "description": "Read a file", "input_schema": {"properties": {}}}],
    }
    assert convert_messages(body) == [
        {"role": "system", "content": "You are helpful. Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "reasoning": "plan", "content": "Reading.",
         "tool_calls": [{"id": "t1", "type": "function",
                         "function": {"name": "read", "arguments": json.dumps({"p": "a"})}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "l1\nl2"},
        {"role": "user", "content": "go on"},
        {"role": "system", "content": "Reminder."},  # in place, its billing block dropped; the other one dropped
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "tool", "tool_call_id": "t2", "content": "ok"},  # the user message itself had no content
    ]
    kept = convert_messages(body, strip_billing=False)
    assert kept[0]["content"] == BILLING + "You are helpful. Be brief."
    assert [m["content"] for m in kept if m["role"] == "system"][1:] == [BILLING + "Reminder.", BILLING]
    merged = convert_messages(body, merge_inline_system=True)  # a system-first template
    assert merged[0]["content"] == "You are helpful. Be brief.Reminder."
    assert [m["role"] for m in merged].count("system") == 1
    assert chat_view(body)["tools"] == [{"type": "function", "function": {
        "name": "read", "description": "Read a file", "parameters": {"properties": {}, "type": "object"}}}]
    assert convert_tools([{"name": "x", "input_schema": {"type": "object"}, "strict": True}]) == [
        {"type": "function", "function": {"name": "x", "description": None, "parameters": {"type": "object"},
                                          "strict": True}}]


def test_billing_header_finding_and_rewrite_on_both_routes() -> None:
    messages_body = {"system": [{"type": "text", "text": BILLING}, {"type": "text", "text": "static"}],
                     "messages": [{"role": "user", "content": "q"}]}
    finding = billing_block_finding(messages_body)
    assert finding is not None and (finding.kind, finding.detail) == (DYNAMIC_HEAD, BILLING_HEADER)
    assert MESSAGES.strip_billing(messages_body)["system"] == [{"type": "text", "text": "static"}]
    chat_body = {"messages": [{"role": "system", "content": BILLING + "\nYou are a coding agent."},
                              {"role": "user", "content": "q"}]}
    assert billing_header_finding(chat_body).detail == BILLING_HEADER
    assert CHAT.strip_billing(chat_body)["messages"][0]["content"] == "You are a coding agent."
    assert strip_billing_lines(chat_body["messages"])[0]["content"] == "You are a coding agent."
    parts = [{"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": "x"}]}]
    assert strip_billing_lines(parts) == [{"role": "system", "content": [{"type": "text", "text": "x"}]}]
    clean = {"messages": [{"role": "system", "content": "You are a coding agent."}]}
    assert strip_billing_lines(clean["messages"]) is clean["messages"]  # no copy when nothing to strip
    assert billing_header_finding(clean) is None and CHAT.strip_billing(clean) is None
    assert billing_block_finding({"system": "static " + BILLING, "messages": []}) is None
