"""`move_dynamic` on `/v1/messages`: a timestamp line on top of the system blocks, over a
Claude-Code-shaped multi-turn session (real `anthropic` client -> proxy -> simulator, loopback):

- under `observe` the line changes the head of every prompt: a `dynamic_head` break each turn
  and almost no cache hits;
- under `rewrite` the line moves into the last user turn (after the billing header is stripped),
  the head renders the same bytes every turn: near-full hits, predicted == engine cached on every
  turn, `x-prefixgate-rewrites` and `prefixgate_rewrites_total{route="messages"}` say so;
- the mapping from the rendered system text back onto the blocks: a string `system`, a line
  left in its block with `system_end`, and the cases where nothing may move;
- Responses `instructions` follow the same targets as chat (`system_end`, and the fallback when
  no user text can carry the line).
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from app.dialects.responses import responses_view
from app.hygiene.findings import LineClassifier, dynamic_lines
from app.hygiene.rewrite import RewriteOptions
from app.hygiene.rewrite_messages import move_system_lines
from app.hygiene.rewrite_responses import apply_responses_rewrites
from app.prefix.convert_messages import chat_view
from tests.test_api_messages import STATIC, TOOLS, billing, breaks, client_for, prompt_of, wait_processed

TURNS = 4


def stamp(turn: int) -> str:
    return f"Current time: 2026-01-05T09:1{turn}:00Z\n"


def timestamp_session(client: anthropic.Anthropic, tenant: str, hook: Any) -> tuple[list[Any], list[Any]]:
    """Billing header + a system block opening with a timestamp line, 22 tools, a growing history;
    each turn's final usage and response headers."""
    history: list[dict[str, Any]] = []
    usages, headers = [], []
    for turn in range(TURNS):
        history.append({"role": "user", "content": [{"type": "text", "text": f"Turn {turn}: fix the failing test."}]})
        system = [billing(turn), {"type": "text", "text": stamp(turn) + STATIC}]
        with client.messages.stream(model="sim", max_tokens=12, system=system, tools=TOOLS, messages=history,
                                    extra_headers={"x-tenant-id": tenant}) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
            headers.append(s.response.headers)
        usages.append(final.usage)
        history.append({"role": "assistant", "content": [{"type": "text", "text": text or "ok"}]})
        wait_processed(hook, turn + 1)
    return usages, headers


@pytest.mark.parametrize("policy", ["observe", "rewrite"])
def test_a_system_timestamp_breaks_every_turn_unless_rewrite_moves_it(sim_factory, proxy_factory, policy) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, tenants={"default": {"policy": policy}})
    hook = proxy.services.prefix
    usages, headers = timestamp_session(client_for(proxy), "cc", hook)
    rows = list(hook.predictions)
    assert len(rows) == TURNS
    assert [p for _, _, p, _ in rows] == [d for _, _, _, d in rows]  # predicted == engine, every turn
    assert sorted(u.cache_read_input_tokens for u in usages) == sorted(d for _, _, _, d in rows)
    ratios = [u.cache_read_input_tokens / prompt_of(u) for u in usages[1:]]
    if policy == "observe":
        assert max(ratios) < 0.05  # the timestamp is the first thing the engine renders
        assert breaks(proxy, "cc") == {"dynamic_head": TURNS - 1}
        assert all("x-prefixgate-rewrites" not in h for h in headers)
    else:
        assert min(ratios) > 0.9
        assert "dynamic_head" not in breaks(proxy, "cc")
        assert all(h["x-prefixgate-rewrites"] == "strip_billing_header, move_dynamic(1)" for h in headers)
        assert all("x-prefixgate-hygiene" not in h for h in headers)  # both findings fixed
        assert proxy.sample("prefixgate_rewrites_total", route="messages", tenant="cc", kind="move_dynamic") == TURNS
        assert proxy.sample("prefixgate_rewrites_total", route="messages", tenant="cc",
                            kind="strip_billing_header") == TURNS
    # the findings are counted under either policy
    assert proxy.sample("prefixgate_hygiene_findings_total", route="messages", tenant="cc",
                        kind="dynamic_head") == TURNS


