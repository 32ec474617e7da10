"""The digest a pod stores for the others (app/prefix/digest.py): what its agent-pattern fields add,
and that a record from a pod without them still reads (as before: no compaction told by it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.prefix.diagnose import diagnose
from app.prefix.digest import RequestDigest, diagnose_digest
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import RequestSketch, build_sketch
from app.prefix.tokens import SegmentTokenizer

TUNE2 = Path(__file__).parent / "fixtures" / "diagnosis_v2" / "tune2.jsonl"
NEW_FIELDS = ("users", "history", "last_turns", "last_users", "first")


@pytest.fixture(scope="module")
def fingerprinter() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def sketches(fpr: Fingerprinter, family: str) -> tuple[list[RequestSketch], list[str | None]]:
    """The sketches of the first tenant of `family` in the second tuning pool, and its labels."""
    row = next(r for r in map(json.loads, TUNE2.read_text(encoding="utf-8").splitlines()) if r["family"] == family)
    out = []
    for body in row["requests"]:
        inp = prompt_input("chat", body)
        fp = fpr.complete_sync(fpr.prepare(inp, 16))
        out.append(build_sketch(inp, fp.text or ""))
    return out, row["labels"]


@pytest.mark.parametrize("family", ["compaction_claude", "compaction_codex"])
def test_a_compaction_is_told_by_the_digest_and_an_older_record_reads_without_it(
        fingerprinter: Fingerprinter, family: str) -> None:
    sks, labels = sketches(fingerprinter, family)
    k = labels.index("compaction")
    record = RequestDigest.of(sks[k - 1]).to_record()
    assert set(NEW_FIELDS) <= set(record)
    full = RequestDigest.from_record(json.loads(json.dumps(record)))  # as the Store hands it back
    assert full is not None and diagnose_digest(full, sks[k]).cause == "compaction"
    older = RequestDigest.from_record({key: v for key, v in record.items() if key not in NEW_FIELDS})
    assert older is not None and (older.users, older.history, older.last_turns, older.first) == ("", [0, 0], [], [])
    assert diagnose_digest(older, sks[k]).cause != "compaction"  # what a pod read before these fields


def test_a_date_that_rolls_over_is_told_by_the_digests_day_numbers_and_an_older_record_reads_without_them(
        fingerprinter: Fingerprinter) -> None:
    """A date without a "today" cue that moved on by a day is a per-request value only against the
    previous date: the digest keeps that date's day numbers for the other pods."""
    rule = "\n- Returns are accepted within 60 days for unused items; shipping takes 4 to 7 business days." * 3
    sks = []
    for day, question in (("04/14/2026", "Where is my order?"), ("04/15/2026", "Can I return boots?")):
        inp = prompt_input("chat", {"model": "m", "messages": [
            {"role": "system", "content": f"Prices as listed on {day}, all taxes included.{rule}"},
            {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
            {"role": "user", "content": question}]})
        fp = fingerprinter.complete_sync(fingerprinter.prepare(inp, 16))
        sks.append(build_sketch(inp, fp.text or ""))
    record = json.loads(json.dumps(RequestDigest.of(sks[0]).to_record()))
    assert record["dates"] and all(entry.startswith("h") for entry in record["dates"])
    full = RequestDigest.from_record(record)
    assert full is not None
    got = diagnose_digest(full, sks[1])
    assert got.cause == "dynamic_head" and [s.text for s in got.spans] == ["04/15/2026"]
    older = RequestDigest.from_record({key: v for key, v in record.items() if key != "dates"})
    assert older is not None and older.dates == []
    assert diagnose_digest(older, sks[1]).cause == "template_change"  # what a pod read before the field


def test_the_head_part_is_read_once_per_head_and_equals_a_fresh_reading(fingerprinter: Fingerprinter) -> None:
    """Every turn repeats the system prompt: its part of the digest is memoised by the head's text,
    the character after it and its message ends, so a digest from the memo equals one read afresh,
    and heads that differ anywhere (a date in the system prompt) are read apart."""
    from app.prefix import digest

    def sketch(system: str, turns: int) -> RequestSketch:
        messages = [{"role": "system", "content": system}]
        for i in range(turns):
            messages += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        messages.append({"role": "user", "content": "and now?"})
        inp = prompt_input("chat", {"messages": messages})
        return build_sketch(inp, fingerprinter.complete_sync(fingerprinter.prepare(inp, 16)).text or "")

    system = "You are terse.\nAs of 07/16/2026, the build is green.\nRequest ID: 7f3a9c\n"
    later = sketch(system, 5)
    digest._head_memo.clear()
    fresh = RequestDigest.of(later).to_record()
    RequestDigest.of(sketch(system, 1))  # the same head, read at an earlier turn
    digest._head_memo.clear()
    RequestDigest.of(sketch(system, 1))
    assert len(digest._head_memo) == 1
    assert RequestDigest.of(later).to_record() == fresh  # from the memo
    other = RequestDigest.of(sketch(system.replace("07/16", "07/17"), 5))
    assert len(digest._head_memo) == 2 and other.dates != RequestDigest.of(later).dates


def test_a_head_changed_in_one_line_is_read_in_that_line_and_equals_a_fresh_reading(fingerprinter: Fingerprinter) -> None:
    """A head not seen before is read unit by unit, each unit memoised with the characters around it
    that its reading looks at: a timestamp on top of a long system prompt reads that line (and the
    one after it, whose look-behind sees its end), not the other units, and the digest equals one
    read with every memo empty."""
    from app.prefix import digest

    rules = "".join(f"- Rule {k}: as of 07/16/2026 answer topic {k} in two sentences.\n" for k in range(40))

    def record(stamp: str) -> dict:
        system = f"Now: {stamp}\n{rules}"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "and now?"}]
        inp = prompt_input("chat", {"messages": messages})
        sk = build_sketch(inp, fingerprinter.complete_sync(fingerprinter.prepare(inp, 16)).text or "")
        return RequestDigest.of(sk).to_record()

    digest._head_memo.clear()
    digest._unit_memo.clear()
    record("2026-07-16T09:31:07Z")
    read = len(digest._unit_memo)
    assert read > 40
    second = record("2026-07-16T09:31:08Z")
    assert len(digest._unit_memo) - read <= 2  # the changed line, and the next one's context
    digest._head_memo.clear()
    digest._unit_memo.clear()
    assert record("2026-07-16T09:31:08Z") == second


