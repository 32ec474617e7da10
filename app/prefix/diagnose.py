"""Why did the cache miss: the first divergence between two prompts of a tenant, its cause, and
the other causes further down. Definitions and examples: docs/diagnosis.md.

Pure functions over two `RequestSketch`es (the previous request the current one is compared with,
and the current one) plus what the tenant sent before (`TenantPast`: which conversations exist).

A divergence costs reusable content (a *break*) when
- it lies before the part of the current prompt expected to vary (its last user turn and what
  follows) and before the end of the previous prompt's reusable part (a trailing system message
  after the history is not reusable) by at least `material` characters, or
- after it, the two prompts re-align for at least `material` characters (static content was
  pushed behind something variable, so the engine recomputes content it already had).

Causes (the first divergence in prompt order is the primary one; the next divergences after each
re-alignment are secondary findings):
- `front_trim`: the system part is unchanged and the history starts later (early turns dropped or
  summarised), possibly after the first message or exchange kept pinned (a sliding window that
  keeps the task).
- `tool_order`: the same tools in another order, or the same tool with its (nested) keys in
  another order, where the divergence lies in the rendered tools; or tool entries listed in the
  system text in another order; or JSON tool schemas written into the message where the prompts
  diverge, in another order. Tools added or removed at the same time are a secondary
  `template_change`.
- `dynamic_head`: the divergence is a changed per-request value (app/prefix/dynamic.py: a known
  pattern, or a changed token whose shape or key marks it as per-request); the span is that value.
- `new_session`: a new conversation. The current request matches the previous ones only through
  the static head and none of its messages continues a conversation the tenant sent before (it
  does not contain the last user turn of any earlier request), or its system prompt is another
  agent's. Not a problem: counted apart from breaks (docs/diagnosis.md).
- `template_change`: the system prompt, the tools or the template's own text were edited.
- `history_edit`: an earlier turn of a continuing conversation was re-sent with other text (or a
  turn inserted or removed before the last one).
- `question_first`: the last user turn starts with variable text and static text follows it.
- `compaction`: the agent compacted its context: the system prompt and tools are kept, at most half
  of the history's text is left (or half of its messages, in less text unless the earlier user
  messages are kept before the summary: it may outweigh short turns), and a message the
  previous history did not have stands in for the dropped turns (a summary: before the newest turn, or as the newest message after the kept
  user messages, Codex's shape). Paid once: the session continues from the new prefix. Not a
  problem: counted apart from breaks, as `new_session` is. A history trimmed a little on every
  turn keeps its length and stays `front_trim`. A transcript kept in the newest user message
  compacts there: a summary line in place of its first lines (app/prefix/transcript.py).

The tests it combines have modules of their own: conversation keys (app/prefix/conversation.py),
re-alignment (app/prefix/realign.py), trims and compactions (app/prefix/history_shape.py), a
transcript in one message (app/prefix/transcript.py), tools in the prompt text
(app/prefix/tool_text.py) and the changed value (app/prefix/value_change.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.prefix.conversation import TenantPast, continues, past_of, system_key
from app.prefix.dynamic import DynamicDetector, Span, get_detector
from app.prefix.history_shape import compacted, front_trimmed, reusable_end, tail_start
from app.prefix.realign import LINE_WINDOW, NEAR_WINDOW, Realignment, find_realignment
from app.prefix.sketch import Region, RequestSketch
from app.prefix.strings import common_prefix_len
from app.prefix.tool_text import lines_permuted, region_schemas_reordered, tool_change, tools_span
from app.prefix.transcript import grew_in_place, system_transcript
from app.prefix.value_change import before_space, changed_value, line_bounds
from app.prefix.value_kind import whole_value_start

CAUSES = ("dynamic_head", "tool_order", "front_trim", "template_change", "history_edit",
          "question_first", "new_session", "compaction")
NOT_A_PROBLEM = frozenset({"new_session", "compaction"})
MAX_SECONDARY = 4


@dataclass
class Finding:
    """A secondary cause: where it is and, for a dynamic value, which value."""

    cause: str
    char_offset: int
    spans: list[Span] = field(default_factory=list)
    detail: str = ""


@dataclass
class Diagnosis:
    cause: str | None  # None: no break
    char_offset: int  # first divergent character in the current prompt
    spans: list[Span] = field(default_factory=list)  # the changed dynamic value(s) at the divergence
    realigned: Realignment | None = None
    detail: str = ""
    secondary: list[Finding] = field(default_factory=list)  # further causes, in prompt order
    # where one token changed that no rule judged (`ValueChange.edit_at`): the tenant's records keep it, so
    # that the same place changing again reads as a per-request value
    edit_at: str | None = None

    @property
    def is_break(self) -> bool:
        return self.cause is not None and self.cause not in NOT_A_PROBLEM


def _first_text(sk: RequestSketch) -> str:
    """What tells one agent's prompt from another's: its system text, or its first 4 KB."""
    return sk.system_text if sk.system_text is not None else sk.text[:4096]


def _similar(a: list[str], b: list[str]) -> float:
    """Share of the non-blank lines `a` also in `b` (0..1), both a text's `splitlines()`; cheap
    similarity for edited vs replaced."""
    la = list(filter(str.strip, a))  # the non-blank lines, at C speed (a 1 MB system prompt)
    if not la or not b:
        return 0.0
    lb = set(filter(str.strip, b))
    return sum(map(lb.__contains__, la)) / len(la)


@dataclass
class _Pair:
    prev: RequestSketch
    cur: RequestSketch
    material: int
    detector: DynamicDetector
    past: TenantPast
    _system_lines: tuple[list[str], list[str]] | None = field(default=None, init=False, repr=False)

    def system_lines(self) -> tuple[list[str], list[str]]:
        """Both prompts' `_first_text` as `splitlines()`, split once: the reordering check (which
        reads two system texts) and the similarity of a new conversation both read them (a 1 MB
        context: ~0.7 ms a split)."""
        if self._system_lines is None:
            self._system_lines = (_first_text(self.prev).splitlines(), _first_text(self.cur).splitlines())
        return self._system_lines

    def loses(self, pd: int, cd: int) -> tuple[bool, Realignment | None]:
        """Is the divergence at (pd, cd) a break: reusable content lost or pushed back?"""
        end = reusable_end(self.prev)
        # in the last turn (where a re-alignment is what makes the divergence a break: a question
        # put before a document) what re-aligns starts within the anchors' reach in both prompts:
        # another document is then ruled out by 64 KB scans of the previous prompt, not 1 MB ones
        prev_end = pd + LINE_WINDOW + NEAR_WINDOW + self.material if cd >= tail_start(self.cur) else None
        realign = find_realignment(self.prev.text, self.cur.text, cd, self.material, pd, prev_end)
        if realign is not None and realign.prev_offset >= end:
            realign = None  # what re-aligns was not reusable in the previous prompt (a trailing system message)
        limit = min(tail_start(self.cur) - cd, end - pd)
        return limit >= self.material or realign is not None, realign

    def classify(self, pd: int, cd: int, realign: Realignment | None, primary: bool) -> Diagnosis:
        prev, cur = self.prev, self.cur
        if primary and compacted(prev, cur):
            return Diagnosis("compaction", cd, [], realign, "the history was replaced by a summary")
        first_history = cur.first_history_start()
        system_same = prev.system_text == cur.system_text
        if (system_same or not primary) and cd >= min(first_history, prev.first_history_start()) - 64 \
                and front_trimmed(prev, cur):  # (a secondary one follows a changed value in the system part)
            return Diagnosis("front_trim", cd, [], realign, "history was cut or summarised at the front")
        tools_at = tools_span(cur)
        prev_tools_at = tools_span(prev)
        reordered, set_changed, tool_detail = tool_change(prev, cur) if (prev.tools_raw or cur.tools_raw) \
            else (False, False, "")
        in_tools = (tools_at is not None and tools_at[0] - 32 <= cd <= tools_at[1]) or \
            (prev_tools_at is not None and prev_tools_at[0] - 32 <= pd <= prev_tools_at[1])
        if in_tools and reordered:
            extra = [Finding("template_change", cd, [], "tools added or removed")] if set_changed else []
            return Diagnosis("tool_order", cd, [], realign, tool_detail, extra)
        region = cur.region_at(cd)
        in_system = region is not None and region.role in ("system", "developer")
        permuted = False
        if in_system and prev.system_text is not None and cur.system_text is not None:
            permuted, tool_like = lines_permuted(prev.system_text, cur.system_text, self.system_lines())
            if permuted and tool_like:  # before values: swapped entries differ in a name that may look like one
                return Diagnosis("tool_order", cd, [], realign, "tools listed in the system text, other order")
        if region is not None and region_schemas_reordered(prev, cur, pd, region):
            return Diagnosis("tool_order", cd, [], realign, "tool schemas written in the prompt text, other order")
        if permuted:
            return Diagnosis("template_change", cd, [], realign, "system prompt lines reordered")
        # a user turn or a tool result before the last turn (a client that refreshes a prefetched tool
        # result, its call fixed, before every model call)
        earlier_turn = region is not None and first_history <= cd < tail_start(cur) and (
            region.role in ("user", "tool") or region.role == "assistant" and _opens_conversation(cur, region))
        value = changed_value(self.detector, prev.text, cur.text, pd, cd, region.end if region is not None else None,
                              earlier_turn, self.past.edits, region.start if in_system and region is not None else None)
        edit_at = value.edit_at if value is not None else None
        if value is not None and value.span is not None:
            # realigned right after the value: later findings are searched from there (also inside a
            # tool's description: a date put there per request)
            span, pend = value.span, value.prev_end
            after = Realignment(pend, span.end, common_prefix_len(prev.text, cur.text, pend, span.end))
            return Diagnosis("dynamic_head", span.start, [span], after,
                             "a per-request value precedes static content", edit_at=edit_at)
        if in_tools and set_changed:
            return Diagnosis("template_change", cd, [], realign, tool_detail)
        if reordered and tools_at is None:
            return Diagnosis("tool_order", cd, [], realign, tool_detail)
        last_turn = region is not None and region.role == "user" and region.start <= tail_start(cur) <= cd
        if last_turn and realign is not None and realign.cur_offset < region.end:  # type: ignore[union-attr]
            return Diagnosis("question_first", cd, [], realign, "variable text precedes static text in the last turn")
        if primary and cur.kind == "chat":
            new = self.new_conversation(cd, realign)
            if new is not None:
                return new
        if cur.kind != "chat" or in_system or cd < first_history or set_changed:
            return Diagnosis("template_change", cd, [], realign, "system prompt or template edited", edit_at=edit_at)
        if last_turn:
            return Diagnosis("question_first", cd, [], realign, "variable text precedes static text in the last turn")
        return Diagnosis("history_edit", cd, [], realign, "an earlier turn was re-sent with other text",
                         edit_at=edit_at)

    def new_conversation(self, cd: int, realign: Realignment | None) -> Diagnosis | None:
        """`new_session` when the current request starts a conversation (see the module docstring):
        another agent's system prompt, or a head shared with earlier requests followed by turns
        that continue none of the tenant's conversations."""
        prev, cur = self.prev, self.cur
        first_history = cur.first_history_start()
        if cd < first_history - 64 and cd < tail_start(cur):
            if realign is not None and realign.common >= self.material * 4:
                return None
            skey = system_key(cur)
            known_agent = skey is not None and skey in self.past.systems and cur.system_text != prev.system_text
            first_prev, first_cur = _first_text(prev), _first_text(cur)
            shared = common_prefix_len(first_cur, first_prev)
            lines_prev, lines_cur = self.system_lines()
            # less than half the lines shared, and at the start less than 64 characters or than the
            # first line (two agents' prompts may open with the same sentence; round 49)
            other = _similar(lines_cur, lines_prev) < 0.5 and (shared < 64 or "\n" not in first_cur[:shared])
            if (known_agent or other) and not (cur.system_text == prev.system_text and continues(cur, self.past)):
                return Diagnosis("new_session", cd, [], realign, "another agent's prompt: a new conversation")
            return None
        if continues(cur, self.past):
            return None
        return Diagnosis("new_session", cd, [], realign, "a new conversation over the shared head")


