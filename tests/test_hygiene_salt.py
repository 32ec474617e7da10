"""app/hygiene/salt.py: per-tenant cache_salt within vLLM's limits, and client salt decisions."""

from __future__ import annotations

import pytest

from app.hygiene.salt import (
    MAX_SALT_CHARS,
    TenantSalts,
    decide_salt,
    derive_salt,
    load_secret,
    valid_salt,
)

SECRET = b"s" * 32


@pytest.mark.parametrize("tenant", ["acme", "", "a/b@c\\d", "ünïcødé-租户", "x" * 10_000, "\x00"])
def test_salt_is_valid_for_vllm_whatever_the_tenant(tenant: str) -> None:
    salt = derive_salt(SECRET, tenant)
    assert valid_salt(salt)
    assert len(salt) <= MAX_SALT_CHARS
    assert not any(c in salt for c in "@/\\\x00")
    assert derive_salt(SECRET, tenant) == salt  # deterministic: every gateway agrees


def test_salt_differs_per_tenant_and_per_secret() -> None:
    salts = {derive_salt(SECRET, f"tenant-{i}") for i in range(1000)}
    assert len(salts) == 1000
    assert derive_salt(SECRET, "acme") != derive_salt(b"t" * 32, "acme")


def test_valid_salt_rules() -> None:
    assert not valid_salt("")
    assert not valid_salt("x" * 129)
    assert valid_salt("x" * 128)
    for bad in ("a@b", "a/b", "a\\b", "a\x00b"):
        assert not valid_salt(bad)
    assert not valid_salt(42)


def test_secret_must_be_configured() -> None:
    with pytest.raises(ValueError, match="MY_SECRET"):
        load_secret("MY_SECRET", {})
    with pytest.raises(ValueError):
        load_secret("MY_SECRET", {"MY_SECRET": "short"})
    assert load_secret("MY_SECRET", {"MY_SECRET": "0123456789abcdef0123"}) == b"0123456789abcdef0123"


def test_tenant_salts_cache() -> None:
    salts = TenantSalts(SECRET)
    assert salts("acme") == derive_salt(SECRET, "acme") == salts("acme")


def test_decisions() -> None:
    mine = derive_salt(SECRET, "acme")
    assert decide_salt(None, None, "replace").action == "none"
    assert decide_salt("theirs", None, "reject") == decide_salt("theirs", None, "replace")
    assert decide_salt("theirs", None, "reject").salt == "theirs"  # isolation off: passes through
    assert (decide_salt(None, mine, "reject").action, decide_salt(None, mine, "reject").salt) == ("inject", mine)
    assert decide_salt(mine, mine, "reject").action == "inject"  # already the tenant's own salt
    assert (decide_salt("theirs", mine, "replace").action, decide_salt("theirs", mine, "replace").salt) == \
        ("replace", mine)
    assert decide_salt("theirs", mine, "reject").action == "reject"