def test_a_pasted_documents_long_line_is_compared_whole_by_another_pod(fingerprinter: Fingerprinter) -> None:
    """A line over LONG_UNIT characters (a document pasted on one line) is keyed from its length,
    its ends and a CRC of all of it. Another pod still tells a question put before the same
    document (question_first from the digest), and an edit in the middle of that line leaves
    nothing repeated: the same length and ends do not make it the same line."""
    from app.prefix import digest

    words = " ".join(f"w{i % 997}" for i in range(4000))
    assert len(words) > digest.LONG_UNIT

    def sketch(question: str, document: str) -> RequestSketch:
        body = {"messages": [{"role": "system", "content": "You answer from the document."},
                             {"role": "user", "content": f"{question}\n{document}\nEnd of the document."}]}
        inp = prompt_input("chat", body)
        return build_sketch(inp, fingerprinter.complete_sync(fingerprinter.prepare(inp, 16)).text or "")

    prev = RequestDigest.of(sketch("Summarise the document in three lines, please.", words))
    same = diagnose_digest(prev, sketch("Which numbers come up most often in it? Answer briefly.", words))
    assert same.cause == "question_first"
    middle = len(words) // 2
    edited = words[:middle] + ("x" if words[middle] != "x" else "y") + words[middle + 1:]
    assert len(edited) == len(words) and edited[:512] == words[:512] and edited[-512:] == words[-512:]
    other = diagnose_digest(prev, sketch("Which numbers come up most often in it? Answer briefly.", edited))
    assert other.cause != "question_first"


