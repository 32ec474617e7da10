"""A conversation kept as a transcript in one user message (round 52), or in the system text (round 81).

Some chains render their whole memory into the newest user message, a line per turn under their
instructions (LangChain's ConversationChain: `Human: …` and `AI: …` lines, then `AI:` for the
reply). From turn to turn that message grows in place: the previous one is where the new one
starts, so the engine lost nothing but the message's closing tokens. A summary memory replaces the
transcript's first lines with a summary line once they overflow its budget: a compaction, paid once.

The tests read lines, as text or as the digest's line keys (app/prefix/digest.py), so the text
path and another pod answer alike.

Others render the memory into the system text (Spring AI's PromptChatMemoryAdvisor: a `USER:` or
`ASSISTANT:` line per message in a MEMORY section) and send the new question alone: the memory's lines
grow where the section ends, and the engine loses only the section's closing and the question. A
window memory that drops its oldest messages as it adds the newest trims the section's front on every
turn: a front trim, as a chat window trimmed on every turn is (`system_transcript`; text path only).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from app.prefix.sketch import Region, RequestSketch
from app.prefix.strings import common_prefix_len, shared_ends, shared_head, suffix_opening

SUMMARY_MIN_CHARS = 64  # the lines that stand in for the dropped ones hold this much text at least
MAX_SUMMARY_LINES = 3  # ... on at most this many lines
MIN_KEPT_LINES = 2  # a compaction keeps the newest exchange at least
MIN_NEW_LINES = 2  # ... and the conversation goes on after it: a reply and a new question
SUMMED_MIN_LINES = 4  # a summary of the whole transcript stands in for two exchanges at least
_SPEAKER = re.compile(r"([^\W\d_][\w .'-]{0,24}):(?: |$)")  # a transcript line's speaker (`Human: `, `AI:`)
_MEMORY_SPEAKER = re.compile(r"[^\W\d_][\w .'-]{0,24}:")  # in a memory section, glued to the message (`USER:Is …`)


def last_user(sk: RequestSketch) -> Region | None:
    return next((r for r in reversed(sk.regions) if r.role == "user"), None)


def grew_in_place(prev: RequestSketch, cur: RequestSketch, diverges_at: int) -> bool:
    """Is the current newest user message the previous one continued: the same message start, all
    of the previous message's text shared (the prompts diverge after it, in its closing) and more
    after it? The previous request ends with that message."""
    p, c = last_user(prev), last_user(cur)
    if p is None or c is None or p.start != c.start or c.end <= p.end or diverges_at < p.end:
        return False
    return prev.regions[-1] is p


def grew_by_lines(p: Sequence[str], c: Sequence[str], capped: bool) -> bool:
    """`grew_in_place` on line keys: every line of the previous message but its last (the
    unfinished line the reply completes) in place, and more lines after them. `capped`: the
    previous message's lines were keyed up to a cap, so all of them are shared."""
    if capped:
        return len(c) >= len(p) >= MIN_KEPT_LINES and list(c[:len(p)]) == list(p)
    return len(p) >= MIN_KEPT_LINES and len(c) > len(p) and list(c[:len(p) - 1]) == list(p[:-1])


def summary_replaced(p: Sequence[str], c: Sequence[str], texts: Sequence[str] | None = None) -> tuple[int, int] | None:
    """(first, end) indexes into `c` of the new lines that took the place of the previous
    message's first transcript lines, or None. After the lines both share (the instructions), the
    previous lines lose one or more, at most MAX_SUMMARY_LINES lines the previous message did not
    hold stand in their place, and what follows is the rest of the previous lines but its
    unfinished last one, MIN_KEPT_LINES at least, in place, and then MIN_NEW_LINES more (the
    conversation went on: a question put before the same pasted lines is no compaction); or a
    summary of the whole transcript (`_summary_of_all`). `texts`: the text of `c`'s lines, when `c`
    holds their keys."""
    p, c = list(p), list(c)
    shared = shared_head(p, c)
    rest_p, rest_c = p[shared:-1], c[shared:]
    j = _kept_after_summary(rest_p, rest_c)
    if j is not None:
        return shared, shared + j
    j = _summary_of_all(rest_p, rest_c, rest_c if texts is None else texts[shared:])
    return None if j is None else (shared, shared + j)


