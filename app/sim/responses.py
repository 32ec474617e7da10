"""The simulator's OpenAI Responses API (`/v1/responses`), shaped like vLLM 0.32's.

A request is converted to chat messages with the rules the engine uses (app/sim/responses_convert.py,
the simulator's own conversion; docs/agents-responses.md), tokenised and generated like a chat
request. Streamed: `event: <type>` + `data: <json>` events with a `sequence_number`:
response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta (one per chunk of tokens),
response.output_text.done, response.content_part.done, response.output_item.done,
response.completed (the usage inside), no `[DONE]`; an engine error mid-stream is an `error`
event. Stored responses (`store`, on unless `responses_store` is off, as vLLM with
VLLM_ENABLE_RESPONSES_API_STORE) live in this replica's memory: `previous_response_id`, GET and
cancel find them here only, and an unknown id is vLLM's 404.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from app.sim.asgi import SSE_HEADERS, EventSender, Receive, Send, StreamDied, cut_connection, send_json
from app.sim.protocol import ApiError
from app.sim.request import SimRequest
from app.sim.responder import body_due
from app.sim.responses_convert import prior_turn, responses_to_chat
from app.sim.tool_dump import dump_tools


def not_found(response_id: str) -> ApiError:
    """vLLM's `_make_not_found_error`."""
    return ApiError(404, f"Response with id '{response_id}' not found.", "response_id", kind="invalid_request_error")


