"""The chat route renders `tools` as the engine dumps them, not as the client sent them.

tests/fixtures/engine_tool_dump/tools.json holds, per case, the tools a client sent and what
vLLM 0.32's and SGLang's request models dump for the template (recorded by the `record.py` next to
it with each engine's own interpreter). vLLM's chat renderer renders that dump (description null
when absent, the function's members in the model's order), so the proxy's prompt ids, and so its
block hashes and predictions, are the engine's only when it renders the same dump.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.prefix.prompt import prompt_input, render_prompt
from app.prefix.tokens import SegmentTokenizer
from app.prefix.tool_dump import engine_tools

CASES = json.loads((Path(__file__).parent / "fixtures" / "engine_tool_dump" / "tools.json").read_text())
ENGINES = ("vllm", "sglang")
MESSAGES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "list the files"}]


@pytest.fixture(scope="module")
def tokenizer() -> SegmentTokenizer:
    return SegmentTokenizer.load(None)


def _encode(tokenizer: SegmentTokenizer, text: str) -> list[int]:
    return [i for ids in tokenizer.encode_segments(tokenizer.split(text)) for i in ids]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_engine_tools_are_the_engine_models_dump(case: int, engine: str) -> None:
    entry = CASES[case]
    assert json.dumps(engine_tools(entry["tools"], engine)) == json.dumps(entry[engine])  # member order too


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_chat_route_ids_equal_the_engines_render(tokenizer: SegmentTokenizer, case: int, engine: str) -> None:
    entry = CASES[case]
    inp = prompt_input("chat", {"messages": MESSAGES, "tools": entry["tools"]}, tool_dump=engine)
    assert inp is not None
    engine_text = tokenizer.template.render(MESSAGES, tools=entry[engine])
    assert _encode(tokenizer, render_prompt(tokenizer.template, inp)) == _encode(tokenizer, engine_text)


def test_vllm_is_the_default_and_a_member_reorder_renders_the_same(tokenizer: SegmentTokenizer) -> None:
    def text(tools: list[dict[str, Any]], **kw: Any) -> str:
        inp = prompt_input("chat", {"messages": MESSAGES, "tools": tools}, **kw)
        assert inp is not None
        return render_prompt(tokenizer.template, inp)

    sent, reordered = CASES[0]["tools"], CASES[2]["tools"]  # the same function, members reordered
    assert text(sent) == text(reordered)
    assert text(sent, tool_dump="sglang") != text(reordered, tool_dump="sglang")  # SGLang keeps the order
