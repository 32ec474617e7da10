"""Request parsing and validation for the simulator's OpenAI surface, with vLLM-shaped 400s.

Pure functions: a JSON body in, a `ParsedRequest` (or an `ApiError`) out. Tokenisation happens
later, in the server, because it may need a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
MAX_SALT_CHARS = 128  # vLLM validate_cache_salt
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI / vLLM default for /v1/completions


class ApiError(Exception):
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or {400: "BadRequestError", 404: "NotFoundError",
                             500: "InternalServerError"}.get(status, "Error")

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.status}})


@dataclass
class ParsedRequest:
    kind: str  # chat | completion
    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    cache_salt: str | None
    extra_key: Any = None  # SGLang's radix namespace (the SGLang flavour honours it)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Any] | None = None
    add_generation_prompt: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    add_special_tokens: bool = False
    skip_prefix_cache: bool = False  # vLLM skips the lookup when prompt logprobs are requested
    dialect: str = "vllm"  # whose chat renderer prepares the messages (app/sim/chat_template.py)


def _missing(name: str) -> ApiError:
    return ApiError(400, f"[{{'type': 'missing', 'loc': ('body', '{name}'), 'msg': 'Field required'}}]", name)


def _type_error(name: str, expected: str) -> ApiError:
    return ApiError(400, f"[{{'type': '{expected}_type', 'loc': ('body', '{name}'), "
                         f"'msg': 'Input should be a valid {expected}'}}]", name)


def load_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "[{'type': 'model_attributes_type', 'loc': ('body',), "
                            "'msg': 'Input should be a valid dictionary or object'}]")
    return body


def validate_cache_salt(salt: Any) -> str | None:
    if salt is None:
        return None
    if not isinstance(salt, str):
        raise _type_error("cache_salt", "string")
    if not salt:
        raise ApiError(400, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > MAX_SALT_CHARS:
        raise ApiError(400, f"Parameter 'cache_salt' must be at most {MAX_SALT_CHARS} characters.", "cache_salt")
    if any(c in salt for c in SALT_FORBIDDEN):
        raise ApiError(400, "Parameter 'cache_salt' must not contain '@', '/', '\\' or NUL characters.",
                       "cache_salt")
    return salt


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "integer")
    if value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}.", name)
    return value


def _bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "boolean")
    return value


def _common(body: dict[str, Any], kind: str, served_model: str, default_max: int | None) -> ParsedRequest:
    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        raise _type_error("model", "string")
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "model", "NotFoundError")
    n = _int_field(body, "n", 1, 1)
    if n != 1:
        raise ApiError(400, "The simulator supports n=1 only.", "n")
    stream = _bool_field(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error("stream_options", "dictionary")
    options = options or {}
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    max_tokens = _int_field(body, "max_completion_tokens", None, 1)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", default_max, 1)
    return ParsedRequest(
        skip_prefix_cache=body.get("prompt_logprobs") is not None, kind=kind, model=model, stream=stream, include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("include_usage")) and bool(options.get("continuous_usage_stats")),
        max_tokens=max_tokens, min_tokens=_int_field(body, "min_tokens", 0, 0) or 0,
        ignore_eos=_bool_field(body, "ignore_eos", False), cache_salt=validate_cache_salt(body.get("cache_salt")),
        extra_key=body.get("extra_key"))


def parse_chat(body: dict[str, Any], served_model: str) -> ParsedRequest:
    if "messages" not in body:
        raise _missing("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _type_error("messages", "list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"[{{'type': 'missing', 'loc': ('body', 'messages', {i}, 'role'), "
                                f"'msg': 'Field required'}}]", "messages")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _type_error(f"messages.{i}.content", "string")
    if not messages:
        raise ApiError(400, "messages must contain at least one message.", "messages")
    req = _common(body, "chat", served_model, None)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _type_error("tools", "list")
    if body.get("tool_choice") == "none":
        pass  # vLLM keeps tools in the prompt unless --exclude-tools-when-tool-choice-none
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _type_error("chat_template_kwargs", "dictionary")
    req.messages = messages
    req.tools = tools or None
    req.add_generation_prompt = _bool_field(body, "add_generation_prompt", True)
    req.template_kwargs = dict(kwargs)
    for key in ("documents", "continue_final_message", "reasoning_effort"):  # vLLM hands these to the template too
        if body.get(key) is not None:
            req.template_kwargs[key] = body[key]
    req.add_special_tokens = _bool_field(body, "add_special_tokens", False)
    return req


def parse_completion(body: dict[str, Any], served_model: str) -> ParsedRequest:
    if "prompt" not in body:
        raise _missing("prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    req = _common(body, "completion", served_model, COMPLETIONS_DEFAULT_MAX_TOKENS)
    if isinstance(prompt, str):
        req.prompt_text = prompt
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        req.prompt_ids = list(prompt)
    else:
        raise ApiError(400, "prompt must be a string, a list of token ids, or a batch of one of them "
                            "(the simulator serves one prompt per request).", "prompt")
    if req.prompt_ids is not None and not req.prompt_ids:
        raise ApiError(400, "Prompt cannot be empty.", "prompt")
    req.add_special_tokens = _bool_field(body, "add_special_tokens", True)
    return req


TOKEN_ID_LIMIT = 2**32  # engines keep token ids as uint32 (the block hashers pack them so)


def check_token_ids(ids: list[int]) -> None:
    """vLLM's vocabulary check on a prompt given as token ids, before anything hashes them: a
    negative id (or one past uint32) is a 400 `Token id N is out of vocabulary`. vLLM bounds ids by
    its tokenizer's vocabulary; the simulator accepts any uint32 id, so tests can use made-up ids
    beyond the small built-in vocabulary."""
    if ids:
        worst = min(ids) if min(ids) < 0 else max(ids)
        if not 0 <= worst < TOKEN_ID_LIMIT:
            raise ApiError(400, f"Token id {worst} is out of vocabulary", "prompt")


def check_length(num_prompt: int, max_tokens: int | None, max_model_len: int) -> int:
    """vLLM's length checks; returns the effective max_tokens."""
    if num_prompt == 0:
        raise ApiError(400, "The decoder prompt cannot be empty.", "prompt")
    if num_prompt >= max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                            f"request has {num_prompt} input tokens. Please reduce the length of the input "
                            f"messages.", "messages")
    room = max_model_len - num_prompt
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                            f"maximum context length is {max_model_len} tokens and your request has "
                            f"{num_prompt} input tokens ({max_tokens} > {max_model_len} - {num_prompt}).",
                       "max_tokens")
    return max_tokens
