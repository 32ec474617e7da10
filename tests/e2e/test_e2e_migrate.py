"""Mid-stream migration against real vLLM (docs/relay.md, "Migration"): a greedy answer cut after
k events and continued on another replica through `continue_final_message` is the same answer,
and a real vLLM process killed mid-stream behind the gateway leaves the client a whole answer.

The cut stream is real vLLM's own events (the first k of an uninterrupted greedy stream); the
continuation request is what the gateway builds (app/proxy/migrate.py `read_partial`,
`continuation_body`) sent to a second replica, and its events go through the gateway's `Splicer`:
the spliced text equals the uninterrupted text, and the summed usage the uninterrupted usage.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.dialects import CHAT
from app.proxy.migrate import Splicer, continuation_body, read_partial
from app.proxy.sse import SSEParser
from tests.e2e.vllm_server import ReplicaSpec, start_replicas, stop_all
from tests.e2e.workload import chat_body

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
PROMPT = [{"role": "user", "content": "Tell me about prefix caches and why the first token matters."}]
MAX_TOKENS = 24


def events(url: str, body: dict[str, Any]) -> list[bytes]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [ev.raw for ev in SSEParser(emit_all=True).feed(r.read()) if ev.data is not None]


def text_and_usage(raws: list[bytes]) -> tuple[str, dict[str, Any] | None]:
    text, usage = "", None
    for raw in raws:
        data = raw[len(b"data: "):].strip()
        if data == b"[DONE]":
            continue
        obj = orjson.loads(data)
        usage = obj.get("usage") or usage
        for choice in obj.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text, usage


@pytest.mark.parametrize("k", [2, 5, 12])
def test_greedy_answer_cut_after_k_events_and_continued_elsewhere_is_the_same(vllm_b32: Any, vllm_b128: Any,
                                                                             k: int) -> None:
    body = chat_body(PROMPT, MAX_TOKENS)
    whole = events(vllm_b32.url, body)
    expected_text, expected_usage = text_and_usage(whole)
    sent = b"".join(whole[:k])  # what the client had when the first replica died
    partial = read_partial(CHAT, sent)
    assert partial.blocker is None and partial.tokens == k - 1  # the role chunk, then one token per event
    continued, why = continuation_body(CHAT, body, partial)
    assert continued is not None, why
    splicer = Splicer(CHAT, partial)
    spliced = [splicer.feed(raw) for raw in events(vllm_b128.url, continued)]
    got_text, got_usage = text_and_usage([e for e in spliced if e])
    print(f"\nk={k}: partial {partial.text!r} + continuation -> {len(got_text)} chars; usage {got_usage}")
    assert partial.text + got_text == expected_text
    assert got_usage is not None and expected_usage is not None
    assert {key: got_usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {key: expected_usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


def test_a_vllm_killed_mid_stream_behind_the_gateway_leaves_the_client_a_whole_answer(
        e2e_proxy: Any, vllm_b128: Any, vllm_model_dir: Path, tmp_path: Path) -> None:
    log_dir = Path(os.environ.get("PREFIXGATE_E2E_LOGS") or tmp_path)
    victim = start_replicas([ReplicaSpec("victim", block_size=None, cpu="0")], vllm_model_dir, log_dir)[0]
    try:
        proxy = e2e_proxy([victim, vllm_b128], routing={"policy": "round_robin", "health_interval_s": 3600,
                                                        "migrate_midstream": {"enabled": True}})
        body = chat_body(PROMPT, 300)
        expected_text, expected_usage = text_and_usage(events(vllm_b128.url, body))
        got = b""
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=120) as r:
            assert r.headers["x-prefixgate-backend"] == "victim"  # round robin's first turn
            for data in r.iter_raw():
                got += data
                if got.count(b"\n\n") >= 6 and victim.proc is not None and victim.proc.poll() is None:
                    os.killpg(victim.proc.pid, signal.SIGKILL)  # the API server and its engine core
                    victim.proc.wait(30)
        raws = [ev.raw for ev in SSEParser(emit_all=True).feed(got) if ev.data is not None]
        text, usage = text_and_usage(raws)
        roles = sum(b'"role"' in raw for raw in raws)
        print(f"\nkilled after 6 events: {len(raws)} events, {roles} role chunk(s), text equal: {text == expected_text}")
        assert raws[-1].strip() == b"data: [DONE]" and not any(b'"error"' in raw for raw in raws)
        assert roles == 1 and text == expected_text
        assert usage is not None and expected_usage is not None
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == \
            (expected_usage["prompt_tokens"], expected_usage["completion_tokens"])
        assert proxy.sample("prefixgate_migrations_total", route="chat", reason="midstream", outcome="continued") == 1
    finally:
        stop_all([victim])
