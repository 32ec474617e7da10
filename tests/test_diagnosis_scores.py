"""Regression floor for diagnosis accuracy on the committed corpora (bench/diagnosis.py scores
them the same way and prints the tables): the scores may rise, never fall below these."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.prefix.fingerprint import Fingerprinter  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402
from bench.diagnosis import CORPORA, score  # noqa: E402

# corpus -> (accuracy, macro-F1, span exact-match F1), as reached when these floors were set
FLOORS = {
    "old": (1.0, 1.0, 1.0),
    "tune": (1.0, 1.0, 1.0),
    "heldout": (1.0, 1.0, 1.0),  # scored once tuning was over: 1.0 / 1.0 / 1.0 at first scoring
}


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


@pytest.mark.parametrize("corpus", sorted(FLOORS))
def test_scores_stay_at_or_above_the_floor(fpr, corpus: str) -> None:
    s = score(CORPORA[corpus], fpr)
    accuracy, macro_f1, span_f1 = FLOORS[corpus]
    assert s.transitions >= 190
    assert s.accuracy >= accuracy and s.macro_f1 >= macro_f1 and s.span_exact_f1 >= span_f1, \
        (corpus, s.accuracy, s.macro_f1, s.span_exact_f1, s.errors[:10])
    assert s.lookalike_false_alarms == 0, s.errors[:10]
