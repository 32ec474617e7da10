"""Fuzzing what an endpoint answers `prefixgate check`: a vLLM-shaped engine on loopback whose
answers are bent, one endpoint at a time, and the real command run against it.

The engine answers as vLLM 0.32 does (its `/metrics` and `/tokenize` as recorded in
tests/fixtures/real_vllm, the prefix-cache counters counting what it served; `/v1/models` with
`max_model_len`; a chat stream of role, text, finish and usage chunks whose `prompt_tokens` and
`cached_tokens` follow the document it was sent, a prefix cache of 16-token blocks), so an
unbent run measures a working cache. Each case bends one
or two of `/v1/models`, `/metrics`, `/tokenize`, `/health` and the chat stream, on every answer
or on one, with tests/bend.py (values replaced by any JSON value: negatives, 2**64, NaN, strings,
objects; keys dropped; garbage bodies; events dropped, repeated, moved, cut) or another status.

What must hold, per case: `prefixgate check URL --json` returns within the timeout, prints one
strict JSON object (no NaN) and exits with a documented status; the table renders; and no probe
document is larger than the sizes the check asks for allow (a count that is no count must not
make it send megabytes). `PREFIXGATE_DOCTOR_FUZZ_CASES` (default 40; 1,500 pass), seeded: a failure
reproduces by its case number.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bend import GARBAGE, bend_json, bend_stream
from rich.console import Console

from app.doctor.check import CheckOptions, run_check
from app.doctor.report import render, to_json
from app.doctor.verdict import EXIT_HEALTHY, EXIT_NOT_MEASURED, EXIT_PROBLEMS

CASES = int(os.environ.get("PREFIXGATE_DOCTOR_FUZZ_CASES", "40"))
TIMEOUT_S = 20.0
FIXTURES = Path(__file__).parent / "fixtures" / "real_vllm"
METRICS = (FIXTURES / "metrics_idle.txt").read_text()
TOKENIZE = json.loads((FIXTURES / "tokenize_chat.json").read_bytes())
PROMPT_TOKENS = 300
MAX_MODEL_LEN = 4096
# a 4,096-token document is ~20 KB of words; the ladder's first rung past the engine's limit (a
# doubling) is the largest the check may send
MAX_BODY_BYTES = 128 * 1024
ENDPOINTS = ("/v1/models", "/metrics", "/tokenize", "/health", "/v1/chat/completions")


def _tokens(body: dict[str, Any]) -> int:
    """The prompt's tokens as this engine counts them: ~1.3 a word plus the template's 6."""
    messages = body.get("messages") or []
    words = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
    return int(words * 1.3) + 6


class Engine:
    """vLLM's answers, bent as the case says; remembers the largest request body."""

    def __init__(self, case: int) -> None:
        self.r = random.Random(case)
        self.bends = {path: self.r.choice(["every", "one"]) for path in self.r.sample(ENDPOINTS, self.r.randint(1, 2))}
        self.bent_one: set[str] = set()
        self.seen: set[str] = set()  # documents prefilled before (the prefix cache)
        self.largest = 0
        self.queries = self.hits = 0  # vllm:prefix_cache_{queries,hits}_total
        self.prefill_per_token = 50e-6  # seconds a token not cached takes (TTFT follows them)
        self.lock = threading.Lock()

    def answer(self, path: str, raw: bytes) -> tuple[int, str, bytes, float]:
        """(status, content type, body, prefill seconds: `prefill_per_token` a token not cached)."""
        with self.lock:
            self.largest = max(self.largest, len(raw))
            queried, hit = self.queries, self.hits
            status, ctype, body = self._plain(path, raw)
            prefill_s = self.prefill_per_token * ((self.queries - queried) - (self.hits - hit))
            how = self.bends.get(path)
            if how == "every" or (how == "one" and path not in self.bent_one and self.r.random() < 0.5):
                self.bent_one.add(path)
                status, ctype, body = self._bend(status, ctype, body)
            return status, ctype, body, prefill_s

    def _plain(self, path: str, raw: bytes) -> tuple[int, str, bytes]:
        if path == "/v1/models":
            return 200, "application/json", json.dumps({"object": "list", "data": [
                {"id": "tiny", "object": "model", "owned_by": "vllm", "root": "tiny", "max_model_len": MAX_MODEL_LEN}]}).encode()
        if path == "/metrics":
            text = re.sub(r'^(vllm:prefix_cache_queries_total\{[^}]*\}) .*$', rf"\g<1> {float(self.queries)}", METRICS,
                          flags=re.M)
            text = re.sub(r'^(vllm:prefix_cache_hits_total\{[^}]*\}) .*$', rf"\g<1> {float(self.hits)}", text, flags=re.M)
            return 200, "text/plain; version=0.0.4", text.encode()
        if path == "/health":
            return 200, "application/json", b""
        body = json.loads(raw or b"{}")
        if path == "/tokenize":
            n = _tokens(body)
            return 200, "application/json", json.dumps({**TOKENIZE, "count": n, "tokens": list(range(n))}).encode()
        if path == "/v1/chat/completions":
            n = _tokens(body)
            if n > MAX_MODEL_LEN:  # its real limit, whatever a bent /v1/models said
                return 400, "application/json", json.dumps({"error": {
                    "message": f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your request "
                               f"has {n} input tokens.", "type": "BadRequestError", "param": None, "code": 400}}).encode()
            return 200, "text/event-stream", self._stream(body)
        return 404, "application/json", b'{"detail":"Not Found"}'

    def _stream(self, body: dict[str, Any]) -> bytes:
        n = _tokens(body)
        text = json.dumps(body.get("messages"))
        cached = n // 16 * 16 if text in self.seen else 0
        self.seen.add(text)
        self.queries, self.hits = self.queries + n, self.hits + cached
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "tiny"}
        out = [dict(chunk, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
        want = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else 8
        out += [dict(chunk, choices=[{"index": 0, "delta": {"content": " x"}, "finish_reason": None}])
                for _ in range(max(1, min(want, 64)))]
        out.append(dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}]))
        out.append(dict(chunk, choices=[], usage={"prompt_tokens": n, "completion_tokens": want,
                                                  "total_tokens": n + want,
                                                  "prompt_tokens_details": {"cached_tokens": cached}}))
        return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in out) + b"data: [DONE]\n\n"

    def _bend(self, status: int, ctype: str, body: bytes) -> tuple[int, str, bytes]:
        r = self.r
        how = r.random()
        if how < 0.1:
            return r.choice([400, 404, 500, 503]), ctype, body
        if how < 0.2:
            return status, ctype, r.choice(GARBAGE)
        if ctype == "text/event-stream":
            return status, ctype, bend_stream(body, r)[0]
        if ctype.startswith("text/plain"):  # an exposition: a sample's value or a line bent
            lines = body.split(b"\n")
            i = r.randrange(len(lines))
            name = lines[i].rpartition(b" ")[0] or lines[i]
            lines[i] = name + b" " + r.choice([b"NaN", b"+Inf", b"-1", b"1e308", b"x", b""])
            return status, ctype, b"\n".join(lines)
        if not body:
            return status, ctype, r.choice(GARBAGE)
        return status, ctype, bend_json(body, r)[0]


