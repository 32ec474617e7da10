"""`prefixgate lint` over bent request bodies: each one is reported, analysed or refused with the
proxy's own 400 message, and the command exits 0, 1 or 2; never a traceback.

The bodies are the HTTP fuzz's (tests/fuzz_cases.py: chat, completions, Messages and Responses
bodies with any field given any JSON value, fields dropped, deep nesting), written as JSONL
sequences of one tenant and run through `prefixgate lint --json` as a CI job would run it.
`PREFIXGATE_LINT_FUZZ` sets the number of sequences (default 100; derandomized, so a failure
reproduces; not shrunk: each example runs the whole command, and the failing pool is printed).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

from app.cli import main
from tests.fuzz_cases import POOL, Pool, anthropic_body, chat_body, completion_body, responses_body

SEQUENCES = int(os.environ.get("PREFIXGATE_LINT_FUZZ", "100"))
MAKERS = (chat_body, anthropic_body, responses_body, completion_body)
MAX_BODY_CHARS = 100_000  # the fuzz's 1 MB prompts only make a run slower here


def _sequence(pool: Pool) -> list[dict]:
    """Up to six bodies of one API or of several (a tenant's requests), objects only: a file
    holding anything else is refused whole (exit 2), which test_prefix_lint covers."""
    r = random.Random(pool.seed)
    makers = [r.choice(MAKERS)] if r.random() < 0.5 else list(MAKERS)
    out = []
    for _ in range(r.randint(1, 6)):
        body = r.choice(makers)(pool, r)
        if isinstance(body, dict) and len(json.dumps(body)) <= MAX_BODY_CHARS:
            out.append(body)
    return out


@settings(max_examples=SEQUENCES, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(pool=POOL)
def test_lint_reports_every_bent_body(pool: Pool, tmp_path: Path, capsys) -> None:
    bodies = _sequence(pool)
    if not bodies:
        return
    f = tmp_path / "seq.jsonl"
    f.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    status = main(["lint", str(f), "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["index"] for row in rows] == list(range(len(bodies)))
    # not analysed, and bad input: refused by the proxy, or no prompt the engine could render
    refused = [row for row in rows if str(row.get("error", "")).startswith(("the proxy would refuse it",
                                                                          "the engine could not render it"))]
    assert status == (2 if refused else 1 if any(row["cause"] not in (None, "new_session", "compaction")
                                                    for row in rows) else 0)
    for row in rows:
        if row.get("error"):
            assert row["cause"] is None and row["spans"] == []
        else:
            assert row["continuity"] is None or 0.0 <= row["continuity"] <= 1.0
