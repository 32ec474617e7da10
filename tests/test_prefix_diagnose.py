"""Break diagnosis on request pairs: each cause, each decoy, helpers (sequences: test_diagnosis_cases.py,
scores on the corpora: test_diagnosis_scores.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.prefix import tool_text
from app.prefix.conversation import past_of
from app.prefix.diagnose import diagnose, fix_for, redact, snippet
from app.prefix.dynamic import find_dynamic_spans
from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import build_sketch
from app.prefix.strings import common_prefix_len, shared_ends, suffix_opening
from app.prefix.tokens import SegmentTokenizer

STATIC = "You are the support assistant. Refunds within 30 days. Shipping takes 3 to 5 days.\n" * 20


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def sk(fpr: Fingerprinter, body: dict, tool_dump: str | None = "vllm"):
    inp = prompt_input("chat", body, tool_dump=tool_dump)
    return build_sketch(inp, fpr.render(inp))


def chat(system: str, *turns: str, tools=None) -> dict:
    roles = ["user", "assistant"]
    body = {"messages": [{"role": "system", "content": system}]
            + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}
    if tools:
        body["tools"] = tools
    return body


def cause(fpr, prev: dict, cur: dict):
    return diagnose(sk(fpr, prev), sk(fpr, cur))


def test_common_prefix_len_with_offsets() -> None:
    a = "x" * 10_000 + "abc"
    assert common_prefix_len(a, a) == len(a)
    assert common_prefix_len(a, "x" * 10_000 + "abd") == 10_002
    assert common_prefix_len("", "a") == 0
    assert common_prefix_len("hello", "help", 0, 0) == 3
    assert common_prefix_len("zzhello", "help", 2, 0) == 3


def _shared_ends_by_definition(a: list[str], b: list[str]) -> tuple[int, int]:
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return head, tail


_FEW_LINES = st.lists(st.sampled_from(["", "a", "b", "c", "1. a", "2) b", "(3) c"]), max_size=40)


@settings(max_examples=400, deadline=None)
@given(_FEW_LINES, _FEW_LINES, _FEW_LINES)
def test_shared_ends_and_suffix_opening_read_as_a_step_per_line(head: list[str], a: list[str], b: list[str]) -> None:
    """Compared as slices and found by `list.index`, the lines two texts share at their ends and the
    least k with a[k:] opening b are those a step per line finds (lines drawn from a few values:
    runs repeat)."""
    x, y = head + a, head + b + a[len(a) // 2:]
    assert shared_ends(x, y) == _shared_ends_by_definition(x, y)
    assert suffix_opening(a, b) == next(k for k in range(len(a) + 1) if b[:len(a) - k] == a[k:])
    assert suffix_opening(a, a[len(a) // 3:] + b) == next(k for k in range(len(a) + 1)
                                                          if (a[len(a) // 3:] + b)[:len(a) - k] == a[k:])
    for first in (1, len(a) // 2):  # the least k from `first` on
        assert suffix_opening(a, b, first) == next((k for k in range(first, len(a)) if b[:len(a) - k] == a[k:]), len(a))


def _lines_permuted_by_definition(prev_text: str, cur_text: str) -> tuple[bool, bool]:
    """`lines_permuted` with every reading computed for every line."""
    p, c = prev_text.splitlines(), cur_text.splitlines()
    i, s = _shared_ends_by_definition(p, c)
    pw, cw = p[i:len(p) - s], c[i:len(c) - s]
    if len(pw) < 2 or pw == cw:
        return False, False
    if sorted(pw) == sorted(cw):
        return True, tool_text.tool_entries(cw) or tool_text.tool_blocks(pw, cw) or \
            tool_text.templated_blocks(pw, cw) or tool_text.in_code_block(c, i, len(c) - s)
    pu, cu = [tool_text._ENUMERATOR.sub("", ln, count=1) for ln in pw], [tool_text._ENUMERATOR.sub("", ln, count=1) for ln in cw]
    if pu != cu and sorted(pu) == sorted(cu) and sum(map(bool, map(tool_text._ENUMERATOR.match, cw))) >= 2:
        return True, tool_text.tool_entries(cw)
    pn, cn = [tool_text._POSITION_NUMBER.sub("#", ln) for ln in pw], [tool_text._POSITION_NUMBER.sub("#", ln) for ln in cw]
    if pn != cn and sorted(pn) == sorted(cn) and any(tool_text._BANNER_NAME.match(ln) for ln in cn):
        return True, tool_text.tool_blocks(pn, cn)
    return False, False


_TOOL_LINES = ["You are an agent.", "", "1. search: find pages", "2. fetch: read a page", "(3) shell: run a command",
               "- search(query): find pages", "- fetch(url): read a page", "BEGIN FUNCTION #1: search",
               "BEGIN FUNCTION #2: fetch", "END FUNCTION", "```python", "```", "def search(query): ...",
               "Answer briefly.", "Version 2.1 of the rules."]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_TOOL_LINES), min_size=0, max_size=14), st.randoms(use_true_random=False),
       st.sampled_from(["shuffle", "renumber", "edit", "other"]))
def test_lines_permuted_reads_as_every_reading_of_every_line(lines: list[str], rng, how: str) -> None:
    """The checks that skip work (as many lines, the same set, numbered lines present, a block's
    number anywhere) answer as computing every reading of every line does."""
    moved = list(lines)
    if how == "shuffle":
        rng.shuffle(moved)
    elif how == "renumber":
        moved = [ln.replace("1", "2") if rng.random() < 0.5 else ln for ln in moved]
        rng.shuffle(moved)
    elif how == "edit" and moved:
        moved[rng.randrange(len(moved))] = "Answer at length."
    else:
        moved = [rng.choice(_TOOL_LINES) for _ in range(rng.randint(0, 14))]
    prev, cur = "\n".join(["Head.", *lines, "Tail."]), "\n".join(["Head.", *moved, "Tail."])
    assert tool_text.lines_permuted(prev, cur) == _lines_permuted_by_definition(prev, cur)


def test_dynamic_head_located(fpr) -> None:
    d = cause(fpr, chat("Current time: 2026-04-14T09:31:07Z\n" + STATIC, "q1"),
              chat("Current time: 2026-04-14T09:32:55Z\n" + STATIC, "q2"))
    assert d.cause == "dynamic_head"
    assert d.spans[0].text == "2026-04-14T09:32:55Z" and d.spans[0].kind == "timestamp"
    fix = fix_for(d, sk(fpr, chat("Current time: 2026-04-14T09:32:55Z\n" + STATIC, "q2")).text)
    assert fix is not None and "`Current time: …`" in fix


def test_continuation_is_not_a_break_and_a_new_question_is_a_new_session(fpr) -> None:
    assert cause(fpr, chat(STATIC, "q1"), chat(STATIC, "q1", "a1", "q2")).cause is None
    d = cause(fpr, chat(STATIC, "What is the refund window?"), chat(STATIC, "How long is shipping?"))
    assert d.cause == "new_session" and not d.is_break  # a new conversation over the same head


def test_decoy_static_date_is_not_dynamic(fpr) -> None:
    head = "Policy effective 2025-01-01, id 550e8400-e29b-41d4-a716-446655440000.\n"
    assert cause(fpr, chat(head + STATIC, "a"), chat(head + STATIC, "b")).cause == "new_session"
    edited = STATIC.replace("30 days", "45 days", 1)
    assert cause(fpr, chat(head + STATIC, "a"), chat(head + edited, "a")).cause == "template_change"


def test_decoy_dynamic_at_the_end_is_no_break(fpr) -> None:
    turns = ("first question " * 10, "first answer " * 10)
    first = sk(fpr, chat(STATIC, turns[0]))  # the conversation so far: its first turn was sent before
    prev = sk(fpr, chat(STATIC, *turns, "q\nCurrent time: 2026-04-14T09:31:07Z"))
    cur = sk(fpr, chat(STATIC, *turns, "q\nCurrent time: 2026-04-14T09:35:07Z"))
    assert diagnose(prev, cur, past=past_of([first, prev])).cause is None
    d = cause(fpr, chat(STATIC + "Now: 2026-04-14 09:31:07", "q"), chat(STATIC + "Now: 2026-04-14 09:39:01", "other q"))
    assert d.cause == "new_session"  # only the question follows the value: nothing reusable was lost


def test_dynamic_end_of_system_breaks_a_conversation(fpr) -> None:
    turns = ("first question " * 10, "first answer " * 10, "second")
    d = cause(fpr, chat(STATIC + "Now: 2026-04-14 09:31:07", *turns[:1]),
              chat(STATIC + "Now: 2026-04-14 09:39:01", *turns))
    assert d.cause == "dynamic_head"


def test_tool_order(fpr) -> None:
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "abc"]
    assert cause(fpr, chat(STATIC, "q", tools=tools), chat(STATIC, "q", tools=tools[::-1])).cause == "tool_order"
    schema = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}]
    keyed = [{"type": "function", "function": {"name": "a", "parameters": {"properties": {}, "type": "object"}}}]
    assert cause(fpr, chat(STATIC, "q", tools=schema), chat(STATIC, "q", tools=keyed)).cause == "tool_order"


@pytest.mark.parametrize(("tool_dump", "expected"), [("vllm", None), ("sglang", "tool_order"), (None, "tool_order")])
def test_a_functions_member_reorder_breaks_only_an_engine_that_keeps_the_order(fpr, tool_dump, expected) -> None:
    """vLLM dumps a function's members in its model's order (app/prefix/tool_dump.py): the same
    prompt, no break; SGLang keeps the client's order, as does an engine rendering as sent."""
    fn = {"name": "a", "description": "does a", "parameters": {"type": "object"}}
    tools = [{"type": "function", "function": fn}, {"type": "function", "function": {"name": "b"}}]
    reordered = [{"type": "function", "function": dict(reversed(fn.items()))}, tools[1]]
    turns = ("first question " * 10, "first answer " * 10)
    prev = sk(fpr, chat(STATIC, *turns[:1], tools=tools), tool_dump)
    cur = sk(fpr, chat(STATIC, *turns, "second", tools=reordered), tool_dump)
    d = diagnose(prev, cur)
    assert (d.cause if d else None) == expected


