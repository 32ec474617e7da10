"""A tiny raw-socket HTTP/1.1 upstream with scripted, timestamped chunked responses.

Only for byte-level tests that need exact control (when each chunk is written, TCP framing,
dying mid-chunk); everything else uses the simulator (app.sim.testing.SimCluster).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson


@dataclass
class FakeResponse:
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "text/event-stream"})
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (delay before, bytes)
    die_after: int | None = None  # close the socket after this many chunks, mid-response
    drop: bool = False  # close the connection without sending any response at all


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Script = Callable[[SeenRequest], FakeResponse]


def sse(obj: object) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


class FakeUpstream:
    def __init__(self, script: Script, model: str = "fake", health_delay_s: float = 0.0,
                 models_delay_s: float = 0.0, models_body: bytes | None = None) -> None:
        self.script = script
        self.model = model
        self.health_delay_s = health_delay_s  # /health answers this late (a busy engine's probe)
        self.models_delay_s = models_delay_s  # /v1/models answers this late
        self.models_body = models_body  # /v1/models answers these bytes (default: a list of `model`)
        self.requests: list[SeenRequest] = []
        self.sent: list[tuple[bytes, float]] = []  # (chunk, perf_counter right after sendall)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (pooled keep-alive ones included)."""
        self._closed = True
        for sock in [self._sock, *list(self._conns)]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()/recv()
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                if not self._respond(conn, SeenRequest(method, path, headers, body)):
                    return
        except OSError:
            return
        finally:
            self._conns.discard(conn)
            conn.close()

    def _respond(self, conn: socket.socket, req: SeenRequest) -> bool:
        if req.path == "/health":
            if self.health_delay_s:
                time.sleep(self.health_delay_s)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return True
        if req.path == "/v1/models":
            if self.models_delay_s:
                time.sleep(self.models_delay_s)
            body = self.models_body or orjson.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]})
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            return True
        if req.path == "/metrics":
            conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return True
        self.requests.append(req)
        resp = self.script(req)
        if resp.drop:
            conn.shutdown(socket.SHUT_RDWR)
            return False
        head = f"HTTP/1.1 {resp.status} X\r\ntransfer-encoding: chunked\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items())
        conn.sendall(head.encode() + b"\r\n")
        for i, (delay, chunk) in enumerate(resp.chunks):
            if resp.die_after is not None and i >= resp.die_after:
                conn.shutdown(socket.SHUT_RDWR)
                return False
            if delay:
                time.sleep(delay)
            conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.sent.append((chunk, time.perf_counter()))
        if resp.die_after is not None:
            conn.shutdown(socket.SHUT_RDWR)
            return False
        conn.sendall(b"0\r\n\r\n")
        return True
