"""The fault matrix (docs/relay.md, "Faults and what the client gets"): every upstream fault x
{stream, non-stream} x {chat, completions}, through the real proxy over loopback HTTP, against
scripted upstreams (tests/fake_upstream.py) replaying recorded vLLM answers. Before the first
byte a fault is retried on another replica; after it, a stream ends with its whole events, one
error event and `[DONE]`, and a non-streamed answer is a 502. Run with `-s` to print the matrix.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from fake_upstream import FakeResponse, SeenRequest
from openai._streaming import SSEDecoder

from app.proxy.sse import SSEParser

FIXTURES = Path(__file__).parent / "fixtures" / "real_vllm"
STALL_S = 3.0  # a stall: far past both timeouts below
# limits.first_byte_timeout_s and limits.read_timeout_s: the replica a stalled request is retried on
# must answer within it too, and at 0.5 s a busy test machine (4 workers on 2 cores) sometimes did not
TIMEOUT_S = 1.0
TRICKLE = (16, 0.002)  # slow trickle: 16-byte writes, 2 ms apart (well inside the read timeout)

COMPLETIONS_JSON = orjson.dumps({
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "fake",
    "choices": [{"index": 0, "text": " ident overridden", "logprobs": None, "finish_reason": "length",
                 "stop_reason": None}],
    "usage": {"prompt_tokens": 1793, "total_tokens": 1801, "completion_tokens": 8,
              "prompt_tokens_details": {"cached_tokens": 0}}})
ANSWERS = {  # (route, stream) -> the upstream's recorded answer
    ("chat", True): (FIXTURES / "chat_stream_cold.sse").read_bytes(),
    ("completions", True): (FIXTURES / "completions_stream.sse").read_bytes(),
    ("chat", False): (FIXTURES / "chat_nonstream.json").read_bytes().strip(),
    ("completions", False): COMPLETIONS_JSON,
}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def raw_events(stream: bytes) -> list[bytes]:
    return [ev.raw for ev in SSEParser(emit_all=True).feed(stream)]


def cut_points(stream: bytes) -> dict[str, int]:
    """Byte offsets to die at: event boundaries and inside events (of the recorded stream)."""
    ends, pos = [], 0
    for raw in raw_events(stream):
        pos += len(raw)
        ends.append(pos)
    return {"after the role/first event": ends[0], "inside event 2": ends[0] + 40,
            "after the last token event": ends[-3], "inside the usage event": ends[-3] + 17,
            "inside [DONE]": ends[-1] - 3, "after [DONE]": ends[-1]}


def chunked(answer: bytes, stream: bool, k: int | None = None) -> list[tuple[float, bytes]]:
    """One HTTP chunk per event (as vLLM writes them) or the JSON whole; cut after k bytes."""
    pieces = raw_events(answer) if stream else [answer]
    out, pos = [], 0
    for piece in pieces:
        if k is not None and pos >= k:
            break
        out.append((0.0, piece if k is None else piece[:k - pos]))
        pos += len(piece)
    return out


@dataclass
class Cell:
    fault: str
    detail: str
    stream: bool
    route: str

    @property
    def id(self) -> str:
        return f"{self.fault}|{self.detail}|{self.stream}|{self.route}"

    def response(self) -> FakeResponse:
        answer = ANSWERS[(self.route, self.stream)]
        ctype = {"content-type": "text/event-stream" if self.stream else "application/json"}
        f = self.fault
        if f == "5xx":
            body = orjson.dumps({"error": {"message": "engine overloaded", "type": "ServiceUnavailable"}})
            return FakeResponse(status=503, headers={"content-type": "application/json"}, chunks=[(0, body)])
        if f == "drop":
            return FakeResponse(drop=True) if self.detail == "no response" else FakeResponse(headers=ctype, die_after=0)
        if f == "stall":
            chunks = chunked(answer, self.stream)
            if self.detail == "before first byte":
                return FakeResponse(headers=ctype, chunks=[(STALL_S, chunks[0][1])] + chunks[1:])
            if self.stream:  # two events, then silence
                return FakeResponse(headers=ctype, chunks=chunks[:2] + [(STALL_S, chunks[2][1])] + chunks[3:])
            half = len(answer) // 2
            return FakeResponse(headers=ctype, chunks=[(0, answer[:half]), (STALL_S, answer[half:])])
        if f == "trickle":
            size, gap = TRICKLE
            return FakeResponse(headers=ctype, chunks=[(gap, answer[i:i + size]) for i in range(0, len(answer), size)])
        if f == "die":
            k = cut_points(answer)[self.detail] if self.stream else len(answer) // 2
            return FakeResponse(headers=ctype, chunks=chunked(answer, self.stream, k), die_after=10**6)
        raise AssertionError(f)

    def expected(self) -> str:
        if self.fault in ("refuse", "5xx", "drop") or self.detail == "before first byte":
            return "retried on the other replica -> 200, the whole answer"
        if self.fault == "trickle" or self.detail == "after [DONE]":
            return "200, the whole answer"
        code = "upstream_timeout" if self.fault == "stall" else ("upstream_midstream" if self.stream
                                                                else "upstream_disconnect")
        if not self.stream:
            return f"502 {code}"
        return f"200, the whole events before the fault + error {code} + [DONE]"


def cells() -> list[Cell]:
    out = []
    for route in ("chat", "completions"):
        for stream in (True, False):
            faults = [("refuse", "connection refused"), ("5xx", "503 before any byte"), ("drop", "no response"),
                      ("drop", "headers, then closed"), ("stall", "before first byte"),
                      ("stall", "mid-response (read timeout)"), ("trickle", f"{TRICKLE[0]} B / {TRICKLE[1] * 1e3:g} ms")]
            if stream:
                faults += [("die", name) for name in cut_points(ANSWERS[(route, True)])]
            else:
                faults.append(("die", "inside the JSON body"))
            out += [Cell(f, d, stream, route) for f, d in faults]
    return out


class Upstreams:
    """Two scripted replicas sharing one script: the first request of each cell suffers the
    cell's fault on whichever replica it lands; any later one (a retry) gets the normal answer."""

    def __init__(self, factory) -> None:
        self.faulted: dict[str, str] = {}
        self.lock = threading.Lock()
        self.servers = [factory(self.script_for(name)) for name in ("up-a", "up-b")]

    def script_for(self, name: str):
        def script(req: SeenRequest) -> FakeResponse:
            cell = req.headers["x-cell"]
            spec = cell.split("|")
            c = Cell(spec[0], spec[1], spec[2] == "True", spec[3])
            with self.lock:
                first = cell not in self.faulted and c.fault != "refuse"
                if first:
                    self.faulted[cell] = name
            if first:
                return c.response()
            answer = ANSWERS[(c.route, c.stream)]
            ctype = "text/event-stream" if c.stream else "application/json"
            return FakeResponse(headers={"content-type": ctype}, chunks=chunked(answer, c.stream))
        return script


