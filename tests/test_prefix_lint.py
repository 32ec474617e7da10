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
