"""The simulator's SGLang flavour against real SGLang 0.5.23 captures (tests/fixtures/real_sglang):
the same SSE event shapes (keys, order, nulls), SGLang's page-size flooring, and SGLang's
`extra_key` radix namespace (which the gateway's prediction must follow too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from app.sim.testing import SimCluster
from tests.e2e.workload import wait_processed

REAL = Path(__file__).parent / "fixtures" / "real_sglang"
TOKENIZER = Path(__file__).resolve().parents[1] / "app" / "assets" / "tokenizer"


def events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.split(b"\n\n"):
        block = block.strip()
        if block.startswith(b"data:") and block != b"data: [DONE]":
            out.append(orjson.loads(block[5:]))
    return out


def shape(obj: Any) -> Any:
    """Keys in order, with values reduced to their JSON type (strings/numbers differ run to run)."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(v) for v in obj]
    return type(obj).__name__


def kinds(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """role / content / finish / usage event -> its shape (the first of each kind)."""
    out: dict[str, Any] = {}
    for ev in evs:
        choices = ev.get("choices") or []
        if not choices:
            kind = "usage"
        else:
            delta = choices[0]["delta"]
            kind = "role" if "role" in delta else ("finish" if choices[0]["finish_reason"] else "content")
        out.setdefault(kind, shape(ev))
    return out


def body(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "prefix caches " * 80}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "ignore_eos": True, **extra}


def sim_stream(url: str, payload: dict[str, Any]) -> bytes:
    with httpx.Client(timeout=30) as client:
        resp = client.post(url + "/v1/chat/completions", json=payload)
        resp.raise_for_status()
        return resp.content


def test_sim_sglang_sse_events_shaped_like_real_sglang() -> None:
    real = kinds(events((REAL / "chat_stream_warm.sse").read_bytes()))
    assert set(real) == {"role", "content", "finish", "usage"}
    with SimCluster(time_scale=0, flavor="sglang", model="tiny", tokenizer=str(TOKENIZER)) as sim:
        simulated = kinds(events(sim_stream(sim.urls[0], body())))
    for kind in ("role", "content", "finish", "usage"):
        assert simulated[kind] == real[kind], kind


def test_sim_sglang_id_has_no_openai_prefix_like_real() -> None:
    real_id = events((REAL / "chat_stream_cold.sse").read_bytes())[0]["id"]
    with SimCluster(time_scale=0, flavor="sglang", model="tiny", tokenizer=str(TOKENIZER)) as sim:
        sim_id = events(sim_stream(sim.urls[0], body()))[0]["id"]
    assert len(sim_id) == len(real_id) == 32 and int(sim_id, 16) >= 0


def test_sim_sglang_page_size_floors_hits_to_whole_pages() -> None:
    """Real SGLang --page-size 16: a repeated 1,734-token prompt reports 1,728 cached (not 1,733)."""
    with SimCluster(time_scale=0, flavor="sglang", sglang_page_size=16, model="tiny",
                    tokenizer=str(TOKENIZER)) as sim:
        url = sim.urls[0]
        sim_stream(url, body())
        last = events(sim_stream(url, body()))[-1]["usage"]
        info = httpx.get(url + "/server_info").json()
    prompt = last["prompt_tokens"]
    assert last["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // 16 * 16
    assert info["page_size"] == 16


def test_sim_sglang_extra_key_namespaces_the_radix_cache() -> None:
    with SimCluster(time_scale=0, flavor="sglang", model="tiny", tokenizer=str(TOKENIZER)) as sim:
        url = sim.urls[0]
        cached = [events(sim_stream(url, body(extra_key=k)))[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
                  for k in ("acme", "globex", "acme")]
    assert cached[:2] == [0, 0] and cached[2] > 0


def test_gateway_prediction_follows_sglang_extra_key(proxy_factory: Any) -> None:
    """Same prompt, different `extra_key`: SGLang (and the simulator's SGLang flavour) share
    nothing, so the gateway must predict 0, not the whole prompt."""
    with SimCluster(time_scale=0, flavor="sglang", model="tiny", tokenizer=str(TOKENIZER)) as sim:
        proxy = proxy_factory(sim.urls, tokenizer=str(TOKENIZER), routing={"block_size": 1})
        delivered = []
        for i, key in enumerate(("acme", "globex", "acme")):
            with httpx.Client(timeout=30) as client:
                resp = client.post(proxy.url + "/v1/chat/completions", json=body(extra_key=key),
                                   headers={"x-request-id": f"ek-{i}"})
            delivered.append(events(resp.content)[-1]["usage"]["prompt_tokens_details"]["cached_tokens"])
            wait_processed(proxy.services.prefix, i + 1)
        predicted = {rid: p for rid, _t, p, _d in proxy.services.prefix.predictions}
    assert delivered[:2] == [0, 0] and delivered[2] > 0
    assert [predicted[f"ek-{i}"] for i in range(3)] == delivered
