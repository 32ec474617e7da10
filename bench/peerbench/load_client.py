#!/usr/bin/env python3
"""Closed-loop streaming load client for OpenAI-compatible /v1/chat/completions.

One process, one event loop (uvloop + httptools, raw asyncio protocol: the
client's own per-request CPU cost is kept small because it shares the cores
with the system under test).

C workers each run requests back-to-back (closed loop). Each worker keeps one
persistent HTTP/1.1 keep-alive connection per target URL. With several
--url values (the "direct" target) requests are spread round-robin across
them by a global counter, like a client-side load balancer.

Per request it records (perf_counter, seconds from just before the request
bytes are written):
  role  - first SSE event received (the {"role":"assistant"} chunk)
  ttft  - first SSE event whose choices[0].delta.content is non-empty
  e2e   - end of the HTTP response (after data: [DONE] and the last chunk)
  maxgap- largest gap between body reads after the first token (a proxy
          that holds back chunks shows up here)
and checks status 200, that [DONE] arrived and the number of SSE events.

Prompts: a pool of --pool distinct prompts of about --prompt-chars
characters (deterministic from --seed); each request takes pool[k] (k
random) plus a unique short suffix, so a prefix-cache-aware router sees
reuse but every request body is distinct.

Output: one JSON object on stdout (percentiles in ms, req/s, errors,
client CPU), optional raw samples with --raw FILE.

Example:
  python load_client.py --url http://127.0.0.1:18101 -c 16 -t 8 --warmup 1
  python load_client.py --url http://127.0.0.1:18001 --url http://127.0.0.1:18002 -c 128 -t 8
"""
import argparse
import asyncio
import json
import os
import random
import resource
import socket
import sys
import time
from urllib.parse import urlsplit

import httptools
import orjson

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

perf = time.perf_counter

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there been one all we their has would when if so no what "
         "can out other were about more will up said time could into only new some like them than "
         "these two may first then do any now my such over our most even made after also did many "
         "before must through back years where much your way well down should because each just those "
         "people how too little state good very make world still own see men work long get here between "
         "both life being under never day same another know while last might us great old year off come "
         "since against go came right used take three").split()


def make_prompt(rng: random.Random, chars: int, line_chars: int = 0) -> str:
    """`chars` characters of words on one line, or (`line_chars` > 0) a line break in place of the
    space after every ~`line_chars` characters, as a document has."""
    out = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    s = " ".join(out)[:chars]
    if line_chars <= 0:
        return s
    lines, start = [], 0
    while start < len(s):
        cut = s.find(" ", start + line_chars)
        cut = len(s) if cut < 0 else cut
        lines.append(s[start:cut])
        start = cut + 1
    return "\n".join(lines)


QUICKACK = False  # --quickack: re-arm TCP_QUICKACK on every read (diagnoses Nagle x delayed-ACK stalls)


