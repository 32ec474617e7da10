"""How a conversation's history changed between two requests: trimmed at the front (possibly with
its first exchange kept pinned) or compacted into a summary (docs/diagnosis.md, `compaction`).
The tests read message keys and sizes, so the text path and another pod's digest share them."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache

from app.prefix.conversation import span_key
from app.prefix.sketch import Region, RequestSketch
from app.prefix.strings import common_prefix_len
from app.prefix.transcript import transcript_compacted

COMPACTED_MIN_MESSAGES = 4  # a history this long before it, at least (one exchange is no context to compact)
PINNED_MESSAGES = 2  # a front trim may keep this many first history messages (the task, its first reply)
MAX_PINNED_EXCHANGE = 32  # ... or the whole first exchange (an agent's: its tool calls too), up to this long
COMPACTED_SHARE = 0.5  # the history after a compaction holds at most this share of the text before
SUMMARY_REPLY_CHARS = 200  # a summary given as the model's reply (or alone, in markup) is this long at least


# ---------------------------------------------------------------------- sketch geometry

def tail_start(sk: RequestSketch) -> int:
    """Where the part expected to vary begins: the last user turn (trailing system messages after it
    included); the sketch's own tail for prompts without one."""
    for region in reversed(sk.regions):
        if region.role == "user":
            return region.start
    return sk.tail_start


def reusable_end(sk: RequestSketch) -> int:
    """End of the reusable part of a previous prompt: system messages after its last turn are
    re-sent elsewhere by the next request of the conversation, so they end it."""
    if sk.kind != "chat" or not sk.regions:
        return len(sk.text)
    last = len(sk.regions) - 1
    while last >= 0 and sk.regions[last].role in ("system", "developer"):
        last -= 1
    if last < 0 or last == len(sk.regions) - 1:
        return len(sk.text)
    return sk.regions[last].end


def front_trimmed(prev: RequestSketch, cur: RequestSketch) -> bool:
    pm = [k for k in prev.message_keys if not k.startswith(("system:", "developer:"))]
    cm = [k for k in cur.message_keys if not k.startswith(("system:", "developer:"))]
    return trimmed(pm, cm, first_exchange([k.startswith("user:") for k in pm]))


def trimmed(pm: list[str], cm: list[str], first_exchange: int = 0) -> bool:
    """Do the history keys `cm` continue `pm` with its first turns dropped or summarised, after at
    most PINNED_MESSAGES messages that stay (a sliding window that keeps the task: the first user
    message, or the first exchange), or after the whole first exchange (`first_exchange` messages,
    when the caller knows the roles: an agent's first exchange holds its tool calls and results),
    or after all the first messages both share, up to MAX_PINNED_EXCHANGE (a window that keeps its
    head and drops from the middle, AutoGen's token-limited context; round 29)?
    Not when only the first of the remaining messages differs and all the others follow in place:
    that message was edited (a value in it changed), nothing was dropped."""
    pins = list(range(min(PINNED_MESSAGES, len(pm), len(cm)) + 1))
    if PINNED_MESSAGES < first_exchange <= min(MAX_PINNED_EXCHANGE, len(pm), len(cm)):
        pins.append(first_exchange)
    shared = _shared_head(pm, cm)
    if shared > max(pins) and shared <= MAX_PINNED_EXCHANGE:
        pins.append(shared)  # a window that keeps the head it had and drops from the middle (round 29)
    for pinned in pins:
        if pm[:pinned] != cm[:pinned]:
            return False
        if _trimmed_front(pm[pinned:], cm[pinned:]):
            return True
    return False


def _shared_head(pm: list[str], cm: list[str]) -> int:
    """How many first history messages two requests share."""
    n = 0
    for a, b in zip(pm, cm, strict=False):
        if a != b:
            break
        n += 1
    return n


def first_exchange(is_user: Sequence[bool]) -> int:
    """How many history messages the first exchange holds, given which history messages are the
    user's: up to the second user message; 0 when there is none within MAX_PINNED_EXCHANGE + 1
    messages."""
    users = [i for i, user in enumerate(is_user[:MAX_PINNED_EXCHANGE + 1]) if user]
    return users[1] if len(users) > 1 else 0


def _trimmed_front(pm: list[str], cm: list[str]) -> bool:
    if not pm or not cm or cm[0] == pm[0] or (len(cm) >= len(pm) and cm[1:len(pm)] == pm[1:]):
        return False
    for j in range(min(3, len(cm) - 1)):  # a summary (one turn, or a user/assistant pair) may replace the dropped ones
        for k in range(j if j >= 2 else j + 1, len(pm)):
            if cm[j] == pm[k] and (j + 1 >= len(cm) or k + 1 >= len(pm) or cm[j + 1] == pm[k + 1]
                                   or j + 1 == len(cm) - 1):
                return True
    return False


def _by_user(history: list[tuple[str, str, int]]) -> HistoryKeys:
    """(a user message?, key) of each message of `_history`'s list."""
    return [(role == "user", key) for role, key, _ in history]


def _keyed(sk: RequestSketch, regions: Sequence[Region]) -> list[tuple[str, str, int]]:
    """(role, key, length) of each of these messages of `sk`, in order."""
    return [(r.role, span_key(r.role, sk.text, r.start, r.end), r.end - r.start) for r in regions]