def _serve(engine_for: dict[str, Engine]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            engine = engine_for["now"]
            status, ctype, body, prefill_s = engine.answer(self.path, raw)
            time.sleep(prefill_s)  # outside the engine's lock: TTFT follows the uncached tokens
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_check_reads_bent_answers_of_an_endpoint() -> None:
    engine_for: dict[str, Engine] = {}
    server = _serve(engine_for)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    exits: dict[int, int] = {}
    try:
        for case in range(CASES):
            engine_for["now"] = engine = Engine(case)
            r = random.Random(-case)
            opts = CheckOptions(url=url, prompt_tokens=PROMPT_TOKENS, repeats=2, warmups=1, measurements=2,
                                short_tokens=4, long_tokens=12, ladder=r.random() < 0.3, ladder_max_tokens=None,
                                timeout_s=5.0)
            try:
                result = asyncio.run(asyncio.wait_for(run_check(opts), TIMEOUT_S))
            except Exception as exc:
                raise AssertionError(f"case {case} (bends {engine.bends}): {type(exc).__name__}: {exc}") from exc
            out = json.dumps(to_json(result), allow_nan=False)  # strict JSON, as --json prints it
            assert json.loads(out)["url"], f"case {case}"
            render(result, Console(file=io.StringIO(), width=120))
            assert result.exit_code in (EXIT_HEALTHY, EXIT_PROBLEMS, EXIT_NOT_MEASURED), f"case {case}"
            assert engine.largest <= MAX_BODY_BYTES, f"case {case} (bends {engine.bends}): sent {engine.largest} bytes"
            exits[result.exit_code] = exits.get(result.exit_code, 0) + 1
    finally:
        server.shutdown()
    print(f"{CASES} cases, exit codes {dict(sorted(exits.items()))}")
    assert exits.get(EXIT_HEALTHY), "no case measured a healthy cache: the unbent engine is not vLLM-shaped enough"


def test_an_unbent_engine_is_measured_healthy() -> None:
    """The oracle of the fuzz: with nothing bent, the check measures a working cache. A cold call
    prefills 1 ms a token (0.3 s) here, so the step stands out of a busy machine's jitter (at 50
    us a token, 15 ms, a warm call slowed by `make test`'s other workers read as "unclear")."""
    engine_for: dict[str, Engine] = {}
    server = _serve(engine_for)
    try:
        engine = Engine(0)
        engine.bends = {}
        engine.prefill_per_token = 1e-3
        engine_for["now"] = engine
        opts = CheckOptions(url=f"http://127.0.0.1:{server.server_address[1]}", prompt_tokens=PROMPT_TOKENS,
                            repeats=2, warmups=1, measurements=2, short_tokens=4, long_tokens=12, timeout_s=5.0)
        result = asyncio.run(run_check(opts))
    finally:
        server.shutdown()
    assert result.measured and result.exit_code == EXIT_HEALTHY, (result.refused, result.problems)
    assert result.cached_tokens[0] == 0 and result.cached_tokens[1] > 0


def test_the_ladder_never_climbs_past_its_cap_on_a_claimed_context() -> None:
    """A `max_model_len` of 10**30 from an endpoint that accepts anything: the ladder stops at
    LADDER_NO_LIMIT_CAP (it would have built documents without end); --max-tokens-ladder still wins."""
    from app.doctor.check import LADDER_NO_LIMIT_CAP, ladder_cap

    opts = CheckOptions(url="http://e")
    assert ladder_cap(opts, 10**30) == LADDER_NO_LIMIT_CAP == ladder_cap(opts, None)
    assert ladder_cap(opts, 4096) < 4096
    assert ladder_cap(CheckOptions(url="http://e", ladder_max_tokens=4 << 20), 10**30) == 4 << 20