class RespProto(asyncio.Protocol):
    """One keep-alive connection; one outstanding request at a time."""

    def __init__(self):
        self.transport = None
        self.sock = None
        self.parser = httptools.HttpResponseParser(self)
        self.fut = None
        self.lost = False

    def connection_made(self, transport):
        self.transport = transport
        if QUICKACK:
            self.sock = transport.get_extra_info("socket")
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

    def connection_lost(self, exc):
        self.lost = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("connection lost: %r" % (exc,)))

    def data_received(self, data):
        if self.sock is not None:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.fut is not None and not self.fut.done():
                self.fut.set_exception(e)
            self.transport.close()

    # request API
    def send(self, data: bytes, fut):
        self.fut = fut
        self.status = 0
        self.t_role = 0.0
        self.t_ttft = 0.0
        self.buf = b""
        self.content_seen = False
        self.events = 0
        self.tail = b""
        self.nbytes = 0
        self.t_last = 0.0
        self.max_gap = 0.0
        self.t0 = perf()
        self.transport.write(data)

    # httptools callbacks
    def on_headers_complete(self):
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes):
        now = perf()
        self.nbytes += len(body)
        self.events += (self.tail[-1:] + body).count(b"\n\n")
        self.tail = body[-16:] if len(body) >= 16 else (self.tail + body)[-16:]
        if self.content_seen:
            g = now - self.t_last
            if g > self.max_gap:
                self.max_gap = g
            self.t_last = now
            return
        if not self.t_role:
            self.t_role = now
        self.buf += body
        # parse complete events until the first non-empty content delta
        while True:
            i = self.buf.find(b"\n\n")
            if i < 0:
                return
            ev = self.buf[:i]
            self.buf = self.buf[i + 2:]
            for line in ev.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue
                try:
                    obj = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                ch = obj.get("choices") or ()
                for c in ch:
                    d = c.get("delta") or {}
                    if d.get("content") or c.get("text"):
                        self.t_ttft = now
                        self.t_last = now
                        self.content_seen = True
                        self.buf = b""
                        return

    def on_message_complete(self):
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(perf())


class Target:
    def __init__(self, url):
        u = urlsplit(url)
        self.host = u.hostname
        self.port = u.port or 80
        self.base = url.rstrip("/")
        self.hosthdr = ("%s:%d" % (self.host, self.port)).encode()


