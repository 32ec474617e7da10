"""What a request asks the engine to tokenise, pulled out of an OpenAI body, and its rendering.

Chat bodies render through the tokenizer's chat template exactly as the engine renders them
(app/prefix/template.py), so the text the proxy splits and encodes is the text the engine encodes;
completion prompts are used as sent; a prompt given as token ids is used as ids (nothing to render).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.prefix.convert_messages import chat_view, strip_billing_lines
from app.prefix.template import ChatTemplate
from app.prefix.tool_dump import ToolDump, engine_tools

PromptKind = Literal["chat", "completions", "ids"]

# The body keys that shape the engine's prompt ids (what engine mode sends to /tokenize).
_ENGINE_KEYS = ("messages", "tools", "add_generation_prompt", "chat_template_kwargs", "documents",
                "continue_final_message", "prompt", "add_special_tokens", "model")


@dataclass
class PromptInput:
    """What a request asks the engine to tokenise: chat messages (+tools) or a completion prompt."""

    kind: PromptKind
    messages: list[Mapping[str, Any]] = field(default_factory=list)
    tools: list[Any] | None = None
    prompt: str = ""
    ids: list[int] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    body: Mapping[str, Any] | None = None  # the request body (engine mode sends it to /tokenize)
    engine: ToolDump = "vllm"  # whose rules render the chat messages (app/prefix/template.py)


def prompt_input(kind: Literal["chat", "completions"], body: Mapping[str, Any], strip_billing: bool = True,
                 tool_dump: ToolDump | None = "vllm") -> PromptInput | None:
    """Extract the prompt from an OpenAI body (None when there is nothing to fingerprint).

    `kind` says how the body holds it: "chat", `messages` (+`tools`) the chat template renders;
    "completions", a `prompt` used as sent (or token ids). `strip_billing`: the engine drops
    Claude Code's billing header line (vLLM does, SGLang does not); `tool_dump`: whose request
    model the chat `tools` go through before rendering (app/prefix/tool_dump.py; None: as sent,
    for tools already converted to the engine's form) and so which engine the prompt is rendered
    for: "sglang" renders by SGLang 0.5.23's rules (docs/agents-apis.md), else vLLM's."""
    if kind == "chat":
        return _chat_input(body, strip_billing, tool_dump, tool_dump or "vllm")
    return _completion_input(body)


def messages_prompt_input(body: Mapping[str, Any], strip_billing: bool = True, merge_inline_system: bool = False,
                          tool_dump: ToolDump | None = "vllm") -> PromptInput | None:
    """The prompt of an Anthropic Messages body, read as the chat body the engine converts it to
    (app/prefix/convert_messages.py); `strip_billing`: the engine drops the billing header block
    there; `merge_inline_system`: the template needs system-first ordering, so inline system
    messages join the leading one; `tool_dump` as in `prompt_input`."""
    engine: ToolDump = tool_dump or "vllm"
    return _chat_input(chat_view(body, strip_billing, merge_inline_system, engine), False, None, engine)


def sglang_tools(tools: list[Any] | None, tool_choice: Any) -> list[Any] | None:
    """The tools SGLang 0.5.23 hands the template (`openai/serving_chat.py`): none under
    `tool_choice: "none"`, only the named one under a named choice, else all (vLLM: always all)."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        return [t for t in tools if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
                and t["function"].get("name") == name] or None
    return tools


def _chat_input(body: Mapping[str, Any], strip_billing: bool, tool_dump: ToolDump | None,
                engine: ToolDump) -> PromptInput | None:
    """A chat body's prompt as `engine` renders it (`tool_dump` as in `prompt_input`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    if strip_billing:  # vLLM's chat renderer drops a system text's billing-header first line
        stripped = strip_billing_lines(messages)
        if stripped is not messages:
            messages, body = stripped, {**body, "messages": stripped}
    kwargs: dict[str, Any] = {}
    extra = body.get("chat_template_kwargs")
    if isinstance(extra, Mapping):
        kwargs.update(extra)
    for key in ("documents", "continue_final_message", "reasoning_effort"):
        if body.get(key) is not None:
            kwargs[key] = body[key]
    kwargs["add_generation_prompt"] = bool(body.get("add_generation_prompt", True))
    tools = body.get("tools")
    if tools and isinstance(tools, list) and tool_dump is not None:
        tools = engine_tools(tools, tool_dump)  # the engine renders its model's dump, not the JSON sent
    if engine == "sglang" and isinstance(tools, list):
        tools = sglang_tools(tools, body.get("tool_choice"))
    return PromptInput("chat", messages=messages, tools=tools if tools else None, template_kwargs=kwargs,
                       model=body.get("model"), body=body, engine=engine)


def _completion_input(body: Mapping[str, Any]) -> PromptInput | None:
    """A completion body's prompt: a string (a batch of one too) or token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return PromptInput("completions", prompt=prompt, model=body.get("model"), body=body)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        # not copied nor checked id by id here (O(prompt) on the loop): the ids are converted to
        # an array as they are hashed, inline for the head and in a worker for the rest, and a
        # non-integer there ends the fingerprint (the engine refuses such a body anyway)
        return PromptInput("ids", ids=prompt)
    return None


def render_prompt(template: ChatTemplate | None, inp: PromptInput) -> str:
    """The prompt text the engine tokenises (chat: the template rendered as the engine does)."""
    if inp.kind == "chat":
        if template is None:
            raise ValueError("tokenizer has no chat template")
        kwargs = dict(inp.template_kwargs)
        agp = kwargs.pop("add_generation_prompt", True)
        return template.render(inp.messages, tools=inp.tools, add_generation_prompt=agp, engine=inp.engine, **kwargs)
    return inp.prompt


def engine_payload(inp: PromptInput) -> dict[str, Any]:
    """The /tokenize request for a chat or completion body (only the keys that shape the ids)."""
    body = inp.body or {}
    return {k: body[k] for k in _ENGINE_KEYS if body.get(k) is not None}
