"""Pure request-side helpers: validation, splicing the forwarded body, tenant resolution."""

from __future__ import annotations

import orjson
import pytest

from app.api.tenant import resolve_tenant, tenant_for_key
from app.config import Tenants
from app.dialects import BY_NAME
from app.pipeline.body import forwarded_body, splice_members
from app.proxy.context import ProxyError
from app.proxy.openai_shape import client_wants_usage


def include_usage(raw: bytes, body: dict) -> bytes:
    return forwarded_body(raw, body, changed=False, salt=None, include_usage=True)


def test_include_usage_is_spliced_without_reserialising() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\u00e9"}], "stream": true}  \n'
    body = orjson.loads(raw)
    out = include_usage(raw, body)
    assert out == raw[:-4] + b',"stream_options":{"include_usage":true}}  \n'  # original bytes verbatim
    assert orjson.loads(out) == {**body, "stream_options": {"include_usage": True}}


def test_include_usage_merges_existing_options() -> None:
    body = {"model": "m", "prompt": "x", "stream_options": {"continuous_usage_stats": False}}
    out = orjson.loads(include_usage(orjson.dumps(body), body))
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert client_wants_usage({"stream_options": {"include_usage": True}})
    assert not client_wants_usage({"stream_options": None})


def test_splice_members_edges() -> None:
    assert splice_members(b'{"a":1}', {}) == b'{"a":1}'
    assert splice_members(b'{ }', {"s": "x"}) == b'{ "s":"x"}'  # an empty object takes no comma
    assert splice_members(b'{"a":1}\r\n', {"s": "x", "o": {"k": True}}) == b'{"a":1,"s":"x","o":{"k":true}}\r\n'
    assert splice_members(b'[1]', {"s": "x"}) is None  # not an object: the caller re-serialises


def test_a_rewritten_body_is_serialised_with_the_salt() -> None:
    raw = b'{"model": "m", "prompt": "x"}'
    out = forwarded_body(raw, {"model": "m", "prompt": "y"}, changed=True, salt="pg1-s", include_usage=False)
    assert orjson.loads(out) == {"model": "m", "prompt": "y", "cache_salt": "pg1-s"}
    same = {"model": "m", "prompt": "x", "cache_salt": "pg1-s"}  # the client already sent this salt
    assert forwarded_body(orjson.dumps(same), same, changed=False, salt="pg1-s", include_usage=False) == orjson.dumps(same)


def test_parse_body_accepts_valid_requests() -> None:
    assert BY_NAME["chat"].parse(b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false}')
    assert BY_NAME["completions"].parse(b'{"model":"m","prompt":[1,2,3],"max_tokens":null}')


@pytest.mark.parametrize("raw,param", [
    (b"", None), (b"nope", None), (b'"str"', None),
    (b'{"model": 3, "messages": [{"role": "user"}]}', "model"),
    (b'{"model": "m", "messages": []}', "messages"),
    (b'{"model": "m", "messages": ["hi"]}', "messages[0]"),
    (b'{"model": "m", "messages": [{"role": "user"}], "temperature": "hot"}', "temperature"),
    (b'{"model": "m", "messages": [{"role": "user"}], "n": 0}', "n"),
])
def test_parse_body_rejects(raw: bytes, param: str | None) -> None:
    with pytest.raises(ProxyError) as info:
        BY_NAME["chat"].parse(raw)
    assert info.value.status == 400 and info.value.param == param


def test_tenant_order_header_then_user_then_default() -> None:
    t = Tenants()
    assert resolve_tenant({"x-tenant-id": "a"}, {"user": "u"}, t) == "a"
    assert resolve_tenant({}, {"user": "u"}, t) == "u"
    assert resolve_tenant({}, {}, t) == "default"
    assert resolve_tenant({"team": "z"}, None, Tenants(header="Team")) == "z"


def test_api_keys_required_and_header_cannot_override() -> None:
    t = Tenants(api_keys={"k1": "alpha", "k2": "beta"})
    assert resolve_tenant({"authorization": "Bearer k2", "x-tenant-id": "alpha"}, None, t) == "beta"
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic k1"}):
        with pytest.raises(ProxyError) as info:
            resolve_tenant(headers, None, t)
        assert info.value.status == 401
    assert tenant_for_key("k1", t.api_keys) == "alpha"
    assert tenant_for_key("k", t.api_keys) is None
