"""The `compaction` cause: an agent replaces its history with a summary (system prompt and tools
kept), pays one cold turn and continues from the new prefix. Counted apart from breaks.

Material written for it here (agent-shaped sessions, never the diagnosis corpora's held-out
split): through `prefixgate lint --json` (a Claude-Code-shaped compaction; a history trimmed on
every turn, a one-off truncation without a summary and a new conversation stay what they are),
a Codex-shaped one on the pair, and through the gateway with the real `anthropic` client (the tenant report,
the explorer's row and the breaks metric) and the real `openai` client on `/v1/responses` (a Codex-shaped
compaction, whose history starts like the conversation's first request).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.cli import main
from app.prefix.diagnose import diagnose, fix_for
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import RequestSketch, build_sketch
from app.prefix.tokens import SegmentTokenizer
from app.prefix.transcript import (
    MAX_SUMMARY_LINES,
    MIN_KEPT_LINES,
    MIN_NEW_LINES,
    SUMMARY_MIN_CHARS,
    _summary_of_all,
    last_user,
    summary_replaced,
    transcript_compacted,
)

SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "fe", "hi", "jo", "bu")


def words(seed: int, n: int) -> str:
    """`n` pseudo-random words for `seed`: unrelated seeds share no long runs (unlike arithmetic
    sequences, which re-align and would read as static text pushed back)."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


SYSTEM = "You are a coding agent working in a git repository. Follow the conventions below.\n" + \
    "\n".join(f"Convention {i}: " + words(300 + i, 12) for i in range(40))
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} a path in the repository",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    for name in ("read_file", "shell", "write_file", "search")]
SUMMARY = ("This session is being continued from a previous conversation that ran out of context. "
           "The conversation is summarized below:\n" + words(900, 160))
FIX = "expected: one cold turn"


def user(t: int) -> dict[str, Any]:
    return {"role": "user", "content": f"step {t}: " + words(100 + t, 40)}


def exchange(t: int) -> list[dict[str, Any]]:
    """The agent's side of turn `t`: a tool call, its (long) output, the reply."""
    call = {"id": f"call_{t}", "type": "function", "function": {"name": "read_file",
                                                                "arguments": json.dumps({"path": f"src/m{t}.py"})}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{t}", "content": words(500 + t, 220)},
            {"role": "assistant", "content": words(700 + t, 60)}]


def body(history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "tools": TOOLS, "messages": [{"role": "system", "content": SYSTEM}, *history]}


def growing(turns: int, start: int = 0, history: list[dict[str, Any]] | None = None) -> list[list[dict[str, Any]]]:
    """The history sent at each of `turns` turns, continuing `history`."""
    out, h = [], list(history or [])
    for t in range(start, start + turns):
        h = [*h, user(t)]
        out.append(h)
        h = [*h, *exchange(t)]
    return out


def sketch(history: list[dict[str, Any]]) -> RequestSketch:
    """The sketch the gateway diagnoses, rendered with the built-in tokenizer's template."""
    inp = prompt_input("chat", body(history))
    fpr = Fingerprinter(SegmentTokenizer.load(None, workers=1))
    try:
        return build_sketch(inp, fpr.complete_sync(fpr.prepare(inp, 16)).text or "")
    finally:
        fpr.close()


def lint(tmp_path: Path, capsys, histories: list[list[dict[str, Any]]]) -> tuple[int, list[dict[str, Any]]]:
    f = tmp_path / "session.jsonl"
    f.write_text("".join(json.dumps(body(h)) + "\n" for h in histories))
    status = main(["lint", str(f), "--json"])
    return status, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_claude_code_shaped_compaction_is_named_and_no_problem(tmp_path: Path, capsys) -> None:
    before = growing(8)
    compacted = [{"role": "user", "content": SUMMARY}]
    after = growing(3, start=8, history=compacted)  # the summary, then the session goes on from it
    status, rows = lint(tmp_path, capsys, [*before, *after])
    causes = [r["cause"] for r in rows]
    assert causes == [None] * 8 + ["compaction", None, None], causes
    assert rows[8]["fix"].startswith(FIX) and rows[8]["secondary"] == []
    assert rows[9]["continuity"] > 0.5  # the next turn continues the new prefix (and adds a long tool output)
    assert status == 0  # not a problem