async def main_async(a):
    loop = asyncio.get_running_loop()
    targets = [Target(u) for u in a.url]
    rng = random.Random(a.seed)
    pool = [make_prompt(rng, a.prompt_chars, a.line_chars) for _ in range(a.pool)]
    # pre-serialise bodies around a placeholder so per-request cost is a concat
    mark = "\x00SUFFIX\x00"
    pre = []
    for p in pool:
        b = orjson.dumps({
            "model": a.model,
            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": p + mark}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": a.max_tokens,
            "temperature": 0.0,
        })
        m = orjson.dumps(mark)[1:-1]
        i = b.index(m)
        pre.append((b[:i], b[i + len(m):]))
    path = a.path.encode()
    extra = b"".join(h.encode("latin-1") + b"\r\n" for h in a.header)  # e.g. an API key

    def build(k, seq, tgt):
        head, tail = pre[k]
        body = head + b" [q%d]" % seq + tail
        return (b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                b"accept: text/event-stream\r\n%scontent-length: %d\r\n\r\n" % (path, tgt.hosthdr, extra, len(body))) + body

    samples = []      # (t_start, t_end, role, ttft, e2e) for requests started after warmup
    errors = {}
    counter = [0]
    t_begin = perf()
    t_warm = t_begin + a.warmup
    t_stop = t_warm + a.duration
    expected_events = None if a.expect_events <= 0 else a.expect_events
    bad_events = [0]
    ok_total = [0]

    async def worker(wid):
        conns = {}
        wrng = random.Random(a.seed * 1000 + wid)
        while True:
            now = perf()
            if now >= t_stop or (a.count and counter[0] >= a.count) or (a.sweep and counter[0] >= len(pre)):
                break
            seq = counter[0]
            counter[0] += 1
            tgt = targets[seq % len(targets)]
            conn = conns.get(tgt.base)
            try:
                if conn is None or conn.lost:
                    _, conn = await asyncio.wait_for(
                        loop.create_connection(RespProto, tgt.host, tgt.port), a.timeout)
                    conns[tgt.base] = conn
                fut = loop.create_future()
                conn.send(build(seq % len(pre) if a.sweep else wrng.randrange(len(pre)), seq, tgt), fut)
                t_end = await asyncio.wait_for(fut, a.timeout)
                if conn.status != 200:
                    errors["http_%d" % conn.status] = errors.get("http_%d" % conn.status, 0) + 1
                elif b"[DONE]" not in conn.tail:
                    errors["no_done"] = errors.get("no_done", 0) + 1
                elif not conn.t_ttft:
                    errors["no_content"] = errors.get("no_content", 0) + 1
                else:
                    ok_total[0] += 1
                    if expected_events and conn.events != expected_events:
                        bad_events[0] += 1
                    if conn.t0 >= t_warm:
                        samples.append((conn.t0, t_end, conn.t_role - conn.t0, conn.t_ttft - conn.t0, t_end - conn.t0,
                                        conn.max_gap))
                if not getattr(conn, "keep_alive", True):
                    conn.transport.close()
                    conns.pop(tgt.base, None)
            except Exception as e:  # noqa: BLE001
                k = type(e).__name__
                errors[k] = errors.get(k, 0) + 1
                c = conns.pop(tgt.base, None)
                if c is not None and c.transport is not None:
                    c.transport.close()
                await asyncio.sleep(0.01)
        for c in conns.values():
            c.transport.close()

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*(worker(i) for i in range(a.concurrency)))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    t_done = perf()

    win = max(1e-9, min(t_stop, t_done) - t_warm)
    completed_in_window = sum(1 for s in samples if s[1] <= t_stop)
    # requests that started before warmup end but completed inside the window
    # are not in samples; closed-loop steady state makes the error tiny.
    res = {
        "targets": a.url, "concurrency": a.concurrency, "prompt_chars": a.prompt_chars,
        "duration_s": a.duration, "warmup_s": a.warmup,
        "n": len(samples), "rps": completed_in_window / win,
        "n_total_ok": ok_total[0], "n_total_sent": counter[0],
        "errors": sum(errors.values()), "error_kinds": errors, "bad_event_count": bad_events[0],
        "client_cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
        "wall_s": t_done - t_begin,
    }

    def pct(vals, q):
        if not vals:
            return None
        vals = sorted(vals)
        k = (len(vals) - 1) * q
        f = int(k)
        c = min(f + 1, len(vals) - 1)
        return (vals[f] + (vals[c] - vals[f]) * (k - f)) * 1000.0

    for name, idx in (("role", 2), ("ttft", 3), ("e2e", 4), ("maxgap", 5)):
        v = [s[idx] for s in samples]
        for q, qn in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            res["%s_%s_ms" % (name, qn)] = pct(v, q)
        res["%s_mean_ms" % name] = (sum(v) / len(v) * 1000.0) if v else None
    if a.raw:
        with open(a.raw, "w") as f:
            for s in samples:
                f.write("%.6f %.6f %.6f %.6f\n" % (s[2], s[3], s[4], s[5]))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", action="append", required=True, help="base URL; repeat to spread across several")
    ap.add_argument("--path", default="/v1/chat/completions")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("-t", "--duration", type=float, default=8.0, help="measured seconds (after warmup)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--count", type=int, default=0, help="stop after this many requests (0 = time-bound)")
    ap.add_argument("--prompt-chars", type=int, default=200)
    ap.add_argument("--pool", type=int, default=32)
    ap.add_argument("--line-chars", type=int, default=0,
                    help="a line break every ~N characters of a prompt, as in a document (0: one line)")
    ap.add_argument("--sweep", action="store_true",
                    help="send each prompt of the pool once, in order, then stop")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--expect-events", type=int, default=0,
                    help="count responses whose SSE event count differs (0 = don't check)")
    ap.add_argument("--raw", default=None, help="write per-request role/ttft/e2e/maxgap seconds here")
    ap.add_argument("--header", action="append", default=[], help="extra request header 'name: value' (repeatable)")
    ap.add_argument("--quickack", action="store_true",
                    help="client ACKs every segment at once (not what normal clients do); "
                         "a TTFT gap that vanishes with this flag is Nagle on the proxy x delayed ACK")
    a = ap.parse_args()
    global QUICKACK
    QUICKACK = a.quickack
    if uvloop is not None:
        uvloop.install()
    res = asyncio.run(main_async(a))
    sys.stdout.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