def test_a_tools_top_level_reorder_is_no_break_on_either_engine(fpr) -> None:
    """Both engines dump a tool as `type, function[, defer_loading]` whatever order it came in."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "abc"]
    keyed = [{"function": t["function"], "type": t["type"]} for t in tools]
    for tool_dump in ("vllm", "sglang"):
        assert sk(fpr, chat(STATIC, "q", tools=tools), tool_dump).text == \
            sk(fpr, chat(STATIC, "q", tools=keyed), tool_dump).text


def test_front_trim(fpr) -> None:
    turns = [f"turn {i} " * 20 for i in range(8)]
    assert cause(fpr, chat(STATIC, *turns[:7]), chat(STATIC, *turns[2:8], "new")).cause == "front_trim"


def test_new_session_and_template_change(fpr) -> None:
    other = "Translate everything into formal Japanese. Never explain.\n" * 10
    assert cause(fpr, chat(STATIC, "q"), chat(other, "q")).cause == "new_session"
    assert cause(fpr, chat(STATIC, "q"), chat("IMPORTANT: be brief.\n" + STATIC, "q")).cause == "template_change"


def test_question_before_docs(fpr) -> None:
    docs = "Section: the returns procedure requires form 7 and a sign-off.\n" * 30
    d = cause(fpr, chat("Be helpful.", f"Who signs?\n{docs}"), chat("Be helpful.", f"Which form?\n{docs}"))
    assert d.cause == "question_first"


def test_redaction_hides_text() -> None:
    text = "Current time: 2026-04-14T09:31:07Z\nSecret plan"
    spans = find_dynamic_spans(text)
    red = redact(text, spans)
    assert "Secret" not in red and "2026" not in red and "<timestamp>" in red
    assert snippet(text, 14, spans, show_text=True) == text[:94]
    assert "Secret" not in snippet(text, 14, spans, show_text=False)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x3000), max_size=80) | st.text(max_size=80))
def test_redaction_keeps_the_shape_of_any_text(text: str) -> None:
    """Letters become x and digits 9 by Unicode's definitions, whatever path a text takes (an
    ASCII text is mapped by a translation table, anything else character by character)."""
    shape = "".join("9" if ch.isdigit() else "x" if ch.isalpha() else ch for ch in text)
    assert redact(text) == shape
    assert redact(text + "é") == shape + "x" and redact(text + "٣") == shape + "9"




def _realignment_per_anchor(prev: str, cur: str, d: int, material: int, pd: int | None = None,
                            prev_end: int | None = None):
    """find_realignment as it was before the probe skip, the end cut and the line tails: every
    anchor searched, up to the prompt's end (the reference)."""
    from app.prefix.realign import ANCHOR_CHARS, _anchors, realign_at

    p0 = d if pd is None else pd
    p1 = len(prev) if prev_end is None else min(len(prev), prev_end)
    for c in _anchors(cur, d + 1, len(cur)):
        anchor = cur[c:c + ANCHOR_CHARS]
        if len(anchor) < min(ANCHOR_CHARS, material) or not anchor.strip():
            continue
        found = realign_at(prev, cur, c, p0, material, p1)
        if found is not None:
            return found
    return None


