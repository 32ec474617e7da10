"""Why did the cache miss: the first divergence between two prompts of a tenant, and its cause.

Pure functions over two `RequestSketch`es (the best previous request and the current one).

A divergence is a *break* only when it costs reusable content:
- it happens before the part of the prompt that is expected to vary (the last turn) and before
  the end of the previous prompt by more than `material` characters, or
- after it, the two prompts re-align for at least `material` characters (static content was
  pushed behind something variable, so the engine recomputes content it already had).
A new question after the same system prompt, a continued conversation, or a timestamp at the very
end are therefore not breaks.

Causes, in the order they are tested (the first divergence decides):
- `front_trim`: the system part is unchanged and the history starts later (early turns dropped or
  summarised): a message of the current history equals a later message of the previous one.
- `tool_order`: the same tools (same canonical JSON) in another order or key order, when the
  divergence lies in the rendered tools (else after the dynamic test, as a fallback).
- `dynamic_head`: the divergence falls inside a dynamic-looking value (app/prefix/dynamic.py) in
  both prompts. Values that look dynamic but are identical in both never reach this test.
- `new_session`: nothing re-aligns and the first message shares little with the previous one.
- `template_change`: the divergence is in the system message or the template's own text.
- `other`: anything else (history edited, re-rendered assistant text differs, a variable question
  placed before static documents...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.prefix.dynamic import DynamicDetector, Span, get_detector
from app.prefix.sketch import RequestSketch

CAUSES = ("dynamic_head", "tool_order", "front_trim", "template_change", "new_session", "other")
ANCHOR_CHARS = 24
MAX_ANCHORS = 160
NEAR_WINDOW = 512  # chars after the divergence where anchors are tried at every word start
LINE_WINDOW = 65_536  # beyond that, only at line starts


@dataclass
class Realignment:
    prev_offset: int
    cur_offset: int
    common: int  # chars equal from there on


@dataclass
class Diagnosis:
    cause: str | None  # None: no break
    char_offset: int  # first divergent character in the current prompt
    spans: list[Span] = field(default_factory=list)  # dynamic values at the divergence (current)
    realigned: Realignment | None = None
    detail: str = ""

    @property
    def is_break(self) -> bool:
        return self.cause is not None


def lcp(a: str, b: str, a0: int = 0, b0: int = 0) -> int:
    """Length of the common prefix of a[a0:] and b[b0:] (binary search over C-level compares)."""
    n = min(len(a) - a0, len(b) - b0)
    if n <= 0:
        return 0
    if a[a0:a0 + n] == b[b0:b0 + n]:
        return n
    lo, hi = 0, n  # a[a0:a0+lo] == b[b0:b0+lo], mismatch somewhere before hi
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[a0 + lo:a0 + mid] == b[b0 + lo:b0 + mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[a0 + lo] == b[b0 + lo]:
        lo += 1
    return lo


def _anchors(cur: str, start: int) -> list[int]:
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


def find_realignment(prev: str, cur: str, d: int, material: int) -> Realignment | None:
    """The first place after `d` where `cur` continues with ≥ `material` chars also in `prev`
    (after `d`): static content that was shifted by whatever differs at `d`."""
    for c in _anchors(cur, d + 1):
        anchor = cur[c:c + ANCHOR_CHARS]
        if len(anchor) < min(ANCHOR_CHARS, material) or not anchor.strip():
            continue
        p = prev.find(anchor, d)
        tries = 0
        while p >= 0 and tries < 3:
            common = lcp(prev, cur, p, c)
            if common >= material:
                return Realignment(p, c, common)
            p = prev.find(anchor, p + 1)
            tries += 1
    return None


def _covering(spans: list[Span], offset: int) -> Span | None:
    for span in spans:
        if span.start <= offset <= span.end:
            return span
    return None


def _line_bounds(text: str, offset: int, until: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", max(offset, until))
    return start, (len(text) if end < 0 else end)


def _dynamic_at(detector: DynamicDetector, prev: RequestSketch, cur: RequestSketch, d: int,
                realign: Realignment | None) -> list[Span]:
    """Dynamic values in the current prompt's divergent region, if one covers the divergence in
    both prompts (a changed value, not an edit next to a static date)."""
    cur_until = realign.cur_offset if realign else d + 1
    c0, c1 = _line_bounds(cur.text, d, cur_until)
    cur_spans = detector.find(cur.text, c0, c1)
    hit = _covering(cur_spans, d)
    if hit is None:
        return []
    prev_until = realign.prev_offset if realign else d + 1
    p0, p1 = _line_bounds(prev.text, d, prev_until)
    if _covering(detector.find(prev.text, p0, p1), d) is None:
        return []
    lo = hit.start
    hi = realign.cur_offset if realign else hit.end
    return [s for s in cur_spans if s.end > lo and s.start <= hi]


def _similar(a: str | None, b: str | None) -> float:
    """Share of lines of `a` also in `b` (0..1); cheap similarity for edited vs replaced."""
    if not a or not b:
        return 0.0
    la = [ln for ln in a.splitlines() if ln.strip()]
    lb = {ln for ln in b.splitlines() if ln.strip()}
    if not la:
        return 0.0
    return sum(1 for ln in la if ln in lb) / len(la)


def _front_trimmed(prev: RequestSketch, cur: RequestSketch) -> bool:
    pm = [k for k in prev.message_keys if not k.startswith(("system:", "developer:"))]
    cm = [k for k in cur.message_keys if not k.startswith(("system:", "developer:"))]
    if not pm or not cm or cm[0] == pm[0]:
        return False
    for j in range(min(3, len(cm) - 1)):  # a summary may replace the dropped turns
        for k in range(j + 1, len(pm)):
            if cm[j] == pm[k] and (j + 1 >= len(cm) or k + 1 >= len(pm) or cm[j + 1] == pm[k + 1]
                                   or j + 1 == len(cm) - 1):
                return True
    return False


def _tools_start(sketch: RequestSketch) -> int | None:
    """Where the first rendered tool definition starts (templates render them with tojson)."""
    found = [p for p in (sketch.text.find(raw) for raw in sketch.tools_raw) if p >= 0]
    return min(found) if found else None


def diagnose(prev: RequestSketch, cur: RequestSketch, material: int = 96,
             extra_patterns: tuple[str, ...] = ()) -> Diagnosis:
    """Compare the current prompt with the best previous one: is it a break, and why."""
    a, b = prev.text, cur.text
    d = lcp(a, b)
    if d >= len(b) or d >= len(a):
        return Diagnosis(None, d, detail="continues the previous prompt")
    limit = min(cur.tail_start, len(a))
    realign = find_realignment(a, b, d, material)
    head_loss = limit - d
    if head_loss < material and realign is None:
        return Diagnosis(None, d, detail="diverges in the part expected to vary")
    first_history = cur.first_history_start()
    # Structural evidence first, where the divergence is inside that structure: the history
    # shifted, or the tools were permuted (a counter or id inside them is not the cause then).
    system_same = prev.system_text == cur.system_text
    if system_same and d >= min(first_history, prev.first_history_start()) - 64 and _front_trimmed(prev, cur):
        return Diagnosis("front_trim", d, [], realign, "history was cut or summarised at the front")
    permuted = (bool(prev.tools_canon) and sorted(prev.tools_canon) == sorted(cur.tools_canon)
                and prev.tools_raw != cur.tools_raw)
    tools_at = _tools_start(cur)
    if permuted and tools_at is not None and d >= tools_at - 32:
        return Diagnosis("tool_order", d, [], realign, "same tools, different order or key order")
    detector = get_detector(tuple(extra_patterns))
    spans = _dynamic_at(detector, prev, cur, d, realign)
    if spans:
        return Diagnosis("dynamic_head", d, spans, realign, "a dynamic value precedes static content")
    if permuted:
        return Diagnosis("tool_order", d, [], realign, "same tools, different order or key order")
    region = cur.region_at(d)
    in_system = region is not None and region.role in ("system", "developer")
    in_template = region is None and d < first_history
    if head_loss < material and region is not None and region.role != "system" and realign is not None:
        return Diagnosis("other", d, [], realign, "variable content precedes static content")
    early = d < first_history or cur.kind != "chat"
    if early and (realign is None or realign.common < material * 4):
        first_prev = prev.system_text if prev.system_text is not None else a[:4096]
        first_cur = cur.system_text if cur.system_text is not None else b[:4096]
        if _similar(first_cur, first_prev) < 0.5 and lcp(first_cur or "", first_prev or "") < 64:
            return Diagnosis("new_session", d, [], realign, "no shared prefix with earlier requests")
    if in_system or in_template or (prev.tools_canon != cur.tools_canon and d < first_history):
        return Diagnosis("template_change", d, [], realign, "system prompt or template edited")
    return Diagnosis("other", d, [], realign, "history differs before the last turn")


# ---------------------------------------------------------------------- presentation

def fix_for(diag: Diagnosis, text: str | None = None, show_text: bool = True) -> str | None:
    """The advice for a diagnosis; quotes the prompt only when `show_text`."""
    if diag.cause is None:
        return None
    if diag.cause == "dynamic_head":
        span = diag.spans[0] if diag.spans else None
        label = f"the {span.kind} value" if span else "the dynamic value"
        if show_text and span is not None and text is not None:
            line_start = text.rfind("\n", 0, span.start) + 1
            key = text[line_start:span.start].strip()
            label = f"`{key} …`" if key else f"`{span.text}`"
        return f"move {label} below the static content (e.g. into the last user message)"
    return {
        "tool_order": "send tools in a stable order (sort by name) with a fixed JSON key order",
        "front_trim": "keep the head of the history stable: trim or summarise in large, rare steps",
        "template_change": "the system prompt or chat template changed; if this repeats, pin it",
        "new_session": "no shared prefix with earlier requests: expected for a new conversation",
        "other": "keep everything before the last turn byte-identical between requests "
                 "(move variable text below static content)",
    }[diag.cause]


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


def _mask(s: str) -> str:
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
