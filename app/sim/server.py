"""One simulated replica's HTTP surface: a raw ASGI app (no framework on the streaming path).

The proxy benchmarks run 128 concurrent streams against simulators on 2 shared cores, so the
per-event cost matters: events are pre-shaped bytes, one ASGI body message each (vLLM sends each
SSE event as its own HTTP chunk). Faults that must cut the TCP connection (drop, die mid-stream)
reach the transport through uvicorn's request cycle (`send.__self__.transport`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from app.prefix.template import TemplateError
from app.sim.engine import SimEngine
from app.sim.faults import Fault, FaultPlan, parse_fault
from app.sim.kv_events import KVEventPublisher
from app.sim.options import SimOptions
from app.sim.protocol import (
    ApiError,
    ParsedRequest,
    check_length,
    load_json,
    parse_chat,
    parse_completion,
)
from app.sim.request import SimRequest
from app.sim.shapes import DONE, Shaper
from app.sim.tokens import SimTokenizer, load_tokenizer

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

THREAD_THRESHOLD_BYTES = 32 * 1024  # bodies above this are tokenised and hashed in a worker thread
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
JSON_HEADERS = [(b"content-type", b"application/json")]
VERSION = "0.33.0+prefixgate.sim"


class _ClientGone(Exception):
    pass


class _Die(Exception):
    pass


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _send_bytes(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, obj: Any) -> None:
    await _send_bytes(send, status, obj if isinstance(obj, bytes) else orjson.dumps(obj), JSON_HEADERS)


async def _cut_connection(send: Send, receive: Receive) -> None:
    """Abort the TCP connection (RST, no response bytes) and wait until uvicorn has noticed, so
    it does not try to answer with a 500 of its own."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise RuntimeError("simulated connection drop")  # uvicorn closes the connection itself
    transport.abort()
    try:
        await asyncio.wait_for(receive(), 2.0)
    except Exception:  # noqa: BLE001 - a timeout or any error: the connection is gone
        pass


