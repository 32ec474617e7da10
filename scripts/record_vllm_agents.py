"""Re-records tests/fixtures/real_vllm_agents/ from a real vLLM 0.32 (the `make e2e` install).

Run by hand after a vLLM upgrade, once `make e2e` has built `.venv-vllm` and `.e2e/model`:
`.venv/bin/python scripts/record_vllm_agents.py`. It starts one replica (block 32, prefix
caching and prompt token details on, `VLLM_ENABLE_RESPONSES_API_STORE=1`, a tool parser so that
`tools` are accepted, `--enable-scale-out` for the render endpoints) on a free loopback port,
sends the requests in `CAPTURES` and `RENDERS`, writes what came back, and stops it by PID.

- `<name>.sse`: a streamed answer's body, byte for byte as the engine wrote it;
- `<name>.json`: `{"status", "body"}` of a non-streamed answer or an error;
- `requests.json`: every capture's request, so the normal tier can replay it on the simulator
  (tests/test_sim_vllm_agents_captures.py);
- `render.json`: `{route, body, token_ids}` from `POST /v1/messages/render` and
  `/v1/responses/render`: the prompt ids vLLM renders for each body, which the proxy's own
  conversion must reproduce exactly (tests/test_vllm_agents_render.py).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.vllm_server import AGENTS_ENV, AGENTS_TOOL_ARGS, ReplicaSpec, start_replicas, stop_all  # noqa: E402
from tests.e2e.workload import words  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "real_vllm_agents"
MODEL = ROOT / ".e2e" / "model"
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch=4f2a9;"
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

MESSAGES_BODY: dict[str, Any] = {
    "model": "tiny", "max_tokens": 8,
    "system": [{"type": "text", "text": BILLING},
               {"type": "text", "text": words("capture-system", 120), "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "read_file", "description": "Read a file.", "input_schema": SCHEMA}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": words("capture-user", 20)}]}],
}
RESPONSES_BODY: dict[str, Any] = {
    "model": "tiny", "max_output_tokens": 8, "instructions": words("capture-instructions", 120),
    "tools": [{"type": "function", "name": "shell", "description": "Run a command.", "strict": False,
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": words("cap", 20)}]}],
}

# name -> (method, path, body); `.sse` when the body streams
CAPTURES: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "messages_stream": ("POST", "/v1/messages", {**MESSAGES_BODY, "stream": True}),
    "messages": ("POST", "/v1/messages", MESSAGES_BODY),
    "messages_404_model": ("POST", "/v1/messages", {**MESSAGES_BODY, "model": "no-such-model"}),
    "messages_400_max_tokens": ("POST", "/v1/messages", {k: v for k, v in MESSAGES_BODY.items() if k != "max_tokens"}),
    "responses_stream": ("POST", "/v1/responses", {**RESPONSES_BODY, "stream": True}),
    "responses": ("POST", "/v1/responses", RESPONSES_BODY),
    "responses_404_previous": ("POST", "/v1/responses", {**RESPONSES_BODY, "previous_response_id": "resp_missing"}),
    "responses_404_get": ("GET", "/v1/responses/resp_missing", None),
}

# Bodies that exercise each conversion rule (docs/agents-apis.md, docs/agents-responses.md)
RENDERS: list[tuple[str, dict[str, Any]]] = [
    ("messages", MESSAGES_BODY),
    ("messages", {
        "model": "tiny", "max_tokens": 8, "system": BILLING + "\nYou are terse.",
        "tools": [{"name": "a", "input_schema": {"properties": {"x": {"type": "integer"}}}},
                  {"name": "b", "description": "B.", "input_schema": SCHEMA, "strict": True},
                  {"name": "c", "description": "C.", "input_schema": SCHEMA, "defer_loading": False}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r1</system-reminder>"},
                                         {"type": "text", "text": "first question"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "text", "text": "looking"},
                                              {"type": "tool_use", "id": "toolu_1", "name": "b",
                                               "input": {"path": "a.py", "n": [1, 2]}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "def f(): ..."},
                                         {"type": "text", "text": "and now?"}]},
            {"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Reminder."}]},
            {"role": "assistant", "content": "plain string reply"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                          "content": [{"type": "text", "text": "l1"}, {"type": "text", "text": "l2"}]}]},
        ]}),
    ("responses", RESPONSES_BODY),
    ("responses", {
        "model": "tiny", "instructions": "Current time: 2026-12-01T20:00:00Z\nBe terse.",
        "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}, "strict": None},
                  {"type": "function", "name": "cat", "description": "Print a file.", "strict": True,
                   "parameters": SCHEMA}],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                              {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": "{\"path\": \"x.py\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x.py"},
            {"type": "function_call_output", "call_id": "c2", "output": "print(1)"},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev note"}]},
            {"type": "message", "role": "user", "content": "string content"},
        ]}),
    ("responses", {"model": "tiny", "input": "just a string"}),
]


def _send(client: httpx.Client, url: str, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
    with client.stream(method, url + path, json=body) as resp:
        return resp.status_code, b"".join(resp.iter_raw())


def record(url: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    requests: dict[str, Any] = {}
    with httpx.Client(timeout=120) as client:
        for name, (method, path, body) in CAPTURES.items():
            status, raw = _send(client, url, method, path, body)
            requests[name] = {"method": method, "path": path, "body": body}
            if body is not None and body.get("stream") and status == 200:
                (OUT / f"{name}.sse").write_bytes(raw)
            else:
                (OUT / f"{name}.json").write_text(json.dumps({"status": status, "body": json.loads(raw)}, indent=1)
                                                  + "\n")
        renders = []
        for route, body in RENDERS:
            resp = client.post(f"{url}/v1/{route}/render", json=body)
            resp.raise_for_status()
            renders.append({"route": route, "body": body, "token_ids": resp.json()["token_ids"]})
    (OUT / "requests.json").write_text(json.dumps(requests, indent=1) + "\n")
    (OUT / "render.json").write_text(json.dumps(renders) + "\n")


def main() -> None:
    spec = ReplicaSpec("agents", block_size=32, env=AGENTS_ENV, extra_args=[*AGENTS_TOOL_ARGS, "--enable-scale-out"])
    replicas = start_replicas([spec], MODEL, Path(tempfile.mkdtemp()))
    try:
        record(replicas[0].url)
    finally:
        stop_all(replicas)
    print(f"recorded into {OUT}")


if __name__ == "__main__":
    main()
