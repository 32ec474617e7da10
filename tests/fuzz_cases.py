"""Hypothesis strategies for the fuzz suite: whole HTTP requests to every route of the proxy.

A case is a `fuzz_client.RawRequest`: method, target, headers, body bytes and framing. Bodies start
from a valid OpenAI request and are then bent: any field replaced by any JSON value, required
fields dropped, extra fields added, the JSON cut short, made invalid UTF-8, nested thousands deep or
made megabytes long; headers get duplicates, non-UTF-8 bytes, wrong content types and lengths that
lie.

How the work is split, for speed (10,000 cases in a CI run) and variety: each hypothesis example
draws a `Pool` of values (JSON values, message lists, extra-field sets, header lists, prompts), and
`batch()` assembles BATCH cases from it with a seeded `random.Random` that picks the route, the
mix of pool values and every structural mutation. Hypothesis alone draws ~100 choices (~5 ms) per
case and repeats most of them (~17 % distinct in a derandomized run of small cases); the Random
is seeded from the example's own draws plus a per-run case counter, and makes no hypothesis draw,
so the data generation stays deterministic for hypothesis and the run reproducible.

The same cases every run, whichever process runs the test: `cases()` draws them in a process of
its own (`python -m tests.fuzz_cases EXAMPLES BATCH PROXIES`, which streams pickled batches) that
imports no project module, because hypothesis also draws literals from the project modules loaded
at draw time (`_no_project_modules` says more). test_fuzz_proxy.py prints the cases' sha256.

Engine-side cost is bounded on purpose: a valid request asks for few tokens (`max_tokens` <= 16
unless the value is not an int; `min_tokens`/`ignore_eos` only in their small range), because the
point is the proxy's handling, not the simulator's decode speed.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import pickle
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz_client import RawRequest

MODEL = "sim"

# --- JSON values ---------------------------------------------------------------------------
_ints = st.one_of(st.integers(-3, 16), st.sampled_from([2**31, 2**63, 2**64 + 1, -(2**63), 10**30]))
_floats = st.one_of(st.floats(-2, 2, allow_nan=False), st.sampled_from([float("nan"), float("inf"), 1e308]))
_strings = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "sim", "user", "assistant", "system", "tool", "text", "image_url",
                     "\u0000", "\ud7ff\ue000", "a" * 300, "<|im_start|>", "{{ x }}", "%s", "../"]),
)
PHRASES = [
    "Hello!", "What is the capital of France?", "You are a helpful assistant.", "Today is 2026-12-01 17:23:48.",
    "def f(x):\n    return x", "日本語のテキスト", "emoji 🙂", "line\r\nbreak", "tab\tsep", "quote \" and \\ backslash",
    "lorem ipsum " * 40,
    # what reaches the dynamic-value detector, the digest's dates and the compaction rule
    "Stand: 16. Jänner 2026, 09:31", "As of Sept. 9, 2026", "lunedì, 4.12. 14:05", "Request ID: req_8f3a9c",
    "Queue depth: 9 (12/220)", "Summary of the conversation so far: the user asked about caches.",
]
_PHRASES = st.sampled_from(PHRASES)
_TEXT = st.one_of(st.text(max_size=8), _PHRASES)
_leaf = st.one_of(st.none(), st.booleans(), _ints, _floats, _strings)
JSON = st.recursive(_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                  st.dictionaries(_strings, kids, max_size=4)),
                    max_leaves=5)

# --- message parts -------------------------------------------------------------------------
_text_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(_TEXT, JSON)})
_odd_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.one_of(
        st.fixed_dictionaries({"url": st.sampled_from(["http://x/y.png", "data:image/png;base64,AAAA", ""])}),
        JSON)}),
    st.dictionaries(st.sampled_from(["type", "text", "image_url", "input_audio"]), JSON, max_size=3),
    JSON,
)
_content = st.one_of(_TEXT, st.lists(st.one_of(_text_part, _odd_part), max_size=3), JSON)
_role = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), JSON)
_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _TEXT}),
    st.fixed_dictionaries({"role": _role, "content": _content},
                          optional={"name": JSON, "tool_calls": JSON, "tool_call_id": JSON,
                                    "reasoning_content": JSON}),
    JSON,
)
_tool = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g", "search", ""]), "parameters": st.one_of(st.just({"type": "object"}), JSON)},
        optional={"description": JSON})}),
    JSON,
)

# optional top-level fields: the ones the proxy reads or the engines take, any JSON as a value
_OPTIONAL = {
    "stream": st.one_of(st.booleans(), JSON), "stream_options": st.one_of(
        st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), JSON)}), JSON),
    "n": st.one_of(st.integers(-1, 2), _strings, st.none()), "max_completion_tokens": st.one_of(st.integers(-1, 8), JSON),
    "temperature": JSON, "top_p": JSON, "user": st.one_of(st.text(max_size=6), JSON),
    "stop": JSON, "tools": st.one_of(st.lists(_tool, max_size=3), JSON), "tool_choice": JSON,
    "cache_salt": st.one_of(st.sampled_from(["s1", "", "a/b", "x" * 200]), JSON), "logprobs": JSON,
    "response_format": JSON, "seed": JSON, "chat_template_kwargs": JSON, "add_generation_prompt": JSON,
    "prompt": JSON, "messages": JSON, "echo": JSON, "suffix": JSON, "metadata": JSON,
    "min_tokens": st.integers(-1, 4), "ignore_eos": st.booleans(),
}
# prebuilt (key, value) strategies: a flatmap building a strategy per draw costs ~10x more
_extras = st.lists(st.one_of([st.tuples(st.just(k), v) for k, v in sorted(_OPTIONAL.items())]), max_size=4).map(dict)
_prompt = st.one_of(_TEXT, st.lists(st.text(max_size=6), max_size=3), st.lists(st.integers(-5, 70000), max_size=40),
                    st.lists(st.lists(st.integers(0, 3000), max_size=8), max_size=3), JSON)


# --- headers -------------------------------------------------------------------------------
_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.!#$%&'*+^`|~", min_size=1, max_size=16)
_value = st.one_of(
    st.binary(max_size=10).map(lambda b: bytes(c for c in b if c not in b"\r\n\x00").strip()),
    st.text(max_size=10).map(lambda t: t.encode("utf-8").replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"").strip()),
    st.sampled_from([b"", b"a" * 300, b"\xff\xfe", b"caf\xe9", b"\xe2\x82\xac", b"Bearer ", b"Bearer x" * 40]),
)
_NAMED = {
    b"x-tenant-id": st.one_of(st.sampled_from([b"acme", b"warned", b"rewritten", b"rejected", b"t" * 200]), _value),
    b"x-request-id": st.one_of(st.sampled_from([b"abc", b"a" * 200, b"../x", b"id with space"]), _value),
    b"x-session-id": _value,
    b"authorization": st.one_of(st.sampled_from([b"Bearer sk-1", b"Basic Zm9vOmJhcg==", b"bearer"]), _value),
    b"x-api-key": _value,
    b"content-type": st.sampled_from([b"application/json", b"text/plain", b"application/x-www-form-urlencoded",
                                      b"multipart/form-data; boundary=x", b"application/json; charset=latin-1", b"\xff"]),
    b"accept-encoding": st.sampled_from([b"gzip", b"br, gzip", b"identity", b"*"]),
    b"accept": st.sampled_from([b"text/event-stream", b"application/json", b"*/*", b"\xff"]),
    b"expect": st.just(b"100-continue"),
    b"traceparent": st.one_of(st.just(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), _value),
    b"cookie": _value,
    b"x-forwarded-for": _value,
}
_header = st.one_of([st.tuples(st.just(k), v) for k, v in sorted(_NAMED.items())]
                    + [st.tuples(_token.map(str.encode), _value)] * 3)




@dataclass
class Pool:
    """One hypothesis example's values, recombined into a batch of cases."""

    jsons: list[Any]
    messages: list[list[Any]]
    extras: list[dict[str, Any]]
    headers: list[list[tuple[bytes, bytes]]]
    values: list[bytes]
    prompts: list[Any]
    garbage: bytes
    seed: int


