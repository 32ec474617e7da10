"""The simulator dumps chat `tools` as each engine's request model does (its own code).

tests/fixtures/engine_tool_dump/tools.json holds, per case, the tools a client sent and the
`model_dump()` of vLLM 0.32's `ChatCompletionToolsParam` and SGLang 0.5.23's `Tool` for them:
what each engine's chat template receives. app/sim/tool_dump.py must reproduce both, member
order included (the template's `tojson` keeps it, so it reaches the prompt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.sim.tool_dump import dump_tools

CASES = json.loads((Path(__file__).parent / "fixtures" / "engine_tool_dump" / "tools.json").read_text())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_sim_tool_dump_equals_the_engines_model_dump(case: dict[str, Any], engine: str) -> None:
    ours = dump_tools(case["tools"], engine)
    assert json.dumps(ours) == json.dumps(case[engine])  # order matters: compare the serialised text
