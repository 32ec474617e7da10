"""Chat `tools` as each engine hands them to the chat template: the simulator's own implementation.

Both engines validate every tool into their request model and give the template the model's
dump, not the client's JSON. The rules below are read off the dumps recorded from vLLM 0.32's
`ChatCompletionToolsParam` and SGLang 0.5.23's `Tool` (tests/fixtures/engine_tool_dump/tools.json,
checked by tests/test_sim_tool_dump.py). The gateway has its own version (app/prefix/tool_dump.py);
an oracle must not share the code it checks, so `duplicates` may flag this one on purpose.

vLLM: `{"type", "function"}` plus the tool's `defer_loading` when set; the function as
`name, description, parameters` (null when absent) then `strict`, `defer_loading` when set (a
function without `defer_loading` takes the tool's). Member order is the model's, whatever the
client's.
SGLang: `{"type", "function", "defer_loading"}` (null when unset); the function's members in the
client's order, then the missing ones in the model's order (`description`, `name`,
`parameters`, `strict`, `defer_loading`), where a null `strict` / `defer_loading` is left out (the
function's `defer_loading` also taken from the tool's).
Unknown members are dropped by both. A tool that is not an object with a `function` object is
passed on untouched (the engine refuses the request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_ALWAYS = ("name", "description", "parameters")
_WHEN_SET = ("strict", "defer_loading")
_SGLANG_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def _vllm_tool(kind: Any, function: Mapping[str, Any], defer: Any) -> dict[str, Any]:
    dumped = {key: function.get(key) for key in _ALWAYS}
    for key in _WHEN_SET:
        value = function.get(key)
        if key == "defer_loading" and value is None:
            value = defer
        if value is not None:
            dumped[key] = value
    tool: dict[str, Any] = {"type": kind, "function": dumped}
    if defer is not None:
        tool["defer_loading"] = defer
    return tool


def _sglang_tool(kind: Any, function: Mapping[str, Any], defer: Any) -> dict[str, Any]:
    values = {key: function.get(key) for key in _SGLANG_FIELDS}
    if values["defer_loading"] is None:
        values["defer_loading"] = defer
    order = [k for k in function if k in values] + [k for k in _SGLANG_FIELDS if k not in function]
    dumped = {k: values[k] for k in order if k in _ALWAYS or values[k] is not None}
    return {"type": kind, "function": dumped, "defer_loading": defer}


def dump_tools(tools: Sequence[Any] | None, engine: str = "vllm") -> list[Any] | None:
    """`tools` as `engine` ("vllm" or "sglang") renders them; None when there are none."""
    if not tools:
        return None
    dump = _sglang_tool if engine == "sglang" else _vllm_tool
    out: list[Any] = []
    for tool in tools:
        if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping):
            out.append(dump(tool.get("type", "function"), tool["function"], tool.get("defer_loading")))
        else:
            out.append(tool)
    return out