def diagnose(prev: RequestSketch, cur: RequestSketch, material: int = 96,
             extra_patterns: tuple[str, ...] = (), past: TenantPast | None = None,
             own_conversation: bool = True) -> Diagnosis:
    """Compare the current prompt with a previous one: is it a break, why, and what else differs.
    `past`: the tenant's earlier conversations (default: only `prev`'s). `own_conversation`
    False: `prev` is another conversation of the tenant (the current one's last request is not
    held), so only a divergence in the head is diagnosed: what follows it is another history."""
    if past is None:
        past = past_of([prev])
    pair = _Pair(prev, cur, material, get_detector(tuple(extra_patterns)), past)
    a, b = prev.text, cur.text
    d = common_prefix_len(a, b)
    if d >= len(b) or d >= len(a):
        return Diagnosis(None, d, detail="continues the previous prompt")
    if not own_conversation and d >= min(cur.first_history_start(), prev.first_history_start()) - 64:
        return Diagnosis(None, d, detail="the conversation's previous request is not held: head unchanged")
    lost, realign = pair.loses(d, d)
    if not lost and (prev.tools_raw or cur.tools_raw):
        at = tools_span(cur)  # an unstable tool order costs more when it is earlier: always say so
        if at is not None and at[0] - 32 <= d <= at[1] and tool_change(prev, cur)[0]:
            lost = True
    if not lost:
        if cur.kind == "chat" and compacted(prev, cur):  # a short compacted history loses little, and is one
            return Diagnosis("compaction", d, [], None, "the history was replaced by a summary")
        if cur.kind == "chat" and grew_in_place(prev, cur, d):
            return Diagnosis(None, d, detail="the newest message grew in place (a transcript in one message)")
        if cur.kind == "chat" and cur.regions and not continues(cur, past):
            return Diagnosis("new_session", d, [], None, "a new conversation over the shared head")
        return Diagnosis(None, d, detail="diverges in the part expected to vary")
    kept_in_system = system_transcript(prev, cur) if cur.kind == "chat" else None
    if kept_in_system == "grew":
        return Diagnosis(None, d, detail="the conversation kept in the system text grew in place")
    if kept_in_system == "trimmed":
        return Diagnosis("front_trim", d, [], realign, "the conversation kept in the system text lost its first lines")
    diag = pair.classify(d, d, realign, primary=True)
    if diag.cause not in NOT_A_PROBLEM:  # what follows a new start is not a finding of its own
        diag.secondary = _secondary(pair, diag)
        if diag.cause == "dynamic_head" and diag.secondary:
            _one_value_per_line(cur, diag)
    return diag