POOL = st.builds(Pool, st.lists(JSON, min_size=6, max_size=6),
                 st.lists(st.lists(_message, min_size=1, max_size=3), min_size=3, max_size=3),
                 st.lists(_extras, min_size=3, max_size=3), st.lists(st.lists(_header, max_size=4), min_size=3, max_size=3),
                 st.lists(_value, min_size=3, max_size=3), st.lists(_prompt, min_size=3, max_size=3),
                 st.binary(max_size=64), st.integers(0, 2**32))


def _weighted(r: random.Random, weights: dict[str, float]) -> str:
    return r.choices(list(weights), weights=list(weights.values()))[0]


def _max_tokens(pool: Pool, r: random.Random) -> Any:
    if r.random() < 0.8:
        return r.randint(1, 12)
    value = r.choice([*pool.jsons, 0, -1, 16])
    return value if not isinstance(value, int) or value <= 16 else 16


def chat_body(pool: Pool, r: random.Random) -> Any:
    if r.random() < 0.5:  # a well-formed conversation, so half the bodies reach an engine
        messages = [{"role": role, "content": r.choice(PHRASES)}
                    for role in ["system", "user", "assistant", "user"][r.randrange(2):r.randint(2, 4)]]
    else:
        messages = list(r.choice(pool.messages))
    if r.random() < 0.3:  # recombine: messages from two draws, or a plain user turn appended
        messages += r.choice(pool.messages) if r.random() < 0.5 else [{"role": "user", "content": r.choice(PHRASES)}]
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": _max_tokens(pool, r)}
    return _finish_body(pool, r, body, "messages")


