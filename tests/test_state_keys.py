"""The Redis key layout and encodings (pure)."""

from __future__ import annotations

from app.state.factory import redacted
from app.state.keys import KeySpace, chain_scores, fold64, next_base, pack_hashes, unpack_members


def test_keys_are_namespaced_versioned_and_residency_shares_one_slot() -> None:
    ks = KeySpace("pg")
    names = [ks.residency("a"), ks.binding("s"), ks.history("t"), ks.counters("t"), ks.tenants()]
    assert all(n.startswith("pg:v1:") for n in names)
    assert len(set(names)) == len(names)
    assert "{res}" in ks.residency("a") and "{res}" in ks.residency("b")
    assert ks.pattern() == "pg:v1:*"


def test_pack_is_8_bytes_per_block_in_chain_order() -> None:
    hashes = [0, 1, 2**64 - 1, 0x0102030405060708]
    blob = pack_hashes(hashes)
    assert len(blob) == 32
    members = unpack_members(blob)
    assert [int.from_bytes(m, "big") for m in members] == hashes


def test_fold64_keeps_64_bit_hashes_and_folds_wider_ones() -> None:
    assert fold64(12345) == 12345
    wide = (7 << 64) | 5
    assert fold64(wide) == 5 ^ 7
    assert 0 <= fold64(-3) < 2**64
    assert len(pack_hashes([2**200 + 1])) == 8


def test_chain_scores_decrease_and_next_chain_outranks_the_previous() -> None:
    assert chain_scores(100, 3) == [100, 99, 98]
    first = next_base(1_000, 0, 5)
    assert first == 1_000
    second = next_base(1_000, first, 5)  # same microsecond: nudged above the whole first chain
    assert min(chain_scores(second, 5)) > max(chain_scores(first, 5))
    assert next_base(10_000, first, 5) == 10_000


def test_redacted_hides_the_password_only() -> None:
    assert redacted("redis://user:secret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"


def test_pack_takes_a_packed_chain_and_folds_wider_hashes() -> None:
    from array import array

    assert pack_hashes(array("Q", [1, 2**64 - 1])) == pack_hashes([1, 2**64 - 1])
    assert pack_hashes([-3, (7 << 64) | 5]) == pack_hashes([fold64(-3), 5 ^ 7])
    assert pack_hashes([]) == b""
