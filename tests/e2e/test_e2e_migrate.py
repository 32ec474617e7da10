"""Mid-stream migration against real vLLM (docs/relay.md, "Migration"): a greedy answer cut after
k events and continued on another replica through `continue_final_message` is the same answer,
and a real vLLM process killed mid-stream behind the gateway leaves the client a whole answer.

The cut stream is real vLLM's own events (the first k of an uninterrupted greedy stream); the
continuation request is what the gateway builds (app/proxy/migrate.py `read_partial`,
`continuation_body`) sent to a second replica, and its events go through the gateway's `Splicer`:
the spliced text equals the uninterrupted text, and the summed usage the uninterrupted usage.

A continuation sends the text so far, which the engine tokenizes again: it is the same answer when
that text tokenizes back to the tokens generated (docs/relay.md). The tier's tiny random model
often generates token sequences that do not (`atch` + `lper` comes back as three tokens), so the
cut points are chosen where the text so far is canonical (vLLM's own /tokenize against the
`token_ids` it streamed); the killed-replica test, whose cut falls where the kill lands, checks
what holds at any cut: a whole answer, exactly the client's token budget, the text it already had.
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
from tests.e2e.workload import chat_body, words

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
PROMPT = [{"role": "user", "content": "Tell me about prefix caches and why the first token matters."}]
MAX_TOKENS = 48


def events(url: str, body: dict[str, Any]) -> list[bytes]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [ev.raw for ev in SSEParser(emit_all=True).feed(r.read()) if ev.data is not None]


def canonical_cuts(url: str, raws: list[bytes]) -> list[int]:
    """The event counts k (the role chunk, then k - 1 content events, before the finish) at which
    the text so far tokenizes back to exactly the token ids generated."""
    ids: list[int] = []
    text, cuts = "", []
    for k, raw in enumerate(raws, 1):
        data = raw[len(b"data: "):].strip()
        if data == b"[DONE]":
            break
        choices = orjson.loads(data).get("choices") or []
        if any(c.get("finish_reason") for c in choices):
            break
        for choice in choices:
            ids += choice.get("token_ids") or []
            text += (choice.get("delta") or {}).get("content") or ""
        if text:
            r = httpx.post(url + "/tokenize", json={"model": "tiny", "prompt": text, "add_special_tokens": False},
                           timeout=30)
            assert r.status_code == 200, r.text
            if r.json()["tokens"] == ids:
                cuts.append(k)
    return cuts


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


# Further prompts for a generation that has no cut the continuation reads back exactly (the claim's
# precondition, below): the random model's first tokens may merge with the chat template's text
# before them when the text is sent back, and then every later cut is off by the same count; or no
# text after the 12th event tokenizes back to the ids streamed. Both were seen in CI with three
# prompts (the streamed ids vary between runs), so there are ten, and a prompt whose cuts read back
# off by one count gives way after `CUTS_PER_PROMPT` of them.
MORE_PROMPTS = [[{"role": "user", "content": "Explain what a block hash chains over, in two sentences."}],
                [{"role": "user", "content": "Why does one changed character early in a prompt cost a cache hit?"}],
                *([{"role": "user", "content": f"{words(f'migrate-{i}', 10)}?"}] for i in range(7))]
CUTS_PER_PROMPT = 3


def _exact_cut(vllm_b32: Any, vllm_b128: Any, prompt: list[dict[str, str]], at_least: int) -> tuple[Any, ...]:
    """Generate greedily on one replica, then find the first cut at or after `at_least` events that
    the continuation on the other replica reads back exactly. The claim holds where the
    continuation's engine reads the text so far as exactly the tokens sent. `/tokenize` of the
    bare text says so for `canonical_cuts`; the continuation's own usage says so in the chat
    template's context (its prompt = the original's + the tokens sent, which the splicer reports as
    the original's prompt_tokens). Where the two disagree (seen in CI: the streamed ids vary between
    runs of the random tiny model, and the continuation read 2-26 tokens more), the cut is not
    canonical and the next one is taken, up to `CUTS_PER_PROMPT`. Returns (k or None, partial,
    spliced text and usage, the uninterrupted text and usage, the cuts skipped)."""
    body = chat_body(prompt, MAX_TOKENS)
    whole = events(vllm_b32.url, {**body, "return_token_ids": True})
    expected_text, expected_usage = text_and_usage(whole)
    assert expected_usage is not None
    partial, got_text, got_usage, skipped = None, "", None, []
    for cut in (c for c in canonical_cuts(vllm_b32.url, whole) if c >= at_least):
        sent = b"".join(whole[:cut])  # what the client had when the first replica died
        partial = read_partial(CHAT, sent)
        assert partial.blocker is None and partial.tokens == cut - 1  # the role chunk, then one token per event
        continued, why = continuation_body(CHAT, body, partial)
        assert continued is not None, why
        splicer = Splicer(CHAT, partial)
        spliced = [splicer.feed(raw) for raw in events(vllm_b128.url, continued)]
        got_text, got_usage = text_and_usage([e for e in spliced if e])
        if got_usage is not None and got_usage.get("prompt_tokens") == expected_usage["prompt_tokens"]:
            return cut, partial, got_text, got_usage, expected_text, expected_usage, skipped
        skipped.append((cut, got_usage))
        if len(skipped) == CUTS_PER_PROMPT:
            break
    return None, partial, got_text, got_usage, expected_text, expected_usage, skipped


@pytest.mark.parametrize("at_least", [2, 5, 12])
def test_greedy_answer_cut_after_k_events_and_continued_elsewhere_is_the_same(vllm_b32: Any, vllm_b128: Any,
                                                                             at_least: int) -> None:
    tried = []
    for prompt in [PROMPT, *MORE_PROMPTS]:  # the next prompt only when no cut of this one reads back exactly
        k, partial, got_text, got_usage, expected_text, expected_usage, skipped = \
            _exact_cut(vllm_b32, vllm_b128, prompt, at_least)
        if k is not None:
            break
        tried.append(skipped)
    assert k is not None and partial is not None, \
        f"no cut at or after {at_least} events read back exactly, for any of {len(tried)} prompts: {tried}"
    print(f"\nk={k} (prompt {len(tried) + 1}): partial {partial.text!r} + continuation -> {len(got_text)} chars; "
          f"usage {got_usage}; cuts not read back exactly: {skipped}")
    assert partial.text + got_text == expected_text
    assert got_usage is not None
    assert {key: got_usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {key: expected_usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


def test_a_vllm_killed_mid_stream_behind_the_gateway_leaves_the_client_a_whole_answer(
        e2e_proxy: Any, vllm_b128: Any, vllm_model_dir: Path, tmp_path: Path) -> None:
    log_dir = Path(os.environ.get("PREFIXGATE_E2E_LOGS") or tmp_path)
    victim = start_replicas([ReplicaSpec("victim", block_size=None, cpu="0")], vllm_model_dir, log_dir)[0]
    try:
        proxy = e2e_proxy([victim, vllm_b128], routing={"policy": "round_robin", "health_interval_s": 3600,
                                                        "migrate_midstream": {"enabled": True}})
        # Long enough that the kill lands mid-stream: 300 tokens (~1.5 s on this box) were once all
        # relayed before a busy box let the client read its 6th event, and nothing was migrated.
        budget = 2000
        body = chat_body(PROMPT, budget, return_token_ids=True)  # every event says which tokens it carries
        expected_text, expected_usage = text_and_usage(events(vllm_b128.url, body))
        got = b""
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=120) as r:
            assert r.headers["x-prefixgate-backend"] == "victim"  # round robin's first turn
            first_text = ""
            for data in r.iter_raw():
                got += data
                if got.count(b"\n\n") >= 6 and victim.proc is not None and victim.proc.poll() is None:
                    first_text = text_and_usage([ev.raw for ev in SSEParser(emit_all=True).feed(got)
                                                 if ev.data is not None])[0]  # what the client had from the victim
                    os.killpg(victim.proc.pid, signal.SIGKILL)  # the API server and its engine core
                    victim.proc.wait(30)
        raws = [ev.raw for ev in SSEParser(emit_all=True).feed(got) if ev.data is not None]
        text, usage = text_and_usage(raws)
        roles = sum(b'"role"' in raw for raw in raws)
        generated = sum(len(choice.get("token_ids") or []) for raw in raws[:-1]
                        for choice in orjson.loads(raw[len(b"data: "):]).get("choices") or [])
        print(f"\nkilled after 6 events: {len(raws)} events, {roles} role chunk(s), {generated} tokens, "
              f"text equal: {text == expected_text}")
        assert raws[-1].strip() == b"data: [DONE]" and not any(b'"error"' in raw for raw in raws)
        assert roles == 1 and text.startswith(first_text) and len(first_text) > 0
        assert generated == budget  # the client's budget, exactly: the tokens sent before the break were counted
        assert usage is not None and expected_usage is not None
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == \
            (expected_usage["prompt_tokens"], expected_usage["completion_tokens"])
        assert proxy.sample("prefixgate_migrations_total", route="chat", reason="midstream", outcome="continued") == 1
    finally:
        stop_all([victim])
