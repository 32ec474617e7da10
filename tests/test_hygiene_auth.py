"""Tenant identity (app/api/tenant.py) as hygiene and isolation rely on it: with API keys
configured a valid key is required (401 otherwise), keys are compared in constant time, and the
tenant comes only from the key, never from a header."""

from __future__ import annotations

import hmac

import httpx
import openai
import pytest

import app.api.tenant as tenant_mod
from app.api.tenant import tenant_for_key

KEYS = {"key-acme-0123456789": "acme", "key-globex-987654321": "globex"}
SECRET_ENV = "PREFIXGATE_TEST_AUTH_SALT"
SYSTEM = "You are the support assistant for Acme.\n" + "Refunds within 30 days; shipping 3 to 5 days.\n" * 40


def chat(client: openai.OpenAI, **extra: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model="sim", max_tokens=2, messages=[{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": "hello"}], **extra)


@pytest.fixture
def keyed(sim_factory, proxy_factory, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "another-secret-of-enough-length")
    sim = sim_factory(replicas=1, time_scale=0.0)
    return proxy_factory(sim, tenants={"api_keys": KEYS, "cache_salt": {"enabled": True, "secret_env": SECRET_ENV}})


def test_missing_and_wrong_keys_get_401(keyed) -> None:
    r = httpx.post(keyed.url + "/v1/chat/completions", json={"model": "sim", "messages": [{"role": "user", "content": "x"}]},
                   headers={"x-tenant-id": "acme"}, timeout=30)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    for wrong in ("nope", "key-acme-012345678", "key-acme-0123456789x", KEYS["key-acme-0123456789"]):
        client = openai.OpenAI(base_url=keyed.base_url, api_key=wrong, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            chat(client)
    good = openai.OpenAI(base_url=keyed.base_url, api_key="key-acme-0123456789", max_retries=0)
    assert chat(good).choices


def test_tenant_comes_from_the_key_not_the_header(keyed) -> None:
    """globex warms the cache; acme claiming to be globex by header still gets acme's salt."""
    globex = openai.OpenAI(base_url=keyed.base_url, api_key="key-globex-987654321", max_retries=0)
    acme = openai.OpenAI(base_url=keyed.base_url, api_key="key-acme-0123456789", max_retries=0)
    assert chat(globex).usage.prompt_tokens_details.cached_tokens == 0
    spoof = chat(acme, extra_headers={"x-tenant-id": "globex"}, user="globex")
    assert spoof.usage.prompt_tokens_details.cached_tokens == 0
    again = chat(globex)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert keyed.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant="acme") == spoof.usage.prompt_tokens


def test_keys_are_compared_in_constant_time(monkeypatch, keyed) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tenant_mod.hmac, "compare_digest", spy)
    # no early exit: every configured key is compared, whichever matches
    assert tenant_for_key("key-acme-0123456789", KEYS) == "acme"
    assert len(calls) == len(KEYS)
    calls.clear()
    assert tenant_for_key("wrong", KEYS) is None and len(calls) == len(KEYS)
    calls.clear()
    client = openai.OpenAI(base_url=keyed.base_url, api_key="key-globex-987654321", max_retries=0)
    chat(client)
    assert {b for _, b in calls} == {k.encode() for k in KEYS}


def test_without_keys_the_header_names_the_tenant(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="anything", max_retries=0)
    reply = chat(client, extra_headers={"x-tenant-id": "initech"})
    assert proxy.sample("prefixgate_prompt_tokens_total", route="chat", model="sim", tenant="initech") == reply.usage.prompt_tokens
