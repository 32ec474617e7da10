"""The digest a pod stores for the others (app/prefix/digest.py): what its agent-pattern fields add,
and that a record from a pod without them still reads (as before: no compaction told by it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