def _history(sk: RequestSketch) -> list[tuple[str, str, int]]:
    """(role, key, length) of each non-system message, in order."""
    return _keyed(sk, sk.history_regions())


def compacted(prev: RequestSketch, cur: RequestSketch) -> bool:
    """Did the agent compact its context between `prev` and `cur` (module docstring)? The system
    prompt and tools unchanged, the previous history at least COMPACTED_MIN_MESSAGES long, the
    current one shrunk (`history_shrunk`), and a new message standing in for the rest
    (`summary_stands_in`)."""
    if prev.tools_canon != cur.tools_canon:
        return False
    if summary_note_rewritten(prev, cur):
        return True
    if prev.system_text != cur.system_text:
        return summary_in_system(prev, cur) or summary_prepended(prev, cur)
    if transcript_compacted(prev, cur):  # a transcript kept in one user message, compacted there (round 52)
        return True
    histories = cache(lambda: (_history(prev), _history(cur)))  # message keys: once, and only when a test needs them
    if first_message_summarised(prev, cur, histories) or summary_merged_into_kept(prev, cur, histories) \
            or dropped_turns_restated(prev, cur, histories):
        return True
    pn = [r.end - r.start for r in prev.history_regions()]
    cn = [r.end - r.start for r in cur.history_regions()]
    if (len(pn) >= COMPACTED_MIN_MESSAGES and summary_alone(cur)) or summary_heads_trim(prev, cur) \
            or summary_replaces_history(prev, cur, histories) or summary_then_turn(prev, cur, histories):
        return True
    if pn and summary_memory(cur) and not {k for _, k, _ in histories()[1]} & {k for _, k, _ in histories()[0]}:
        return True
    if len(pn) >= COMPACTED_MIN_MESSAGES and summary_after_pinned(prev, cur, *histories()):
        return True
    if history_compacted((len(pn), sum(pn), len(cn), sum(cn)),
                         lambda: (_by_user(histories()[0]), _by_user(histories()[1]))):
        return True
    if len(prev.message_parts) < COMPACTED_MIN_MESSAGES:  # too short to compact: no message keys computed
        return False
    if len(cn) * 2 <= len(pn) and summary_asked(histories()[0], _asked_history(cur)):
        return True
    if len(cn) * 2 <= len(pn) and summary_in_call(cur, *histories()):
        return True
    if len(cn) >= len(pn) and results_cleared(*histories(), lambda i: _message_text(cur, i)):
        return True
    if tool_turns_pruned(*histories()):
        return True
    if messages_truncated(prev, cur):
        return True
    prev_offset, cur_offset = _prompt_messages(prev.message_keys), _prompt_messages(cur.message_keys)
    return newest_kept(_after_prompt(prev.message_keys), _after_prompt(cur.message_keys),
                       lambda i: _extended(prev, cur, i + prev_offset),
                       lambda i: _long_message(cur, i + cur_offset))


# one element of markup holding the whole message: `<summary>…</summary>`
_TAGGED_WHOLE = re.compile(r"\s*<([A-Za-z_][\w-]{0,31})>([\s\S]*)</\1>\s*")


def summary_alone(cur: RequestSketch) -> bool:
    """Is the current history one user message, a single element of markup around
    SUMMARY_REPLY_CHARS characters or more (the Anthropic SDKs' tool runner compaction: every
    message replaced by a user message holding its `<summary>`, the next turn left to the model;
    round 54)? A new conversation opens with a question, not one tagged block."""
    history = cur.history_regions()
    if len(history) != 1 or not opens_with_summary(history):
        return False
    m = _TAGGED_WHOLE.fullmatch(cur.text, history[0].start, history[0].end)
    return m is not None and len(m.group(2)) >= SUMMARY_REPLY_CHARS


def summary_replaces_history(prev: RequestSketch, cur: RequestSketch,
                             histories: Callable[[], tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]]) -> bool:
    """Is the current history one new user message of SUMMARY_REPLY_CHARS or more that restates the
    previous history (STACKED_MIN_MESSAGES or more, a summary's reply and the next question after an
    earlier summary too), every earlier message gone (Suna's context manager: the messages since the
    latest summary summarised into one user message between its markers, the call sent with the
    system prompt and that summary alone; round 77)? A new conversation opens with a question that
    restates none of the one before. Read on the text path only."""
    history, old_history = cur.history_regions(), prev.history_regions()
    if len(history) != 1 or len(old_history) < STACKED_MIN_MESSAGES or not opens_with_summary(history):
        return False
    ph, ch = histories()
    return ch[0][1] not in {k for _, k, _ in ph} and restates_history(cur, history[0].start, history[0].end, source=prev)


def summary_then_turn(prev: RequestSketch, cur: RequestSketch,
                      histories: Callable[[], tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]]) -> bool:
    """Is the current history the model's summary of SUMMARY_REPLY_CHARS or more, then its reply and the
    next question, none of them a message of the previous history (STACKED_MIN_MESSAGES or more), the
    summary restating it (Microsoft.Extensions.AI's SummarizingChatReducer: the messages but the newest
    summed up as the model's message of its own, and summed up again with that summary when they grow
    past the reducer's threshold; round 80)? A new conversation opens with the user's question, or
    with a greeting and then the question: never two messages of the model's first. Read on the text
    path only."""
    history, old_history = cur.history_regions(), prev.history_regions()
    if len(history) != 3 or len(old_history) < STACKED_MIN_MESSAGES \
            or [r.role for r in history] != ["assistant", "assistant", "user"] \
            or history[0].end - history[0].start < SUMMARY_REPLY_CHARS:
        return False
    ph, ch = histories()
    return not {k for _, k, _ in ch} & {k for _, k, _ in ph} \
        and restates_history(cur, history[0].start, history[0].end, source=prev)