def anthropic_body(pool: Pool, r: random.Random) -> Any:
    """A Messages API body: chat's turns without system messages, the system as a top-level string
    or blocks (sometimes opening with Claude Code's billing header)."""
    body = chat_body(pool, r)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return body
    turns = body["messages"]
    system = [m.get("content") for m in turns if isinstance(m, dict) and m.get("role") == "system"]
    body["messages"] = [m for m in turns if not (isinstance(m, dict) and m.get("role") == "system")]
    if system and r.random() < 0.5:
        body["system"] = system[0]
    elif r.random() < 0.5:
        blocks = [{"type": "text", "text": r.choice(PHRASES)}]
        if r.random() < 0.5:
            version, cch = r.randrange(99), r.randrange(16**5)
            blocks.insert(0, {"type": "text", "text": f"x-anthropic-billing-header: cc_version=1.0.{version}; "
                                                      f"cc_entrypoint=cli; cch={cch:05x};"})
        body["system"] = blocks if r.random() < 0.9 else r.choice(pool.jsons)
    return body


def responses_body(pool: Pool, r: random.Random) -> Any:
    """A Responses API body: `input` as a string or chat-like items, sometimes `instructions`,
    `previous_response_id` (unknown ids included) and `store`."""
    body = chat_body(pool, r)
    if not isinstance(body, dict):
        return body
    turns = body.pop("messages", None)
    body["input"] = r.choice(PHRASES) if r.random() < 0.3 else turns
    body["max_output_tokens"] = body.pop("max_tokens", 8)
    if r.random() < 0.4:
        body["instructions"] = r.choice([*PHRASES, *pool.jsons])
    if r.random() < 0.2:
        body["previous_response_id"] = r.choice(["resp_unknown", "", *pool.jsons])
    if r.random() < 0.3:
        body["store"] = r.random() < 0.5
    return body


def completion_body(pool: Pool, r: random.Random) -> Any:
    prompt = r.choice(pool.prompts) if r.random() < 0.7 else r.choice(PHRASES) * r.randint(1, 20)
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": _max_tokens(pool, r)}
    return _finish_body(pool, r, body, "prompt")


