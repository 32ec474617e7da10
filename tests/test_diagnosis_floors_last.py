"""The floors of the last third of the tune-side splits (tests/test_diagnosis_scores.py holds the
floors, the first third and why the splits have floors): a file of its own so that `make test`'s
workers score the thirds side by side."""

from __future__ import annotations

from tests.test_diagnosis_scores import (
    floors_of,
    fpr,  # noqa: F401 - the fixture, one tokenizer per file
)

test_scores_stay_at_or_above_the_floor = floors_of(2)