def summary_heads_trim(prev: RequestSketch, cur: RequestSketch) -> bool:
    """Did the history lose its first turns with a new user message of SUMMARY_REPLY_CHARS or more
    opening it in their place, the history shorter than before (round 56)? A summary that opens a
    window of the same length again on every turn (a rolling summary: Griptape's
    SummaryConversationMemory once its window is full) is paid on every turn: issue 29 names that a
    front trim (tests/test_prefix_compaction.py). A front trim keeps its first messages as they were
    or drops them bare."""
    history = cur.history_regions()
    if not opens_with_summary(history):
        return False
    if len(history) >= len(prev.history_regions()):
        return False  # the window kept its length: trimmed on every turn, a front trim (issue 29)
    first = span_key("user", cur.text, history[0].start, history[0].end)
    return first not in {k for _, k, _ in _history(prev)} and front_trimmed(prev, cur)


REPLACED_PREFIX_CHARS = 32  # a summary in place of a message opens otherwise than it did (within this much)


def first_message_summarised(prev: RequestSketch, cur: RequestSketch,
                             histories: Callable[[], tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]]) -> bool:
    """Did a summary take the place of the history's first message, every later message kept in place
    and the conversation going on (the Strands Agents SDK's SummarizingConversationManager when the
    oldest share it sums up is one message: `## Conversation Summary …`; round 73)? The new first
    message is a user message of SUMMARY_REPLY_CHARS or more (`opens_with_summary`), longer than the
    one it replaced, opening otherwise (REPLACED_PREFIX_CHARS) and sharing no line with it, that
    restates the previous history (`restates_history`); or, whatever its length, the model's message in
    place of the user's (Microsoft.Extensions.AI's SummarizingChatReducer summing up the first question
    alone: `The user asked: “…”`; round 80): a user's message edited stays the user's. A first message edited keeps its opening or
    its lines and its length (a value in its context block changed, a JSON block on one line too);
    another question in its place is short and restates nothing. Read on the text path only: another
    pod, which holds the previous messages' keys, not their lengths or text, reads an earlier turn
    edited. `histories`: both histories' message keys (`_history`), asked for only once the regions'
    lengths and openings pass."""
    old_history, history = prev.history_regions(), cur.history_regions()
    if len(old_history) < COMPACTED_MIN_MESSAGES or len(history) <= len(old_history):
        return False
    old, new = old_history[0], history[0]
    if not (opens_with_summary(history) or new.role == "assistant" and old.role == "user"):
        return False  # a summary: a user message of its length, or the model's account in place of the user's message
    if new.end - new.start <= old.end - old.start \
            or common_prefix_len(prev.text, cur.text, old.start, new.start) >= REPLACED_PREFIX_CHARS:
        return False  # no longer than the message it replaced, or opening as it did: that message edited
    ph, ch = histories()
    if ph[0][1] == ch[0][1] or ph[1:] != ch[1:len(ph)]:
        return False
    old_lines = {line for line in prev.text[old.start:old.end].split("\n") if line.strip()}
    if any(line in old_lines for line in cur.text[new.start:new.end].split("\n")):
        return False
    return restates_history(cur, new.start, new.end, source=prev)


def dropped_turns_restated(prev: RequestSketch, cur: RequestSketch,
                           histories: Callable[[], tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]]) -> bool:
    """Did the history drop its first turns (two messages or more) and keep the rest to its end, with new
    messages in their place, SUMMARY_REPLY_CHARS or more together, that restate the turns dropped
    (round 77: whatever the summary's role or its number of messages, a summary and the model's
    acknowledgement, say)? The history is shorter than before, or the summary is the first (the
    previous history opened with no summary: Pipecat's context summarization, its newest messages
    kept; round 78). A front trim puts nothing in place of what it drops; a summary rewritten over a
    window that keeps its length is paid on every turn and stays a front trim (issue 29). Read on the
    text path only."""
    old_history, history = prev.history_regions(), cur.history_regions()
    if len(old_history) < COMPACTED_MIN_MESSAGES or not history:
        return False
    if len(history) >= len(old_history) and opens_with_summary(old_history):
        return False  # a summary rewritten over a window that keeps its length: a rolling summary
    ph, ch = histories()
    pk = [k for _, k, _ in ph]
    first_kept = next((n for n, (_, k, _) in enumerate(ch) if k in pk), None)
    if not first_kept:
        return False  # none kept, or the first message kept: nothing stands in front
    j = pk.index(ch[first_kept][1])
    if j < 2 or [k for _, k, _ in ch[first_kept:first_kept + len(pk) - j]] != pk[j:]:
        return False
    new = history[:first_kept]
    if sum(r.end - r.start for r in new) < SUMMARY_REPLY_CHARS:
        return False
    return _restated(set().union(*(_content_words(cur.text, r.start, r.end) for r in new)),
                     set().union(*(_content_words(prev.text, r.start, r.end) for r in old_history[:j])))