_WORD = st.sampled_from(["alpha", "beta", "gamma", "delta", "x", "\n", " ", "  ", ", ", "id=42", "Ü"])


@settings(max_examples=300, deadline=None)
@given(words=st.lists(_WORD, min_size=20, max_size=400), cut=st.floats(0, 1), cut2=st.floats(0, 1),
       insert=st.lists(_WORD, max_size=60), material=st.sampled_from([16, 24, 40, 64, 96]),
       tails_after=st.sampled_from([0, 1, 4]), shift=st.integers(-30, 30), bound=st.none() | st.integers(0, 400))
def test_probe_skip_finds_the_same_realignment(words: list[str], cut: float, cut2: float, insert: list[str],
                                               material: int, tails_after: int, shift: int, bound: int | None) -> None:
    # tails_after: line tails gathered after that many failed probes (0: from the first anchor on)
    from unittest import mock

    from app.prefix import realign

    prev = "".join(words)
    a = int(cut * len(prev))
    b = max(a, int(cut2 * len(prev)))
    with mock.patch.object(realign, "PROBES_BEFORE_FILTERS", tails_after):
        for cur in (prev[:a] + "".join(insert) + prev[a:], prev[:a] + prev[b:], prev[:a] + "".join(insert) + prev[b:]):
            d = min(a, len(cur) - 1)
            pd = max(0, min(len(prev), d + shift))
            prev_end = None if bound is None else pd + bound
            assert realign.find_realignment(prev, cur, d, material) == _realignment_per_anchor(prev, cur, d, material)
            assert (realign.find_realignment(prev, cur, d, material, pd, prev_end)
                    == _realignment_per_anchor(prev, cur, d, material, pd, prev_end))


