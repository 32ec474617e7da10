"""The proxy renders the prompt ids real vLLM 0.32 renders for Messages and Responses bodies.

tests/fixtures/real_vllm_agents/render.json holds, per body, the `token_ids` vLLM's own
`POST /v1/messages/render` and `/v1/responses/render` returned (recorded by
scripts/record_vllm_agents.py, tiny model = the default tokenizer). The bodies exercise the
conversion rules of docs/agents-apis.md and docs/agents-responses.md: billing header blocks and
lines, system blocks with cache_control, tools with and without description / type / strict /
defer_loading, thinking, tool_use and tool_result blocks, inline system messages, function calls and
outputs, a developer message. Equal ids are what makes the proxy's block hashes the engine's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.prefix.convert_responses import ResponseHistory, responses_prompt_input
from app.prefix.prompt import messages_prompt_input, render_prompt
from app.prefix.tokens import SegmentTokenizer

CASES = json.loads((Path(__file__).parent / "fixtures" / "real_vllm_agents" / "render.json").read_text())


@pytest.fixture(scope="module")
def tokenizer() -> SegmentTokenizer:
    return SegmentTokenizer.load(None)


def _ids(tokenizer: SegmentTokenizer, route: str, body: dict[str, Any]) -> list[int]:
    inp = messages_prompt_input(body) if route == "messages" else responses_prompt_input(body, ResponseHistory())
    assert inp is not None
    text = render_prompt(tokenizer.template, inp)
    return [i for ids in tokenizer.encode_segments(tokenizer.split(text)) for i in ids]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['route']}-{i}" for i, c in enumerate(CASES)])
def test_prompt_ids_equal_vllm_render(tokenizer: SegmentTokenizer, case: dict[str, Any]) -> None:
    assert _ids(tokenizer, case["route"], case["body"]) == case["token_ids"]
