"""The dialect registry (app/dialects/): every API path has its dialect, every other /v1 path
passes through, each parsed dialect answers what the steps ask, and the request core asks the
dialect rather than comparing route names."""

from __future__ import annotations

import pathlib
import re

import orjson
import pytest

from app.dialects import BY_NAME, DIALECTS, MESSAGES, PASSTHROUGH, dialect_of
from app.errors import ProxyError
from app.prefix.namespace import request_namespace

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_each_api_path_has_its_dialect_and_any_other_passes_through() -> None:
    assert {d.path: d.name for d in DIALECTS} == {
        "/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
        "/v1/messages": "messages", "/v1/messages/count_tokens": "passthrough"}
    assert dialect_of("/v1/embeddings") is PASSTHROUGH and not PASSTHROUGH.parses
    assert dialect_of("/v1/responses/resp_1") is PASSTHROUGH
    assert set(BY_NAME) == {"chat", "completions", "responses", "messages", "passthrough"}


@pytest.mark.parametrize("name", ["chat", "completions", "responses", "messages"])
def test_a_parsed_dialect_answers_every_step(name: str) -> None:
    dialect = BY_NAME[name]
    with pytest.raises(ProxyError) as info:
        dialect.parse(b'{"model": "m"}')  # its own required member is missing
    assert info.value.status == 400 and info.value.code == "missing_required_parameter"
    assert dialect.stream_shape() is not None
    err = orjson.loads(dialect.error_body(ProxyError(429, "slow down")))
    assert err["type"] == "error" if dialect.anthropic else err["error"]["message"] == "slow down"


def test_anthropic_paths_are_refused_in_anthropics_shape() -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = orjson.loads(dialect_of(path).error_body(ProxyError(503, "busy")))
        assert body == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


def test_count_tokens_is_routed_by_its_model_and_other_passthroughs_are_not() -> None:
    assert dialect_of("/v1/messages/count_tokens").model_of(b'{"model": "claude"}') == "claude"
    assert PASSTHROUGH.model_of(b'{"model": "claude"}') is None


ROUTE_BRANCH = re.compile(r"\broute\s*(==|!=|\bin\s*\(|\bnot in\s*\()|\bROUTES\b|ANTHROPIC_PATHS")
CORE = ["app/pipeline", "app/api", "app/epp/exchange.py", "app/proxy/forward.py", "app/proxy/relay.py"]


def test_the_request_core_asks_the_dialect_instead_of_comparing_route_names() -> None:
    files = [p for c in CORE for p in ([ROOT / c] if c.endswith(".py") else sorted((ROOT / c).rglob("*.py")))]
    found = [f"{p.relative_to(ROOT)}:{i}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if ROUTE_BRANCH.search(line)]
    assert not found, found


def test_only_sglangs_messages_api_drops_the_salt() -> None:
    """SGLang's /v1/messages request model has no `cache_salt` nor `extra_key`: a Messages request
    in front of SGLang lives in the unsalted namespace (app/prefix/namespace.py); every other API,
    and every API on vLLM, keeps the salt."""
    for dialect in (d for d in DIALECTS if d.parses):
        expected = None if dialect is MESSAGES else "s"
        assert request_namespace(dialect.sglang_salts, "sglang", "s", None) == expected, dialect
        assert request_namespace(dialect.sglang_salts, "vllm", "s", None) == "s", dialect
