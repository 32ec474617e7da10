"""The probe document: deterministic within a run, unique across runs, sized by calibration."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from app.doctor.document import QUESTION, Calibration, build_document, new_nonce
from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))


def test_same_nonce_same_text_and_nonce_on_first_line() -> None:
    a = build_document(500, "abc123")
    assert a == build_document(500, "abc123")
    assert "abc123" in a.splitlines()[0]
    assert a.rstrip().endswith(QUESTION)


def test_runs_differ_from_the_first_block(tokenizer: Tokenizer) -> None:
    a = tokenizer.encode(build_document(500, new_nonce())).ids
    b = tokenizer.encode(build_document(500, new_nonce())).ids
    # A previous run's blocks must not match: the first 16-token block already differs.
    assert a[:16] != b[:16]
    # ...and the bodies are different word streams, not just a different header.
    assert a[40:80] != b[40:80]


def test_word_count_is_respected() -> None:
    body = build_document(1234, "n").splitlines()[2:-2]
    assert sum(len(line.split()) for line in body) == 1234


def test_calibration_hits_the_target_with_the_default_tokenizer(tokenizer: Tokenizer) -> None:
    def count(words: int) -> int:
        return len(tokenizer.encode(build_document(words, "calib")).ids) + 5  # + chat template

    calibration = Calibration()
    small = calibration.words_for(500)
    calibration.observe(small, count(small))
    one_point = calibration.words_for(4000)  # a ratio: the fixed header overhead skews it
    assert count(one_point) == pytest.approx(4000, rel=0.15)
    calibration.observe(small // 4, count(small // 4))  # a line through two points: tight
    words = calibration.words_for(4000)
    assert count(words) == pytest.approx(4000, rel=0.02)
    assert abs(count(words) - 4000) < abs(count(one_point) - 4000)
    calibration.observe(words, count(words))
    words = calibration.words_for(16_000)
    assert count(words) == pytest.approx(16_000, rel=0.01)


def test_calibration_line_fits_overhead() -> None:
    calibration = Calibration()
    calibration.observe(100, 1.5 * 100 + 40)
    calibration.observe(1000, 1.5 * 1000 + 40)
    per_word, overhead = calibration.line()
    assert per_word == pytest.approx(1.5)
    assert overhead == pytest.approx(40)
    assert calibration.words_for(1540) == 1000
    assert calibration.tokens_for(1000) == 1540
    assert Calibration().words_for(1250) == 1000  # the starting guess
