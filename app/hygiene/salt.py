"""Per-tenant `cache_salt`: cache isolation between tenants on a shared engine.

vLLM puts the salt into block 0's extra keys, so requests with different salts never share a
block and requests with the same salt share exactly as unsalted ones (docs/pipeline.md, step 2);
SGLang namespaces its radix tree with it. One salt per tenant therefore keeps each tenant's cache
reusable by that tenant and invisible to the others: no tenant can probe another's prompts
through cache timing.

salt = "pg1-" + base64url(HMAC-SHA256(secret, tenant id)), 47 characters: within vLLM's
validation (non-empty, at most 128 characters, no `@`, `/`, `\\` or NUL). The secret makes salts
unguessable, so a client that learns another tenant's id still cannot forge its salt; the
"pg1-" prefix versions the derivation. The same secret on every gateway gives the same salt.

A client-supplied `cache_salt` is replaced by the tenant's (`client_salt: replace`) or the
request is refused (`reject`). With isolation off the client's salt passes through untouched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

SALT_VERSION = "pg1-"
MAX_SALT_CHARS = 128  # vLLM validate_cache_salt
FORBIDDEN_SALT_CHARS = ("@", "/", "\\", "\x00")
MIN_SECRET_BYTES = 16
SALT_CACHE_ENTRIES = 100_000

SaltAction = Literal["none", "inject", "replace", "reject", "client"]


def derive_salt(secret: bytes, tenant: str) -> str:
    mac = hmac.new(secret, tenant.encode("utf-8"), hashlib.sha256).digest()
    return SALT_VERSION + base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def valid_salt(salt: Any) -> bool:
    """What vLLM accepts as `cache_salt`."""
    return (isinstance(salt, str) and 0 < len(salt) <= MAX_SALT_CHARS
            and not any(c in salt for c in FORBIDDEN_SALT_CHARS))


def load_secret(secret_env: str, environ: Mapping[str, str] | None = None) -> bytes:
    """The salt secret from the environment; ValueError when missing or short, because running
    with isolation switched on but without a secret would silently not isolate anyone."""
    value = (environ if environ is not None else os.environ).get(secret_env, "")
    if len(value.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"tenants.cache_salt.enabled is true but ${secret_env} is unset or shorter "
                         f"than {MIN_SECRET_BYTES} bytes; set it to a random secret (e.g. `openssl rand -hex 32`)")
    return value.encode()


class TenantSalts:
    """tenant -> salt, derived once per tenant (bounded: cleared when full)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._cache: dict[str, str] = {}

    def __call__(self, tenant: str) -> str:
        salt = self._cache.get(tenant)
        if salt is None:
            if len(self._cache) >= SALT_CACHE_ENTRIES:
                self._cache.clear()
            salt = self._cache[tenant] = derive_salt(self._secret, tenant)
        return salt


@dataclass(frozen=True)
class SaltDecision:
    action: SaltAction  # none: no salt; client: the client's own passes; inject / replace / reject
    salt: str | None  # the salt the engine will see


def decide_salt(client_salt: Any, tenant_salt: str | None, client_policy: str) -> SaltDecision:
    """What happens to `cache_salt` (pure). `tenant_salt` is None when isolation is off."""
    if tenant_salt is None:
        return SaltDecision("client", client_salt) if isinstance(client_salt, str) else SaltDecision("none", None)
    if client_salt is None or client_salt == tenant_salt:
        return SaltDecision("inject", tenant_salt)
    if client_policy == "reject":
        return SaltDecision("reject", None)
    return SaltDecision("replace", tenant_salt)
