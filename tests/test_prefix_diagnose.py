"""Break diagnosis on request pairs: each cause, each decoy, helpers (sequences: test_diagnosis_cases.py,
scores on the corpora: test_diagnosis_scores.py)."""

from __future__ import annotations

import pytest

from app.prefix.diagnose import diagnose, fix_for, lcp, past_of, redact, snippet
from app.prefix.dynamic import find_dynamic_spans
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import build_sketch
from app.prefix.tokens import SegmentTokenizer

STATIC = "You are the support assistant. Refunds within 30 days. Shipping takes 3 to 5 days.\n" * 20


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def sk(fpr: Fingerprinter, body: dict):
    inp = prompt_input("chat", body)
    return build_sketch(inp, fpr.render(inp))


def chat(system: str, *turns: str, tools=None) -> dict:
    roles = ["user", "assistant"]
    body = {"messages": [{"role": "system", "content": system}]
            + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}
    if tools:
        body["tools"] = tools
    return body


def cause(fpr, prev: dict, cur: dict):
    return diagnose(sk(fpr, prev), sk(fpr, cur))


def test_lcp() -> None:
    a = "x" * 10_000 + "abc"
    assert lcp(a, a) == len(a)
    assert lcp(a, "x" * 10_000 + "abd") == 10_002
    assert lcp("", "a") == 0
    assert lcp("hello", "help", 0, 0) == 3
    assert lcp("zzhello", "help", 2, 0) == 3


def test_dynamic_head_located(fpr) -> None:
    d = cause(fpr, chat("Current time: 2026-04-14T09:31:07Z\n" + STATIC, "q1"),
              chat("Current time: 2026-04-14T09:32:55Z\n" + STATIC, "q2"))
    assert d.cause == "dynamic_head"
    assert d.spans[0].text == "2026-04-14T09:32:55Z" and d.spans[0].kind == "timestamp"
    fix = fix_for(d, sk(fpr, chat("Current time: 2026-04-14T09:32:55Z\n" + STATIC, "q2")).text)
    assert fix is not None and "`Current time: …`" in fix


def test_continuation_is_not_a_break_and_a_new_question_is_a_new_session(fpr) -> None:
    assert cause(fpr, chat(STATIC, "q1"), chat(STATIC, "q1", "a1", "q2")).cause is None
    d = cause(fpr, chat(STATIC, "What is the refund window?"), chat(STATIC, "How long is shipping?"))
    assert d.cause == "new_session" and not d.is_break  # a new conversation over the same head


def test_decoy_static_date_is_not_dynamic(fpr) -> None:
    head = "Policy effective 2025-01-01, id 550e8400-e29b-41d4-a716-446655440000.\n"
    assert cause(fpr, chat(head + STATIC, "a"), chat(head + STATIC, "b")).cause == "new_session"
    edited = STATIC.replace("30 days", "45 days", 1)
    assert cause(fpr, chat(head + STATIC, "a"), chat(head + edited, "a")).cause == "template_change"


def test_decoy_dynamic_at_the_end_is_no_break(fpr) -> None:
    turns = ("first question " * 10, "first answer " * 10)
    first = sk(fpr, chat(STATIC, turns[0]))  # the conversation so far: its first turn was sent before
    prev = sk(fpr, chat(STATIC, *turns, "q\nCurrent time: 2026-04-14T09:31:07Z"))
    cur = sk(fpr, chat(STATIC, *turns, "q\nCurrent time: 2026-04-14T09:35:07Z"))
    assert diagnose(prev, cur, past=past_of([first, prev])).cause is None
    d = cause(fpr, chat(STATIC + "Now: 2026-04-14 09:31:07", "q"), chat(STATIC + "Now: 2026-04-14 09:39:01", "other q"))
    assert d.cause == "new_session"  # only the question follows the value: nothing reusable was lost


def test_dynamic_end_of_system_breaks_a_conversation(fpr) -> None:
    turns = ("first question " * 10, "first answer " * 10, "second")
    d = cause(fpr, chat(STATIC + "Now: 2026-04-14 09:31:07", *turns[:1]),
              chat(STATIC + "Now: 2026-04-14 09:39:01", *turns))
    assert d.cause == "dynamic_head"


def test_tool_order(fpr) -> None:
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "abc"]
    assert cause(fpr, chat(STATIC, "q", tools=tools), chat(STATIC, "q", tools=tools[::-1])).cause == "tool_order"
    keyed = [{"function": t["function"], "type": t["type"]} for t in tools]
    assert cause(fpr, chat(STATIC, "q", tools=tools), chat(STATIC, "q", tools=keyed)).cause == "tool_order"


def test_front_trim(fpr) -> None:
    turns = [f"turn {i} " * 20 for i in range(8)]
    assert cause(fpr, chat(STATIC, *turns[:7]), chat(STATIC, *turns[2:8], "new")).cause == "front_trim"


def test_new_session_and_template_change(fpr) -> None:
    other = "Translate everything into formal Japanese. Never explain.\n" * 10
    assert cause(fpr, chat(STATIC, "q"), chat(other, "q")).cause == "new_session"
    assert cause(fpr, chat(STATIC, "q"), chat("IMPORTANT: be brief.\n" + STATIC, "q")).cause == "template_change"


def test_question_before_docs(fpr) -> None:
    docs = "Section: the returns procedure requires form 7 and a sign-off.\n" * 30
    d = cause(fpr, chat("Be helpful.", f"Who signs?\n{docs}"), chat("Be helpful.", f"Which form?\n{docs}"))
    assert d.cause == "question_first"


def test_redaction_hides_text() -> None:
    text = "Current time: 2026-04-14T09:31:07Z\nSecret plan"
    spans = find_dynamic_spans(text)
    red = redact(text, spans)
    assert "Secret" not in red and "2026" not in red and "<timestamp>" in red
    assert snippet(text, 14, spans, show_text=True) == text[:94]
    assert "Secret" not in snippet(text, 14, spans, show_text=False)