def _opens_conversation(sk: RequestSketch, region: Region) -> bool:
    """Is this assistant message before the first user message (a chat widget's welcome, written
    by the client with its status lines, not a reply of the model; round 26)?"""
    return not any(r.role == "user" and r.start < region.start for r in sk.regions)


def _one_value_per_line(cur: RequestSketch, diag: Diagnosis) -> None:
    """Values found one after another in the value of one `key: value` line are that line's value,
    whole (`Schmelze: 1.496 °C, 1,7 t flüssig`: one value, not a temperature and a secondary
    weight; round 24; or the value again, wider: `1:56.160` then `1:56.160 (car 31)`, round 25, also
    when the wider one opens before it: `6` then `chamber 6 of 14, 326 kg/h`, round 28): the
    primary's span becomes the value from after the key to the line's end, and the secondary values
    inside it go."""
    first = diag.spans[0] if diag.spans else None
    if first is None:
        return
    text = cur.text
    line0, line1 = line_bounds(text, first.start)
    region = cur.region_at(first.start)
    end = min(line1, region.end if region is not None else len(text))
    inside = [f for f in diag.secondary if f.cause == "dynamic_head" and f.spans
              and line0 <= f.spans[0].start and first.start < f.spans[-1].end <= end]
    vs = whole_value_start(text[line0:first.start]) if inside else None
    if vs is None:
        return
    end = before_space(text, line0, end)
    diag.spans = [Span(line0 + vs, end, first.kind, text[line0 + vs:end])] + diag.spans[1:]
    diag.secondary = [f for f in diag.secondary if not any(f is g for g in inside)]


