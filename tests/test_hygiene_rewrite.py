"""app/hygiene/rewrite.py: pure, deterministic rewrites that keep every original line."""

from __future__ import annotations

import copy
import random
from collections import Counter

import orjson

from app.hygiene.findings import LineClassifier, dynamic_lines
from app.hygiene.rewrite import (
    RewriteOptions,
    apply_rewrites,
    canonical_json,
    move_dynamic,
    sort_tools,
)

STATIC = "You are the support assistant for Acme.\n" + "Refunds within 30 days; shipping 3 to 5 days.\n" * 30
HEAD = "Current time: 2026-04-14T09:31:07Z\nRequest id: req_8a7b6c5d4e\n"


def chat(system: str, user: str | list = "Where is my order?", history: tuple = ()) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system}, *history,
                                       {"role": "user", "content": user}]}


def all_lines(body: dict) -> Counter:
    out: Counter = Counter()
    for m in body["messages"]:
        content = m["content"]
        texts = [content] if isinstance(content, str) else [p["text"] for p in content]
        for text in texts:
            out.update(line for line in text.split("\n") if line)
    return out


def lines(body: dict) -> list:
    return dynamic_lines(body, LineClassifier())


def test_move_to_last_user_keeps_every_line_and_is_deterministic() -> None:
    body = chat(HEAD + STATIC)
    original = copy.deepcopy(body)
    new, moved = move_dynamic(body, lines(body))
    assert moved == 2
    assert body == original  # input untouched
    assert new["messages"][0]["content"] == STATIC
    assert new["messages"][1]["content"] == "Where is my order?\n\n" + HEAD.rstrip("\n")
    assert all_lines(new) == all_lines(body)  # every original line, nothing added or lost
    again, _ = move_dynamic(copy.deepcopy(body), lines(body))
    assert orjson.dumps(again) == orjson.dumps(new)


def test_the_static_head_becomes_identical_across_requests() -> None:
    a = chat("Current time: 2026-04-14T09:31:07Z\n" + STATIC, "q1")
    b = chat("Current time: 2026-04-14T10:02:55Z\n" + STATIC, "q2")
    ra, rb = (apply_rewrites(x, lines(x), RewriteOptions()).body for x in (a, b))
    assert ra["messages"][0] == rb["messages"][0]


def test_move_to_system_end() -> None:
    body = chat(HEAD + STATIC)
    new, _ = move_dynamic(body, lines(body), target="system_end")
    assert new["messages"][0]["content"] == STATIC + HEAD.rstrip("\n")
    assert new["messages"][1] == body["messages"][1]
    assert all_lines(new) == all_lines(body)


def test_last_line_without_newline_and_middle_lines() -> None:
    history = ({"role": "user", "content": "earlier question " * 10},
               {"role": "assistant", "content": "earlier answer " * 10})
    system = "Be brief.\nToday is 2026-04-14.\nStay polite.\nNow: 09:31:07 UTC"
    body = chat(system, history=history)
    found = lines(body)
    assert [ln.line_no for ln in found] == [2, 4]
    new, moved = move_dynamic(body, found)
    assert moved == 2
    assert new["messages"][0]["content"] == "Be brief.\nStay polite."
    assert new["messages"][-1]["content"].endswith("\n\nToday is 2026-04-14.\nNow: 09:31:07 UTC")
    assert all_lines(new) == all_lines(body)


def test_cap_and_paragraphs_move_nothing() -> None:
    many = "".join(f"Session {i}: sess_{i:08d}abc\n" for i in range(9)) + STATIC
    body = chat(many)
    assert len(lines(body)) == 9
    assert move_dynamic(body, lines(body), max_lines=8) is None
    assert move_dynamic(body, lines(body), max_lines=9) is not None
    paragraph = chat("It is 2026-04-14T09:31:07Z now. " + "Be kind. " * 200 + "\n" + STATIC)
    assert move_dynamic(paragraph, lines(paragraph)) is None


