"""`prefixgate lint`: JSON / JSONL input, findings with the fix, exit status, --json shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.cli import main

STATIC = "You are the support assistant for Acme. Refunds within 30 days. Shipping 3-5 days.\n" * 25


def body(system: str, user: str) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def write_jsonl(path: Path, bodies: list[dict]) -> Path:
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    return path


def test_jsonl_dynamic_head_exit_1(tmp_path: Path, capsys) -> None:
    f = write_jsonl(tmp_path / "seq.jsonl", [
        body(f"Current time: 2026-04-14T09:3{i}:07Z\n{STATIC}", f"question {i}") for i in range(3)])
    assert main(["lint", str(f), "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert set(rows[0]) == {"index", "continuity", "cause", "spans", "span_kinds", "fix", "secondary"}
    assert rows[0]["cause"] is None
    assert rows[1]["cause"] == "dynamic_head" and rows[1]["spans"] == ["2026-04-14T09:31:07Z"]
    assert rows[1]["continuity"] < 0.05
    assert "`Current time: …`" in rows[1]["fix"] and "below the static content" in rows[1]["fix"]


def test_jsonl_clean_exit_0(tmp_path: Path, capsys) -> None:
    """Stateless single-turn requests over one system prompt: new conversations, not problems."""
    f = write_jsonl(tmp_path / "seq.jsonl", [body(STATIC, f"question {i}") for i in range(3)])
    assert main(["lint", str(f)]) == 0
    out = capsys.readouterr().out
    assert "0 problem(s)" in out and "continuity 1.00: new_session" in out


def test_single_request_static_check(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(body(f"Request ID: 7f3a9c1e\n{STATIC}", "hi")))
    assert main(["lint", str(bad)]) == 1
    assert "dynamic_head" in capsys.readouterr().out
    decoy = tmp_path / "decoy.json"
    decoy.write_text(json.dumps(body(f"Policy version 2.3, effective 2025-01-01.\n{STATIC}", "hi")))
    assert main(["lint", str(decoy)]) == 0


def test_bad_input_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text("[1, 2")
    assert main(["lint", str(f)]) == 2


def test_console_script_runs(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "seq.jsonl", [body(STATIC, "a"), body("Totally different prompt.\n" * 30, "b")])
    proc = subprocess.run([sys.executable, "-m", "app", "lint", str(f), "--json"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr  # new_session is not a problem
    assert json.loads(proc.stdout.splitlines()[1])["cause"] == "new_session"


def test_a_body_the_proxy_refuses_is_reported_with_its_message_and_exit_2(tmp_path: Path, capsys) -> None:
    """Bent bodies in a sequence (a role that is no string, a message that is no object, a
    Messages `system` that is a number) are reported with the message the proxy answers them
    with, and the other bodies are still analysed: no traceback."""
    bodies = [body(STATIC, "a"), {"model": "m", "messages": [{"role": 5, "content": {"a": 1}}]},
              {"model": "m", "messages": [None, 5, "x"]},
              {"model": "m", "system": 5, "messages": [{"role": "user", "content": "hi"}]},
              body(STATIC, "b")]
    f = write_jsonl(tmp_path / "seq.jsonl", bodies)
    assert main(["lint", str(f), "--json"]) == 2
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[1]["error"] == rows[2]["error"] == \
        "the proxy would refuse it (chat): 'messages[0]' must be an object with a string 'role'"
    assert rows[3]["error"] == "the proxy would refuse it (messages): 'system' must be a string or a list of content blocks"
    assert "error" not in rows[0] and "error" not in rows[4]
    assert rows[4]["cause"] == "new_session" and rows[4]["continuity"] > 0.9  # analysed against request 0
    assert main(["lint", str(f)]) == 2
    assert capsys.readouterr().out.splitlines()[-1] == "5 request(s), 0 problem(s), 3 refused"


def test_a_jsonl_line_that_is_no_json_is_named(tmp_path: Path, capsys) -> None:
    f = tmp_path / "seq.jsonl"
    f.write_text(json.dumps(body(STATIC, "a")) + "\nnot json\n")
    assert main(["lint", str(f)]) == 2
    assert "line 2 is no JSON" in capsys.readouterr().err


def test_a_messages_sequence_is_read_with_its_top_level_system(tmp_path: Path, capsys) -> None:
    """Anthropic Messages bodies (Claude Code's shape: `system` beside `messages`, content blocks):
    the clock in `system` is found, as the gateway finds it on /v1/messages."""
    bodies = [{"model": "m", "max_tokens": 64, "system": f"Current time: 2026-04-14T09:3{i}:07Z\n{STATIC}",
               "messages": [{"role": "user", "content": [{"type": "text", "text": f"question {i}"}]}]}
              for i in range(2)]
    f = write_jsonl(tmp_path / "seq.jsonl", bodies)
    assert main(["lint", str(f), "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1]["cause"] == "dynamic_head" and rows[1]["spans"] == ["2026-04-14T09:31:07Z"]


def test_a_responses_sequence_is_read_with_its_instructions(tmp_path: Path, capsys) -> None:
    """Responses bodies (Codex's shape: `instructions` and `input`) are rendered as the engine
    renders them, not skipped as bodies without messages."""
    bodies = [{"model": "m", "instructions": f"Current time: 2026-04-14T09:3{i}:07Z\n{STATIC}",
               "input": [{"type": "message", "role": "user", "content": f"question {i}"}]} for i in range(2)]
    f = write_jsonl(tmp_path / "seq.jsonl", bodies)
    assert main(["lint", str(f), "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1]["cause"] == "dynamic_head" and rows[1]["spans"] == ["2026-04-14T09:31:07Z"]
    assert main(["lint", str(f), "--json", "--api", "chat"]) == 2  # forced to chat: no `messages`, refused
    assert "'messages' is a required property" in capsys.readouterr().out


def test_token_ids_that_are_no_ids_are_reported_not_raised(tmp_path: Path, capsys) -> None:
    """A completions prompt of token ids the engine cannot hold (negative, past 32 bits): the proxy
    forwards it without a fingerprint; lint reports it (found by tests/test_lint_fuzz.py)."""
    f = write_jsonl(tmp_path / "seq.jsonl", [{"model": "m", "prompt": [-1]}, {"model": "m", "prompt": [2**40, 5]},
                                             {"model": "m", "prompt": [1, 2, 3]}])
    assert main(["lint", str(f), "--json"]) == 2
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["error"].split(":")[0] for r in rows[:2]] == ["the engine could not render it (completions)"] * 2
    assert "error" not in rows[2]