def _finish_body(pool: Pool, r: random.Random, body: dict[str, Any], main: str) -> Any:
    """Stream or not, extra fields, then the structural mutations both generate routes share."""
    if r.random() < 0.5:
        body["stream"] = True
        if r.random() < 0.5:
            body["stream_options"] = {"include_usage": r.random() < 0.5}
    if r.random() < 0.6:
        body.update(r.choice(pool.extras))
    if r.random() < 0.1:  # one field the proxy reads, given any JSON value
        body[r.choice(["stream", "stream_options", "n", "user", "tools", "cache_salt", "stop", main])] = r.choice(pool.jsons)
    how = _weighted(r, {"keep": 80, "drop": 4, "model": 4, "deep": 4, "huge": 2, "not_object": 4})
    if how == "drop":
        body.pop(r.choice(["model", main, "max_tokens"]), None)
    elif how == "model":
        body["model"] = r.choice([*pool.jsons, "", "other-model", "sim "])
    elif how == "deep":  # deeper than most recursive walkers (and orjson's 1024 limit) expect
        depth = r.choice([50, 200, 900, 1100, 5000])
        body[r.choice(["metadata", "tools", main])] = _nested(depth, r.choice(["list", "dict"]))
    elif how == "huge":  # big prompts, within and beyond the configured body limit
        size = r.choice([70_000, 300_000, 300_000, 1_200_000])
        body["max_tokens"] = 1
        if main == "messages":
            body["messages"] = [{"role": "user", "content": "lorem ipsum " * (size // 12)}]
        else:
            body["prompt"] = "lorem ipsum " * (size // 12)
    elif how == "not_object":  # a copy: the agents' routes reshape a dict body, and the pool's values are shared
        return copy.deepcopy(r.choice(pool.jsons))
    return body


_DEEP = "__fuzz_deep_%d_%s__"


def _nested(depth: int, kind: str) -> str:
    """A placeholder that `encode_body` expands into `depth` nested lists or objects (textually:
    json.dumps itself would hit the recursion limit)."""
    return _DEEP % (depth, kind)


def _expand_deep(raw: bytes) -> bytes:
    start = raw.find(b'"__fuzz_deep_')
    if start < 0:
        return raw
    end = raw.index(b'"', start + 1) + 1
    depth, kind = raw[start + 13:end - 3].split(b"_")
    n = int(depth)
    inner = b"[" * n + b'"x"' + b"]" * n if kind == b"list" else b'{"a":' * n + b'"x"' + b"}" * n
    return raw[:start] + inner + raw[end:]


def encode_body(pool: Pool, r: random.Random, body: Any) -> bytes:
    """The body as bytes, sometimes broken on the wire."""
    raw = json.dumps(body, allow_nan=True, ensure_ascii=r.random() < 0.5).encode("utf-8", "surrogatepass")
    raw = _expand_deep(raw)
    how = _weighted(r, {"ok": 85, "truncate": 3, "garbage": 3, "bad_utf8": 3, "empty": 2, "bom": 2, "trailing": 2})
    if how == "truncate" and raw:
        return raw[: r.randint(0, max(0, len(raw) - 1))]
    if how == "garbage":
        return pool.garbage
    if how == "bad_utf8":
        at = r.randint(0, len(raw))
        return raw[:at] + r.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]) + raw[at:]
    if how == "empty":
        return b""
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "trailing":
        return raw + r.choice([b" ", b"\n", b"}", b"{}", b",", b"\x00"])
    return raw


def headers(pool: Pool, r: random.Random) -> list[tuple[bytes, bytes]]:
    out = list(r.choice(pool.headers)) if r.random() < 0.7 else []
    if out and r.random() < 0.2:  # a duplicate of one of them, with another value
        out.append((out[0][0], r.choice(pool.values)))
    if r.random() < 0.2:
        out.append((b"x-tenant-id", r.choice([b"acme", b"warned", b"rejected", *pool.values])))
    return out


# --- routes --------------------------------------------------------------------------------
CONTROL = ["/v1/models", "/healthz", "/health", "/readyz", "/metrics", "/hygiene/engines", "/hygiene/tenants",
           "/ui"]
PASSTHROUGH = ["/v1/embeddings", "/v1/messages/count_tokens", "/v1/responses/resp_unknown/cancel", "/v1/responses/resp_x", "/v1/audio/transcriptions", "/v1/chat/completions/x",
               "/v1/models/sim", "/v1/", "/v1//completions", "/v1/%2e%2e/metrics", "/v1/tokenize", "/v1/a%00b",
               "/v1/\u00e9"]
QUERIES = ["?a=1", "?x=%ff", "?" + "q" * 3000, "?a=1&a=2", "?%", "?stream=true"]
METHODS = ["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]


def _route_label(path: str) -> str:
    if path.startswith("/hygiene/tenants/"):
        return "/hygiene/tenants/{tenant}"
    return path if path in CONTROL else "passthrough /v1/*"


BODIES: dict[str, Callable[[Pool, random.Random], Any]] = {
    "chat": chat_body, "completions": completion_body, "messages": anthropic_body, "responses": responses_body}
ROUTE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "messages": "/v1/messages",
               "responses": "/v1/responses"}


def generate_case(pool: Pool, r: random.Random, route: str) -> RawRequest:
    body = BODIES[route](pool, r)
    stream = isinstance(body, dict) and body.get("stream") is True
    raw = encode_body(pool, r, body)
    framing = _weighted(r, {"length": 85, "chunked": 6, "short": 3, "long": 3, "none": 3})
    method = "POST" if r.random() < 0.96 else r.choice(METHODS)
    path = ROUTE_PATHS[route]
    target = path + (r.choice(QUERIES) if r.random() < 0.05 else "")
    drop = r.choice([1, 40, 200, 600]) if stream and r.random() < 0.3 else None
    return RawRequest(method, target, headers(pool, r), raw, framing, drop, route=path, stream=stream)


def other_case(pool: Pool, r: random.Random) -> RawRequest:
    kind = _weighted(r, {"control": 50, "tenant": 10, "passthrough": 30, "unknown": 10})
    if kind == "control":
        path = r.choice(CONTROL)
    elif kind == "tenant":
        path = "/hygiene/tenants/" + r.choice(["acme", "default", "%ff", "a" * 300, "..", "x%2Fy", "%00"])
    elif kind == "passthrough":
        path = r.choice(PASSTHROUGH)
    else:
        path = r.choice(["/", "/admin", "/v1", "/sim/state", "/metrics/x", "//", "/ui/"])
    method = _weighted(r, {"GET": 60, "POST": 20, "PUT": 5, "DELETE": 5, "HEAD": 5, "OPTIONS": 5})
    raw = b""
    if method in ("POST", "PUT"):
        which = r.random()
        payload = r.choice(pool.jsons) if which < 0.4 else chat_body(pool, r) if which < 0.7 else completion_body(pool, r)
        raw = encode_body(pool, r, payload)
    framing = _weighted(r, {"length": 85, "chunked": 6, "short": 3, "long": 3, "none": 3}) if raw else "length"
    label = "unknown" if kind == "unknown" else _route_label(path)
    query = r.choice(QUERIES) if r.random() < 0.2 else ""
    return RawRequest(method, path + query, headers(pool, r), raw, framing, route=label)


def batch(pool: Pool, size: int, number: int, proxies: int) -> list[tuple[int, RawRequest]]:
    """`size` cases from one pool: 30 % chat, 24 % completions, 8 % each agents' API, 30 % every other route, each sent
    to one of `proxies`. `number` (the example's position in the run) varies the Random, so the
    pools hypothesis repeats still give new cases."""
    r = random.Random(f"prefixgate-fuzz:{pool.seed}:{number}")
    out = []
    for _ in range(size):
        kind = _weighted(r, {"chat": 30, "completions": 24, "messages": 8, "responses": 8, "other": 30})
        case = other_case(pool, r) if kind == "other" else generate_case(pool, r, kind)
        out.append((r.randrange(proxies), case))
    return out


# --- the generator process -------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def generate(examples: int, size: int, proxies: int, each: Callable[[list[tuple[int, RawRequest]]], None]) -> None:
    """The derandomized hypothesis search over `examples` pools; each pool's batch goes to `each`,
    in order. Only `python -m tests.fuzz_cases` (`cases()`) calls it: see `_no_project_modules`."""
    _no_project_modules()
    numbers = itertools.count()

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(POOL)
    def run(pool: Pool) -> None:
        each(batch(pool, size, next(numbers), proxies))

    run()


def _no_project_modules() -> None:
    """Hypothesis mixes in literals harvested from every project module outside tests/ that is
    imported at draw time (its "local constants", drawn with p=0.05 per choice). In the pytest
    process that set is whatever conftest and the other collected tests imported (one file alone,
    `-k`, or the whole suite each give other cases), and any app/ edit changes it. So the cases
    are drawn in a process of their own that imports no project module: they depend on
    tests/fuzz_*.py and the hypothesis version only. (The batch Random is seeded from a string,
    never `hash()`, which PYTHONHASHSEED changes; nothing reads the clock or a set's order.)"""
    venv = Path(sys.prefix).resolve()  # a virtualenv inside the checkout (.venv) is site-packages, not ours
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        where = Path(path).resolve() if path else None
        if where and where.is_relative_to(ROOT) and not where.is_relative_to(ROOT / "tests") \
                and not where.is_relative_to(venv):
            raise RuntimeError(f"{module.__name__} is loaded: its literals would change the fuzz cases")


def case_key(proxy: int, req: RawRequest) -> bytes:
    """Every byte of one case and where it goes, for comparing runs."""
    return repr((proxy, req.method, req.target, req.headers, req.body, req.framing, req.drop_after)).encode()


def cases(examples: int, size: int, proxies: int, env: dict[str, str] | None = None) -> Iterator[list[tuple[int, RawRequest]]]:
    """The batches, drawn by `python -m tests.fuzz_cases` (a clean process, see `_no_project_modules`)
    and streamed back pickled: the pipe holds the generator at most a batch ahead of the reader."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz_cases", str(examples), str(size), str(proxies)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        while True:
            try:
                yield pickle.load(proc.stdout)
            except EOFError:
                break
    finally:
        proc.stdout.close()
        if proc.wait(30) != 0:
            raise RuntimeError(f"tests/fuzz_cases.py exited with {proc.returncode}")


def main(argv: list[str]) -> int:
    examples, size, proxies = (int(a) for a in argv)
    out = sys.stdout.buffer

    def each(batch: list[tuple[int, RawRequest]]) -> None:
        pickle.dump(batch, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()

    generate(examples, size, proxies, each)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