def test_a_run_whose_anchor_ends_at_the_bound_is_found() -> None:
    # the bound is where an anchor may start (it ends before `prev_end`); the run, and the probe
    # for it, may reach past it
    from app.prefix.realign import Realignment, find_realignment

    static = "".join(chr(0x4E00 + i) for i in range(100))  # no word starts, no repeats
    prev, cur = "zz " + static, "yy " + static
    assert find_realignment(prev, cur, 0, 40, 0, 27) == Realignment(3, 3, 100)
    assert find_realignment(prev, cur, 0, 40, 0, 26) is None  # the anchor would end past it


@pytest.mark.parametrize("material", [64, 96])
def test_a_run_of_exactly_material_on_a_long_line_is_found_wherever_it_lies(material: int) -> None:
    # sampled pieces (a long line from a line start): a run no longer than `material`, at every
    # offset from the sampling grid, and with its anchor ending at the bound or not
    from unittest import mock

    from app.prefix import realign

    def unique(n: int, base: int) -> str:
        return "".join(chr(base + i) for i in range(n))

    run = unique(material, 0x4E00)
    stride = material - realign.ANCHOR_CHARS + 1
    with mock.patch.object(realign, "PROBES_BEFORE_FILTERS", 0):
        for shift in range(stride + 2):
            prev = unique(40 + shift, 0x3400) + run + unique(30, 0x0400)
            cur = unique(20, 0xAC00) + "\n" + run + unique(30, 0x0600)
            at = 40 + shift
            for prev_end in (None, at + realign.ANCHOR_CHARS, at + realign.ANCHOR_CHARS - 1):
                found = realign.find_realignment(prev, cur, 0, material, 0, prev_end)
                assert found == _realignment_per_anchor(prev, cur, 0, material, 0, prev_end)
                assert found == (None if prev_end == at + realign.ANCHOR_CHARS - 1 else realign.Realignment(at, 21, material))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=1500), a=st.integers(0, 1500), b=st.integers(0, 1500),
       before=st.one_of(st.none(), st.text(max_size=700)))
