"""The bytes the pipeline forwards: the client's own, with what the gateway adds spliced in.

Re-serialising a body costs O(prompt) on the event loop before the first upstream byte and
changes what the engine sees (number formatting, escapes, key order): with cache isolation on
that was every request. The scripted upstream (tests/fake_upstream.py) records the raw bytes it
received, so these tests compare byte for byte.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from fake_upstream import FakeResponse, sse

from app.hygiene.salt import derive_salt

SECRET_ENV = "PREFIXGATE_TEST_SALT_SECRET"
SECRET = "a-test-secret-of-enough-length"
SALT = {"tenants": {"cache_salt": {"enabled": True, "secret_env": SECRET_ENV}}}
COMPLETION = {"id": "c1", "object": "chat.completion", "model": "fake", "created": 1,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}
# formatting a re-serialiser would change: spaces around ':' and ',', a newline, key order,
# 1.0E0 and 0.50 (orjson writes 1.0 and 0.5), an escaped é and slash, a trailing newline
CHAT = (b'{ "messages" : [ {"role":"system","content":"caf\\u00e9 \\/ ok"},\n'
        b'  {"role": "user", "content": "hi"} ], "temperature": 1.0E0, "top_p": 0.50,'
        b' "model": "fake" , "max_tokens": 8 }\n')
STREAM_CHAT = CHAT.replace(b'"max_tokens": 8', b'"max_tokens": 8, "stream": true')


def reply(req: Any) -> FakeResponse:
    if b'"stream": true' in req.body:
        return FakeResponse(chunks=[(0, sse({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                                             "model": "fake", "choices": [{"index": 0, "delta": {"content": "ok"}}]})),
                                    (0, sse(b"[DONE]"))])
    return FakeResponse(headers={"content-type": "application/json"}, chunks=[(0, orjson.dumps(COMPLETION))])


def spliced(raw: bytes, addition: bytes) -> bytes:
    """`raw` with `addition` (`,"key":value...`) before the top-level object's closing brace."""
    end = raw.rindex(b"}")
    return raw[:end] + addition + raw[end:]


def post(proxy: Any, path: str, raw: bytes, **headers: str) -> httpx.Response:
    return httpx.post(proxy.url + path, content=raw, timeout=30,
                      headers={"content-type": "application/json", "x-tenant-id": "t1", **headers})


def salt_of(tenant: str) -> bytes:
    return derive_salt(SECRET.encode(), tenant).encode()


def test_salt_is_spliced_into_the_client_bytes(fake_upstream_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    up = fake_upstream_factory(reply)
    proxy = proxy_factory([up.url], **SALT)
    assert post(proxy, "/v1/chat/completions", CHAT).status_code == 200
    assert up.requests[0].body == spliced(CHAT, b',"cache_salt":"' + salt_of("t1") + b'"')


def test_salt_and_include_usage_are_spliced_together(fake_upstream_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    up = fake_upstream_factory(reply)
    proxy = proxy_factory([up.url], **SALT)
    assert post(proxy, "/v1/chat/completions", STREAM_CHAT).status_code == 200
    addition = b',"cache_salt":"' + salt_of("t1") + b'","stream_options":{"include_usage":true}'
    assert up.requests[0].body == spliced(STREAM_CHAT, addition)


def test_completions_salt_is_spliced(fake_upstream_factory, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    up = fake_upstream_factory(reply)
    proxy = proxy_factory([up.url], **SALT)
    raw = b'{"prompt": [1, 2, 3, 4], "model":"fake", "logprobs" : null}'
    assert post(proxy, "/v1/completions", raw).status_code == 200
    assert up.requests[0].body == spliced(raw, b',"cache_salt":"' + salt_of("t1") + b'"')


def test_a_null_client_salt_is_replaced_not_duplicated(fake_upstream_factory, proxy_factory, monkeypatch) -> None:
    """A key that is present (even as null) cannot be spliced again: a duplicate key would leave
    the engine's parser to pick one. That body is re-serialised with the tenant's salt."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    up = fake_upstream_factory(reply)
    proxy = proxy_factory([up.url], **SALT)
    raw = CHAT.replace(b'"max_tokens": 8', b'"max_tokens": 8, "cache_salt": null')
    assert post(proxy, "/v1/chat/completions", raw).status_code == 200
    sent = up.requests[0].body
    assert sent.count(b'"cache_salt"') == 1
    assert orjson.loads(sent) == {**orjson.loads(raw), "cache_salt": salt_of("t1").decode()}


def test_without_isolation_the_bytes_are_untouched(fake_upstream_factory, proxy_factory) -> None:
    up = fake_upstream_factory(reply)
    proxy = proxy_factory([up.url])
    assert post(proxy, "/v1/chat/completions", CHAT).status_code == 200
    assert up.requests[0].body == CHAT


def test_passthrough_tenant_comes_from_headers_not_the_body(fake_upstream_factory, proxy_factory) -> None:
    """A passthrough body (/v1/embeddings, /v1/responses, ...) is relayed as bytes and never
    parsed: its `user` does not name the tenant (the header or API key does). Observed on the
    session policy, which binds a request without a session id to its tenant."""
    up = fake_upstream_factory(lambda req: FakeResponse(headers={"content-type": "application/json"},
                                                        chunks=[(0, b'{"object":"list","data":[]}')]))
    proxy = proxy_factory([up.url], routing={"policy": "session"})
    raw = b'{"model": "fake", "input": "hello", "user": "alice"}'
    r = httpx.post(proxy.url + "/v1/embeddings", content=raw, timeout=30)
    assert r.status_code == 200 and up.requests[0].body == raw
    r = httpx.post(proxy.url + "/v1/embeddings", content=raw, headers={"x-tenant-id": "bob"}, timeout=30)
    assert r.status_code == 200
    proxy.settle()
    store = proxy.services.store

    async def bindings() -> dict[str, str | None]:
        return {t: await store.binding_get(f"session:tenant:{t}") for t in ("alice", "default", "bob")}

    found = asyncio.run_coroutine_threadsafe(bindings(), proxy.server.loop).result(10)
    assert found["alice"] is None
    assert found["default"] is not None and found["bob"] is not None