def test_list_content_user_gets_a_text_part() -> None:
    body = chat(HEAD + STATIC, user=[{"type": "text", "text": "Where is my order?"}])
    new, _ = move_dynamic(body, lines(body))
    assert new["messages"][1]["content"][-1] == {"type": "text", "text": HEAD.rstrip("\n")}


def test_no_user_message_falls_back_to_system_end() -> None:
    body = {"messages": [{"role": "system", "content": HEAD + STATIC},
                         {"role": "assistant", "content": "Hello! " * 30}]}
    new, _ = move_dynamic(body, lines(body))
    assert new["messages"][0]["content"].endswith(HEAD.rstrip("\n"))


def tool(name: str, marker: int = 0) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} #{marker}",
                                             "parameters": {"type": "object", "required": ["q"],
                                                            "properties": {"q": {"type": "string"}}}}}


def test_sort_tools_is_stable() -> None:
    tools = [tool("zeta"), tool("alpha", 1), tool("mid"), tool("alpha", 2), tool("alpha", 3)]
    new = sort_tools({"tools": tools})
    assert [t["function"]["description"] for t in new["tools"]] == \
        ["alpha #1", "alpha #2", "alpha #3", "mid #0", "zeta #0"]
    assert sort_tools(new) is None  # already sorted: nothing to change
    assert sort_tools({"tools": [tool("a")]}) is None


def test_canonical_json_sorts_every_key() -> None:
    messy = {"function": {"parameters": {"properties": {"q": {"type": "string"}}, "type": "object"},
                          "name": "find"}, "type": "function"}
    new = canonical_json({"tools": [messy]})
    out = orjson.dumps(new["tools"])
    assert out == orjson.dumps([messy], option=orjson.OPT_SORT_KEYS)
    assert out.index(b'"name"') < out.index(b'"parameters"')
    assert canonical_json(new) is None


def test_shuffled_tools_give_the_same_bytes() -> None:
    tools = [tool(n) for n in ("search", "lookup", "refund", "cancel", "escalate")]
    opts = RewriteOptions(canonical_json=True)
    outputs = set()
    for seed in range(6):
        shuffled = [orjson.loads(orjson.dumps(t)) for t in tools]
        random.Random(seed).shuffle(shuffled)
        if seed % 2:
            shuffled = [{k: t[k] for k in reversed(list(t))} for t in shuffled]
        body = {**chat(STATIC), "tools": shuffled}
        outputs.add(orjson.dumps(apply_rewrites(body, [], opts).body))
    assert len(outputs) == 1


def test_apply_rewrites_reports_only_what_changed() -> None:
    clean = {**chat(STATIC), "tools": [tool("a"), tool("b")]}
    result = apply_rewrites(clean, lines(clean), RewriteOptions())
    assert not result.changed and result.body is clean
    dirty = {**chat(HEAD + STATIC), "tools": [tool("b"), tool("a")]}
    result = apply_rewrites(dirty, lines(dirty), RewriteOptions())
    assert result.kinds == ("move_dynamic", "sort_tools") and result.moved_lines == 2
    off = RewriteOptions(move_dynamic=False, sort_tools=False)
    assert not apply_rewrites(dirty, lines(dirty), off).changed


def test_move_from_the_tail_of_the_system_prompt() -> None:
    history = ({"role": "user", "content": "My parcel is late. " * 10},
               {"role": "assistant", "content": "Let me check that for you. " * 10})
    body = chat(STATIC * 4 + "Current date: 2026-04-14", history=history)
    new, moved = move_dynamic(body, lines(body))
    assert moved == 1
    assert new["messages"][0]["content"] == (STATIC * 4).rstrip("\n")
    assert new["messages"][-1]["content"].endswith("\n\nCurrent date: 2026-04-14")
    assert all_lines(new) == all_lines(body)