def decode(chunks: list[bytes]) -> list[str]:
    return [sse.data for sse in SSEDecoder().iter_bytes(iter(chunks))]


def client_view(answer: bytes, k: int | None) -> list[str]:
    """What the client must decode from the first k bytes of the answer: its whole events, minus
    the usage chunk the proxy asked for on the client's behalf."""
    whole = b"".join(raw_events(answer if k is None else answer[:k]))
    return [d for d in decode([whole]) if '"choices":[]' not in d]


def run_cell(client: httpx.Client, proxy, cell: Cell, failed_backend) -> str:
    """Send the cell's request; return the outcome in the matrix's words (or a mismatch)."""
    body = {"model": "fake", "stream": cell.stream, "max_tokens": 8}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if cell.route == "chat" else {"prompt": "hi"})
    with client.stream("POST", proxy.url + PATHS[cell.route], json=body, headers={"x-cell": cell.id}) as resp:
        chunks = list(resp.iter_raw())
    answer = ANSWERS[(cell.route, cell.stream)]
    backend = resp.headers.get("x-prefixgate-backend")
    blob = b"".join(chunks)
    if resp.status_code != 200:
        err = orjson.loads(blob)["error"]
        return f"{resp.status_code} {err['code']}"
    retried = proxy.services.replicas.get(backend) is not None and backend != failed_backend(cell)
    if not cell.stream:
        if orjson.loads(blob) != orjson.loads(answer):
            return "200 with a different body"
        return ("retried on the other replica -> 200, the whole answer" if retried and failed_backend(cell)
                else "200, the whole answer")
    got = decode(chunks)
    for data in got[:-1]:
        try:
            orjson.loads(data)  # every event is valid JSON
        except orjson.JSONDecodeError:
            return f"200, an event that is not JSON: {data[:60]!r}"
    if got == client_view(answer, None):
        return ("retried on the other replica -> 200, the whole answer" if retried and failed_backend(cell)
                else "200, the whole answer")
    k = cut_points(answer).get(cell.detail)
    if cell.fault == "stall":
        k = sum(len(r) for r in raw_events(answer)[:2])
    whole = client_view(answer, k)
    if got[:len(whole)] == whole and len(got) == len(whole) + 2 and got[-1] == "[DONE]":
        code = orjson.loads(got[-2])["error"]["code"]
        return f"200, the whole events before the fault + error {code} + [DONE]"
    return f"200, unexpected events: {got[len(whole):]!r}"


