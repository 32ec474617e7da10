"""One simulated replica's HTTP surface: a raw ASGI app (no framework on the streaming path).

The proxy benchmarks run 128 concurrent streams against simulators on 2 shared cores, so the
per-event cost matters: events are pre-shaped bytes, one ASGI body message each (vLLM sends each
SSE event as its own HTTP chunk). Response writing lives in responder.py, ASGI plumbing in asgi.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.sim import anthropic, responder
from app.sim import responses as responses_api
from app.sim.asgi import ClientGone, Receive, Scope, Send, cut_connection, read_body, send_bytes, send_json
from app.sim.chat_template import RenderError
from app.sim.engine import SimEngine
from app.sim.faults import FaultPlan, parse_fault
from app.sim.kv_events import KVEventPublisher
from app.sim.options import SimOptions
from app.sim.protocol import (
    ApiError,
    ParsedRequest,
    check_length,
    check_token_ids,
    load_json,
    parse_chat,
    parse_completion,
)
from app.sim.request import SimRequest
from app.sim.responses import ResponsesStore, ResponsesWriter
from app.sim.shapes import Shaper
from app.sim.tokens import SimTokenizer, load_tokenizer
from app.sim.tool_dump import dump_tools

THREAD_THRESHOLD_BYTES = 32 * 1024  # bodies above this are tokenised and hashed in a worker thread
VERSION = "0.33.0+prefixgate.sim"


class SimApp:
    """ASGI app of one replica. `engine` is exposed for white-box assertions."""

    def __init__(self, options: SimOptions, tokenizer: SimTokenizer | None = None) -> None:
        self.options = options
        self.tokenizer = tokenizer or load_tokenizer(options.tokenizer)
        self.publisher: KVEventPublisher | None = None
        if options.kv_events and options.prefix_caching:
            endpoint = options.kv_events if isinstance(options.kv_events, str) else "tcp://127.0.0.1:0"
            self.publisher = KVEventPublisher(endpoint, options.flavor, options.page_size,
                                              options.kv_events_topic,
                                              replay_endpoint=options.kv_events_replay or "tcp://127.0.0.1:0")
        self.engine = SimEngine(options, self.tokenizer,
                                event_sink=self.publisher.publish if self.publisher else None)
        self.faults = FaultPlan()
        self.system_first = self.tokenizer.template.requires_system_first()  # /v1/messages, as vLLM probes
        self.routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("GET", "/health"): self.health, ("GET", "/ping"): self.health, ("POST", "/ping"): self.health,
            ("GET", "/health_generate"): self.health,
            ("GET", "/v1/models"): self.models, ("GET", "/metrics"): self.metrics,
            ("GET", "/version"): self.version, ("GET", "/server_info"): self.server_info,
            ("GET", "/get_server_info"): self.server_info,
            ("POST", "/tokenize"): self.tokenize, ("POST", "/detokenize"): self.detokenize,
            ("POST", "/reset_prefix_cache"): self.reset_prefix_cache,
            ("POST", "/flush_cache"): self.reset_prefix_cache, ("GET", "/flush_cache"): self.reset_prefix_cache,
            ("POST", "/v1/chat/completions"): self.chat, ("POST", "/v1/completions"): self.completion,
            ("POST", "/v1/messages"): self.messages, ("POST", "/v1/messages/count_tokens"): self.count_tokens,
            ("POST", "/sim/faults"): self.set_faults, ("GET", "/sim/faults"): self.get_faults,
            ("GET", "/sim/state"): self.state, ("GET", "/kv_event_sources"): self.kv_event_sources,
        }
        self.responses_store = ResponsesStore(options.responses_store)  # app/sim/responses.py
        self.routes[("POST", "/v1/responses")] = self.responses
        self.routes[("POST", "/v1/messages/render")] = self.render_messages  # vLLM --enable-scale-out
        self.routes[("POST", "/v1/responses/render")] = self.render_responses

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher else None

    @property
    def kv_replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint if self.publisher else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        self.engine.start()
        handler = self.routes.get((scope["method"], scope["path"]))
        if handler is None and scope["path"].startswith("/v1/responses/"):
            await self.responses_store.by_id(scope["method"], scope["path"], send)
            return
        if handler is None:
            known = any(path == scope["path"] for _, path in self.routes)
            status = 405 if known else 404
            await send_json(send, status, ApiError(status, "Method Not Allowed" if known else "Not Found",
                                                    kind="NotFoundError").body())
            return
        try:
            await handler(scope, receive, send)
        except ClientGone:
            pass

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.stop()
                if self.publisher:
                    self.publisher.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ small endpoints
    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.engine.dead:
            await send_json(send, 500, ApiError(500, "EngineCore encountered an issue.").body())
        else:
            await send_bytes(send, 200, b"", [])

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        o = self.options
        await send_json(send, 200, {"object": "list", "data": [{
            "id": o.model, "object": "model", "created": int(time.time()),
            "owned_by": "sglang" if o.flavor == "sglang" else "vllm", "root": o.model, "parent": None,
            "max_model_len": o.max_model_len}]})

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, content_type = self.engine.metrics.render()
        await send_bytes(send, 200, body, [(b"content-type", content_type.encode())])

    async def version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"version": VERSION})

    async def server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        o = self.options
        await send_json(send, 200, {"model_path": o.model, "page_size": o.page_size,
                                     "max_total_num_tokens": o.pool_blocks * o.page_size,
                                     "disable_radix_cache": not o.prefix_caching, "version": VERSION})

    async def kv_event_sources(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.kv_events_endpoint
        await send_json(send, 200, {"sources": [{"data_parallel_rank": 0, "endpoint": endpoint,
                                                  "topic": self.options.kv_events_topic,
                                                  "replay_endpoint": self.kv_replay_endpoint}]
                                     if endpoint else []})

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await read_body(receive)
        try:
            body = load_json(raw)
            if "messages" in body:
                parsed = parse_chat({**body, "model": self.options.model}, self.options.model)
                tools = _sglang_tool_choice(parsed.tools, body) if self.options.flavor == "sglang" else parsed.tools
                parsed.tools = dump_tools(tools, self.options.flavor)  # the engine's model dump
                parsed.dialect = self.options.flavor
            else:
                parsed = parse_completion({**body, "model": self.options.model}, self.options.model)
            ids = await self._tokenize(parsed, len(raw))
        except ApiError as exc:
            await send_json(send, exc.status, exc.body())
            return
        await send_json(send, 200, {"count": len(ids), "max_model_len": self.options.max_model_len,
                                     "tokens": ids, "token_strs": None})

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = load_json(await read_body(receive))
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ApiError(400, "tokens must be a list of token ids", "tokens")
        except ApiError as exc:
            await send_json(send, exc.status, exc.body())
            return
        await send_json(send, 200, {"prompt": self.tokenizer.decode(tokens)})

    async def reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok = self.engine.reset_prefix_cache()
        await send_json(send, 200, {"success": ok})

    async def set_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            fault = parse_fault(load_json(await read_body(receive)))
        except (ApiError, ValueError) as exc:
            await send_json(send, 400, ApiError(400, str(exc)).body())
            return
        if fault.mode == "clear":
            self.faults.clear()
            self.engine.slow_factor = 1.0
            self.engine.dead = False
        elif fault.mode == "slow":
            self.engine.slow_factor = fault.factor
        elif fault.mode == "kv_gap":
            if self.publisher is None:
                await send_json(send, 400, ApiError(400, "kv events are not enabled").body())
                return
            self.publisher.drop_next += fault.remaining
        else:
            self.faults.add(fault)
        await send_json(send, 200, {"ok": True, "pending": self.faults.describe(),
                                     "slow_factor": self.engine.slow_factor})

    async def get_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"pending": self.faults.describe(), "slow_factor": self.engine.slow_factor,
                                     "dead": self.engine.dead})

    async def state(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {**self.engine.state(), "kv_events_endpoint": self.kv_events_endpoint,
                                     "kv_replay_endpoint": self.kv_replay_endpoint,
                                     "kv_events_seq": self.publisher.seq if self.publisher else None,
                                     "faults": self.faults.describe()})

    # ------------------------------------------------------------------ generation
    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate("chat", receive, send)

    async def completion(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate("completion", receive, send)

    async def responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate("responses", receive, send)

    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate("messages", receive, send)

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Anthropic's count_tokens: the prompt's tokens as the Messages route renders it."""
        raw = await read_body(receive)
        try:
            parsed = anthropic.parse_messages(load_json(raw), self.options.model, self.options.strip_billing_header,
                                              count_only=True, merge_inline_system=self.system_first)
            ids = await self._tokenize(parsed, len(raw))
        except ApiError as exc:
            await send_json(send, exc.status, anthropic.error_body(exc))
            return
        await send_json(send, 200, {"input_tokens": len(ids)})

    async def render_messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's render-only endpoint: the prompt ids a Messages body would be generated from."""
        raw = await read_body(receive)
        try:
            parsed = anthropic.parse_messages(load_json(raw), self.options.model, self.options.strip_billing_header,
                                              merge_inline_system=self.system_first)
            ids = await self._tokenize(parsed, len(raw))
        except ApiError as exc:
            await send_json(send, exc.status, anthropic.error_body(exc))
            return
        await send_json(send, 200, {"token_ids": ids})

    async def render_responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's render-only endpoint for a Responses body."""
        raw = await read_body(receive)
        try:
            chat_body, _ = self.responses_store.chat_body(load_json(raw))
            ids = await self._tokenize(parse_chat(chat_body, self.options.model), len(raw))
        except ApiError as exc:
            await send_json(send, exc.status, exc.body())
            return
        await send_json(send, 200, {"token_ids": ids})

    def _tokenize_sync(self, parsed: ParsedRequest) -> list[int]:
        if parsed.prompt_ids is not None:
            check_token_ids(parsed.prompt_ids)
            return parsed.prompt_ids
        if parsed.kind == "chat":
            # vLLM 0.32's chat renderer drops a system text's billing-header first line (every
            # route, /tokenize included); an SGLang-like replica keeps it (docs/agents-apis.md)
            text = self.tokenizer.render_chat(parsed.messages, parsed.tools, parsed.add_generation_prompt,
                                              self.options.strip_billing_header, parsed.dialect,
                                              **parsed.template_kwargs)
        else:
            text = parsed.prompt_text or ""
        return self.tokenizer.encode(text, parsed.add_special_tokens)

    async def _tokenize(self, parsed: ParsedRequest, raw_len: int) -> list[int]:
        try:
            if raw_len > THREAD_THRESHOLD_BYTES:
                return await asyncio.to_thread(self._tokenize_sync, parsed)
            return self._tokenize_sync(parsed)
        except (RenderError, TypeError, ValueError) as exc:  # e.g. `tool_calls: true`: vLLM says 400 too
            raise ApiError(400, str(exc)) from exc

    def _continued(self, parsed: ParsedRequest) -> int:
        """Canned output tokens a continuation request already holds (tokens.continued_tokens)."""
        if parsed.kind == "chat":
            if not parsed.template_kwargs.get("continue_final_message") or not parsed.messages:
                return 0
            final = parsed.messages[-1]
            content = final.get("content") if final.get("role") == "assistant" else None
            return self.tokenizer.continued_tokens(content, whole=True) if isinstance(content, str) else 0
        if parsed.kind == "completion" and parsed.prompt_text:
            return self.tokenizer.continued_tokens(parsed.prompt_text, whole=False)
        return 0

    async def _generate(self, kind: str, receive: Receive, send: Send) -> None:
        arrival = time.monotonic()
        raw = await read_body(receive)
        fault = self.faults.take()

        def shaped(exc: ApiError) -> Any:  # the route's own error shape
            return anthropic.error_body(exc) if kind == "messages" else exc.body()

        if self.engine.dead:
            await send_json(send, 500, shaped(ApiError(500, "EngineCore encountered an issue.")))
            return
        if fault is not None:
            if fault.mode == "error":
                await send_json(send, fault.status, shaped(ApiError(fault.status, "Simulated engine failure.")))
                return
            if fault.mode == "drop":
                await cut_connection(send, receive)
                return
            if fault.mode == "stall":
                await asyncio.sleep(fault.delay_s)
        o = self.options
        try:
            body = load_json(raw)
            messages: list[dict[str, Any]] = []
            if kind == "responses":
                chat_body, messages = self.responses_store.chat_body(body)
                parsed = parse_chat(chat_body, o.model)
            elif kind == "messages":
                parsed = anthropic.parse_messages(body, o.model, o.strip_billing_header,
                                                  merge_inline_system=self.system_first)
            else:
                parsed = parse_chat(body, o.model) if kind == "chat" else parse_completion(body, o.model)
                if kind == "chat":  # tools and messages as the engine's own chat renderer prepares them
                    parsed.tools = dump_tools(_sglang_tool_choice(parsed.tools, body) if o.flavor == "sglang"
                                              else parsed.tools, o.flavor)
                    parsed.dialect = o.flavor
            ids = await self._tokenize(parsed, len(raw))
            max_tokens = check_length(len(ids), parsed.max_tokens, o.max_model_len)
            capacity = (o.pool_blocks - 1) * o.page_size
            if len(ids) > capacity:
                # vLLM refuses to start when max_model_len exceeds the KV cache; the sim allows
                # the mismatch (small pools for eviction tests) and rejects the one request.
                raise ApiError(400, f"The prompt has {len(ids)} tokens, more than the KV cache holds "
                                    f"({capacity} tokens = {o.pool_blocks - 1} blocks of {o.page_size}).",
                               "messages")
        except ApiError as exc:
            await send_json(send, exc.status, shaped(exc))
            return
        if o.crash_above_tokens is not None and len(ids) > o.crash_above_tokens:
            self.engine.dead = True
            await send_json(send, 500, shaped(ApiError(500, "EngineCore encountered an issue. See stack trace "
                                                             "(above) for the root cause.")))
            return
        # SGLang namespaces its radix tree by (extra_key, cache_salt); vLLM has no extra_key
        extra_key = parsed.extra_key if o.flavor == "sglang" and isinstance(parsed.extra_key, str) \
            and parsed.extra_key else None
        req = SimRequest(ids, max_tokens, min_tokens=parsed.min_tokens, ignore_eos=parsed.ignore_eos,
                         cache_salt=parsed.cache_salt, extra_key=extra_key, streaming=parsed.stream, arrival=arrival,
                         skip_prefix_cache=parsed.skip_prefix_cache, output_offset=self._continued(parsed))
        if len(raw) > THREAD_THRESHOLD_BYTES:
            await asyncio.to_thread(self.engine.prepare, req)
        else:
            self.engine.prepare(req)
        self.engine.add(req)
        die_after = fault.after_chunks if fault is not None and fault.mode == "die_midstream" else None
        if fault is not None and fault.mode == "stall_midstream":
            send = _stalling(send, fault.after_chunks, fault.delay_s)
        watcher = asyncio.get_running_loop().create_task(self._watch(receive, req))
        try:
            if kind == "responses":
                writer = ResponsesWriter(o.model, body)
                cached_on = o.enable_prompt_tokens_details
                if parsed.stream:
                    final = await responses_api.stream(writer, req, send, receive, die_after, cached_on,
                                                       o.deltas_per_chunk, self.engine.abort)
                else:
                    final = await responses_api.respond(writer, req, send, receive, die_after, cached_on)
                if final is not None:
                    self.responses_store.keep(body, final, messages)
                return
            if kind == "messages":
                writer = anthropic.stream if parsed.stream else anthropic.respond
                await writer(self.engine, req, parsed.model, send, receive, die_after)
                return
            shaper = Shaper(kind, o.model, o.flavor)
            if parsed.stream:
                await responder.stream(self.engine, parsed, req, shaper, send, receive, die_after)
            else:
                await responder.respond(self.engine, req, shaper, send, receive, die_after)
        finally:
            watcher.cancel()
            if not req.finished:
                self.engine.abort(req)

    async def _watch(self, receive: Receive, req: SimRequest) -> None:
        """Abort the engine request when the client goes away (frees its blocks and budget)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.engine.abort(req)
                return


def _sglang_tool_choice(tools: list[Any] | None, body: dict[str, Any]) -> list[Any] | None:
    """SGLang renders no tools for `tool_choice: "none"`, and only the named one for a named choice
    (vLLM keeps every tool in the prompt)."""
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        return [t for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
                and t["function"].get("name") == name] or None
    return tools


def build_app(options: SimOptions | None = None, **kwargs: Any) -> SimApp:
    """A replica app from options (or keyword options with the CLI flag names)."""
    return SimApp(options or SimOptions.from_kwargs(**kwargs))


__all__ = ["SimApp", "build_app"]


def _stalling(send: Send, after_events: int, delay_s: float) -> Send:
    """`send` that pauses `delay_s` before the body chunk after the first `after_events` ones
    (the stall_midstream fault: the replica goes silent mid-stream)."""
    sent = 0

    async def wrapped(message: Any) -> None:
        nonlocal sent
        if message.get("type") == "http.response.body" and message.get("body"):
            if sent == after_events:
                await asyncio.sleep(delay_s)
            sent += 1
        await send(message)
    return wrapped