MERGED_SUMMARY_CHARS = 120  # a summary merged into the message it comes before: a topic's paragraph at least


def summary_merged_into_kept(prev: RequestSketch, cur: RequestSketch,
                             histories: Callable[[], tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]]) -> bool:
    """Did the history lose its first turns, with their summary put at the start of the first user
    message it kept, in that message (Agent Zero's topic history: each summary is a user message of
    its own, merged with the next one when the history is rendered; round 76)? The current history
    opens with a user message that ends with a later user message of the previous one, every message
    after that one kept in order, and what comes before it, MERGED_SUMMARY_CHARS or more, restates the
    previous history. A front trim keeps its first message as it was, and a note about the cut is
    short and restates nothing. Read on the text path only, as `first_message_summarised` is."""
    old_history, history = prev.history_regions(), cur.history_regions()
    if len(old_history) < COMPACTED_MIN_MESSAGES or not opens_with_summary(history):
        return False
    new = history[0]
    for j, old in enumerate(old_history[2:], 2):  # two messages dropped at least: an exchange
        merged = new.end - (old.end - old.start)
        if old.role != "user" or merged - new.start < MERGED_SUMMARY_CHARS \
                or not cur.text.startswith(prev.text[old.start:old.end], merged, new.end):
            continue
        ph, ch = histories()
        return ch[1:len(ph) - j] == ph[j + 1:] and restates_history(cur, new.start, merged, source=prev)
    return False


PINNED_BEFORE_SUMMARY = 3  # messages a compactor may keep before its summary (Hermes Agent: the first three)


def summary_after_pinned(prev: RequestSketch, cur: RequestSketch, ph: list[tuple[str, str, int]],
                         ch: list[tuple[str, str, int]]) -> bool:
    """Did the history keep its first messages (PINNED_BEFORE_SUMMARY at most) and its newest ones,
    with one new message of SUMMARY_REPLY_CHARS or more in place of two or more between them, and go
    on after them (Hermes Agent's context compressor: the first three and the last four messages
    kept around a `[CONTEXT SUMMARY]:` message; round 71)? Or only the new question after it, the
    summary restating the turns it stands in for (CAMEL's ChatAgent, its earlier summaries kept before
    the new one; round 74). A front trim puts nothing in place of the
    turns it drops, and a pinned reply with a note about the cut appended (Cline's) is that reply
    extended, not a new message."""
    pk, ck = [k for _, k, _ in ph], [k for _, k, _ in ch]
    p = _shared_head(pk, ck)
    if not 1 <= p <= PINNED_BEFORE_SUMMARY or p >= len(ck) or ck[p] in pk or ch[p][2] < SUMMARY_REPLY_CHARS:
        return False
    if p < len(pk) and _message_text(cur, p).startswith(_message_text(prev, p)):
        return False  # the pinned message extended
    rest = ck[p + 1:]
    kept = next((n for n in range(min(len(rest), len(pk) - p), 0, -1) if rest[:n] == pk[len(pk) - n:]), 0)
    if kept == 0 and len(rest) == 1 and ch[-1][0] == "user" and len(pk) - p >= 2:
        # nothing kept after it, only the new question: the summary restates what it stands in for
        # (CAMEL's ChatAgent, its earlier summaries pinned; round 74)
        region = cur.history_regions()[p]
        return ck[-1] not in pk and restates_history(cur, region.start, region.end, source=prev)
    return kept >= 1 and len(pk) - p - kept >= 2 and ck[-1] not in pk  # and the conversation went on


SUMMARY_MEMORY_CHARS = 120  # a memory's summary, the model's message that opens the history, this long at least


def summary_memory(cur: RequestSketch) -> bool:
    """Is the current history a summary as the model's message, then one user message (a memory
    that keeps only a summary of the conversation, rewritten as messages are added: the BeeAI
    Framework's SummarizeMemory; round 63)? With neither message in the previous request, the run
    opens on the summary in place of every earlier message: a compaction at each run's first call.
    A new conversation opens with the user's message, or a greeting shorter than a summary."""
    history = cur.history_regions()
    return len(history) == 2 and history[0].role == "assistant" and history[1].role == "user" \
        and history[0].end - history[0].start >= SUMMARY_MEMORY_CHARS


def opens_with_summary(history: Sequence[Region]) -> bool:
    """Does the history open with a user message long enough to be a summary (SUMMARY_REPLY_CHARS)?"""
    return bool(history) and history[0].role == "user" and history[0].end - history[0].start >= SUMMARY_REPLY_CHARS


def summary_note_rewritten(prev: RequestSketch, cur: RequestSketch) -> bool:
    """A running summary kept in a system note after the system prompt (AutoGPT's "This reminds you
    of these events from your past:"), rewritten SUMMARY_REPLY_CHARS longer or more as the
    history's first turns are dropped (round 55): the note was there before, so the summary
    stands in for those turns; a note that first appears where turns were dropped is a front
    trim's (round 20's labels)."""
    ps, cs = _leading_system_texts(prev), _leading_system_texts(cur)
    if len(ps) != 2 or len(cs) != 2 or ps[0] != cs[0] or len(cs[1]) - len(ps[1]) < SUMMARY_REPLY_CHARS:
        return False
    return front_trimmed(prev, cur)