def test_a_system_note_where_the_first_turns_were_is_a_front_trim_on_both_paths(fingerprinter: Fingerprinter) -> None:
    """A client that drops its oldest exchanges and says so in a system message after its system
    prompt (`Earlier in this chat: ...`): the head grew where the history began, and the history
    lost its front. The text path reads a front trim; another pod, from the digest, read the grown
    head as an edited template. Both now say front_trim; the same note with the history kept
    whole is still an edit of the template on both."""
    system = "You are the support assistant of a bicycle shop.\nAnswer in two sentences at most.\n"
    turns = [("Do you repair e-bikes?", "Yes, all brands."), ("How long does a service take?", "Two days."),
             ("Can I book online?", "Yes, on the website.")]

    def sketch(note: str | None, kept: int) -> RequestSketch:
        messages = [{"role": "system", "content": system}]
        if note is not None:
            messages.append({"role": "system", "content": note})
        for q, a in turns[len(turns) - kept:]:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": "What does it cost?"})
        inp = prompt_input("chat", {"messages": messages})
        return build_sketch(inp, fingerprinter.complete_sync(fingerprinter.prepare(inp, 16)).text or "")

    prev = sketch(None, 3)
    note = "Earlier in this chat the customer asked whether e-bikes are repaired here (yes, all brands)."
    trimmed = sketch(note, 2)
    assert diagnose(prev, trimmed).cause == "front_trim"
    assert diagnose_digest(RequestDigest.of(prev), trimmed).cause == "front_trim"
    whole = sketch(note, 3)
    assert diagnose(prev, whole).cause == diagnose_digest(RequestDigest.of(prev), whole).cause == "template_change"


@pytest.mark.parametrize(("at", "cause"), [(1000, "dynamic_head"), (6000, "template_change")])
def test_a_value_in_a_long_head_line_is_read_in_its_first_4_kb_by_both_paths(
        fingerprinter: Fingerprinter, at: int, cause: str) -> None:
    """Values are short and sit by their key: a line longer than LINE_SCAN_CHARS is a document, read
    for values in its head only (the detector's ~30 patterns cost ~2 s over a 1 MB line). A clock
    in the first 4 KB of a one-line system prompt is a per-request value for this pod and for
    another one reading the digest; past 4 KB both read an edit."""
    from app.prefix.diagnose import diagnose
    from app.prefix.dynamic import LINE_SCAN_CHARS

    prose = " ".join(f"rule{i % 89} applies" for i in range(1200))
    assert len(prose) > at > 0 and (at < LINE_SCAN_CHARS) == (cause == "dynamic_head")

    def sketch(clock: str, question: str) -> RequestSketch:
        system = f"{prose[:at]} Current time: {clock}. {prose[at:]}"
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello"},
                             {"role": "assistant", "content": "Hi, how can I help?"},
                             {"role": "user", "content": question}]}
        inp = prompt_input("chat", body)
        return build_sketch(inp, fingerprinter.complete_sync(fingerprinter.prepare(inp, 16)).text or "")

    prev, cur = sketch("2026-04-14T09:31:07Z", "Where is my order?"), sketch("2026-04-14T09:32:55Z", "Can I return it?")
    text_path = diagnose(prev, cur)
    digest_path = diagnose_digest(RequestDigest.from_record(RequestDigest.of(prev).to_record()), cur)
    assert text_path.cause == digest_path.cause == cause, (text_path, digest_path)
    if cause == "dynamic_head":
        assert [s.text for s in text_path.spans] == [s.text for s in digest_path.spans] == ["2026-04-14T09:32:55Z"]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab9 .!?\n\t", max_size=60), st.integers(0, 8), st.integers(0, 8))
def test_sentence_ends_are_the_look_behind_patterns_matches(text: str, cut0: int, cut1: int) -> None:
    """The head's sentence units are found from their punctuation (a fast scan) and must be the
    units the look-behind pattern gives (keys other pods compare), at any start and end."""
    from app.prefix.digest import SENTENCE_END, _sentence_ends

    start, end = min(cut0, len(text)), max(min(cut0, len(text)), len(text) - cut1)
    assert list(_sentence_ends(text, start, end)) == [m.span() for m in SENTENCE_END.finditer(text, start, end)]


def _sketch(fpr: Fingerprinter, messages: list[dict]) -> RequestSketch:
    inp = prompt_input("chat", {"model": "m", "messages": messages})
    fp = fpr.complete_sync(fpr.prepare(inp, 16))
    return build_sketch(inp, fp.text or "")


RULES = "\n- Returns are accepted within 60 days for unused items; shipping takes 4 to 7 business days." * 3


