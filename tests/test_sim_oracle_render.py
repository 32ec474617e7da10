"""The gateway renders the prompt ids the independent simulator renders, on edge-case bodies.

The simulator renders with its own code (app/sim/chat_template.py, anthropic_convert.py,
responses_convert.py, tool_dump.py; tests/test_sim_independence.py), written from vLLM's and
transformers' behaviour and checked against real vLLM's ids (tests/test_sim_render_captures.py).
Each body below is tokenised by the simulator over loopback HTTP (`/tokenize`, `/v1/messages/render`,
`/v1/responses/render`) and by the gateway's prompt path (app/prefix/prompt.py, the template and
tokenizer its fingerprints use); the ids must be equal. The cases are where the two
implementations disagreed when the simulator became independent (docs/testing-oracles.md lists
each disagreement and what arbitrated it), plus the conversions' corner cases:
- chat content parts of the other text types (`input_text`, `refusal`, bare strings) and empty
  text parts, which vLLM's parser joins / skips;
- `continue_final_message` (transformers cuts the prompt after the final message's text);
- a template that iterates a message's content ("openai" format: string content becomes a text
  part, null none);
- named templates (a request with tools renders the "tool_use" one).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.prefix.convert_messages import requires_system_first
from app.prefix.convert_responses import ResponseHistory, responses_prompt_input
from app.prefix.prompt import messages_prompt_input, prompt_input, render_prompt
from app.prefix.tokens import SegmentTokenizer
from app.sim.testing import SimCluster
from tests.e2e.workload import wait_processed

ASSETS = Path(__file__).resolve().parent.parent / "app" / "assets" / "tokenizer"
SYSTEM = "You are a careful assistant. " * 12
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.a1b; cch=4f2a9;"

DEFAULT_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("chat-text-like-parts", "chat", {"messages": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": ""}, "b",
                                     {"type": "output_text", "text": "c"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, {"role": "user", "content": "d"}]}),
    ("chat-continue-final-message", "chat", {"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}],
        "add_generation_prompt": False, "continue_final_message": True}),
    ("chat-tool-calls", "chat", {"messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": "{bad"}},
            {"id": "3", "type": "function", "function": {"name": "h", "arguments": "{\"x\": \"\u00e9\"}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "tool_calls": []}],
        "tools": [{"type": "function", "function": {"name": "ls", "description": None, "strict": None,
                                                    "defer_loading": False}},
                  {"function": {"parameters": {"type": "object"}, "name": "b"}, "defer_loading": True}]}),
    ("chat-billing-and-developer", "chat", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": SYSTEM}]},
        {"role": "developer", "content": "dev"}, {"role": "user", "content": BILLING + "\nq"}]}),
    ("messages-blocks", "messages", {"model": "m", "max_tokens": 2, "system": BILLING + "\n" + SYSTEM, "messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "t"},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": "\u00e9"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
                                     {"type": "text", "text": "next"}]},
        {"role": "system", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
        {"role": "ctx", "content": "c"}, {"role": "user", "content": []}],
        "tools": [{"name": "a", "input_schema": {"properties": {}}, "strict": True}]}),
    ("responses-items", "responses", {"model": "m", "instructions": "I", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d1"},
                                                              {"type": "input_text", "text": "d2"}]},
        {"type": "message", "role": "user", "content": "u"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "o1"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A1"},
                                                              {"type": "output_text", "text": "A2"}]},
        {"type": "message", "role": "user", "content": "u2"}],
        "tools": [{"type": "web_search"}, {"type": "function", "name": "f", "defer_loading": True}]}),
]

OPENAI_FORMAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
                 "{% else %}{% for part in m['content'] %}{% if part['type'] == 'text' %}[{{ part['text'] }}]{% endif %}"
                 "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
NAMED = [{"name": "default", "template": "{% for m in messages %}D:{{ m['content'] }}\n{% endfor %}"},
         {"name": "tool_use", "template": "{% for t in tools %}T:{{ t | tojson }}\n{% endfor %}"
                                          "{% for m in messages %}U:{{ m['content'] }}\n{% endfor %}"}]
SYSTEM_FIRST = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
                "{{ raise_exception('System message must be at the beginning.') }}{% endif %}<|im_start|>{{ m['role'] }}\n"
                "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEMPLATE_CASES: list[tuple[str, Any, str, dict[str, Any]]] = [
    ("openai-format-parts", OPENAI_FORMAT, "chat", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, "c"]},
        {"role": "assistant", "content": None}, {"role": "user", "content": "x"}]}),
    ("named-tool-use", NAMED, "chat", {"messages": [{"role": "user", "content": "x"}],
                                       "tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("named-default", NAMED, "chat", {"messages": [{"role": "user", "content": "x"}]}),
    ("system-first-merge", SYSTEM_FIRST, "messages", {"model": "m", "max_tokens": 2, "system": SYSTEM, "messages": [
        {"role": "user", "content": "a"}, {"role": "system", "content": "reminder"}, {"role": "user", "content": "b"}]}),
]


def _sim_ids(url: str, route: str, body: dict[str, Any]) -> list[int]:
    path = "/tokenize" if route == "chat" else f"/v1/{route}/render"
    resp = httpx.post(url + path, json={"model": "m", **body} if route == "chat" else body, timeout=30)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    return data["tokens"] if route == "chat" else data["token_ids"]


def _gateway_ids(tok: SegmentTokenizer, route: str, body: dict[str, Any]) -> list[int]:
    if route == "responses":
        inp = responses_prompt_input(body, ResponseHistory())
    elif route == "messages":
        inp = messages_prompt_input(body, merge_inline_system=requires_system_first(tok.template))
    else:
        inp = prompt_input("chat", body)
    assert inp is not None
    return [i for ids in tok.encode_segments(tok.split(render_prompt(tok.template, inp))) for i in ids]


@pytest.fixture(scope="module")
def default_sim() -> Iterator[str]:
    with SimCluster(replicas=1, model="m", time_scale=0.0, kv_blocks=100_000) as sim:
        yield sim.urls[0]


@pytest.mark.parametrize(("name", "route", "body"), DEFAULT_CASES, ids=[c[0] for c in DEFAULT_CASES])
def test_gateway_ids_equal_the_simulators(default_sim: str, name: str, route: str, body: dict[str, Any]) -> None:
    assert _gateway_ids(SegmentTokenizer.load(None), route, body) == _sim_ids(default_sim, route, body)


@pytest.mark.parametrize(("name", "template", "route", "body"), TEMPLATE_CASES, ids=[c[0] for c in TEMPLATE_CASES])
def test_gateway_ids_equal_the_simulators_with_other_templates(tmp_path: Path, name: str, template: Any, route: str,
                                                               body: dict[str, Any]) -> None:
    directory = tmp_path / "tokenizer"
    shutil.copytree(ASSETS, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    with SimCluster(replicas=1, model="m", time_scale=0.0, kv_blocks=100_000, tokenizer=str(directory)) as sim:
        assert _gateway_ids(SegmentTokenizer.load(str(directory)), route, body) == _sim_ids(sim.urls[0], route, body)


SGLANG_CASES: list[tuple[str, dict[str, Any]]] = [
    ("sglang-text-parts", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
    ("sglang-final-assistant-message", {"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "partial"}]}),
    ("sglang-tool-choice-none", {"messages": [{"role": "user", "content": "q"}], "tool_choice": "none",
                                 "tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("sglang-named-tool-choice", {"messages": [{"role": "user", "content": "q"}],
                                  "tool_choice": {"type": "function", "function": {"name": "g"}},
                                  "tools": [{"type": "function", "function": {"name": "f"}},
                                            {"type": "function", "function": {"name": "g", "description": "d"}}]}),
    ("sglang-final-assistant-parts", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "p"}, {"type": "text", "text": "q"}]}],
        "add_generation_prompt": False}),
]


@pytest.fixture(scope="module")
def sglang_sim() -> Iterator[str]:
    with SimCluster(replicas=1, model="m", time_scale=0.0, kv_blocks=100_000, flavor="sglang",
                    strip_billing_header=False) as sim:
        yield sim.urls[0]


@pytest.mark.parametrize(("name", "body"), SGLANG_CASES, ids=[c[0] for c in SGLANG_CASES])
def test_gateway_ids_equal_the_sglang_simulators(sglang_sim: str, name: str, body: dict[str, Any]) -> None:
    inp = prompt_input("chat", body, strip_billing=False, tool_dump="sglang")
    assert inp is not None
    tok = SegmentTokenizer.load(None)
    ids = [i for part in tok.encode_segments(tok.split(render_prompt(tok.template, inp))) for i in part]
    assert ids == _sim_ids(sglang_sim, "chat", body)


def test_the_proxy_predicts_an_sglang_fleet_exactly(sim_factory: Any, proxy_factory: Any) -> None:
    """Through the proxy, in front of an SGLang-flavour replica (its engine kind scraped): a chat
    session with list content, tools under `tool_choice: "none"` and a final assistant message
    is rendered SGLang's way, so every turn's prediction equals the replica's cached tokens."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000, flavor="sglang", strip_billing_header=False)
    proxy = proxy_factory(sim)
    hook = proxy.services.prefix
    deadline = time.monotonic() + 20
    while {r.engine for r in proxy.services.replicas.all()} != {"sglang"}:
        assert time.monotonic() < deadline, "the replica's engine kind was never scraped"
        time.sleep(0.05)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": SYSTEM},
                                                                 {"type": "text", "text": SYSTEM}]}]
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": SYSTEM,
                                               "parameters": {"type": "object"}}} for i in range(4)]
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for turn in range(4):
            msgs.append({"role": "user", "content": [{"type": "text", "text": f"Turn {turn}:"},
                                                     {"type": "text", "text": "which files changed?"}]})
            body = {"model": "sim", "messages": msgs, "tools": tools, "tool_choice": "none", "max_tokens": 8}
            if turn == 3:
                body["messages"] = [*msgs, {"role": "assistant", "content": "Partial answer"}]
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            wait_processed(hook, turn + 1)
    rows = list(hook.predictions)
    assert len(rows) == 4
    assert [(p, d) for _, _, p, d in rows if p != d] == []
    assert sum(d for _, _, _, d in rows if d) > 300  # the engine really served the history from cache
