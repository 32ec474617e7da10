"""app/hygiene/findings.py: the bounded scan of one request body, and the tool-order memo."""

from __future__ import annotations

import random

from app.hygiene.findings import (
    HEAD_SCAN_CHARS,
    LineClassifier,
    ToolOrderMemo,
    dynamic_findings,
    dynamic_lines,
    tool_findings,
    tools_signature,
)

STATIC = "You are the support assistant for Acme.\n" + "Refunds within 30 days; shipping 3 to 5 days.\n" * 30
QUESTION = {"role": "user", "content": "Where is my order?"}


def chat(system: str, *more: dict, role: str = "system") -> dict:
    return {"model": "m", "messages": [{"role": role, "content": system}, *more, QUESTION]}


def lines_of(body: dict, classifier: LineClassifier | None = None) -> list:
    return dynamic_lines(body, classifier or LineClassifier())


def test_timestamp_on_the_first_line_is_a_finding() -> None:
    found = lines_of(chat("Current time: 2026-04-14T09:31:07Z\n" + STATIC))
    assert [(ln.message, ln.line_no, ln.kinds, ln.movable) for ln in found] == [(0, 1, ("timestamp",), True)]
    assert found[0].static_after >= len(STATIC)
    finding = dynamic_findings(found)[0]
    assert finding.kind == "dynamic_head" and finding.where == "messages[0] line 1"
    assert "2026" not in finding.label()  # findings never carry prompt text


def test_several_kinds_and_developer_messages() -> None:
    system = "Session id: sess_9f8e7d6c5b\nUser: Markus\nToday is 2026-04-14.\n" + STATIC
    found = lines_of(chat(system, role="developer"))
    assert [ln.line_no for ln in found] == [1, 2, 3]
    assert {k for ln in found for k in ln.kinds} >= {"id", "user", "date"}


def test_value_at_the_end_is_left_alone() -> None:
    assert lines_of(chat(STATIC + "Current time: 2026-04-14T09:31:07Z")) == []
    # a short system prompt whose last line is the value: only the question follows
    assert lines_of(chat("Be brief.\nCurrent time: 2026-04-14T09:31:07Z\n")) == []


def test_value_before_the_history_is_a_finding() -> None:
    """At the end of a short system prompt but before earlier turns: it breaks the history."""
    history = [{"role": "user", "content": "My parcel 4711 is late, what now? " * 5},
               {"role": "assistant", "content": "Let me check the tracking for you. " * 5}]
    found = lines_of(chat("Be brief.\nCurrent time: 2026-04-14T09:31:07Z", *history))
    assert [ln.line_no for ln in found] == [2]


def test_decoy_fixed_date_is_left_alone() -> None:
    system = "Our refund policy was last changed on 2024-01-15.\nCopyright 2019 Acme.\n" + STATIC
    assert lines_of(chat(system)) == []
    assert lines_of(chat("Today is 2024-01-15.\n" + STATIC))  # the same date with a "today" cue


def test_user_messages_are_not_scanned() -> None:
    body = {"messages": [{"role": "system", "content": STATIC},
                         {"role": "user", "content": "Current time: 2026-04-14T09:31:07Z\n" + STATIC}]}
    assert lines_of(body) == []


def test_list_content_first_text_part() -> None:
    body = {"messages": [{"role": "system", "content": [
        {"type": "text", "text": "Now: 2026-04-14T09:31:07Z\n" + STATIC}]}, QUESTION]}
    found = lines_of(body)
    assert [(ln.part, ln.line_no) for ln in found] == [(0, 1)]


def test_long_paragraph_is_not_movable() -> None:
    paragraph = "It is 2026-04-14T09:31:07Z and you are the support assistant. " + "Be kind. " * 200
    found = lines_of(chat(paragraph + "\n" + STATIC))
    assert len(found) == 1 and not found[0].movable


def test_scan_is_bounded_and_memoised() -> None:
    """A 1 MB prompt costs only its head; static lines are classified once."""
    classifier = LineClassifier()
    deep = "".join(f"policy clause number {i:06d}, keep it static\n" for i in range(25_000))  # ~1 MB
    body = chat(deep[:500_000] + "Current time: 2026-04-14T09:31:07Z\n" + deep)
    assert lines_of(body, classifier) == []  # beyond the head: not scanned
    assert classifier.misses <= HEAD_SCAN_CHARS // 20
    first = classifier.misses
    for second in range(3):
        lines_of(chat(f"Current time: 2026-04-14T09:31:0{second}Z\n" + STATIC), classifier)
    before = classifier.misses
    lines_of(chat("Current time: 2026-04-14T09:31:09Z\n" + STATIC), classifier)
    assert classifier.misses == before + 1  # only the new timestamp line went to the detector
    assert first > 0


def test_custom_pattern() -> None:
    classifier = LineClassifier([r"\bshard-[a-z]+\b"])
    assert lines_of(chat("Routing: shard-west\n" + STATIC), classifier)
    assert not lines_of(chat("Routing: shard-west\n" + STATIC))


TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
         for n in ("alpha", "beta", "gamma", "delta")]


def test_tool_order_only_when_it_varies() -> None:
    memo = ToolOrderMemo()
    unsorted = [TOOLS[2], TOOLS[0], TOOLS[3], TOOLS[1]]
    assert tool_findings("t", tools_signature(unsorted), memo, flag_unsorted=False) == []
    assert tool_findings("t", tools_signature(unsorted), memo, flag_unsorted=False) == []  # stable: fine
    other = list(reversed(unsorted))
    found = tool_findings("t", tools_signature(other), memo, flag_unsorted=False)
    assert [(f.kind, f.detail) for f in found] == [("tool_order", "order")]
    assert tool_findings("u", tools_signature(other), memo, flag_unsorted=False) == []  # per tenant


def test_tool_key_order_and_flag_unsorted() -> None:
    memo = ToolOrderMemo()
    assert tool_findings("t", tools_signature(TOOLS), memo, flag_unsorted=False) == []
    reordered_keys = [{"function": t["function"], "type": t["type"]} for t in TOOLS]
    found = tool_findings("t", tools_signature(reordered_keys), memo, flag_unsorted=False)
    assert [(f.kind, f.detail) for f in found] == [("tool_order", "key order")]
    shuffled = TOOLS[:]
    random.Random(1).shuffle(shuffled)
    found = tool_findings("fresh", tools_signature(shuffled), ToolOrderMemo(), flag_unsorted=True)
    assert [f.detail for f in found] == ["unsorted"]
    canonical = sorted(TOOLS, key=lambda t: t["function"]["name"])
    import orjson
    canonical = orjson.loads(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS))
    assert tool_findings("fresh2", tools_signature(canonical), ToolOrderMemo(), flag_unsorted=True) == []


def test_value_closing_a_long_system_prompt_before_the_history() -> None:
    """The tail of a long system prompt is scanned only when earlier turns follow it."""
    long_static = STATIC * 4  # beyond the head window
    system = long_static + "Current date: 2026-04-14\n"
    assert lines_of(chat(system)) == []  # single turn: only the question follows
    history = ({"role": "user", "content": "My parcel is late. " * 10},
               {"role": "assistant", "content": "Let me check that for you. " * 10})
    found = lines_of(chat(system, *history))
    assert [(ln.line_no, ln.kinds) for ln in found] == [(-1, ("date",))]
    assert system[found[0].start:found[0].end] == "Current date: 2026-04-14"
    middle = long_static[:3000] + "Current date: 2026-04-14\n" + long_static[3000:]
    assert lines_of(chat(middle, *history)) == []  # neither head nor tail: not scanned (bounded)