@pytest.mark.parametrize(("old", "new", "cause"), [
    ("Tug Harbour Star: 4.6 nm off, SOG 9.8 kn", "Tug Harbour Star: 4.1 nm off, SOG 10.2 kn", "dynamic_head"),
    ("Bins at the depot: paper 55%, glass 76%", "Bins at the depot: paper 61%, glass 76%", "dynamic_head"),
    ("Note: delivery in 4 to 7 business days.", "Note: delivery in 3 to 5 business days.", "template_change"),
])
def test_a_status_line_that_changed_in_its_numbers_is_told_by_its_shape_and_an_older_record_reads_without_it(
        fingerprinter: Fingerprinter, old: str, new: str, cause: str) -> None:
    """Another pod cannot compare the numbers (it has no previous text): the digest keeps each
    short head unit's key with its digits masked, so a line that changed in its numbers only reads
    as a status line from the current side (round 23); a rule's small numbers stay an edit."""
    turns = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"}]
    sks = [_sketch(fingerprinter, [{"role": "system", "content": f"{line}\nYou help the harbour office.{RULES}"},
                                   *turns, {"role": "user", "content": q}])
           for line, q in ((old, "Where is the tug?"), (new, "When does it berth?"))]
    record = json.loads(json.dumps(RequestDigest.of(sks[0]).to_record()))
    full = RequestDigest.from_record(record)
    assert full is not None and full.shapes
    got = diagnose_digest(full, sks[1])
    assert got.cause == cause == diagnose(sks[0], sks[1]).cause
    if cause == "dynamic_head":  # the value, or a reading of it a pattern knows from this side (`10.2` before `kn`)
        assert got.spans and got.spans[0].text in new.split(": ", 1)[1]
        older = RequestDigest.from_record({key: v for key, v in record.items() if key != "shapes"})
        assert older is not None
        if "%" in new:  # no reading a pattern knows from one side: an older record reads an edit
            assert diagnose_digest(older, sks[1]).cause == "template_change"


def test_a_developer_messages_context_block_is_head_on_both_paths(fingerprinter: Fingerprinter) -> None:
    """A context block sent as a developer message after the system prompt is head, not history,
    for both paths (OpenAI's developer role is the system's): another pod finds its changed value."""
    def messages(clock: str, question: str) -> list[dict]:
        return [{"role": "system", "content": f"You help the harbour office.{RULES}"},
                {"role": "developer", "content": f"<status>\nLocal time: {clock}\nBerths: 4\n</status>"},
                {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
                {"role": "user", "content": question}]
    sks = [_sketch(fingerprinter, messages(c, q)) for c, q in (("14:32:08", "Where is the tug?"),
                                                                ("14:41:55", "When does it berth?"))]
    full = RequestDigest.from_record(json.loads(json.dumps(RequestDigest.of(sks[0]).to_record())))
    assert full is not None
    text, digest = diagnose(sks[0], sks[1]), diagnose_digest(full, sks[1])
    assert text.cause == digest.cause == "dynamic_head"
    assert [s.text for s in digest.spans] == [s.text for s in text.spans] == ["14:41:55"]


def test_raised_digits_in_a_changed_head_value_are_diagnosed_on_another_pod() -> None:
    """A timetable writes its minutes raised (`9¹⁵`): `str.isdigit` holds for them and `int` refuses
    them. Another pod, diagnosing against the digest, read such a token as a port number and raised
    (found by heldout24), so the request was recorded nowhere. Two trackers sharing a Store, in turn."""
    import asyncio

    from bench.diagnosis import _answers
    from tests.test_diagnosis_cases import SYSTEM_DE, body, conversation

    values = ["Linie 3 um 9¹⁵", "Linie 5 um 9³⁰", "Linie 3 um 9⁴⁵", "Linie 5 um 10⁰⁰"]
    bodies = [body(f"Nächster Bus Marktplatz: {v}\n{SYSTEM_DE}", t) for v, t in zip(values, conversation(4), strict=True)]
    answers = asyncio.run(_answers(bodies, Fingerprinter(SegmentTokenizer.load()), 2))
    assert len(answers) == 4 and all(cause is not None for cause, _, _ in answers[1:])