def _secondary(pair: _Pair, diag: Diagnosis) -> list[Finding]:
    """The next divergences after each re-alignment, diagnosed the same way (prompt order)."""
    out: list[Finding] = list(diag.secondary)
    seen = {diag.cause, *(f.cause for f in out)}
    a, b = pair.prev.text, pair.cur.text
    realign = diag.realigned
    head = pair.cur.first_history_start()
    for _ in range(16):
        if realign is None or len(out) >= MAX_SECONDARY:
            break
        pd = realign.prev_offset + common_prefix_len(a, b, realign.prev_offset, realign.cur_offset)
        cd = realign.cur_offset + (pd - realign.prev_offset)
        if cd >= len(b) or pd >= len(a):
            break
        lost, nxt = pair.loses(pd, cd)
        if not lost:
            break
        found = pair.classify(pd, cd, nxt, primary=False)
        cause = found.cause or ""
        if diag.cause == "tool_order" and cause == "template_change" and cd < head:
            cause = ""  # the rest of the reordered entries, not an edit of its own
        if cause and (cause == "dynamic_head" or cause not in seen):
            out.append(Finding(cause, found.char_offset, found.spans, found.detail))
            seen.add(cause)
        realign = found.realigned
    return out


# ---------------------------------------------------------------------- presentation

