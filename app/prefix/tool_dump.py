"""Chat `tools` as the engine hands them to the chat template (docs/engine-hashing.md, "Tools").

Neither vLLM nor SGLang renders a chat request's `tools` JSON as the client sent it: each parses
every tool into its pydantic request model and renders the model's dump. The proxy renders the
same dump, or its prompt (and so its block hashes and predictions) differs from the engine's as
soon as a tool lacks a `description` or orders its members differently. The two dumps:

- vLLM 0.32 (`ChatCompletionToolsParam` / `FunctionDefinition`): `{"type", "function", ["defer_loading"]}`
  with the function's members in the model's fixed order `name, description, parameters, [strict],
  [defer_loading]` (description / parameters null when absent; strict / defer_loading only when
  not null; a tool's `defer_loading` fills the function's when that is null; the tool's own only
  when not null). Unknown members are dropped. A client that reorders a function's members sends
  vLLM the same prompt.
- SGLang (`Tool` / `Function`): the function's members in the client's order, then the model's
  members it left out (description / parameters as null; strict / defer_loading dropped when
  null); the tool as `{"type", "function", "defer_loading"}` (that last one null when unset).
  Unknown members are dropped. A reorder of a function's members changes SGLang's prompt.

A tool that is not an object with a `function` object is left as sent (the engine refuses the
request, so there is no cache to predict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

ToolDump = Literal["vllm", "sglang"]

_FUNCTION_FIELDS = ("name", "description", "parameters")  # null when absent, both engines
_FUNCTION_OPTIONAL = ("strict", "defer_loading")  # dropped when null, both engines
_SGLANG_MODEL_ORDER = ("description", "name", "parameters", "strict", "defer_loading")


def vllm_function(function: Mapping[str, Any]) -> dict[str, Any]:
    """A function definition as vLLM's `FunctionDefinition` dumps it (fixed member order)."""
    out: dict[str, Any] = {k: function.get(k) for k in _FUNCTION_FIELDS}
    out.update({k: function[k] for k in _FUNCTION_OPTIONAL if function.get(k) is not None})
    return out


def _sglang_function(function: Mapping[str, Any], defer: Any) -> dict[str, Any]:
    full = {k: function.get(k) for k in _SGLANG_MODEL_ORDER}
    if full["defer_loading"] is None:
        full["defer_loading"] = defer  # set after the client's member order was taken
    order = [k for k in function if k in full] + [k for k in _SGLANG_MODEL_ORDER if k not in function]
    return {k: full[k] for k in order if full[k] is not None or k in _FUNCTION_FIELDS}


def engine_tools(tools: Sequence[Any] | None, engine: ToolDump = "vllm") -> list[Any] | None:
    """`tools` as `engine` dumps them for the template (None when there are none)."""
    if not tools:
        return None
    out: list[Any] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping):
            out.append(tool)
            continue
        defer = tool.get("defer_loading")
        kind = tool.get("type", "function")
        if engine == "sglang":
            out.append({"type": kind, "function": _sglang_function(function, defer), "defer_loading": defer})
        else:
            if defer is not None and function.get("defer_loading") is None:
                function = {**function, "defer_loading": defer}
            dumped = {"type": kind, "function": vllm_function(function)}
            if defer is not None:
                dumped["defer_loading"] = defer
            out.append(dumped)
    return out
