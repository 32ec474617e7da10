"""The admin surface (/metrics, /hygiene/*, /ui) is not the data port: on its own port with
`admin.listen` (the data port answers 404), or behind `admin.token` when it shares the data port
and API keys are configured; probes stay open; /v1/models needs a valid API key."""

from __future__ import annotations

import httpx
import pytest

from app.serving import ServerThread, free_port

KEYS = {"key-acme-0123456789": "acme"}
TOKEN_ENV = "PREFIXGATE_TEST_ADMIN_TOKEN"
TOKEN = "admin-token-0123456789abcdef"
ADMIN_PATHS = ("/metrics", "/hygiene/tenants", "/hygiene/engines", "/ui")
PROBES = ("/healthz", "/health", "/readyz")


def get(base: str, path: str, token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.get(base + path, headers=headers, timeout=10)


def test_separate_admin_port_serves_admin_and_data_port_answers_404(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, admin={"listen": {"host": "127.0.0.1", "port": free_port()}})
    assert proxy.app.admin is not None
    with ServerThread(proxy.app.admin, port=proxy.settings.admin.listen.port, lifespan="off") as admin:
        for path in ADMIN_PATHS:
            assert get(proxy.url, path).status_code == 404, path
            assert get(admin.url, path).status_code == 200, path
        assert "prefixgate_requests_total" in get(admin.url, "/metrics").text
        for path in PROBES:
            assert get(proxy.url, path).status_code == 200, path
        assert get(admin.url, "/v1/chat/completions").status_code == 404  # no hot path there
    r = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                   json={"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


@pytest.fixture
def keyed(sim, proxy_factory, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return proxy_factory(sim, tenants={"api_keys": KEYS}, admin={"token_env": TOKEN_ENV})


def test_shared_port_with_keys_needs_the_admin_token(keyed) -> None:
    for path in ADMIN_PATHS:
        r = get(keyed.url, path)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_admin_token"
        assert get(keyed.url, path, token="key-acme-0123456789").status_code == 401, path  # an API key is not it
        assert get(keyed.url, path, token=TOKEN + "x").status_code == 401, path
        assert get(keyed.url, path, token=TOKEN).status_code == 200, path
    for path in PROBES:
        assert get(keyed.url, path).status_code == 200, path


def test_models_needs_a_valid_api_key_when_keys_are_configured(keyed) -> None:
    assert get(keyed.url, "/v1/models").status_code == 401
    assert get(keyed.url, "/v1/models", token="nope").status_code == 401
    r = get(keyed.url, "/v1/models", token="key-acme-0123456789")
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["sim"]


def test_keys_without_a_token_lock_the_admin_surface(sim, proxy_factory, monkeypatch) -> None:
    monkeypatch.delenv("PREFIXGATE_ADMIN_TOKEN", raising=False)
    proxy = proxy_factory(sim, tenants={"api_keys": KEYS})
    r = get(proxy.url, "/hygiene/tenants")
    assert r.status_code == 401 and "PREFIXGATE_ADMIN_TOKEN" in r.json()["error"]["message"]


def test_no_keys_no_token_leaves_the_shared_port_open(proxy) -> None:
    for path in ADMIN_PATHS:
        assert get(proxy.url, path).status_code == 200, path
    assert get(proxy.url, "/v1/models").status_code == 200