def fix_for(diag: Diagnosis, text: str | None = None, show_text: bool = True) -> str | None:
    """The advice for a diagnosis; quotes the prompt only when `show_text`."""
    if diag.cause is None:
        return None
    if diag.cause == "dynamic_head":
        span = diag.spans[0] if diag.spans else None
        if span is not None and span.kind == "billing_header":
            return "drop Claude Code's x-anthropic-billing-header block (the `rewrite` policy does)"
        label = f"the {span.kind} value" if span else "the dynamic value"
        if show_text and span is not None and text is not None:
            line_start = text.rfind("\n", 0, span.start) + 1
            key = text[line_start:span.start].strip()
            label = f"`{key} …`" if key else f"`{span.text}`"
        return f"move {label} below the static content (e.g. into the last user message)"
    return {
        "tool_order": "send tools in a stable order (sort by name) with a fixed JSON key order",
        "front_trim": "keep the head of the history stable: trim or summarise in large, rare steps",
        "template_change": "the system prompt, tools or chat template changed; if this repeats, pin it",
        "history_edit": "re-send earlier turns byte-identical (the assistant text and tool results as received)",
        "question_first": "put the variable question after the static documents in the last turn",
        "new_session": "a new conversation: only the shared head can be reused (expected, nothing to fix)",
        "compaction": "expected: one cold turn (the history was compacted into a summary; later turns "
                      "continue the new prefix)",
    }.get(diag.cause, "keep everything before the last turn byte-identical between requests")


def redact(text: str, spans: list[Span] | None = None) -> str:
    """Shape without content: dynamic values become <kind>, letters x, digits 9."""
    out: list[str] = []
    cursor = 0
    for span in spans or []:
        if span.start < cursor:
            continue
        out.append(_mask(text[cursor:span.start]))
        out.append(f"<{span.kind}>")
        cursor = span.end
    out.append(_mask(text[cursor:]))
    return "".join(out)


# ASCII's digits and letters are exactly its characters for which str.isdigit / str.isalpha hold
_ASCII_MASK = str.maketrans({**{c: "9" for c in "0123456789"},
                             **{c: "x" for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}})


def _mask(s: str) -> str:
    """Digits become 9, letters x, the rest stays (Unicode's definitions). An ASCII text, the
    common case, is mapped at C speed (a step per character in Python was ~0.1 ms a diagnosis)."""
    if s.isascii():
        return s.translate(_ASCII_MASK)
    return "".join("9" if ch.isdigit() else "x" if ch.isalpha() else ch for ch in s)


def snippet(text: str, offset: int, spans: list[Span] | None = None, show_text: bool = False,
            before: int = 40, after: int = 80) -> str:
    """The prompt around the divergence; redacted unless `show_text`."""
    lo = max(0, offset - before)
    hi = min(len(text), offset + after)
    part = text[lo:hi]
    if show_text:
        return part
    local = [Span(s.start - lo, s.end - lo, s.kind, s.text) for s in spans or [] if lo <= s.start and s.end <= hi]
    return redact(part, local)

