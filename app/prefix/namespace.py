"""The cache namespace a request's prefix lives in: `cache_salt`, plus SGLang's `extra_key`.

SGLang (0.5.23) keys its radix tree by the token ids *and* the request's `extra_key` and
`cache_salt`, so two requests with the same prompt but different `extra_key` share nothing there
(docs/e2e-sglang.md). vLLM has no `extra_key`; a client that sends one to vLLM gets a prediction
that is too low, never too high. The simulator's SGLang flavour derives its namespace with its
own code (app/sim/hashing.py), so the two are checked against each other, not shared.

SGLang's `/v1/messages` request model has neither field and drops unknown ones: a salt (or an
`extra_key`) sent there never reaches its radix cache, so a Messages request in front of SGLang
lives in the unsalted namespace (`request_namespace`), and tenants share its cached tokens.
"""

from __future__ import annotations

from typing import Any


def cache_namespace(cache_salt: str | None, extra_key: Any) -> str | None:
    """The salt string that roots the block chain: `cache_salt` alone when no `extra_key` (a
    non-empty string) is given, else both, tagged so that no salt can imitate a pair."""
    if not isinstance(extra_key, str) or not extra_key:
        return cache_salt
    return f"\x00extra_key={extra_key}\x00cache_salt={cache_salt or ''}"


def request_namespace(sglang_salts: bool, engine: str, cache_salt: str | None, extra_key: Any) -> str | None:
    """The namespace the engine actually caches a request under: `cache_namespace`, except on an
    SGLang API that ignores both (`sglang_salts` False, its dialect's: `/v1/messages`; None: unsalted)."""
    if engine == "sglang" and not sglang_salts:
        return None
    return cache_namespace(cache_salt, extra_key)