SUMMARY_IN_SYSTEM_CHARS = 64  # a summary appended to the system prompt is this long at least
STACKED_SUMMARY_CHARS = 200  # a summary appended this long compacts a history of STACKED_MIN_MESSAGES
STACKED_MIN_MESSAGES = 3  # a question, its answer and the next question


def summary_in_system(prev: RequestSketch, cur: RequestSketch) -> bool:
    """A compaction that keeps its summary with the system prompt (round 24): appended to it (a
    running summary kept there), or as a system message of its own before it (SillyTavern's
    `[Summary: …]`, round 25); the previous history (at least COMPACTED_MIN_MESSAGES) is gone but
    for its newest messages (at most half of it), the current history is short (half the previous
    one's messages, and its new user message), and it ends with a user message. An edited system
    prompt over a conversation that goes on keeps its history: a `template_change`. A conversation
    without a system prompt may gain one that holds the summary (LangGraph's how-to on summaries;
    round 53)."""
    ps, cs = prev.system_text, cur.system_text
    if cs is None or len(cs) < SUMMARY_IN_SYSTEM_CHARS:
        return False
    # appended to the system prompt, or a system message of its own before it, or where there was
    # none (LangGraph's summary as a system message before the kept turns; round 53)
    appended = ps is not None and len(cs) - len(ps) >= SUMMARY_IN_SYSTEM_CHARS and cs.startswith(ps)
    if ps is not None and not appended and ps not in _leading_system_texts(cur)[1:]:
        return False
    pm, cm = [k for _, k, _ in _history(prev)], _history(cur)
    # a summary of a summary's length appended after one before it (aichat's recaps stacked in the system
    # message; round 62) compacts a shorter history: the conversation's context is in the recap before it
    least = STACKED_MIN_MESSAGES if appended and len(cs) - len(ps) >= STACKED_SUMMARY_CHARS else COMPACTED_MIN_MESSAGES
    if len(pm) < least or not cm or cm[-1][0] != "user":
        return False
    ck = [k for _, k, _ in cm]
    kept = next((n for n in range(min(len(ck), len(pm)), 0, -1) if ck[:n] == pm[len(pm) - n:]), 0)
    # where there was no system prompt, one that opens a new conversation keeps none of the old turns
    return kept * 2 <= len(pm) and (len(ck) - 1) * 2 <= len(pm) and (ps is not None or kept >= 1)


def summary_prepended(prev: RequestSketch, cur: RequestSketch) -> bool:
    """A summary of the chat put in a system message of its own before the system prompt, the
    conversation kept whole after it (NextChat's long-term memory: "This is a summary of the chat
    history as a recap: …" before the mask's context; round 68): the system prompt and every
    earlier message unchanged, SUMMARY_MEMORY_CHARS or more put before them once the history
    (COMPACTED_MIN_MESSAGES or more) is long enough to summarise. The prompt is cold once, then
    continues from the summary: a compaction, not an edited system prompt."""
    ls, lp = _leading_system_texts(cur), _leading_system_texts(prev)
    if not lp or ls[1:] != lp or len(ls[0]) < SUMMARY_MEMORY_CHARS:
        return False
    ph, ch = _history(prev), _history(cur)
    return len(ph) >= COMPACTED_MIN_MESSAGES and len(ch) > len(ph) and ch[:len(ph)] == ph and ch[-1][0] == "user" \
        and restates_history(cur, cur.regions[0].start, cur.regions[0].end)


_CONTENT_WORD = re.compile(r"[^\W\d_]{4,}")
RESTATED_SHARE = 1 / 3  # a summary's words found in the history it sums up, at least this share of them
RESTATED_SCAN_CHARS = 64 * 1024  # the history's text read for them, from its start


def restates_history(sk: RequestSketch, start: int, end: int, source: RequestSketch | None = None) -> bool:
    """Do RESTATED_SHARE or more of the words (four letters or more) in `sk.text[start:end]` occur in
    the history of `source` (default `sk`; each message read up to RESTATED_SCAN_CHARS)? A summary
    restates what the chat said; a deployment's note put before the system prompt says something new
    (an edited template)."""
    seen: set[str] = set()
    budget = RESTATED_SCAN_CHARS
    source = source or sk
    for r in source.history_regions():
        if budget <= 0:
            break
        seen |= _content_words(source.text, r.start, min(r.end, r.start + budget))
        budget -= r.end - r.start
    return _restated(_content_words(sk.text, start, end), seen)


def _content_words(text: str, start: int, end: int) -> set[str]:
    """The words of four letters or more, lower-cased, in `text[start:end]`, read up to RESTATED_SCAN_CHARS."""
    return {w.lower() for w in _CONTENT_WORD.findall(text, start, min(end, start + RESTATED_SCAN_CHARS))}


def _restated(words: set[str], seen: set[str]) -> bool:
    """Do RESTATED_SHARE or more of `words` occur in `seen`?"""
    return bool(words) and len(words & seen) >= RESTATED_SHARE * len(words)