def test_span_key_is_the_key_of_the_joined_text(text: str, a: int, b: int, before: str | None) -> None:
    # turn keys are stored in the Store and compared across pods: the same value as before, uncopied
    import hashlib

    from app.prefix.conversation import KEY_SIZE, span_key

    start, end = sorted((min(a, len(text)), min(b, len(text))))
    joined = text[start:end] if before is None else f"{before}\x01{text[start:end]}"
    raw = f"user\x00{len(joined)}\x00{joined[:512]}\x00{joined[-512:]}".encode("utf-8", "surrogatepass")
    assert span_key("user", text, start, end, before) == hashlib.blake2b(raw, digest_size=KEY_SIZE // 2).hexdigest()


def _anchors_reference(cur: str, start: int) -> list[int]:
    """Anchors a step per character: `start`, every position after one of the separators within
    NEAR_WINDOW (half of MAX_ANCHORS at most), then line starts within LINE_WINDOW."""
    from app.prefix.realign import LINE_WINDOW, MAX_ANCHORS, NEAR_WINDOW

    out: list[int] = []
    end = min(len(cur), start + NEAR_WINDOW)
    for i in range(start, end):
        if i == start or cur[i - 1] in " \n\t\"'>:,.;":
            out.append(i)
        if len(out) >= MAX_ANCHORS // 2:
            break
    pos = cur.find("\n", end)
    while 0 <= pos < start + LINE_WINDOW and len(out) < MAX_ANCHORS:
        out.append(pos + 1)
        pos = cur.find("\n", pos + 1)
    return out


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab \n\t\"'>:,.;xy", max_size=1200), st.integers(min_value=0, max_value=1300),
       st.integers(min_value=-10, max_value=1300))
def test_anchors_equal_a_step_per_character_reference(cur: str, start: int, last: int) -> None:
    from app.prefix.realign import _anchors

    assert _anchors(cur, start, len(cur)) == _anchors_reference(cur, start)
    assert _anchors(cur, start, last) == [a for a in _anchors_reference(cur, start) if a <= last]


@pytest.mark.parametrize(("before", "cause"), [("", "question_first"), ("See the appendix first. " * 40, "question_first"),
                                               ("Old notes. " * 9000, "new_session")])
def test_a_question_before_a_document_is_told_when_it_realigns_within_the_anchors_reach(before: str, cause: str) -> None:
    """In the last turn a re-alignment is what makes a divergence a break (the same document pushed
    back by a question), and it is searched where the anchors reach in both prompts (LINE_WINDOW):
    the document found again after less than 64 KB of other text in the previous prompt is a
    `question_first`; after ~100 KB it is another conversation, as another document is (found out
    by 64 KB scans of the previous prompt instead of 1 MB ones)."""
    from app.prefix.diagnose import diagnose
    from app.prefix.fingerprint import Fingerprinter, prompt_input
    from app.prefix.realign import LINE_WINDOW
    from app.prefix.sketch import build_sketch
    from app.prefix.tokens import SegmentTokenizer

    fpr = Fingerprinter(SegmentTokenizer.load())
    assert (len(before) < LINE_WINDOW) == (cause == "question_first")
    document = " ".join(f"clause {i % 211} of the lease binds the tenant" for i in range(3000))

    def sketch(user: str):
        inp = prompt_input("chat", {"messages": [{"role": "system", "content": "You answer from the lease."},
                                                 {"role": "user", "content": user}]})
        return build_sketch(inp, fpr.complete_sync(fpr.prepare(inp, 16)).text or "")

    prev = sketch(before + document)
    cur = sketch("Which clause covers the deposit? Answer with its number only. " + document)
    assert diagnose(prev, cur).cause == cause