class SimApp:
    """ASGI app of one replica. `engine` is exposed for white-box assertions."""

    def __init__(self, options: SimOptions, tokenizer: SimTokenizer | None = None) -> None:
        self.options = options
        self.tokenizer = tokenizer or load_tokenizer(options.tokenizer)
        self.publisher: KVEventPublisher | None = None
        if options.kv_events and options.prefix_caching:
            endpoint = options.kv_events if isinstance(options.kv_events, str) else "tcp://127.0.0.1:0"
            self.publisher = KVEventPublisher(endpoint, options.flavor, options.page_size,
                                              options.kv_events_topic)
        self.engine = SimEngine(options, self.tokenizer,
                                event_sink=self.publisher.publish if self.publisher else None)
        self.faults = FaultPlan()
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
            ("POST", "/sim/faults"): self.set_faults, ("GET", "/sim/faults"): self.get_faults,
            ("GET", "/sim/state"): self.state, ("GET", "/kv_event_sources"): self.kv_event_sources,
        }

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        self.engine.start()
        handler = self.routes.get((scope["method"], scope["path"]))
        if handler is None:
            known = any(path == scope["path"] for _, path in self.routes)
            status = 405 if known else 404
            await _send_json(send, status, ApiError(status, "Method Not Allowed" if known else "Not Found",
                                                    kind="NotFoundError").body())
            return
        try:
            await handler(scope, receive, send)
        except _ClientGone:
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
            await _send_json(send, 500, ApiError(500, "EngineCore encountered an issue.").body())
        else:
            await _send_bytes(send, 200, b"", [])

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        o = self.options
        await _send_json(send, 200, {"object": "list", "data": [{
            "id": o.model, "object": "model", "created": int(time.time()),
            "owned_by": "sglang" if o.flavor == "sglang" else "vllm", "root": o.model, "parent": None,
            "max_model_len": o.max_model_len}]})

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, content_type = self.engine.metrics.render()
        await _send_bytes(send, 200, body, [(b"content-type", content_type.encode())])

    async def version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, {"version": VERSION})

    async def server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        o = self.options
        await _send_json(send, 200, {"model_path": o.model, "page_size": o.page_size,
                                     "max_total_num_tokens": o.pool_blocks * o.page_size,
                                     "disable_radix_cache": not o.prefix_caching, "version": VERSION})

    async def kv_event_sources(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.kv_events_endpoint
        await _send_json(send, 200, {"sources": [{"data_parallel_rank": 0, "endpoint": endpoint,
                                                  "topic": self.options.kv_events_topic,
                                                  "replay_endpoint": None}] if endpoint else []})

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await _read_body(receive)
        try:
            body = load_json(raw)
            if "messages" in body:
                parsed = parse_chat({**body, "model": self.options.model}, self.options.model)
            else:
                parsed = parse_completion({**body, "model": self.options.model}, self.options.model)
            ids = await self._tokenize(parsed, len(raw))
        except ApiError as exc:
            await _send_json(send, exc.status, exc.body())
            return
        await _send_json(send, 200, {"count": len(ids), "max_model_len": self.options.max_model_len,
                                     "tokens": ids, "token_strs": None})

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = load_json(await _read_body(receive))
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ApiError(400, "tokens must be a list of token ids", "tokens")
        except ApiError as exc:
            await _send_json(send, exc.status, exc.body())
            return
        await _send_json(send, 200, {"prompt": self.tokenizer.decode(tokens)})

    async def reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok = self.engine.reset_prefix_cache()
        await _send_json(send, 200, {"success": ok})

    async def set_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            fault = parse_fault(load_json(await _read_body(receive)))
        except (ApiError, ValueError) as exc:
            await _send_json(send, 400, ApiError(400, str(exc)).body())
            return
        if fault.mode == "clear":
            self.faults.clear()
            self.engine.slow_factor = 1.0
            self.engine.dead = False
        elif fault.mode == "slow":
            self.engine.slow_factor = fault.factor
        else:
            self.faults.add(fault)
        await _send_json(send, 200, {"ok": True, "pending": self.faults.describe(),
                                     "slow_factor": self.engine.slow_factor})

    async def get_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, {"pending": self.faults.describe(), "slow_factor": self.engine.slow_factor,
                                     "dead": self.engine.dead})

    async def state(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, {**self.engine.state(), "kv_events_endpoint": self.kv_events_endpoint,
                                     "faults": self.faults.describe()})

    # ------------------------------------------------------------------ generation
    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate("chat", receive, send)

    async def completion(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate("completion", receive, send)

    def _tokenize_sync(self, parsed: ParsedRequest) -> list[int]:
        if parsed.prompt_ids is not None:
            return parsed.prompt_ids
        if parsed.kind == "chat":
            text = self.tokenizer.render_chat(parsed.messages, parsed.tools, parsed.add_generation_prompt,
                                              **parsed.template_kwargs)
        else:
            text = parsed.prompt_text or ""
        return self.tokenizer.encode(text, parsed.add_special_tokens)

    async def _tokenize(self, parsed: ParsedRequest, raw_len: int) -> list[int]:
        try:
            if raw_len > THREAD_THRESHOLD_BYTES:
                return await asyncio.to_thread(self._tokenize_sync, parsed)
            return self._tokenize_sync(parsed)
        except TemplateError as exc:
            raise ApiError(400, str(exc)) from exc

    async def _generate(self, kind: str, receive: Receive, send: Send) -> None:
        arrival = time.monotonic()
        raw = await _read_body(receive)
        fault = self.faults.take()
        if self.engine.dead:
            await _send_json(send, 500, ApiError(500, "EngineCore encountered an issue.").body())
            return
        if fault is not None:
            if fault.mode == "error":
                await _send_json(send, fault.status, ApiError(fault.status, "Simulated engine failure.").body())
                return
            if fault.mode == "drop":
                await _cut_connection(send, receive)
                return
            if fault.mode == "stall":
                await asyncio.sleep(fault.delay_s)
        o = self.options
        try:
            body = load_json(raw)
            parsed = parse_chat(body, o.model) if kind == "chat" else parse_completion(body, o.model)
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
            await _send_json(send, exc.status, exc.body())
            return
        if o.crash_above_tokens is not None and len(ids) > o.crash_above_tokens:
            self.engine.dead = True
            await _send_json(send, 500, ApiError(500, "EngineCore encountered an issue. See stack trace "
                                                      "(above) for the root cause.").body())
            return
        req = SimRequest(ids, max_tokens, min_tokens=parsed.min_tokens, ignore_eos=parsed.ignore_eos,
                         cache_salt=parsed.cache_salt, streaming=parsed.stream, arrival=arrival)
        if len(raw) > THREAD_THRESHOLD_BYTES:
            await asyncio.to_thread(self.engine.prepare, req)
        else:
            self.engine.prepare(req)
        self.engine.add(req)
        die_after = fault.after_chunks if fault is not None and fault.mode == "die_midstream" else None
        watcher = asyncio.get_running_loop().create_task(self._watch(receive, req))
        try:
            shaper = Shaper(kind, o.model, o.flavor)
            if parsed.stream:
                await self._stream(parsed, req, shaper, send, receive, die_after)
            else:
                await self._respond(req, shaper, send, receive, die_after)
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

    def _usage(self, req: SimRequest, shaper: Shaper, final_response: bool = False) -> dict[str, Any]:
        cached = max(req.num_cached_tokens, 0) if self.options.enable_prompt_tokens_details else None
        return shaper.usage(req.num_prompt_tokens, len(req.output_ids), cached, req.created_cache_tokens,
                            final_response)

    async def _respond(self, req: SimRequest, shaper: Shaper, send: Send, receive: Receive,
                       die_after: int | None) -> None:
        while not req.finished:
            await req.event.wait()
            req.event.clear()
        if req.finish_reason == "abort":
            return
        if req.finish_reason == "error":
            await _send_json(send, 500, ApiError(500, req.error or "engine error").body())
            return
        if die_after is not None:
            await _cut_connection(send, receive)
            return
        r = self.options.reasoning_tokens
        reasoning = "".join(req.output_text[:r]) if r and req.output_text else None
        content = "".join(req.output_text[r:])
        await _send_json(send, 200, shaper.full_response(content, reasoning, req.finish_reason or "stop",
                                                         self._usage(req, shaper, True)))

    async def _stream(self, parsed: ParsedRequest, req: SimRequest, shaper: Shaper, send: Send,
                      receive: Receive, die_after: int | None) -> None:
        o = self.options
        chat = parsed.kind == "chat"
        usage_on = parsed.include_usage or o.include_usage_always
        continuous = parsed.continuous_usage
        k = o.deltas_per_chunk
        r = o.reasoning_tokens
        sent_events = 0

        async def emit(data: bytes) -> None:
            nonlocal sent_events
            if die_after is not None and sent_events >= die_after:
                raise _Die
            await send({"type": "http.response.body", "body": data, "more_body": True})
            sent_events += 1

        def running_usage(upto: int) -> dict[str, Any] | None:
            if not continuous:
                return None
            return shaper.usage(req.num_prompt_tokens, upto, None)

        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        try:
            role_sent = False
            if chat and o.role_chunk_early:
                await emit(shaper.role_event(running_usage(0)))
                role_sent = True
            sent = 0
            while True:
                await req.event.wait()
                req.event.clear()
                if req.finish_reason == "abort":
                    return
                if req.finish_reason == "error":
                    await emit(shaper.error_event(req.error or "engine error"))
                    break
                available = len(req.output_ids)
                finished = req.finished
                if chat and not role_sent and available:
                    await emit(shaper.role_event(running_usage(0)))
                    role_sent = True
                while available - sent >= k or (finished and sent < available):
                    end = min(sent + k, available)
                    if sent < r < end:
                        end = r  # reasoning and content never share an event
                    last = finished and end == available
                    text = "".join(req.output_text[sent:end])
                    await emit(shaper.delta_event(text, reasoning=sent < r,
                                                  finish_reason=req.finish_reason if last else None,
                                                  usage=running_usage(end)))
                    sent = end
                if finished:
                    if available == 0:
                        await emit(shaper.finish_event(req.finish_reason or "stop"))
                    break
            if usage_on:
                await emit(shaper.usage_event(self._usage(req, shaper)))
            await emit(DONE)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except _Die:
            self.engine.abort(req)
            await _cut_connection(send, receive)


def build_app(options: SimOptions | None = None, **kwargs: Any) -> SimApp:
    """A replica app from options (or keyword options with the CLI flag names)."""
    return SimApp(options or SimOptions.from_kwargs(**kwargs))


__all__ = ["SimApp", "build_app", "Fault"]