def summary_asked(prev: list[tuple[str, str, int]], cur: list[tuple[str, str, int]]) -> bool:
    """A compaction that asks for the summary and keeps it as the model's reply (opencode: "What did
    we do so far?", the summary, then "Continue if you have next steps"; round 27): the previous
    history (COMPACTED_MIN_MESSAGES or more) is gone, the current one (`cur`: the messages after the
    system prompt) opens with a user message, a reply at least four times as long and
    SUMMARY_REPLY_CHARS, then a user message, none of them sent before, and holds at most half as
    many messages. The ask may be an instruction in a system message of its own, the reply then at
    least twice its length (Pydantic AI's summarizing history processor; round 29). A conversation
    that opens with a primer the client sends every time has sent it before."""
    if len(prev) < COMPACTED_MIN_MESSAGES or len(cur) < 3 or len(cur) * 2 > len(prev):
        return False
    (r0, k0, n0), (r1, k1, n1), (r2, k2, _) = cur[:3]
    seen = {k for _, k, _ in prev}
    if (r1, r2) != ("assistant", "user") or {k0, k1, k2} & seen:
        return False
    if r0 == "user":
        return n1 >= max(SUMMARY_REPLY_CHARS, 4 * n0)
    return r0 in ("system", "developer") and n1 >= max(SUMMARY_REPLY_CHARS, 2 * n0)


def summary_in_call(cur: RequestSketch, prev: list[tuple[str, str, int]], history: list[tuple[str, str, int]]) -> bool:
    """A compaction whose summary is the arguments of the model's tool call after the task (Cline's
    condense: the first user message kept, the model's call whose arguments hold the summary, the
    tool's answer that it was accepted, then the new user message; round 35): the previous history
    (COMPACTED_MIN_MESSAGES or more) is gone but for its first messages (PINNED_MESSAGES at most),
    the current one (`history`, `_history(cur)`) holds at most half as many messages, and between
    the kept messages and the new user message stand only new tool results, after a call of
    SUMMARY_REPLY_CHARS or more. A new conversation that opens with the same question has the
    model's reply before its next question, and a call that reads a file is short."""
    if len(prev) < COMPACTED_MIN_MESSAGES or len(history) < 3 or len(history) * 2 > len(prev) \
            or history[-1][0] != "user":
        return False
    seen = {k for _, k, _ in prev}
    regions = cur.history_regions()
    for pinned in range(1, min(PINNED_MESSAGES, len(history) - 2) + 1):
        if [k for _, k, _ in history[:pinned]] != [k for _, k, _ in prev[:pinned]]:
            break
        between = history[pinned:-1]
        if all(role == "tool" and key not in seen for role, key, _ in between) \
                and regions[pinned].start - regions[pinned - 1].end >= SUMMARY_REPLY_CHARS:
            return True
    return False


def results_cleared(prev: list[tuple[str, str, int]], cur: list[tuple[str, str, int]],
                    text_of: Callable[[int], str]) -> bool:
    """A compaction that clears old tool results in place (Anthropic's context editing, Claude Code's
    microcompaction; round 32): the previous history's messages all follow in their roles, the ones
    that changed are tool results, each now one placeholder (the same text for all, its numbers
    aside: SWE-agent's `Old environment output: (7 lines omitted)`, round 60) at most half as long as
    before, the rest unchanged. Paid once, as a summary is; a refreshed result keeps its length.
    `text_of(i)`: the current history's message i."""
    changed = [(i, p, c) for i, (p, c) in enumerate(zip(prev, cur, strict=False)) if p[1] != c[1]]
    if not changed or any(p[0] != c[0] for p, c in zip(prev, cur, strict=False)) \
            or not all(p[0] == "tool" and c[2] * 2 <= p[2] for _, p, c in changed):
        return False
    return len({c[1] for _, _, c in changed}) == 1 or len({_NUMBERS.sub("#", text_of(i)) for i, _, _ in changed}) == 1


_NUMBERS = re.compile(r"\d+")


def _message_text(sk: RequestSketch, i: int) -> str:
    """The text of the sketch's history message i (`_history`'s order)."""
    region = sk.history_regions()[i]
    return sk.text[region.start:region.end]


def tool_turns_pruned(prev: list[tuple[str, str, int]], cur: list[tuple[str, str, int]]) -> bool:
    """A compaction that drops the tool calls and their results and keeps every other message in
    place (the Vercel AI SDK's `pruneMessages`; round 36): the previous history (COMPACTED_MIN_MESSAGES
    or more) without its tool results opens the current one, message for message, and the current
    one goes on after it; a tool result of an earlier exchange (before the previous request's last
    user message) is among those dropped. Paid once, as a summary is. A client that drops the
    current exchange's tool call once it is answered drops nothing older."""
    last_user = max((i for i, (role, _, _) in enumerate(prev) if role == "user"), default=-1)
    if len(prev) < COMPACTED_MIN_MESSAGES or not any(role == "tool" for role, _, _ in prev[:last_user]):
        return False
    kept = [key for role, key, _ in prev if role != "tool"]
    return len(cur) > len(kept) and [key for _, key, _ in cur[:len(kept)]] == kept


TRUNCATION_MARK_CHARS = 48  # the marker a client puts after what it kept of a message (`... [Contents truncated!]`)
_ELLIPSIS = re.compile(r"\.\.\.|…")


