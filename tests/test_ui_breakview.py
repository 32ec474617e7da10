"""The break view the tracker writes into the Store (app/prefix/breakview.py), and the page's
per-tenant row (app/ui/data.py): pure functions, no server."""

from __future__ import annotations

import pytest

from app.prefix.breakview import STRUCTURE_AROUND, break_view, locate, window
from app.prefix.diagnose import diagnose
from app.prefix.dynamic import Span
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import build_sketch
from app.prefix.tokens import SegmentTokenizer
from app.ui.data import nearest_rank, tenant_summary, ttft_by_bucket

STATIC = "You are the Quokka freight desk. Pallets leave Zanzibar on weekdays.\n" * 20


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def sketch(fpr: Fingerprinter, messages: list[dict]):
    inp = prompt_input("chat", {"messages": messages})
    return build_sketch(inp, fpr.render(inp))


def clock(ts: str, question: str = "Where is crate 7?") -> list[dict]:
    return [{"role": "system", "content": f"Current time: {ts}\n{STATIC}"}, {"role": "user", "content": question}]


def marked(side: dict) -> list[str]:
    return [side["text"][a:b] for a, b, _ in side["marks"]]


def test_redacted_view_marks_the_value_as_its_kind_and_hides_every_letter(fpr) -> None:
    prev, cur = sketch(fpr, clock("2026-04-14T09:31:07Z")), sketch(fpr, clock("2026-04-14T09:32:07Z"))
    diag = diagnose(prev, cur)
    assert diag.cause == "dynamic_head"
    view = break_view(prev, cur, diag, show_text=False)
    for side in ("prev", "cur"):
        win = view["view"][side]
        assert marked(win) == ["<timestamp>"] and win["marks"][0][2] == "timestamp"
        assert "Quokka" not in win["text"] and "2026" not in win["text"] and "Current" not in win["text"]
        assert "xxxxxxx xxxx: <timestamp>\nxxx xxx xxx xxxxxx" in win["text"]  # shape kept
    assert view["view"]["text_shown"] is False
    assert view["message"] == {"index": 0, "role": "system", "where": "content", "line": 1}
    assert view["line"] == cur.text.count("\n", 0, diag.char_offset) + 1
    assert view["structure"]["cur"]["regions"] == [[0, "system", len(cur.system_text)], [1, "user", 17]]


def test_shown_view_marks_the_real_values_on_both_sides(fpr) -> None:
    prev, cur = sketch(fpr, clock("2026-04-14T09:31:07Z")), sketch(fpr, clock("2026-04-14T09:32:07Z"))
    view = break_view(prev, cur, diagnose(prev, cur), show_text=True)
    assert marked(view["view"]["cur"]) == ["2026-04-14T09:32:07Z"]
    assert marked(view["view"]["prev"]) == ["2026-04-14T09:31:07Z"]
    assert "Quokka freight desk" in view["view"]["cur"]["text"]


def test_a_non_dynamic_break_marks_the_differing_run(fpr) -> None:
    base = [{"role": "system", "content": STATIC}, {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "An answer about pallets.\n" * 10}]
    edited = [base[0], {"role": "user", "content": "first question, edited"}, base[2]]
    prev = sketch(fpr, [*base, {"role": "user", "content": "next"}])
    cur = sketch(fpr, [*edited, {"role": "user", "content": "next"}])
    diag = diagnose(prev, cur)
    assert diag.cause is not None and not diag.spans
    view = break_view(prev, cur, diag, show_text=False)
    kinds = {m[2] for m in view["view"]["cur"]["marks"]}
    assert kinds == {"diff"} and marked(view["view"]["cur"])[0].startswith(",")  # ", edited" masked
    assert view["message"]["index"] == 1 and view["message"]["role"] == "user"


def test_window_maps_marks_through_replaced_spans() -> None:
    text = "head line\nid: 7f3a9c1e-aaaa-bbbb-cccc-123456789abc then Static words follow here"
    start = text.index("7f3a")
    span = Span(start, start + 36, "uuid", text[start:start + 36])
    win = window(text, start, [(span.start, span.end, "uuid"), (span.end + 1, span.end + 5, "diff")], [span], False)
    assert marked(win) == ["<uuid>", "xxxx"]
    assert win["text"] == "xxxx xxxx\nxx: <uuid> xxxx xxxxxx xxxxx xxxxxx xxxx"


def test_locate_names_template_text_before_a_message(fpr) -> None:
    cur = sketch(fpr, clock("2026-04-14T09:32:07Z"))
    first = cur.regions[0]
    assert locate(cur, first.start - 1) == (first, "template")
    assert locate(cur, first.start) == (first, "content")
    assert locate(cur, len(cur.text) + 5) == (None, "template")


def test_structure_is_bounded_around_the_divergent_message(fpr) -> None:
    turns = [{"role": "system", "content": STATIC}]
    for i in range(60):
        turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 5})
    prev = sketch(fpr, [*turns, {"role": "user", "content": "last"}])
    turns[30] = {"role": "assistant", "content": "rewritten " * 5}
    cur = sketch(fpr, [*turns, {"role": "user", "content": "last"}])
    diag = diagnose(prev, cur)
    view = break_view(prev, cur, diag, show_text=False)
    regions = view["structure"]["cur"]["regions"]
    assert view["message"]["index"] == 30
    assert [r[0] for r in regions] == list(range(30 - STRUCTURE_AROUND, 30 + STRUCTURE_AROUND + 1))
    assert view["structure"]["cur"]["messages"] == 62


def test_ttft_quantiles_by_bucket_are_observed_values_and_unknown_is_absent() -> None:
    recent = [{"ttft_s": v, "prompt_tokens": 1500} for v in (0.5, 0.1, 0.3, 0.2, 0.4)]
    recent += [{"ttft_s": 2.0, "prompt_tokens": 20_000}, {"ttft_s": None, "prompt_tokens": 300},
               {"ttft_s": 0.7, "prompt_tokens": None}]
    assert ttft_by_bucket(recent) == {"1k-4k": {"n": 5, "p50": 0.3, "p95": 0.5},
                                      "16k-64k": {"n": 1, "p50": 2.0, "p95": 2.0}}
    assert nearest_rank([1.0, 2.0], 0.5) == 1.0 and nearest_rank([3.0], 0.95) == 3.0


def test_tenant_summary_keeps_the_newest_break_and_the_sparkline() -> None:
    report = {"tenant": "t", "requests": 3, "window": 3, "continuity": 0.5, "breaks": 1,
              "breaks_by_cause": {"other": 1}, "last_breaks": [{"seq": 3, "cause": "other"}],
              "recent": [{"seq": 1, "continuity": None, "cause": None, "ttft_s": 0.1, "prompt_tokens": 10},
                         {"seq": 2, "continuity": 1.0, "cause": None},
                         {"seq": 3, "continuity": 0.1, "cause": "other"}]}
    row = tenant_summary(report)
    assert row["last_break"] == {"seq": 3, "cause": "other"}
    assert [r["continuity"] for r in row["recent"]] == [None, 1.0, 0.1]
    assert row["ttft_by_bucket"] == {"0-1k": {"n": 1, "p50": 0.1, "p95": 0.1}}
    assert tenant_summary({**report, "last_breaks": []})["last_break"] is None
