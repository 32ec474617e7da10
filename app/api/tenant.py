"""Tenant resolution: who is asking, for metrics, continuity tracking and hygiene policy.

Order: X-Tenant-ID header (name from settings.tenants.header), else the API key's tenant
(settings.tenants.api_keys), else the body's `user` (chat/completions only), else "default". When
api_keys is non-empty a valid key is required and the tenant comes only from the key: a header
cannot claim another tenant's identity.

Passthrough paths pass no body here: their bytes are relayed unparsed, because parsing a possibly
large body (embeddings inputs, a /v1/responses transcript) only to read `user` would be work that
grows with the request before its first upstream byte. They are not fingerprinted or tracked, so
their tenant only names the session policy's fallback binding; a client that wants one tenant on
every path sends the header or its API key, which is also the only identity a client cannot forge.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from app.config import Tenants
from app.errors import ProxyError

DEFAULT_TENANT = "default"
MAX_TENANT_LEN = 128


def bearer_token(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


def tenant_for_key(key: str | None, api_keys: Mapping[str, str]) -> str | None:
    """The tenant of `key`, comparing against every configured key in constant time (no early
    exit, so timing does not reveal which prefix matched or how many keys exist before it)."""
    if key is None:
        return None
    found: str | None = None
    candidate = key.encode()
    for known, tenant in api_keys.items():
        if hmac.compare_digest(candidate, known.encode()):
            found = tenant
    return found


def resolve_tenant(headers: Mapping[str, str], body: Mapping[str, Any] | None, tenants: Tenants) -> str:
    """Resolve the tenant; raises ProxyError(401) when keys are configured and none is valid."""
    if tenants.api_keys:
        tenant = tenant_for_key(bearer_token(headers), tenants.api_keys)
        if tenant is None:
            raise ProxyError(401, "invalid or missing API key", type="authentication_error",
                             code="invalid_api_key")
        return tenant
    header = headers.get(tenants.header.lower())
    if header:
        return header[:MAX_TENANT_LEN]
    if body:
        user = body.get("user")
        if isinstance(user, str) and user:
            return user[:MAX_TENANT_LEN]
    return DEFAULT_TENANT