def messages_truncated(prev: RequestSketch, cur: RequestSketch) -> bool:
    """A compaction that cuts messages in place to a budget and drops nothing (AutoGen's
    `MessageTokenLimiter`; round 38): the previous history (COMPACTED_MIN_MESSAGES or more) follows
    message for message in its roles, two messages or more each now the start of what it was, the
    rest unchanged (new messages may follow). Paid once, as a summary is; a message edited is
    rewritten, not cut to its start. A client may mark each cut with the same short text after what
    it kept, an ellipsis in it (Langroid's ChatAgent: `\\n... [Contents truncated!]`, a short message
    kept whole with the mark added; round 65): one message cut so is enough."""
    ph, ch = prev.history_regions(), cur.history_regions()
    if len(ph) < COMPACTED_MIN_MESSAGES or len(ch) < len(ph):
        return False
    cut, shortened, marks = 0, 0, set()
    for p, c in zip(ph, ch, strict=False):  # each message unchanged, or the start of what it was
        if p.role != c.role:
            return False
        kept = common_prefix_len(prev.text, cur.text, p.start, c.start)
        kept = min(kept, p.end - p.start, c.end - c.start)
        if kept == p.end - p.start == c.end - c.start:
            continue
        mark = cur.text[c.start + kept:c.end]
        if not kept or len(mark) > TRUNCATION_MARK_CHARS or (mark and not _ELLIPSIS.search(mark)):
            return False
        cut += 1
        shortened += kept < p.end - p.start
        marks.add(mark)
    if len(marks) > 1 or not shortened:
        return False
    return cut >= 2 or (cut == 1 and marks != {""})


def _asked_history(sk: RequestSketch) -> list[tuple[str, str, int]]:
    """(role, key, length) of each message after the system prompt (the first message, when it is
    a system or developer message), in order: a later system message too (an instruction)."""
    return _keyed(sk, [r for r in sk.regions if not (r.index == 0 and r.role in ("system", "developer"))])


def _leading_system_texts(sk: RequestSketch) -> list[str]:
    """The texts of the system and developer messages that open the prompt, in order."""
    out = []
    for region in sk.regions:
        if region.role not in ("system", "developer") or region.index != len(out):
            break
        out.append(sk.text[region.start:region.end])
    return out


def _prompt_messages(keys: list[str]) -> int:
    """1 when the first message is the system prompt (a system or developer message), else 0."""
    return 1 if keys and keys[0].startswith(("system:", "developer:")) else 0


def _after_prompt(keys: list[str]) -> list[str]:
    """Message keys after the system prompt."""
    return keys[_prompt_messages(keys):]


def _long_message(sk: RequestSketch, index: int) -> bool:
    """Does message `index` hold SUMMARY_REPLY_CHARS or more of text?"""
    region = _region(sk, index)
    return region is not None and region.end - region.start >= SUMMARY_REPLY_CHARS


def _region(sk: RequestSketch, index: int) -> Region | None:
    """The region of message `index` (None when its content was not found in the text)."""
    return next((r for r in sk.regions if r.index == index), None)


def _extended(prev: RequestSketch, cur: RequestSketch, index: int) -> bool:
    """Is message `index` of `cur` that of `prev` with text added after it (Cline's note that
    history was removed, appended to the first reply)?"""
    p, c = _region(prev, index), _region(cur, index)
    return p is not None and c is not None and p.role == c.role and c.end - c.start > p.end - p.start \
        and cur.text.startswith(prev.text[p.start:p.end], c.start)


def newest_kept(prev: list[str], cur: list[str], extended: Callable[[int], bool] = lambda i: False,
                long_summary: Callable[[int], bool] = lambda i: False) -> bool:
    """A compaction that keeps the newest messages as they were (LangMem's SummarizationNode, Strands'
    SummarizingConversationManager, Roo Code's condense): after the first messages that stay (none,
    or up to PINNED_MESSAGES: the task), a new message stands in for the rest (the summary; no
    reply when it opens the history: a new conversation brings replies too), the previous
    history's newest messages follow unchanged through its end, and most of what was not pinned is
    gone. A sliding window that drops the oldest exchange under a summary keeps most of it, and one
    that notes the cut in a pinned message (`extended`: message i with text added) stands nothing
    in for it: front trims. A summary that opens the history as the model's message counts when it
    is long (`long_summary`: message i holds SUMMARY_REPLY_CHARS or more; Google ADK's sliding-window
    compaction, round 31): a greeting that opens a new conversation is short."""
    for pinned in range(min(PINNED_MESSAGES, len(prev), len(cur) - 2) + 1):
        if prev[:pinned] != cur[:pinned]:
            break
        rest, summary = prev[pinned:], cur[pinned]
        if len(rest) < COMPACTED_MIN_MESSAGES or summary in prev or extended(pinned) \
                or (not pinned and summary.startswith("assistant:") and not long_summary(pinned)):
            continue
        follows = pinned + 1
        if cur[follows].startswith("assistant:") and cur[follows] not in prev and not summary.startswith("assistant:"):
            follows += 1  # the model's acknowledgement of the summary (Gemini CLI's "Got it. ..."; round 24)
        if follows >= len(cur) or cur[follows] not in rest:
            continue
        dropped = rest.index(cur[follows])
        kept = rest[dropped:]
        if dropped * 2 > len(rest) and cur[follows:follows + len(kept)] == kept:
            return True
    return False


