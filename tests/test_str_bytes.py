"""xxh3_128_utf8 hashes exactly the UTF-8 of the range asked for, read in place when ASCII;
same_prefix compares exactly the first n characters."""

from __future__ import annotations

import random
import sys

import pytest
import xxhash

import app.prefix.str_bytes as str_bytes
from app.prefix.str_bytes import same_prefix, xxh3_128_utf8


def _expected(text: str, a: int, b: int) -> bytes:
    return xxhash.xxh3_128_digest(text[a:b].encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("alphabet", ["ab c\n", "ab é\n", "ab \U0001f600\n", "ab \ud800\n"])
def test_any_range_hashes_the_utf8_of_that_range(alphabet: str) -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(alphabet) for _ in range(20_000))
    for _ in range(200):
        a = rng.randrange(0, len(text) + 1)
        b = rng.randrange(a, len(text) + 1)
        assert xxh3_128_utf8(text, a, b) == _expected(text, a, b)
    assert xxh3_128_utf8(text) == _expected(text, 0, len(text))
    assert xxh3_128_utf8(text, 5, 10**9) == _expected(text, 5, len(text))
    assert xxh3_128_utf8("") == xxhash.xxh3_128_digest(b"")


def test_an_ascii_text_is_read_in_place_and_another_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    views: list[int] = []
    real = str_bytes._view

    def counted(address: int, size: int, flags: int) -> memoryview:
        views.append(size)
        return real(address, size, flags)

    monkeypatch.setattr(str_bytes, "_view", counted)
    ascii_text = "a line of words " * 70_000
    xxh3_128_utf8(ascii_text, 16, 1_000_016)
    assert views == [1_000_000]
    wide = "é" * 100_000
    size = sys.getsizeof(wide)
    xxh3_128_utf8(wide, 0, 50_000)
    assert views == [1_000_000]
    assert sys.getsizeof(wide) == size  # no UTF-8 copy left cached on the str


@pytest.mark.parametrize("alphabet", ["ab c\n", "ab é\n"])
@pytest.mark.parametrize("libc", [True, False])
def test_same_prefix_says_whether_the_first_n_characters_agree(alphabet: str, libc: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if not libc:  # no C library found by name: the slices' compare
        monkeypatch.setattr(str_bytes, "_memcmp", None)
    rng = random.Random(11)
    text = "".join(rng.choice(alphabet) for _ in range(5_000))
    for _ in range(300):
        at = rng.randrange(0, len(text))
        other = text[:at] + ("Z" if text[at] != "Z" else "Y") + text[at + 1:]
        other = other[:rng.randrange(at, len(other) + 1)] if rng.random() < 0.3 else other
        n = rng.randrange(0, len(text) + 2)
        expected = n <= len(other) and n <= len(text) and text[:n] == other[:n]
        assert same_prefix(text, other, n) is expected
        assert same_prefix(other, text, n) is expected
    assert same_prefix("", "", 0) and not same_prefix("", "a", 1)
