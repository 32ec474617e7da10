"""Tenant cache isolation on real SGLang. SGLang 0.5.23 namespaces its radix tree by the request's
`cache_salt` and by its `extra_key` (sglang/srt/mem_cache/radix_cache.py: the key carries both),
so with `tenants.cache_salt` on, two tenants sending the same prompt share nothing and one tenant
sending it twice shares every token but the last. The same holds for a client's own `extra_key`;
either way the proxy's prediction must say what SGLang delivers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.workload import chat_body, stream_chat, wait_processed, words

pytestmark = [pytest.mark.e2e_sglang, pytest.mark.timeout(600)]
SECRET_ENV = "PREFIXGATE_E2E_SGLANG_SALT"
MESSAGES = [{"role": "system", "content": words("isolation-system", 300)},
            {"role": "user", "content": words("isolation-user", 30)}]


def _send(proxy: Any, order: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, int | None, int | None, int]]:
    """(tenant, prompt tokens, SGLang cached tokens, predicted) per request, in order."""
    out = []
    with httpx.Client(timeout=120) as client:
        for i, (tenant, extra) in enumerate(order):
            rid = f"iso-{i}"
            result = stream_chat(client, proxy.url, chat_body(MESSAGES, 4, **extra),
                                 {"x-tenant-id": tenant, "x-request-id": rid})
            wait_processed(proxy.services.prefix, i + 1)
            predicted = {r: p for r, _t, p, _d in proxy.services.prefix.predictions}[rid]
            out.append((tenant, result.prompt_tokens, result.cached_tokens, predicted))
    print("\n" + "\n".join(f"{t}: prompt {p}, sglang cached {c}, predicted {q}" for t, p, c, q in out))
    return out


def test_gateway_cache_salt_two_tenants_share_nothing_one_tenant_shares(
        e2e_proxy: Any, sglang_radix: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    proxy = e2e_proxy([sglang_radix], tenants={"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})
    rows = _send(proxy, [("acme", {}), ("globex", {}), ("acme", {}), ("globex", {})])
    prompt = rows[0][1]
    assert prompt is not None
    assert [c for _t, _p, c, _q in rows] == [0, 0, prompt - 1, prompt - 1]
    assert [q for *_, q in rows] == [c for _t, _p, c, _q in rows]


def test_client_extra_key_namespaces_the_radix_cache(e2e_proxy: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_radix])
    rows = _send(proxy, [("acme", {"extra_key": "acme"}), ("globex", {"extra_key": "globex"}),
                         ("acme", {"extra_key": "acme"})])
    prompt = rows[0][1]
    assert prompt is not None
    assert [c for _t, _p, c, _q in rows] == [0, 0, prompt - 1]
    assert [q for *_, q in rows] == [c for _t, _p, c, _q in rows]