HistoryKeys = list[tuple[bool, str]]  # (a user message?, key) of each history message, in order


def history_compacted(sizes: tuple[int, int, int, int],
                      keys: Callable[[], tuple[HistoryKeys, HistoryKeys]]) -> bool:
    """The history test of a compaction, on either path (the text's and another pod's digest):
    `sizes` (messages and characters before, then now) shrunk as the summary's shape asks
    (`history_shrunk`), and a new message standing in for the rest (`summary_stands_in`). Lengths
    first: `keys` (the previous and the current history's, a hash of each message's ends) is
    called only for a pair that can be one. With the files read last restored after the summary
    (`SUMMARY_RESTORED`), half of the messages is enough, as with the user messages kept: restored
    files may hold more text than the turns they replaced. Every reply dropped, the user messages
    kept before the summary (`replies_dropped`), needs no share: the history lost all but them."""
    shrunk = history_shrunk(*sizes, users_kept=True)
    if not shrunk and not (sizes[0] >= COMPACTED_MIN_MESSAGES and 0 < sizes[2] < sizes[0]):
        return False
    prev, cur = keys()
    if replies_dropped(prev, cur):
        return True
    if not shrunk:
        return False
    shape = summary_stands_in(prev, {k for _, k in prev}, cur)
    return shape in (USERS_KEPT, SUMMARY_RESTORED) or shape == SUMMARY_FIRST and history_shrunk(*sizes)


REPLIES_DROPPED_MIN = 2  # replies the previous history held, at least, for a compaction that drops them all


def _latest_of(kept: list[str], earlier: list[str]) -> bool:
    """Are `kept` the latest of `earlier`, in their order?"""
    return kept == earlier[len(earlier) - len(kept):]


def replies_dropped(prev: HistoryKeys, cur: HistoryKeys) -> bool:
    """Codex CLI's compacted history rebuilt (round 45): the previous history's user messages kept
    in order (the latest of them, within a budget), every reply and tool result dropped, then one
    new user message (the summary), then at most the newest user message. A front trim keeps
    replies; a new conversation does not repeat the previous one's user messages in order."""
    if sum(not user for user, _ in prev) < REPLIES_DROPPED_MIN:
        return False
    seen = {k for _, k in prev}
    at = next((i for i, (_, k) in enumerate(cur) if k not in seen), None)
    if not at or len(cur) - at > 2 or not all(user for user, _ in cur[at:]):
        return False
    kept = [k for _, k in cur[:at]]
    users = [k for user, k in prev if user]
    return all(user for user, _ in cur[:at]) and _latest_of(kept, users)


def history_shrunk(prev_messages: int, prev_chars: int, cur_messages: int, cur_chars: int,
                   users_kept: bool = False) -> bool:
    """A history long enough to compact, and the current one at most COMPACTED_SHARE of its text, or
    at most half of its messages in less text (a summary may be long next to short turns). With
    the earlier user messages kept before the summary (`users_kept`, Codex's shape, which no new
    conversation has), half of the messages is enough: the summary may outweigh short turns."""
    return prev_messages >= COMPACTED_MIN_MESSAGES and cur_messages > 0 and (
        cur_chars <= COMPACTED_SHARE * prev_chars
        or cur_messages * 2 <= prev_messages and (users_kept or cur_chars < prev_chars))


SUMMARY_FIRST = "summary first"  # Claude Code: the summary opens the history
SUMMARY_RESTORED = "summary restored"  # Claude Code: the summary, then the files read last, restored
USERS_KEPT = "users kept"  # Codex: the latest earlier user messages, then the summary


def summary_stands_in(prev: list[tuple[bool, str]], seen: set[str], cur: list[tuple[bool, str]]) -> str | None:
    """In which shape a new message stands in for the dropped turns, if one does. `prev` and `cur`
    are (a user message?, key) of the history messages in order (`prev` may be only its last ones:
    what is kept is at its end), `seen` every key of the previous history that is known. A new
    message before the newest user turn, a user message, with no new reply beside it
    (`SUMMARY_FIRST`; `SUMMARY_RESTORED` when more new user messages follow it: the files read last,
    restored as Read calls and results, round 44), or as the newest message when what is kept is only
    the latest of the earlier user messages (`USERS_KEPT`). A new model message is the summary only
    alone before the newest user message (the Continue CLI's `[COMPACTED HISTORY]`, round 51): a new
    conversation opens with the user's message, a pinned greeting is no new message."""
    newest = max((i for i, (user, _) in enumerate(cur) if user), default=len(cur) - 1)
    added = [user for user, k in cur[:newest] if k not in seen]
    if added == [False] and newest == 1:
        return SUMMARY_FIRST  # the summary as one new model message, then the newest user message alone (round 51)
    if added:  # only user messages are new (a conversation never seen before brings replies too)
        if not all(added):
            return None
        return SUMMARY_RESTORED if len(added) > 1 else SUMMARY_FIRST
    kept = [k for _, k in cur[:newest]]
    if cur[newest][1] not in seen and kept and _latest_of(kept, [k for user, k in prev if user]):
        return USERS_KEPT
    return None
