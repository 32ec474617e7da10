"""The dynamic-value detector: formats, languages, ids, and things that must not match."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.prefix.dynamic import (
    DynamicDetector,
    Span,
    _merge,
    date_days,
    dynamic_lines,
    find_dynamic_spans,
    needs_digit,
)

ROOT = Path(__file__).resolve().parent.parent

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


@pytest.mark.parametrize("pattern,needs", [
    (r"\d+", True), (r"[0-9a-f]{8}", False), (r"[2-9]{5}", True), (r"(?=[A-Za-z]*\d)[A-Za-z0-9]{6,}", True),
    (r"(?<=\d)x", False), (r"a\d?", False), (r"(?:\d|x)", False), (r"(?:\d|[0-9])y", True), (r"(?i)(ab|7)c", False),
    (r"x{0,3}\d{2}", True), (r"(?:ab)+1", True),
])
def test_needs_digit_reads_the_parsed_pattern(pattern: str, needs: bool) -> None:
    """Only a digit that every match holds (or that a lookahead every match passes needs) counts;
    a lookbehind, an optional digit or a branch without one does not."""
    assert needs_digit(pattern) is needs


def test_find_skips_patterns_a_window_cannot_match_and_answers_the_same() -> None:
    """Without a digit in the window, only patterns that can match without one run; with digits and
    no weekday or month name, the name patterns do not run; the answers are those of every pattern
    run on every window (the corpora's distinct prompts, sliced)."""
    detector = DynamicDetector()
    every = detector._variants[True, True]
    assert len(detector._variants[False, True]) < len(every) / 2
    assert len(detector._variants[True, False]) < len(every)
    texts = []
    for path in sorted((ROOT / "tests/fixtures/diagnosis_v2").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines()[:12]:
            for req in json.loads(line)["requests"][:2]:
                texts += [m["content"] for m in req["messages"] if isinstance(m.get("content"), str)]
    texts = list(dict.fromkeys(texts))  # each distinct text once: tenants and turns repeat their system prompts
    assert len(texts) > 200
    for text in texts:
        for start in range(0, len(text), 151):
            end = min(len(text), start + 300)
            reference = [Span(m.start(), m.end(), k, m.group(0)) for k, p in every
                         for m in p.finditer(text, start, end) if m.end() > m.start()]
            assert detector.find(text, start, end) == _merge(reference), (text[start:end],)


def test_the_days_a_date_may_mean_in_any_spelling_of_its_month_and_none_for_no_date() -> None:
    """`date_days` reads a month by any spelling the detector knows (Austria's `Jänner`, French
    without accents, `Sept.`) and gives no day, never an error, for a text with a year but no
    month name and fewer than two numbers (it raised ValueError, which the tracker's
    after-response work logged instead of recording the request)."""
    from datetime import date

    assert date_days("16. Jänner 2026") == {date(2026, 1, 16).toordinal()}
    assert date_days("3 aout 2026") == date_days("3 août 2026") == {date(2026, 8, 3).toordinal()}
    assert date_days("Sept. 9, 2026") == {date(2026, 9, 9).toordinal()}
    assert date_days("5 mei 2026") == {date(2026, 5, 5).toordinal()}
    assert date_days("04.05.26") == {date(2026, 4, 5).toordinal(), date(2026, 5, 4).toordinal()}
    for text in ("16 2026", "Brumaire 2026", "2026"):
        assert date_days(text) == set()