def test_fault_matrix(fake_upstream_factory, proxy_factory) -> None:
    ups = Upstreams(fake_upstream_factory)
    limits = {"first_byte_timeout_s": TIMEOUT_S, "read_timeout_s": TIMEOUT_S}
    routing = {"policy": "round_robin", "health_interval_s": 3600, "max_retries": 1}
    proxy = proxy_factory([s.url for s in ups.servers], names=["up-a", "up-b"], limits=limits, routing=routing)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    refusing = proxy_factory([dead, ups.servers[0].url], names=["dead", "up-a"], limits=limits, routing=routing)
    rows: list[tuple[Cell, str, str]] = []
    with httpx.Client(timeout=30) as client:
        for cell in cells():
            if cell.fault == "refuse":
                rows.append((cell, cell.expected(), refuse_cell(client, refusing, cell)))
                continue
            for replica in proxy.services.replicas.all():
                replica.healthy = True  # passive marking took the faulted one out: put it back
            rows.append((cell, cell.expected(), run_cell(client, proxy, cell, lambda c: ups.faulted.get(c.id))))
    width = max(len(f"{c.route} {'stream' if c.stream else 'non-stream'} {c.fault}: {c.detail}") for c, _, _ in rows)
    print("\nfault matrix (route, mode, fault -> client outcome)")
    for cell, want, got in rows:
        name = f"{cell.route} {'stream' if cell.stream else 'non-stream'} {cell.fault}: {cell.detail}"
        print(f"{name:<{width}}  ->  {got}{'' if got == want else f'   [EXPECTED: {want}]'}")
    bad = [(c.id, want, got) for c, want, got in rows if got != want]
    assert not bad, bad


def refuse_cell(client: httpx.Client, proxy, cell: Cell) -> str:
    """The refusing replica must be tried first: requests are repeated (the policy picks) until
    one was, each of them answered by the live replica. The dead replica is made to look as the
    gateway last knew it before it died: healthy and serving the live one's models."""
    dead = proxy.services.replicas.get("dead")
    live = proxy.services.replicas.get("up-a")
    before = proxy.sample("prefixgate_upstream_errors_total", backend="dead", kind="connect") or 0
    for _ in range(4):
        dead.healthy, dead.models = True, live.models
        got = run_cell(client, proxy, cell, lambda c: None)
        if got != "200, the whole answer":
            return got
        if (proxy.sample("prefixgate_upstream_errors_total", backend="dead", kind="connect") or 0) > before:
            return "retried on the other replica -> 200, the whole answer"
        time.sleep(0)
    return "the refusing replica was never tried"