def _kept_after_summary(rest_p: list[str], rest_c: list[str]) -> int | None:
    """j: how many new lines (MAX_SUMMARY_LINES at most, none of them a line of `rest_p`) open
    `rest_c` before the lines of `rest_p` but its first k (k >= 1, MIN_KEPT_LINES or more kept), then
    MIN_NEW_LINES more; None when none do. The new lines end where `rest_c` first holds a line of
    `rest_p`, so j is that place; the kept lines are a run of `rest_p`'s end that opens what follows
    (`suffix_opening`: C speed, no Python pass over the lines)."""
    in_p = set(rest_p)
    j = next((i for i, line in enumerate(rest_c[:MAX_SUMMARY_LINES + 1]) if line in in_p), 0)
    if not j:
        return None
    fewest_dropped = max(1, len(rest_p) - len(rest_c) + j + MIN_NEW_LINES)  # more kept leave too few new lines
    k = suffix_opening(rest_p, rest_c[j:], fewest_dropped)
    return j if k <= len(rest_p) - MIN_KEPT_LINES else None


def _summary_of_all(rest_p: Sequence[str], rest_c: Sequence[str], texts: Sequence[str]) -> int | None:
    """How many lines of `rest_c` (their text: `texts`) are a summary that stands in for the whole
    transcript before it, or None: every line new, the summary's lines (MAX_SUMMARY_LINES at most)
    then one new question and the reply's opening line, each led by a speaker (`Human: …`, `AI:`),
    and no summary line led by either of them; SUMMED_MIN_LINES or more lines dropped (Haystack
    1.x's ConversationSummaryMemory: `Human asked about …. AI: …`, round 72). A new conversation
    opens with its question, no summary before it. The test reads no words of the summary, only
    the lines' places and speakers, so another pod, which holds the previous lines' keys, reads it
    alike."""
    j = len(rest_c) - MIN_NEW_LINES
    if not 1 <= j <= MAX_SUMMARY_LINES or len(rest_p) < SUMMED_MIN_LINES or set(rest_c) & set(rest_p):
        return None
    asked, opened = _SPEAKER.match(texts[j]), _SPEAKER.match(texts[j + 1])
    if asked is None or opened is None or texts[j + 1] != opened.group() or asked.group(1) == opened.group(1):
        return None
    speakers = (f"{asked.group(1)}:", f"{opened.group(1)}:")
    return None if any(line.startswith(speakers) for line in texts[:j]) else j


# Line breaks `summary_replaced` needs after the lines two messages share, at least: in the previous
# message, a line replaced and MIN_KEPT_LINES kept before its unfinished last one (or SUMMED_MIN_LINES
# summed up); in the new one, a summary line and MIN_NEW_LINES after it.
_PREV_MIN_BREAKS = min(MIN_KEPT_LINES + 1, SUMMED_MIN_LINES)  # 3: `_may_keep_lines` reads two of them
_CUR_MIN_BREAKS = MIN_NEW_LINES


def _room_for_summary(prev: str, p0: int, p1: int, cur: str, c0: int, c1: int) -> bool:
    """Do prev[p0:p1] and cur[c0:c1] hold the lines a summary in place of lines needs? Found from
    their ends by memrchr, nothing copied: a one-line message is read once at C speed."""
    return _breaks_at_least(prev, p0, p1, _PREV_MIN_BREAKS) and _breaks_at_least(cur, c0, c1, _CUR_MIN_BREAKS)


def _breaks_at_least(text: str, start: int, end: int, n: int) -> bool:
    for _ in range(n):
        end = text.rfind("\n", start, end)
        if end < 0:
            return False
    return True


