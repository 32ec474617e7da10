"""Diagnosis accuracy on the committed corpora (bench/diagnosis.py scores them the same way and
prints the tables), and the wall between the detector and the held-out split.

The first corpus and the tune split are what the detector was developed against: their scores may
rise, never fall below the floors. The held-out split is measured, not tuned for: its test asserts
issue 20's goal (macro-F1 >= 0.95, span exact-match F1 >= 0.85), never the score it happens to
reach, and a second test fails when a value or key that only the held-out pool uses enters the
detector's word lists (docs/diagnosis.md, *How the held-out split is kept apart*)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests/fixtures/diagnosis_v2"))

from material import POOLS  # noqa: E402

from app.prefix import dynamic  # noqa: E402
from app.prefix.fingerprint import Fingerprinter  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402
from bench.diagnosis import CORPORA, Scores, score  # noqa: E402

# corpus -> (accuracy, macro-F1, span exact-match F1), as reached when these floors were set
FLOORS = {
    "old": (1.0, 1.0, 1.0),
    "tune": (1.0, 1.0, 1.0),
}
# issue 20's goal on the held-out split. Measured with the held-out-only words and tool-line form
# removed (issue 28): accuracy 0.911, macro-F1 0.842, span exact-match F1 0.925 -- the macro-F1 goal
# is not met.
HELDOUT_GOAL_MACRO_F1 = 0.95
HELDOUT_GOAL_SPAN_F1 = 0.85

# the detector's word lists: every frozenset of words in app/prefix/dynamic.py, and the regexes
# that recognise a key or a "now" cue by its words (the value-format patterns are not word lists)
KEY_PATTERNS = {name: getattr(dynamic, name) for name in ("_FLAG_KEY", "_DYNAMIC_KEY", "_WEEK_KEY", "NOW_CUE")}
WORD_SETS = {name: value for name, value in vars(dynamic).items()
             if isinstance(value, frozenset) and all(isinstance(w, str) for w in value)}


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


@pytest.fixture(scope="module")
def heldout(fpr) -> Scores:
    return score(CORPORA["heldout"], fpr)


@pytest.mark.parametrize("corpus", sorted(FLOORS))
def test_scores_stay_at_or_above_the_floor(fpr, corpus: str) -> None:
    s = score(CORPORA[corpus], fpr)
    accuracy, macro_f1, span_f1 = FLOORS[corpus]
    assert s.transitions >= 190
    assert s.accuracy >= accuracy and s.macro_f1 >= macro_f1 and s.span_exact_f1 >= span_f1, \
        (corpus, s.accuracy, s.macro_f1, s.span_exact_f1, s.errors[:10])
    assert s.lookalike_false_alarms == 0, s.errors[:10]


def test_heldout_span_f1_meets_the_goal_with_no_lookalike_alarm(heldout: Scores) -> None:
    assert heldout.transitions >= 500
    assert heldout.span_exact_f1 >= HELDOUT_GOAL_SPAN_F1, (heldout.span_exact_f1, heldout.errors[:10])
    assert heldout.lookalike_false_alarms == 0, heldout.errors[:10]


@pytest.mark.xfail(strict=True, reason="goal not met on the held-out split: macro-F1 0.842 once the words and "
                                       "the tool-line form only it uses were taken out of the detector (issue 28); strict, so it "
                                       "turns red when the goal is reached and this mark must go")
def test_heldout_macro_f1_meets_the_goal(heldout: Scores) -> None:
    assert heldout.macro_f1 >= HELDOUT_GOAL_MACRO_F1, (heldout.macro_f1, heldout.errors[:10])


def _corpus_values(split: str) -> set[str]:
    """The changing values (lower-cased) the labels of a committed corpus name."""
    out: set[str] = set()
    for line in CORPORA[split].read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        spans = row["spans"] if "requests" in row else [[row["span"]] if row.get("span") else []]
        out.update(v.lower() for vs in spans for v in vs)
    return out


def _tune_side_text() -> str:
    """Everything the detector may have been developed against: the tune pool and both tune-side corpora."""
    return "\n".join([json.dumps(POOLS["tune"], ensure_ascii=False), CORPORA["tune"].read_text(encoding="utf-8"),
                      CORPORA["old"].read_text(encoding="utf-8")]).lower()


def _recognised_by(word: str) -> list[str]:
    """The word lists that recognise `word` (as a member, or as a key/cue their regexes match)."""
    hits = [name for name, words in WORD_SETS.items() if word.lower() in words]
    return hits + [name for name, pattern in KEY_PATTERNS.items() if pattern.search(word)]


def test_no_value_or_key_that_only_the_heldout_pool_uses_is_in_the_detectors_word_lists() -> None:
    heldout_only = _corpus_values("heldout") - _corpus_values("tune") - _corpus_values("old")
    words = {v for v in heldout_only if re.fullmatch(r"[^\W\d_]+", v)}  # flag values: on, off, test, ...
    assert words, "the held-out corpus names no word values: the check below would prove nothing"
    leaked = {v: _recognised_by(v) for v in words if _recognised_by(v)}
    leaked |= {v: hits for v in heldout_only - words if (hits := [n for n, ws in WORD_SETS.items() if v in ws])}
    # the keys: words of the held-out pool's dynamic lines that no tune-side material contains
    tune_text = _tune_side_text()
    key_words = {w.lower() for _, line, _ in sum(POOLS["heldout"]["dynamic"].values(), [])
                 for w in re.findall(r"[^\W\d_]+", line.replace("{v}", " "))}
    held_keys = {w for w in key_words if w not in tune_text}
    assert {"buster", "gruppe"} <= held_keys  # the check sees the held-out pool's own keys
    leaked |= {w: hits for w in held_keys if (hits := _recognised_by(w))}
    assert not leaked, f"held-out-only words in the detector's word lists: {leaked}"