def test_codex_shaped_compaction_keeps_user_messages_then_the_summary() -> None:
    """Codex rebuilds the history as the earlier user messages followed by the summary (a user
    message): the summary is the newest message of the request after the compaction. Pair level;
    the gateway test below checks that the tracker picks this pair (docs/diagnosis.md)."""
    before = growing(8)
    users = [m for m in before[-1] if m["role"] == "user"]
    prev, cur = sketch(before[-1]), sketch([*users, {"role": "user", "content": SUMMARY}])
    diag = diagnose(prev, cur)
    assert diag.cause == "compaction" and not diag.is_break and fix_for(diag).startswith(FIX)
    # the user messages kept, but not the latest ones only (the first and a new one): no summary shape
    assert diagnose(prev, sketch([users[0], user(8)])).cause != "compaction"


def test_a_summary_long_next_to_short_turns_is_a_compaction() -> None:
    """Short turns (a chat without tool output) summarised: the summary keeps more than half of the
    history's text, but half of its messages or fewer in less text is still a compaction; a
    "summary" longer than all it replaces is not one."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(300 + i, 12)} for i in range(9)]
    text = sum(len(m["content"]) for m in turns)
    prev = sketch(turns)
    summary = {"role": "user", "content": "Summary of the conversation so far: " + words(950, 45)}
    newest = {"role": "user", "content": words(960, 10)}
    kept = len(summary["content"]) + len(newest["content"])
    assert 0.5 * text < kept < text  # more than COMPACTED_SHARE of the text, in fewer characters
    assert diagnose(prev, sketch([summary, newest])).cause == "compaction"
    longer = {"role": "user", "content": "Summary of the conversation so far: " + words(970, 90)}
    assert diagnose(prev, sketch([longer, newest])).cause != "compaction"


def test_lint_names_a_codex_shaped_compaction(tmp_path: Path, capsys) -> None:
    """Through `prefixgate lint --json` (the tracker's choice of the pair): the compacted history
    starts like the session's first request, and is still named against the request it compacted."""
    before = growing(8)
    users = [m for m in before[-1] if m["role"] == "user"]
    compacted = [*users, {"role": "user", "content": SUMMARY}]
    after = growing(1, start=8, history=[*compacted, *exchange(8)[1:]])
    status, rows = lint(tmp_path, capsys, [*before, compacted, *after])
    assert [r["cause"] for r in rows] == [None] * 8 + ["compaction", None], rows
    assert rows[8]["fix"].startswith(FIX) and status == 0


def test_a_history_trimmed_on_every_turn_stays_front_trim(tmp_path: Path, capsys) -> None:
    """A sliding window (the last two exchanges kept, with or without a rolling summary on top)
    keeps the history's length: every turn is a `front_trim`, a problem to fix."""
    full = growing(10)
    windowed = [h[-9:] for h in full[4:]]
    summarised = [[{"role": "user", "content": f"Summary {i}: " + words(950 + i, 160)}, *h[-9:]]
                  for i, h in enumerate(full[4:])]
    for sessions in (windowed, summarised):
        status, rows = lint(tmp_path, capsys, sessions)
        assert [r["cause"] for r in rows[1:]] == ["front_trim"] * (len(sessions) - 1)
        assert status == 1


def test_a_truncation_without_a_summary_is_front_trim(tmp_path: Path, capsys) -> None:
    before = growing(8)
    cut = [*before[-1][-4:], *exchange(7)[1:], user(8)]  # the last turn kept, nothing stands in
    status, rows = lint(tmp_path, capsys, [*before, cut])
    assert rows[8]["cause"] == "front_trim" and status == 1


def test_a_new_conversation_with_its_own_replies_is_not_a_compaction(tmp_path: Path, capsys) -> None:
    """Same system prompt and tools, a short history the tenant never sent (replies included):
    another conversation, not a summary of this one."""
    before = growing(8)
    other = [{"role": "user", "content": "hello " + words(4000, 20)},
             {"role": "assistant", "content": words(4001, 30)}, {"role": "user", "content": words(4002, 20)}]
    status, rows = lint(tmp_path, capsys, [*before, other])
    assert rows[8]["cause"] != "compaction"


# ---------------------------------------------------------------------- through the gateway

STATIC = "You are a coding agent. Follow the repository conventions; run the tests before you answer.\n" * 30
MESSAGES_TOOLS = [{"name": f"tool_{i:02d}", "description": f"Tool number {i}: reads or edits files.",
                   "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
                  for i in range(8)]


def wait_processed(hook: Any, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def test_gateway_counts_a_compaction_apart_from_breaks(sim_factory, proxy_factory) -> None:
    """A Claude-Code-shaped Messages session compacts once: the tenant report counts one
    compaction and no break, the explorer's row carries it, the metric names it."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, names=["r0"])
    client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    hook = proxy.services.prefix

    def send(n: int, messages: list[dict[str, Any]]) -> None:
        client.messages.create(model="sim", max_tokens=4, system=STATIC, tools=MESSAGES_TOOLS, messages=messages,
                               extra_headers={"x-tenant-id": "agent"})
        wait_processed(hook, n)

    history: list[dict[str, Any]] = []
    n = 0
    for t in range(6):
        history.append({"role": "user", "content": f"step {t}: " + words(100 + t, 40)})
        n += 1
        send(n, history)
        history.append({"role": "assistant", "content": words(700 + t, 160)})
    history = [{"role": "user", "content": SUMMARY}, {"role": "user", "content": "step 6: go on"}]
    for t in range(7, 9):
        n += 1
        send(n, history)
        history = [*history, {"role": "assistant", "content": words(700 + t, 40)},
                   {"role": "user", "content": f"step {t}: " + words(100 + t, 40)}]
    report = httpx.get(proxy.url + "/hygiene/tenants/agent", timeout=10).json()
    assert report["compactions"] == 1 and report["breaks"] == 0, report
    assert report["breaks_by_cause"] == {"compaction": 1} and report["last_breaks"] == []
    assert report["unmatched_blocks"]["compaction"] > 0 and report["unmatched_blocks"]["break"] == 0
    row = next(t for t in httpx.get(proxy.url + "/hygiene/tenants", timeout=10).json()["tenants"]
               if t["tenant"] == "agent")
    assert row["compactions"] == 1 and row["breaks"] == 0
    assert [r["cause"] for r in row["recent"]].count("compaction") == 1
    proxy.settle()
    assert proxy.sample("prefixgate_prefix_breaks_total", route="messages", tenant="agent", cause="compaction") == 1
    # nor billed (docs/ttft-ledger.md): its one cold turn is the price of a shorter context, not a break
    assert report["bill"] == {} and "prefixgate_break_recomputed_tokens_total{" not in proxy.metrics_text()


@pytest.mark.parametrize("interleaved", [False, True], ids=["alone", "beside-another-session"])
def test_gateway_names_a_codex_shaped_compaction_on_the_responses_route(sim_factory, proxy_factory,
                                                                        interleaved: bool) -> None:
    """A Codex-shaped Responses session compacts once: its input becomes the user messages so far
    followed by the summary. That history starts like the conversation's first request (the same
    first user message), yet the tracker compares it with the session's newest request and names
    it `compaction`: one compaction, no break, and the turns after it continue the new prefix.
    Beside another agent's session on the same tenant (a turn of it before each of this one's, so
    the tenant's newest request is never this session's) it is named the same."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, names=["r0"])
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0,
                           default_headers={"x-tenant-id": "codex"})
    hook = proxy.services.prefix
    tools = [{"type": "function", "name": name, "description": f"{name} a path in the repository",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
             for name in ("read_file", "shell", "write_file", "search")]
    sent = 0

    def message(text: str) -> dict[str, Any]:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    def tool_round(t: int, seed: int = 500) -> list[dict[str, Any]]:
        return [{"type": "function_call", "call_id": f"call_{t}", "name": "read_file",
                 "arguments": json.dumps({"path": f"src/m{t}.py"})},
                {"type": "function_call_output", "call_id": f"call_{t}", "output": words(seed + t, 220)}]

    def send(items: list[dict[str, Any]], key: str = "codex-session-1", agent: tuple[str, list] = (SYSTEM, tools)) -> None:
        nonlocal sent
        client.responses.create(model="sim", instructions=agent[0], tools=agent[1], input=items,
                                max_output_tokens=4, store=False, prompt_cache_key=key)
        sent += 1
        wait_processed(hook, sent)

    other: list[dict[str, Any]] = []
    reviewer = ("You review pull requests.\n" + words(2100, 300),
                [{"type": "function", "name": "comment", "description": "comment on a pull request",
                  "parameters": {"type": "object", "properties": {"body": {"type": "string"}}}}])

    def other_turn(t: int) -> None:  # the tenant's other session (another agent): a turn before each of this one's
        nonlocal other
        if interleaved:
            other = [*other, message(f"task {t}: " + words(2000 + t, 40))]
            send(other, key="codex-session-2", agent=reviewer)
            other = [*other, *tool_round(t, seed=2500)]

    items: list[dict[str, Any]] = []
    users: list[dict[str, Any]] = []
    for t in range(6):
        users.append(message(f"step {t}: " + words(100 + t, 40)))
        items.append(users[-1])
        other_turn(t)
        send(items)
        items += tool_round(t)
    items = [*users, message(SUMMARY)]  # Codex's compacted history: the user messages, then the summary
    for t in range(6, 8):
        other_turn(t)
        send(items)
        items = [*items, *tool_round(t), message(f"step {t}: " + words(100 + t, 40))]
    report = httpx.get(proxy.url + "/hygiene/tenants/codex", timeout=10).json()
    assert report["breaks_by_cause"] == ({"compaction": 1, "new_session": 1} if interleaved else {"compaction": 1}), report
    assert report["compactions"] == 1 and report["breaks"] == 0 and report["last_breaks"] == []
    mine = report["recent"][1::2] if interleaved else report["recent"]
    causes = [r["cause"] for r in mine]
    first = "new_session" if interleaved else None  # the tenant's other session came first
    assert causes == [first] + [None] * 5 + ["compaction", None], causes
    assert mine[-1]["continuity"] > 0.5  # the turn after it continues the compacted prefix
    assert report["unmatched_blocks"]["compaction"] > 0 and report["unmatched_blocks"]["break"] == 0
    assert report["bill"] == {}  # a compaction is not billed


def messages_body(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The same session as Claude Code sends it on /v1/messages: `system` beside the messages,
    tool calls as `tool_use` blocks, their outputs as `tool_result` blocks in a user turn."""
    turns: list[dict[str, Any]] = []
    for m in history:
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                       "input": json.loads(c["function"]["arguments"])} for c in m["tool_calls"]]
            turns.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"],
                                                       "content": m["content"]}]})
        else:
            turns.append({"role": m["role"], "content": m["content"]})
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    return {"model": "m", "max_tokens": 1024, "system": SYSTEM, "tools": tools, "messages": turns}


def test_lint_names_a_compaction_in_a_messages_session(tmp_path: Path, capsys) -> None:
    """A Claude Code session as the Messages bodies it sends: lint names its compaction, the turns
    around it continue (that its `system` is read at all: test_prefix_lint's Messages test)."""
    before = growing(8)
    after = growing(3, start=8, history=[{"role": "user", "content": SUMMARY}])
    f = tmp_path / "session.jsonl"
    f.write_text("".join(json.dumps(messages_body(h)) + "\n" for h in [*before, *after]))
    status = main(["lint", str(f), "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["cause"] for r in rows] == [None] * 8 + ["compaction", None, None], rows
    assert rows[8]["fix"].startswith(FIX) and status == 0
    assert all(r["continuity"] > 0.5 for r in rows[1:8])  # the turns before it continue their session


def _summary_replaced_by_definition(p: list[str], c: list[str]) -> tuple[int, int] | None:
    """`summary_replaced` as its docstring reads, every (k, j) tried in turn."""
    shared = 0
    while shared < min(len(p), len(c)) and p[shared] == c[shared]:
        shared += 1
    rest_p, rest_c = p[shared:-1], c[shared:]
    for k in range(1, len(rest_p) - MIN_KEPT_LINES + 1):
        kept = rest_p[k:]
        for j in range(1, min(MAX_SUMMARY_LINES, len(rest_c)) + 1):
            if rest_c[j - 1] in rest_p:
                break
            if rest_c[j:j + len(kept)] == kept and len(rest_c) - j - len(kept) >= MIN_NEW_LINES:
                return shared, shared + j
    j = _summary_of_all(rest_p, rest_c, rest_c)
    return None if j is None else (shared, shared + j)


def _full_transcript_compacted(prev: RequestSketch, cur: RequestSketch) -> bool:
    """`transcript_compacted` by its definition: every line split, every (k, j) tried."""
    p, c = last_user(prev), last_user(cur)
    if p is None or c is None or prev.system_text != cur.system_text or prev.tools_canon != cur.tools_canon:
        return False
    cur_lines = cur.text[c.start:c.end].split("\n")
    found = _summary_replaced_by_definition(prev.text[p.start:p.end].split("\n"), cur_lines)
    return found is not None and sum(len(line) for line in cur_lines[found[0]:found[1]]) >= SUMMARY_MIN_CHARS


def test_summary_replaced_finds_what_trying_every_place_finds() -> None:
    """The summary's place is searched only where the kept lines can start (their first line), and
    found where trying every place finds it, on lines drawn from a few values (many repeats, blank
    lines among them) and on compactions built to match."""
    rng = random.Random(11)
    found = 0
    for _ in range(3000):
        pool = ["", "a", "b", "Customer: c", "Assistant: d", "S1", "S2"][:rng.randint(2, 7)]
        p = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        if p and rng.random() < 0.5:  # a summary in place of p's first lines, the rest kept, two new
            k = rng.randint(0, len(p))
            c = [*p[:rng.randint(0, 2)], *["Summary " + str(i) for i in range(rng.randint(1, 4))],
                 *p[k:-1], *[rng.choice(pool) for _ in range(rng.randint(0, 3))]]
        else:
            c = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        expected = _summary_replaced_by_definition(p, c)
        assert summary_replaced(p, c) == expected, (p, c)
        found += expected is not None
    assert found > 100


def test_a_transcripts_shared_lines_skipped_read_as_every_line_split() -> None:
    """The lines two transcript messages open with alike are skipped before the lines are split
    (a long document asked again costs no split): the answer is the one the full split gives, on
    transcripts that grow, are summarised, trimmed, edited inside a shared line, cut short, or
    share nothing; both answers occur."""
    rng = random.Random(7)
    said_lines = [f"{'Customer' if i % 2 == 0 else 'Assistant'}: " + words(1200 + i, rng.randint(1, 12))
                  for i in range(24)]
    intro = "Conversation so far, kept by the chain:\n" + words(1190, 30)

    def sk(lines: list[str]) -> RequestSketch:
        content = "\n".join(lines)
        inp = prompt_input("chat", {"model": "m", "messages": [{"role": "system", "content": "S"},
                                                                {"role": "user", "content": content}]})
        header = "x" * rng.randint(0, 40)  # the message starts at another place in each prompt
        return build_sketch(inp, f"<sys>S</sys>\n<user {header}>{content}</user><assistant>")

    answers = []
    for _ in range(600):
        k = rng.randint(0, 20)
        prev = [intro, *said_lines[:k], "Assistant:"]
        if rng.random() < 0.3:  # no instructions: the transcript's first line is the message's
            prev = prev[1:]
        shape = rng.choice(("grow", "summary", "trim", "edit", "short", "other", "same"))
        if shape == "grow":
            cur = [*prev[:len(prev) - k - 1], *said_lines[:k + rng.randint(1, 3)], "Assistant:"]
        elif shape == "summary":
            cut = rng.randint(0, k)
            lead = rng.choice(("Summary: ", "Customer asked "))  # a summary may open as a speaker's line does
            summary = [lead + words(1199 + i, rng.randint(1, 14)) for i in range(rng.randint(1, 3))]
            cur = [*prev[:len(prev) - k - 1], *summary, *said_lines[cut:k + rng.randint(0, 3)], "Assistant:"]
        elif shape == "trim":
            cur = [*prev[:len(prev) - k - 1], *said_lines[rng.randint(0, k):k + 2], "Assistant:"]
        elif shape == "edit":  # a character changed inside a line both hold
            cur = list(prev)
            i = rng.randrange(len(cur))
            j = rng.randrange(len(cur[i]) + 1)
            cur[i] = cur[i][:j] + "#" + cur[i][j:]
        elif shape == "short":  # the new message is a head of the old one, cut inside a line
            text = "\n".join(prev)
            cur = text[:rng.randint(0, len(text))].split("\n")
        elif shape == "other":
            cur = [words(1300 + rng.randint(0, 99), 20), *said_lines[k:k + 3]]
        else:
            cur = list(prev)
        a, b = sk(prev), sk(cur)
        expected = _full_transcript_compacted(a, b)
        assert transcript_compacted(a, b) == expected, (shape, k)
        answers.append(expected)
    assert True in answers and False in answers
    # the fewest lines each kind of summary needs: in place of the first line (two kept, two new)
    # and in place of the whole transcript (four summed up, a question and the reply's line)
    long_summary = "Summary: " + words(1199, 14)
    for prev, cur in (([intro, *said_lines[:3], "Assistant:"], [intro, long_summary, *said_lines[1:4], "Assistant:"]),
                      ([*said_lines[:3], "Assistant:"], [long_summary, *said_lines[1:4], "Assistant:"]),
                      ([intro, *said_lines[:4], "Assistant:"], [intro, long_summary, said_lines[4], "Assistant:"])):
        a, b = sk(prev), sk(cur)
        assert _full_transcript_compacted(a, b) and transcript_compacted(a, b)
