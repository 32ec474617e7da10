"""The floors of the second third of the tune-side splits (tests/test_diagnosis_scores.py holds the
floors, the first third and why the splits have floors): a file of its own so that `make test`'s
workers score the thirds side by side."""

from __future__ import annotations

import pytest

from app.prefix.fingerprint import Fingerprinter
from app.prefix.tokens import SegmentTokenizer
from tests.test_diagnosis_scores import FLOOR_THIRDS, assert_at_or_above_the_floor


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


@pytest.mark.parametrize("corpus", FLOOR_THIRDS[1])
def test_scores_stay_at_or_above_the_floor(fpr, corpus: str) -> None:
    assert_at_or_above_the_floor(fpr, corpus)