def _may_keep_lines(prev: str, p0: int, p1: int, cur: str, c0: int, c1: int) -> bool:
    """After the lines both share, can a summary stand in cur[c0:c1] for lines of prev[p0:p1]? The
    lines it leaves end with the previous message's last whole line, which the new one then holds
    between two of its lines (a summary line before, MIN_NEW_LINES after); a summary of them all
    leaves the new one MAX_SUMMARY_LINES + MIN_NEW_LINES lines at most (one more: a shared line may
    end one message). Read at C speed: two long documents that share no line are told apart
    without splitting either."""
    if not _breaks_at_least(cur, c0, c1, MAX_SUMMARY_LINES + MIN_NEW_LINES + 1):
        return True
    end = prev.rfind("\n", p0, p1)  # the unfinished line follows it; `_room_for_summary` saw a break
    start = prev.rfind("\n", p0, end) + 1  # and one before it
    return cur.find("\n" + prev[start:end] + "\n", c0, c1) >= 0


def _lines(text: str, region: Region, skip: int = 0) -> list[str]:
    """The region's lines, from `skip` characters into it (the start of a line)."""
    return text[region.start + skip:region.end].split("\n")


def transcript_compacted(prev: RequestSketch, cur: RequestSketch) -> bool:
    """Did a summary line take the place of the first lines of the transcript in the newest user
    message (`summary_replaced`), the system prompt and tools kept?"""
    p, c = last_user(prev), last_user(cur)
    if p is None or c is None or prev.system_text != cur.system_text or prev.tools_canon != cur.tools_canon:
        return False
    if not _room_for_summary(prev.text, p.start, p.end, cur.text, c.start, c.end):
        return False  # a one-line message: nothing compared
    # The whole lines both messages open with are the lines `summary_replaced` finds shared first,
    # one by one: found here at C speed and left unsplit (a document of many lines asked again).
    same = min(common_prefix_len(prev.text, cur.text, p.start, c.start), p.end - p.start, c.end - c.start)
    skip = max(prev.text.rfind("\n", p.start, p.start + same) + 1 - p.start, 0)  # past the last shared line
    if not _room_for_summary(prev.text, p.start + skip, p.end, cur.text, c.start + skip, c.end) \
            or not _may_keep_lines(prev.text, p.start + skip, p.end, cur.text, c.start + skip, c.end):
        return False
    cur_lines = _lines(cur.text, c, skip)
    found = summary_replaced(_lines(prev.text, p, skip), cur_lines)
    return found is not None and sum(len(line) for line in cur_lines[found[0]:found[1]]) >= SUMMARY_MIN_CHARS


def system_transcript(prev: RequestSketch, cur: RequestSketch) -> str | None:
    """"grew" when the system text changed only by transcript lines (`_MEMORY_SPEAKER`) put in before a closing
    it kept (MIN_NEW_LINES or more, one of them holding the previous request's last user message: the
    exchange the memory added); "trimmed" when, besides, the transcript's first lines went, the rest
    kept in order before the new ones (a window memory); None otherwise (an edit of the system text, a
    summary in place of the lines: other rules read those)."""
    if not prev.system_text or not cur.system_text or prev.system_text == cur.system_text:
        return None
    asked = last_user(prev)
    if asked is None or asked.end - asked.start < 2 or prev.regions[-1] is not asked:
        return None
    question = prev.text[asked.start:asked.end].strip()
    if question not in cur.system_text:  # no line can hold it: one scan, before splitting 1 MB twice
        return None
    p, c = prev.system_text.split("\n"), cur.system_text.split("\n")
    head, tail = shared_ends(p, c)
    if tail == 0:
        return None  # the section's closing kept: what changed sits inside the text
    gone, added = p[head:len(p) - tail], c[head:len(c) - tail]
    kept = suffix_opening(gone, added)  # the lines gone from the front: the rest opens what was added
    new = added[len(gone) - kept:]
    if len(new) < MIN_NEW_LINES or not all(_MEMORY_SPEAKER.match(line) for line in gone[:kept] + new) \
            or not any(question in line for line in new):
        return None
    return "trimmed" if kept else "grew"