class ResponsesStore:
    """One replica's stored responses and the chat messages each was generated from."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.responses: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}

    def chat_body(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The chat body the engine renders for a Responses body, and its messages (to store)."""
        if body.get("input") is None:
            raise ApiError(400, "[{'type': 'missing', 'loc': ('body', 'input'), 'msg': 'Field required'}]", "input")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict)
                                         and all(isinstance(v, str) for v in metadata.values())):
            # the request model types it dict[str, str]: anything else is vLLM's validation 400
            raise ApiError(400, "[{'type': 'dict_type', 'loc': ('body', 'metadata'), "
                                "'msg': 'Input should be a valid dictionary of strings'}]", "metadata")
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            # a list of tool objects (a union of pydantic models): anything else is vLLM's validation 400
            raise ApiError(400, "[{'type': 'model_type', 'loc': ('body', 'tools'), "
                                "'msg': 'Input should be a list of valid tool objects'}]", "tools")
        previous = body.get("previous_response_id")
        history = None
        if isinstance(previous, str):
            prev = self.responses.get(previous)
            if prev is None:
                raise not_found(previous)
            history = prior_turn(self.messages.get(previous, []), prev)
        messages, tools = responses_to_chat(body, history)
        if not messages:
            raise ApiError(400, "input must contain at least one item.", "input")
        chat: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                                "stream": bool(body.get("stream")), "cache_salt": body.get("cache_salt")}
        if tools:
            chat["tools"] = dump_tools(tools)
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        for key in ("ignore_eos", "min_tokens"):
            if body.get(key) is not None:
                chat[key] = body[key]
        return chat, messages

    def keep(self, body: dict[str, Any], response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        if self.enabled and body.get("store", True) is not False:
            self.responses[response["id"]] = response
            self.messages[response["id"]] = messages

    async def by_id(self, method: str, path: str, send: Send) -> None:
        """GET /v1/responses/{id} and POST /v1/responses/{id}/cancel."""
        rest = path[len("/v1/responses/"):]
        cancel = rest.endswith("/cancel")
        response_id = rest[:-len("/cancel")] if cancel else rest
        found = self.responses.get(response_id)
        if found is None or (cancel and method != "POST") or (not cancel and method != "GET"):
            await send_json(send, 404, not_found(response_id).body())
            return
        if cancel and found.get("status") not in ("queued", "in_progress"):
            await send_json(send, 400, ApiError(400, "Cannot cancel a synchronous response.", "response_id",
                                                kind="invalid_request_error").body())
            return
        await send_json(send, 200, found)


_FUNCTION_TOOL = ("name", "parameters", "strict", "type", "allowed_callers", "async", "defer_loading", "description",
                  "output_schema")


def _tool_dump(tool: Any) -> Any:
    """A function tool as vLLM echoes it in the response (its pydantic model, every field)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    return {k: tool.get(k) for k in _FUNCTION_TOOL}


class ResponsesWriter:
    """The events (or the body) of one response."""

    def __init__(self, model: str, body: dict[str, Any]) -> None:
        self.id = "resp_" + uuid.uuid4().hex
        self.item_id = "msg_" + uuid.uuid4().hex
        self.model = model
        self.body = body
        self.created = int(time.time())
        self.seq = 0

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 incomplete: str | None = None) -> dict[str, Any]:
        """vLLM 0.32's response object, every member it sends (tests/fixtures/real_vllm_agents)."""
        b = self.body
        tools = [_tool_dump(t) for t in b.get("tools") or []]
        return {"id": self.id, "created_at": self.created,
                "incomplete_details": {"reason": incomplete} if incomplete else None,
                "instructions": b.get("instructions"), "metadata": b.get("metadata"), "model": self.model,
                "object": "response", "output": output, "parallel_tool_calls": True,
                "temperature": b.get("temperature", 1.0), "tool_choice": b.get("tool_choice", "auto" if tools else "none"),
                "tools": tools, "top_p": b.get("top_p", 1.0), "background": False,
                "max_output_tokens": b.get("max_output_tokens"), "max_tool_calls": b.get("max_tool_calls"),
                "previous_response_id": b.get("previous_response_id"), "prompt": None, "reasoning": None,
                "service_tier": "auto", "status": status, "text": None, "top_logprobs": b.get("top_logprobs"),
                "truncation": "disabled", "usage": usage, "user": None, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "kv_transfer_params": None, "ec_transfer_params": None,
                "input_messages": None, "output_messages": None}

    def item(self, text: str, status: str) -> dict[str, Any]:
        content = [self.part(text)] if status == "completed" else []
        return {"id": self.item_id, "content": content, "role": "assistant", "status": status, "type": "message",
                "phase": None}

    @staticmethod
    def part(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
        """An output_text part: vLLM sends `logprobs: []` in content_part.added, null once done."""
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}

    @staticmethod
    def usage(req: SimRequest, cached_on: bool) -> dict[str, Any]:
        n, out = req.num_prompt_tokens, len(req.output_ids)
        cached = max(req.num_cached_tokens, 0) if cached_on else 0
        written = req.created_cache_tokens if cached_on else 0
        return {"input_tokens": n,
                "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written,
                                         "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                          "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
                "total_tokens": n + out}

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def final(self, req: SimRequest, cached_on: bool) -> dict[str, Any]:
        text = "".join(req.output_text)
        length = req.finish_reason == "length"
        return self.response("incomplete" if length else "completed", [self.item(text, "completed")] if text else [],
                             self.usage(req, cached_on), "max_output_tokens" if length else None)


async def respond(writer: ResponsesWriter, req: SimRequest, send: Send, receive: Receive, die_after: int | None,
                  cached_on: bool) -> dict[str, Any] | None:
    """Non-streamed: the whole response object once generation ended (returned, for the store)."""
    if not await body_due(req, send, receive, die_after):
        return None
    final = writer.final(req, cached_on)
    await send_json(send, 200, final)
    return final


async def stream(writer: ResponsesWriter, req: SimRequest, send: Send, receive: Receive, die_after: int | None,
                 cached_on: bool, deltas_per_chunk: int, abort: Any) -> dict[str, Any] | None:
    """Streamed: the event sequence above; returns the final response (None when it broke)."""
    emit = EventSender(send, die_after)

    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    w = writer
    ids = {"output_index": 0, "item_id": w.item_id, "content_index": 0}
    try:
        initial = w.response("in_progress", [], None)
        await emit(w.event("response.created", response=initial))
        await emit(w.event("response.in_progress", response=initial))
        opened = False
        sent = 0
        while True:
            await req.event.wait()
            req.event.clear()
            if req.finish_reason == "abort":
                return None
            if req.finish_reason == "error":
                await emit(w.event("error", code=None, message=req.error or "Internal server error", param=None))
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return None
            available = len(req.output_ids)
            if available and not opened:
                await emit(w.event("response.output_item.added", output_index=0, item=w.item("", "in_progress")))
                await emit(w.event("response.content_part.added", **ids, part=w.part("", [])))
                opened = True
            while available - sent >= deltas_per_chunk or (req.finished and sent < available):
                end = min(sent + deltas_per_chunk, available)
                await emit(w.event("response.output_text.delta", **ids, delta="".join(req.output_text[sent:end]),
                                   logprobs=[]))
                sent = end
            if req.finished:
                break
        text = "".join(req.output_text)
        if opened:
            await emit(w.event("response.output_text.done", **ids, text=text, logprobs=[]))
            await emit(w.event("response.content_part.done", **ids, part=w.part(text)))
            await emit(w.event("response.output_item.done", output_index=0, item=w.item(text, "completed")))
        final = w.final(req, cached_on)
        await emit(w.event("response.completed", response=final))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return final
    except StreamDied:
        abort(req)
        await cut_connection(send, receive)
        return None