# ---------------------------------------------------------------------------- the body itself
QUESTION = [{"role": "user", "content": "Fix it."}]


def moved(body: dict[str, Any], **opts: Any) -> dict[str, Any] | None:
    view = chat_view(body)
    lines = dynamic_lines(view, LineClassifier())
    return move_system_lines(body, lines, RewriteOptions(**opts))


def rendered_system(body: dict[str, Any]) -> str:
    return chat_view(body)["messages"][0]["content"]


def test_a_string_system_moves_its_line_into_the_last_user_turn() -> None:
    body = {"system": "Rules.\n" + stamp(0) + STATIC, "messages": QUESTION}
    new = moved(body)
    assert new is not None and new["system"] == "Rules.\n" + STATIC
    assert new["messages"] == [{"role": "user", "content": "Fix it.\n\n" + stamp(0).rstrip("\n")}]
    assert body["system"].startswith("Rules.\n" + stamp(0))  # the input is never mutated


def test_a_block_left_empty_is_dropped_and_list_content_gets_a_text_block() -> None:
    body = {"system": [billing(0), {"type": "text", "text": stamp(1)}, {"type": "text", "text": STATIC}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Fix it."}]}]}
    new = moved(body)
    assert new is not None
    assert new["system"] == [billing(0), {"type": "text", "text": STATIC}]  # the billing block is not this rewrite's
    assert new["messages"][0]["content"][-1] == {"type": "text", "text": stamp(1).rstrip("\n")}


def test_system_end_appends_to_the_last_system_block() -> None:
    body = {"system": [{"type": "text", "text": stamp(2) + STATIC}, {"type": "text", "text": "Be brief."}],
            "messages": QUESTION}
    new = moved(body, move_target="system_end")
    assert new is not None and new["messages"] == QUESTION
    assert rendered_system(new) == STATIC + "Be brief.\n" + stamp(2).rstrip("\n")
    assert new["system"][1]["text"] == "Be brief.\n" + stamp(2).rstrip("\n")


def test_a_line_across_two_blocks_or_in_an_inline_system_message_does_not_move() -> None:
    across = {"system": [{"type": "text", "text": "Current time: 2026-01-05T09:10"},
                         {"type": "text", "text": ":00Z\n" + STATIC}], "messages": QUESTION}
    assert dynamic_lines(chat_view(across), LineClassifier())  # it is a finding
    assert moved(across) is None  # but no block holds the whole line
    merged = {"system": "Rules.\n", "messages": [{"role": "system", "content": stamp(3) + STATIC}, *QUESTION]}
    view = chat_view(merged, merge_inline_system=True)
    lines = dynamic_lines(view, LineClassifier())
    assert lines and move_system_lines(merged, lines, RewriteOptions()) is None


# ---------------------------------------------------------------------------- and Responses, by chat's rule
def responses_moved(body: dict[str, Any], **opts: Any) -> dict[str, Any]:
    lines = dynamic_lines(responses_view(body), LineClassifier())
    return apply_responses_rewrites(body, lines, RewriteOptions(**opts)).body


def test_responses_instructions_follow_chats_targets() -> None:
    body = {"instructions": stamp(0) + STATIC, "input": "Fix it."}
    assert responses_moved(body) == {"instructions": STATIC, "input": "Fix it.\n\n" + stamp(0).rstrip("\n")}
    # system_end: the line goes to the end of the instructions, as chat's system message
    assert responses_moved(body, move_target="system_end") == \
        {"instructions": STATIC + stamp(0).rstrip("\n"), "input": "Fix it."}
    # no user text to carry it (only a tool output follows): chat's fallback, the end of the instructions
    tool_only = {"instructions": stamp(1) + STATIC,
                 "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    assert responses_moved(tool_only)["instructions"] == STATIC + stamp(1).rstrip("\n")
