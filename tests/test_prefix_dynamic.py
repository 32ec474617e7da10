"""The dynamic-value detector: formats, languages, ids, and things that must not match."""

from __future__ import annotations

import pytest

from app.prefix.dynamic import DynamicDetector, dynamic_lines, find_dynamic_spans

DYNAMIC = [
    ("Current time: 2026-04-14T09:31:07Z", "timestamp"),
    ("now 2026-04-14 09:31:07.123+02:00", "timestamp"),
    ("Heute ist der 30.08.2026, 14:03 Uhr", "date"),
    ("Dienstag, 14. April 2026", "date"),
    ("Nous sommes le 14 avril 2026", "date"),
    ("Hoy es 14 de abril de 2026", "date"),
    ("今天是2026年4月14日", "date"),
    ("Today is Tuesday, April 14, 2026 at 9:31 AM", "date"),
    ("Date: 04/14/2026", "date"),
    ("Mon, 14 Apr 2026 09:31:07 GMT", "date"),
    ("It is 21:07:55 now", "time"),
    ("trace 550e8400-e29b-41d4-a716-446655440000", "uuid"),
    ("ulid 01ARZ3NDEKTSV4RRFFQ69G5FAV", "ulid"),
    ("Request ID: 7f3a9c1e", "id"),
    ("session_id=abc123xyz", "id"),
    ("ref req_8HfK2mQ9zT", "id"),
    ("contact bob.smith@example.com", "email"),
    ("Du sprichst mit Markus", "user"),
    ("username: alice_w", "user"),
    ("This is turn 12 of the session", "counter"),
    ("commit 3f5a9c0e1b2d4f6a8c7e", "hex"),
    ("ts=1712345678", "epoch"),
]

NOT_DYNAMIC = [
    "Policy v2.3.1 applies.", "Use Python 3.11 or newer.", "Ratio 3:1 is fine.", "Pages 12-14.",
    "You are a helpful assistant.", "Section 4.2.1 describes it.", "Answer in JSON.",
    "Call the tool named get_weather.",
]


@pytest.mark.parametrize("text,kind", DYNAMIC)
def test_detects(text: str, kind: str) -> None:
    spans = find_dynamic_spans(text)
    assert spans, text
    assert spans[0].kind == kind
    assert text[spans[0].start:spans[0].end] == spans[0].text


@pytest.mark.parametrize("text", NOT_DYNAMIC)
def test_ignores_static_text(text: str) -> None:
    assert find_dynamic_spans(text) == []


def test_lines_helper_locates_lines() -> None:
    text = "You are helpful.\nCurrent time: 2026-04-14T09:31:07Z\nAnswer briefly.\nUser: bob@example.com"
    lines = dynamic_lines(text)
    assert [ln.text for ln in lines] == ["Current time: 2026-04-14T09:31:07Z", "User: bob@example.com"]
    assert text[lines[0].start:lines[0].end] == lines[0].text


def test_extra_patterns() -> None:
    assert find_dynamic_spans("build BLD-4411 ok") == []
    det = DynamicDetector([r"BLD-\d+"])
    spans = det.find("build BLD-4411 ok")
    assert [(s.kind, s.text) for s in spans] == [("custom", "BLD-4411")]
    assert find_dynamic_spans("build BLD-4411 ok", [r"BLD-\d+"])[0].text == "BLD-4411"
