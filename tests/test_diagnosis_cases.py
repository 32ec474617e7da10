"""Diagnosis on request sequences of one tenant, one test per failure kind of issue 20: new
conversations, values no pattern knows, tools listed in system text, nested and adjacent tool
reorders, several causes at once, a trailing system message, edits that only look dynamic and
static look-alikes; and of issue 29 (agents' patterns, material written here, not from any
held-out split): a sliding window that keeps the first messages, tool schemas written as JSON
into the prompt text and reordered, a per-request value in the first user message; and of its
round 3 (values told by their line's form or their shape, dates that roll over without a cue,
slash-command tool lists), round 4 (budgets counting down, base32 draws, tools declared as code,
timestamp-shaped edits) and round 5 (amounts, usage meters, dotted clocks, pods' names, trace
contexts, values after an arrow, in a tag or on a label line, routes and columns of tools) and
round 6 (shares left, usage fractions, queue places, elapsed times, builds of one release, braced
GUIDs, tools described in blocks) and round 7 (table rows, ports, nanosecond epochs, trace and
message ids, tools numbered by position, in wrappers, as TOML tables or annotated methods) and
round 8 (rising sequence ids, b3, Message-IDs, positions, countdown durations, short codes as
flags, C# kernel functions) and round 9 (readings with units or timing keys, times ago, ISO
durations, zero-padded tickets, log positions, stream ids, structured booleans, hour offsets,
yearless stamps, weak ETags, base64 JSON, tool blocks of XML templates and classes) and round 10
(sizes, ranges, redrawn hashes, long tokens, joined ids, hours and minutes, log, Oracle and German
`date` stamps, spoken dates, a key's clock with `Uhr`, tools made by calls) and round 11 (units
ending a key's value, current values, signs, clocks in new orders, tokens in halves or with a
version, URL segments, ADK, R and C# tool lists). Each runs
the gateway's own analysis (`prefixgate lint`: fingerprint, tracker, diagnosis) over the bodies a client would send."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from app.prefix.fingerprint import Fingerprinter
from app.prefix.lint import analyse
from app.prefix.tokens import SegmentTokenizer
from tests.fixtures.diagnosis_v2.build import Gen

SYSTEM = ("You are the support assistant of Northwind Outfitters. Be friendly and precise.\n"
          "- Returns are accepted within 60 days for unused items.\n"
          "- Standard shipping takes 4 to 7 business days.\n"
          "- Hand over to a human agent for warranty disputes or legal threats.\n"
          "- Never promise a delivery date the tracking system does not show.\n")
SYSTEM_DE = ("Du bist der digitale Kundenservice der Stadtwerke Musterstadt.\n"
             "- Antworte freundlich, sachlich und in ganzen Sätzen.\n"
             "- Zählerstände nimmst du nur mit Zählernummer und Ablesedatum entgegen.\n"
             "- Bei Störungen verweist du auf die Störungshotline.\n")
CODER = ("You are Codewright, an autonomous coding agent in a sandboxed repository.\n"
         "1. Read the relevant files first.\n2. Make the smallest change.\n3. Run the tests after every change.\n")
QUESTIONS = ["Where is my order 48213?", "Can I return boots I wore once?", "How long does express take?",
             "Do you price match?", "Can I change the address?", "Is the jacket waterproof?"]


def tool(name: str, **props: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"{name} for an order",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": list(props)[:1]}}}


TOOLS = [tool("lookup_order", order_number={"type": "string"}, email={"type": "string"}),
         tool("create_return", order_number={"type": "string"}, reason={"type": "string"}),
         tool("track_shipment", tracking_id={"type": "string"}, carrier={"type": "string"}),
         tool("update_address", order_number={"type": "string"}, address={"type": "string"})]


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def body(system: str, turns: list[str], tools: list | None = None, trailing: str | None = None) -> dict:
    """A chat body: the system prompt, then user and assistant turns alternating (the corpus
    generator's helper, so tests and corpus build requests the same way)."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return Gen.body(system, msgs, tools, trailing)


def conversation(n: int) -> list[list[str]]:
    """What request k of one growing conversation sends: its turns so far."""
    turns: list[str] = []
    out = []
    for k in range(n):
        turns = [*turns, QUESTIONS[k]]
        out.append(turns)
        turns = [*turns, f"Answer {k}: the parcel left the depot and arrives in two days."]
    return out


def run(fpr: Fingerprinter, bodies: list[dict]) -> list[dict[str, Any]]:
    return asyncio.run(analyse(bodies, fpr, 16))[1:]


def run_value_line(fpr: Fingerprinter, line: str, values: list[str]) -> list[dict[str, Any]]:
    """Three requests of one growing conversation whose system text opens with `line` holding each
    of `values` in turn: the analysis of the second and the third."""
    return run(fpr, [body(f"{line.format(v)}\n{SYSTEM}", t) for v, t in zip(values, conversation(3), strict=True)])


def assert_values_found(fpr: Fingerprinter, line: str, values: list[str]) -> list[dict[str, Any]]:
    """`run_value_line`'s second and third requests are each a `dynamic_head`; their analyses."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"], got
    return got


def assert_values_whole(fpr: Fingerprinter, line: str, values: list[str]) -> None:
    """`run_value_line`'s second and third requests are each a `dynamic_head` whose span is the
    value it sent, whole."""
    got = assert_values_found(fpr, line, values)
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]


def causes(fpr: Fingerprinter, bodies: list[dict]) -> list[str | None]:
    return [r["cause"] for r in run(fpr, bodies)]


# ------------------------------------------------------------------ new conversations
def test_stateless_single_turn_clients_are_new_sessions(fpr) -> None:
    bodies = [body(SYSTEM, [q]) for q in QUESTIONS[:4]]
    assert causes(fpr, bodies) == ["new_session"] * 3


def test_switching_between_two_agents_and_back(fpr) -> None:
    a, b = conversation(3), [[f"{q} (urgent)"] for q in QUESTIONS[3:5]]
    bodies = [body(SYSTEM, a[0]), body(SYSTEM, a[1]), body(CODER, b[0]), body(SYSTEM, a[2]),
              body(CODER, [*b[0], "Reading the files now.", "Run the tests too."]), body(SYSTEM, ["A new question?"])]
    assert causes(fpr, bodies) == [None, "new_session", None, None, "new_session"]


def test_pinned_first_exchange_then_start_over(fpr) -> None:
    pin = ["Hello", "Hi! I am the Northwind assistant. How can I help?"]
    bodies = [body(SYSTEM, [*pin, QUESTIONS[0]]),
              body(SYSTEM, [*pin, QUESTIONS[0], "It ships today.", QUESTIONS[1]]),
              body(SYSTEM, [*pin, QUESTIONS[2]]),
              body(SYSTEM, [*pin, QUESTIONS[2], "Two days.", QUESTIONS[3]])]
    assert causes(fpr, bodies) == [None, "new_session", None]


# ------------------------------------------------------------------ agents' sliding windows (issue 29)
TASK = "Migrate the billing module to the new invoice API; keep the public functions and their tests. " * 3


def agent_history(exchanges: int) -> list[dict[str, str]]:
    """The task, then `exchanges` (reply, user message) pairs of distinct text."""
    msgs = [{"role": "user", "content": TASK}]
    for k in range(1, exchanges + 1):
        msgs += [{"role": "assistant", "content": f"Reply {k}: " + " ".join(f"r{k}w{i}" for i in range(40))},
                 {"role": "user", "content": " ".join(f"u{k}w{i}" for i in range(30))}]
    return msgs


@pytest.mark.parametrize("pinned", [1, 2], ids=["first-user-message", "first-exchange"])
def test_sliding_window_that_keeps_the_first_messages_is_a_front_trim(fpr, pinned: int) -> None:
    """A window over the latest turns that keeps the task (the first user message, or the first
    exchange) pinned: every request drops turns after what is pinned, a front trim."""
    msgs = agent_history(9)
    bodies = [Gen.body(CODER, msgs[:n] if n == 7 else [*msgs[:pinned], *msgs[:n][-5:]], None, None)
              for n in (7, 9, 11, 13, 15)]
    assert causes(fpr, bodies) == ["front_trim"] * 4


def test_sliding_window_that_keeps_an_agents_first_exchange_with_its_tool_calls_is_a_front_trim(fpr) -> None:
    """The pinned first exchange of an agent is longer than two messages (the task, a tool call, its
    result, the reply): the window still drops the turns after it, a front trim."""
    call = {"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "billing.py"}'}}
    first = [{"role": "user", "content": TASK}, {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_0", "content": "def invoice(order):\n    return legacy(order)\n" * 4},
             {"role": "assistant", "content": "The module calls the legacy API in one place."}]
    later = agent_history(9)[1:]  # (reply, user message) pairs
    later = [later[1], *later[2:]]  # start at a user message
    bodies = [Gen.body(CODER, [*first, *later[:n]], None, None) if n == 5 else
              Gen.body(CODER, [*first, *later[:n][-5:]], None, None) for n in (5, 7, 9, 11)]
    assert causes(fpr, bodies) == ["front_trim"] * 3


def test_a_compaction_that_leaves_too_little_to_be_a_break_is_still_a_compaction(fpr) -> None:
    """Codex's shape kept short: the newest user message, then the summary. Less than a block's worth
    of text follows the divergence, so it costs no reusable content, yet it is what it is: the
    history was compacted (not a new conversation)."""
    history = [*agent_history(4)[:-1], {"role": "user", "content": "Continue."}]
    compacted = [history[-1], {"role": "user", "content": "Summary: invoices half migrated."}]
    bodies = [Gen.body(CODER, history[:7], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, compacted, None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_codex_compaction_whose_summary_outweighs_the_short_turns_it_replaced(fpr) -> None:
    """Codex's shape (the earlier user messages kept, then the summary) after short turns: the
    summary is longer than the history it stands in for, yet the history lost more than half its
    messages and nothing but the summary is new (round 19: no text condition when the messages halve)."""
    history = [{"role": "user", "content": "Fix the flaky test."}]
    for k in range(1, 6):
        history += [{"role": "assistant", "content": f"Done step {k}."}, {"role": "user", "content": f"Next, part {k}."}]
    summary = {"role": "user", "content": "USER_CONTEXT: the invoice tests flake under load. " + "Progress noted. " * 40}
    compacted = [history[-3], history[-1], summary]
    bodies = [Gen.body(CODER, history[:9], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, compacted, None, None)]
    assert sum(len(m["content"]) for m in compacted) > sum(len(m["content"]) for m in history)
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_prefetched_tool_result_refreshed_before_every_call_is_a_value(fpr) -> None:
    """A client that prefetches a tool result (its call fixed) after the first user message and
    refreshes it before every model call: one value of the earlier tool message changes, the rest
    of the conversation stays. A per-request value, as in a context block (round 21), not an
    earlier turn edited."""
    call = {"id": "call_prefetch", "type": "function", "function": {"name": "road_status", "arguments": "{}"}}

    def messages(speed: int, answered: int) -> list[dict[str, Any]]:
        status = json.dumps({"avg_speed_mph": speed, "lanes_open": 1, "source": "ROC command and control"}, indent=2)
        out: list[dict[str, Any]] = [{"role": "user", "content": TASK},
                                     {"role": "assistant", "content": None, "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": "call_prefetch", "content": status},
                                     {"role": "assistant", "content": "The road status is loaded."}]
        for k in range(answered):
            out += [{"role": "user", "content": QUESTIONS[k]}, {"role": "assistant", "content": f"Answer {k}."}]
        return [*out, {"role": "user", "content": QUESTIONS[answered]}]

    bodies = [Gen.body(CODER, messages(v, k), None, None) for k, v in enumerate([34, 32, 29])]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"], got
    assert [r["spans"] for r in got] == [["32"], ["29"]]


def test_the_first_user_message_edited_in_place_is_a_history_edit(fpr) -> None:
    """Nothing dropped: only the first message differs (not by a value) and the rest follow in place."""
    msgs = agent_history(3)
    edited = [{"role": "user", "content": TASK.replace("keep the public functions", "rename the public functions")},
              *msgs[1:]]
    assert causes(fpr, [Gen.body(CODER, msgs[:5], None, None), Gen.body(CODER, edited, None, None)]) == ["history_edit"]


@pytest.mark.parametrize(("key", "values"), [
    ("Session started:", ["2026-04-14T09:31:07Z", "2026-04-14T09:32:55Z", "2026-04-14T09:40:01Z", "2026-04-14T10:02:13Z"]),
    ("Aktuelle Uhrzeit:", ["14.04.2026 09:31", "14.04.2026 09:32", "14.04.2026 09:40", "14.04.2026 10:02"]),
    ("request_id:", ["8c1f0e2a4b6d", "1d9e7f3a5c2b", "6a0b4c8d2e1f", "f3e2d1c0b9a8"]),
])
def test_a_value_in_the_first_user_messages_context_block(fpr, key: str, values: list[str]) -> None:
    """An agent opens the conversation with a context block that carries a per-request value: every
    request of the conversation re-renders it, so every turn breaks there (dynamic_head, the value
    its span), whatever the history after it looks like."""
    def first(value: str) -> str:
        return f"<context>\nWorking directory: /repo\n{key} {value}\nBranch: main\n</context>\n" + TASK

    bodies = [body(CODER, [first(v), *t[1:]]) for v, t in zip(values, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head"] * 3, got
    assert [r["spans"] for r in got] == [[v] for v in values[1:]]


# ------------------------------------------------------------------ values no pattern knows
@pytest.mark.parametrize(("line", "values", "kind"), [
    ("Request received at {} (unix).", ["1776000000", "1776000042", "1776000107"], "epoch"),
    ("server_ts={}", ["1776000000123", "1776000042456", "1776000107789"], "epoch"),
    ("Nonce: {}", ["q8ZtR2mXw0Lp", "Hc41vNk9sTbE", "x7Yq0PaL2mWd"], "nonce"),
    ("Experiment group: {}", ["control", "treatment", "control"], "flag"),
    ("Variante: {}", ["A", "B", "A"], "flag"),
    ("Gruppe: {}", ["Kontrolle", "Test", "Kontrolle"], "flag"),  # any two words after a flag key
    ("dark_mode={}", ["on", "off", "on"], "flag"),
    ("Planning week: {}", ["2026-W15", "2026-W16", "2026-W17"], "week"),
    ("Aktuelle Kalenderwoche: KW {}", ["15", "16", "17"], "week"),
    ("Today is {}.", ["Tuesday", "Wednesday", "Thursday"], "date"),
    ("The customer's name is {}.", ["Anna Schmidt", "Markus Weber", "Lena Hoffmann"], "user"),
    ("Der Kunde heißt {}.", ["Anna", "Markus", "Lena"], "user"),
    ("Request arrived {} (time.time()).", ["1776000000.123456", "1776000042.5", "1776000107.25"], "epoch"),
    ("Generated on {} by the context builder.", ["Tue Apr 14 09:31:07 UTC 2026", "Tue Apr 14 09:32:55 UTC 2026",
                                                 "Tue Apr 14 09:40:01 UTC 2026"], "timestamp"),
    # by shape or by their line's form, whatever the key's words (issue 29, round 3)
    ("release channel: {}", ["beta", "stable", "beta"], "flag"),  # one word, the whole value of a key line
    ("Auslieferung: {}", ["Vorschau", "Standard", "Vorschau"], "flag"),
    ("Upstream ref: {}", ["edge-pqtrmxwz", "edge-kfhsdlqa", "edge-znwbcyre"], "value"),  # an id, whatever its key
    ("Snapshot taken {}", ["20260414T093107Z", "20260414T093255Z", "20260414T094001Z"], "timestamp"),  # ISO basic
    ("The local time is {}.", ["09:31", "09:32", "09:40"], "time"),  # a clock time that ends a sentence
    ("Retry token: {}", ["q8ZtR2mXw0Lp-", "Hc41vNk9sTbE_", "x7Yq0PaL2mW-"], "nonce"),  # an id ending in `-`
    # what is left of a budget, by its key or the words after it, and base32 draws (round 4)
    ("Budget remaining: {} tokens", ["120000", "113512", "107004"], "counter"),
    ("Noch übrige Aufrufe: {}", ["12", "11", "10"], "counter"),
    ("You have {} requests left.", ["30", "29", "28"], "counter"),
    ("Instance key {}", ["JBSWYQKLMNOPRSTU", "MZXW6YTBOI3DEMRS", "NBSWY3DPEB3W64TM"], "nonce"),  # the first without a digit
    # round 5: amounts with a currency or decimal groups, usage meters, dotted German clocks, pods'
    # names, trace contexts, Go's and a web log's times, values after an arrow, in a tag, on a label line
    ("Remaining balance for this key: ${}", ["12.40", "12.05", "11.71"], "counter"),
    ("Restbudget: {} €", ["18,50", "17,95", "17,20"], "counter"),
    ("{} / 128K tokens used", ["12,004", "19,877", "27,310"], "counter"),
    ("Es ist jetzt {} Uhr.", ["9.41", "9.58", "10.12"], "time"),
    ("Stand der Abfrage: {} Uhr", ["Di., 14.04.2026, 9.31", "Di., 14.04.2026, 9.58", "Di., 14.04.2026, 10.12"],
     "timestamp"),
    ("Handled by pod {}", ["api-gateway-7d9f8b6c5d-x2k4q", "api-gateway-7d9f8b6c5d-m8wzt", "api-gateway-7d9f8b6c5d-p5rtv"],
     "instance"),
    ("W3C trace context {}", ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                              "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                              "00-5e2a1d7c9b8f4e3a2d1c0b9a8f7e6d5c-a1b2c3d4e5f60718-01"], "trace"),
    ("Generated {}", ["2026-04-14 09:31:07.123456789 +0000 UTC", "2026-04-14 09:32:55.987654321 +0000 UTC",
                      "2026-04-14 09:40:01.555555555 +0000 UTC"], "timestamp"),
    ("Access log time [{}]", ["14/Apr/2026:09:31:07 +0000", "14/Apr/2026:09:32:55 +0000", "14/Apr/2026:09:40:01 +0000"],
     "timestamp"),
    ("active profile -> {}", ["fast", "thorough", "fast"], "flag"),
    ("<verbosity>{}</verbosity>", ["terse", "verbose", "terse"], "flag"),
    ("Region {}", ["West", "East", "West"], "flag"),
    # round 6: shares left, usage fractions, queue places, elapsed times, builds of one release,
    # braced GUIDs, Cloud Trace contexts, JavaScript's Date
    ("{}% of the monthly quota is left.", ["64", "61", "57"], "counter"),
    ("Kontingentnutzung: {} von 50.000 Anfragen", ["12.480", "12.913", "13.377"], "counter"),
    ("Context so far: {} of the 200k window", ["18.4k", "22.9k", "27.1k"], "counter"),
    ("Your place in the queue: {}", ["5", "4", "3"], "counter"),
    ("Session elapsed: {}", ["3m 12s", "4m 55s", "7m 02s"], "elapsed"),
    ("Worker uptime {} s", ["81234", "81301", "81377"], "elapsed"),
    ("Service build: {}", ["v3.2.0-41-g1a2b3c4", "v3.2.0-42-g5d6e7f8", "v3.2.0-43-g9a8b7c6"], "value"),
    ("Device {}", ["{1B4E28BA-2FA1-11D2-883F-0016D3CCA427}", "{7C9E6679-7425-40DE-944B-E07FC1F90AE7}",
                   "{C56A4180-65AA-42EC-A945-5FD21DEC0538}"], "uuid"),
    ("X-Cloud-Trace-Context: {}", ["0af7651916cd43dd8448eb211c80319c/1234567890123;o=1",
                                   "4bf92f3577b34da6a3ce929d0e0e4736/9876543210987;o=1",
                                   "5e2a1d7c9b8f4e3a2d1c0b9a8f7e6d5c/5555555555555;o=1"], "trace"),
    ("Client time: {}", ["Tue Apr 14 2026 09:31:07 GMT+0200 (Central European Summer Time)",
                         "Tue Apr 14 2026 09:32:55 GMT+0200 (Central European Summer Time)",
                         "Tue Apr 14 2026 09:40:01 GMT+0200 (Central European Summer Time)"], "timestamp"),
    # round 7: values in a Markdown table row, ports, epochs in nanoseconds, weeks with their year,
    # a sum spent so far, Sentry's and Jaeger's trace ids, WhatsApp message ids, base64 padding,
    # a clock with its German zone, a German date and time joined by `um`
    ("| Share used | {} % |", ["38,9", "40,4", "43,0"], "counter"),
    ("| Channel | {} |", ["web", "app", "web"], "flag"),
    ("Preview server listens on port {}.", ["51234", "53871", "49822"], "port"),
    ("Inspector at 127.0.0.1:{}", ["51234", "53871", "49822"], "port"),
    ("Trace started {}", ["1776000000123456789", "1776000042987654321", "1776000107555555555"], "epoch"),
    ("Planning for KW {}", ["15/2026", "16/2026", "17/2026"], "week"),
    ("This run has cost ${} so far.", ["0.1290", "0.1545", "0.1873"], "counter"),
    ("sentry-trace: {}", ["0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
                          "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                          "5e2a1d7c9b8f4e3a2d1c0b9a8f7e6d5c-a1b2c3d4e5f60718-1"], "trace"),
    ("Reply to {}", ["wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTg0QkE5RkQ3MjA5RTFEAA==",
                     "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQ0RDc1QzE4QTlCMjcwRjNFAA==",
                     "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQ5RTIxRjM0QjhBNzYwQzJBAA=="], "message"),
    ("csp-nonce={}", ["2sYICSOgfs5Is0Ei6XtZcQ==", "4kmFnzbnk/yk2r/YwFBfaQ==", "9gL2aQx7RtYpWm3vKc8NsA=="], "nonce"),
    ("Ortszeit {}", ["13:59 MEZ", "14:02 MEZ", "14:31 MEZ"], "time"),
    ("Eingegangen am {}", ["04.02.2026 um 06:21 Uhr", "04.02.2026 um 06:48 Uhr", "04.02.2026 um 07:02 Uhr"], "timestamp"),
    # round 8: rising sequence ids, snake-case id keys, Zipkin's b3, Message-IDs, Matrix events,
    # positions, countdowns as Go durations, short upper-case flags, syslog and Java zoned times,
    # a clock's sentence `Uhr` left out
    ("BUILD_RUN_ID={}", ["73410258811", "73410259420", "73410260117"], "id"),
    ("Last webhook delivery: {}", ["512003417", "512003421", "512003430"], "id"),
    ("b3: {}", ["0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1-00f067aa0ba902b7",
                "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1-b7ad6b7169203331",
                "5e2a1d7c9b8f4e3a2d1c0b9a8f7e6d5c-a1b2c3d4e5f60718-1-0a1b2c3d4e5f6071"], "trace"),
    ("In-Reply-To: <{}>", ["CAFx9b2_q8Zt=R2mXw0Lp@mail.example.com", "CAGh41vNk9s=TbEx7Yq0Pa@mail.example.com",
                           "CAJm3vKc8N=sA9gL2aQx7R@mail.example.com"], "message"),
    ("Matrix event {}", ["$GTd7FguoV8FWnFbB0JxXujr4qqaaABvvLOzAxzXMcU1",
                         "$vsHiQMaRiNTN9Ox98whGcTZc1UWb5fxzpF7STG7nVLe",
                         "$3lARUsRJlNONwktN9ugkZeESG61she-QAqq0nv3Vth1"], "message"),
    ("Vehicle position: {}", ["48.13712,11.57542", "48.13804,11.57391", "48.13911,11.57205"], "position"),
    ("Quota resets in {}", ["41.2s", "38.77s", "35.05s"], "counter"),
    ("x-ratelimit-reset-requests: {}", ["1m12.5s", "1m03.2s", "58.1s"], "counter"),
    ("Network: {}", ["4G", "LTE", "4G"], "flag"),
    ("Log line: {} sshd[812]: accepted key", ["Jul  4 09:15:22", "Jul  4 09:17:03", "Jul  4 09:21:40"], "timestamp"),
    ("Request time: {}", ["2026-03-04T09:15:22.481+01:00[Europe/Berlin]", "2026-03-04T09:17:03.112+01:00[Europe/Berlin]",
                          "2026-03-04T09:21:40.905+01:00[Europe/Berlin]"], "timestamp"),
    ("Jetzt ist es {} Uhr.", ["14:53", "14:58", "15:07"], "time"),
    # round 9: readings with a unit or after a timing key, times ago, ISO durations, zero-padded
    # tickets, log positions, stream ids, structured booleans, hour offsets, yearless stamps,
    # weak ETags, base64 JSON
    ("x-envoy-upstream-service-time-ms: {}", ["418", "1203", "377"], "counter"),
    ("Timing: render;dur={}", ["81.4", "140.9", "62.7"], "counter"),
    ("Battery temperature {} °C", ["31.7", "33.2", "32.9"], "counter"),
    ("Voraussichtliche Dauer: {} Min.", ["14", "23", "17"], "counter"),
    ("Julian date {}", ["2461102.81547", "2461102.82211", "2461102.83904"], "counter"),
    ("The cache was warmed {} minutes ago.", ["3", "11", "26"], "counter"),
    ("Zuletzt synchronisiert vor {} Minuten.", ["2", "9", "14"], "counter"),
    ("Conversation age: {}", ["PT2M13S", "PT5M40S", "PT9M2S"], "counter"),
    ("Aufrufnummer {}", ["A-017", "A-018", "A-021"], "id"),
    ("Replication at LSN {}", ["3F/1A2B3C4D", "3F/1A4C0E11", "3F/1A6F2290"], "id"),
    ("Kafka offset token {}", ["1767225600123-0", "1767225604551-3", "1767225611002-1"], "epoch"),
    ("Save-Data: {}", ["?0", "?1", "?0"], "flag"),
    ("Rendered at {}", ["2026-02-03 08:15:09.512+01", "2026-02-03 08:16:44.073+01", "2026-02-03 08:19:02.930+01"], "timestamp"),
    ("Preise Stand {}", ["14.02., 07:45", "14.02., 09:12", "14.02., 11:30"], "timestamp"),
    ("If-Match: {}", ['W/"1f4a-Qm9vdHN0cmFwIGNhY2hl0A"', 'W/"1f52-ZmlsZSBsaXN0aW5nIHYyB9"', 'W/"1f60-c3RhdGUgc25hcHNob3Q3x"'], "etag"),
    # round 10: sizes with a unit, ranges, redrawn hashes with a separator, long tokens, joined ids,
    # hours and minutes, log and Oracle stamps, German `date`, spoken dates, a key's clock with `Uhr`
    ("Scratch space left: {}", ["2.4T", "2.3T", "2.1T"], "counter"),
    ("Freier Speicher: {}", ["812G", "797G", "770G"], "counter"),
    ("Wartezeit an der Kasse: {} Minuten", ["5–10", "10–15", "0–5"], "counter"),
    ("Build cache entry [{}] reused.", ["3f/9a1c2e", "52/771043", "a0/e4b9d1"], "nonce"),
    ("__RequestVerificationToken: {}", ['CfDJ8gtD7fGUOv8fwNfBb0jXxUJR4QQAAabVVloZaXZxmCu1VShIqmArIntn9oX98WHgCtzC1uwB5FXZPf7stg7NvlE3LaruSrjLnonWKTn9UGKzEesg61SH', 'CfDJ8E_qaQQ0NV3vTH1lS6V6-o9jl8zSOwW_rXL-iuItEnuj-hlrWB8gpj7ktsjs0sW5uqSVZu9kK1V1miDZU4XcXF8cVGROoX9YE17swJaevAszj0OvEmMl', 'CfDJ8rltQ10v7SUw9ZRLsAwNpSpw23c_l9wxUhm_g1Con-kS9DP4flFRyB9jf8Ef-iTkl_8PCQmkrlD7suQEAg6NYB229x8yZl7ImA3k8nSV9_qT2GIdiKID'], "nonce"),
    ("activity.id = {}", ["Kq3vT9xw2LmP0aZ-eu|0000012", "Kq3vT9xw2LmP0aZ-eu|0000015", "Kq3vT9xw2LmP0aZ-eu|0000019"], "id"),
    ("ETA at the gate in {}.", ["4h 12m", "3h 58m", "3h 41m"], "elapsed"),
    ("Log: {} [main] INFO", ["Mar-03 09:12:44.120", "Mar-03 09:15:02.981", "Mar-03 09:21:30.007"], "timestamp"),
    ("SYSTIMESTAMP -> {}", ["03-MAR-26 09.12.44.120000 AM +01:00", "03-MAR-26 09.15.02.981000 AM +01:00",
                            "03-MAR-26 09.21.30.007000 AM +01:00"], "timestamp"),
    ("Serverzeit: {}", ["Do 3. Dez 09:12:44 CET 2026", "Do 3. Dez 09:15:02 CET 2026", "Do 3. Dez 09:21:30 CET 2026"],
     "timestamp"),
    ("Today is {}.", ["Tuesday, March third", "Wednesday, March fourth", "Thursday, March fifth"], "date"),
    ("Uhrzeit am Empfang: {}", ["09:12:44 Uhr", "09:15:02 Uhr", "09:21:30 Uhr"], "time"),
    # round 11: a key's number with its unit, the current value, a minus sign, German weekdays
    # before a written date, a clock before the date, German `9 Uhr 12`, logcat, base64 halves,
    # versioned signatures, a URL's last segment, a word glued before a UUID
    ("Pegel Maxau: {} cm", ["512", "508", "497"], "counter"),
    ("Netzfrequenz: {} Hz", ["49.987", "50.012", "50.003"], "counter"),
    ("<Lautheit>{} LUFS</Lautheit>", ["-23,4", "-19,8", "-21,1"], "counter"),
    ("Current bid: £{}", ["4,300", "4,700", "5,200"], "counter"),
    ("Sendetag: {}", ["Di., 3. März 2026", "Mi., 4. März 2026", "Do., 5. März 2026"], "date"),
    ("system__time: {}", ["Tuesday, 09:12 3 March 2026", "Tuesday, 09:40 3 March 2026", "Tuesday, 10:05 3 March 2026"],
     "timestamp"),
    ("An der Kasse ist es {}.", ["9 Uhr 12", "9 Uhr 40", "10 Uhr 05"], "time"),
    ("Newest logcat line: {}  1234  5678 I App: ok", ["03-03 09:12:44.120", "03-03 09:15:02.981", "03-03 09:21:30.007"],
     "timestamp"),
    ("requesttoken: {}", ['575YX8XM5mSLFy5UBIHEYeD7p4Zdl/AK6j0KgodkDIN=:zNlxICAbaG8wy1JZirLnqB0PRfMBH7+WY5YQ1xOy1bA=', 'imCaXyMFSb4hBqlxJJLafBvv6Q9RxXTndfYUZx9K1GN=:NEgeyg1+lWIQd9JjbaCIi05fHFWkvQLuR5qREC8tnEC=', 'J9InoRJJ5vFQrtK8J1D/BwwBJKLOg1qx647KDnL9CdO=:/+gBvmSZVr4/epzgZ3ZbxcoaRR/sFIjVO58jb0w/o5p='], "id"),
    ("webhook-signature: {}", ['v1,JEjFjtnCRz6YDieSGO5NvJZZ8gWB8EWcisUycL0xQ56=', 'v1,ZAwr7paMPbfxLnphCsKE4r1j+DbI2EWqR8T4/Lc4lVg=', 'v1,nwamSi/Z0OAwDFzP+LVI60zif8/Qr38oNY1DhQCEYTd='], "nonce"),
    ("Build scan: https://scans.example.com/s/{}", ["q7x2mf9k3ab4c", "z8n1vk5p0dq2e", "m3c9wt4h7jr6f"], "nonce"),
    ("Invocation: {}", ["e-1b2c3d4e-5f60-4718-8a9b-0c1d2e3f4a5b", "e-6c7d8e9f-0a1b-4c2d-9e3f-4a5b6c7d8e9f",
                        "e-0f1e2d3c-4b5a-4968-8776-5a4b3c2d1e0f"], "uuid"),
    ("Authorization: Bearer {}", ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIiwiaWF0IjoxNzY3MjI1NjAwfQ.a1B2c3D4e5F6g7H8",
                                  "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIiwiaWF0IjoxNzY3MjI1NjYwfQ.Z9y8X7w6V5u4T3s2",
                                  "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIiwiaWF0IjoxNzY3MjI1NzIwfQ.k1L2m3N4o5P6q7R8"], "token"),
    # round 12: scientific notation, a count out of a capacity, a work week and its day, a German
    # weekday's abbreviation before a date without a year, a date then `at` and a clock, a zone's
    # name with its offset, a true minus sign
    ("Load-lock vacuum: {} mbar", ["3.1E-05", "2.8E-05", "4.4E-06"], "counter"),
    ("Plant calendar: {}", ["WW12.2", "WW12.3", "WW12.4"], "week"),
    ("Stand: {}", ["Mo., 9. März", "Di., 10. März", "Mi., 11. März"], "date"),
    ("Stock counted {}", ["3 March 2026 at 09:12", "3 March 2026 at 09:40", "3 March 2026 at 10:05"], "timestamp"),
    ("Snapshot written {}", ["2026-03-03 09:12:44 AM CET+0100", "2026-03-03 09:40:02 AM CET+0100",
                             "2026-03-03 10:05:30 AM CET+0100"], "timestamp"),
    ("Kühlzelle 3: {} °C", ["−21,3", "−20,8", "−21,9"], "counter"),
    ("<reading>Kiln state: {}</reading>", ["FIRING", "COOLING", "FIRING"], "flag"),  # a key's whole value, a tag's end
    ('{{"vacuum_mbar": "{}"}}', ["2.4E-03", "2.9E-03", "3.3E-03"], "counter"),  # a JSON value in scientific notation
    # round 13: a compact stamp (HL7's DTM), Python's datetime repr, a French clock, long signed
    # draws, a number with decimals before a unit of measure in a sentence, an abbreviated
    # counter's key, a count left before something, two words in quotes after a flag key
    ("MSH-7: {}", ["20260303091244+0100", "20260303091502+0100", "20260303092130+0100"], "timestamp"),
    ("Captured at {}", ["datetime.datetime(2026, 3, 3, 9, 12, 44, 120000)", "datetime.datetime(2026, 3, 3, 9, 15, 2, 981)",
                        "datetime.datetime(2026, 3, 3, 9, 21, 30, 7)"], "timestamp"),
    ("Heure au port : {}", ["9 h 12", "9 h 40", "10 h 05"], "time"),
    ("View state: {}", ["4410923866123456789:-2288811122233344455", "-118273645501928374:7766554433221100998",
                        "9081726354453627180:-1029384756647382910"], "nonce"),
    ("The tide gauge reads {} m (live).", ["2.41", "2.38", "2.35"], "counter"),
    ("uplink f_cnt={}", ["10412", "10419", "10433"], "counter"),
    ("{} slots left before the desk closes", ["231", "229", "224"], "counter"),
    ('reception_info{{mode="{}"}} 1', ["night service", "routine", "night service"], "flag"),
    # round 14: a key glued to its value, a unit over a square metre, Go's zone and monotonic
    # reading, Rust's SystemTime, a weekday, `the`, an ordinal, `of` and a month, a URL-escaped cookie
    ("X-DEPOT-SALZ:{} t", ["501,4", "499,0", "497,2"], "counter"),
    ("Restsalz am Messpunkt: {} g/m²", ["12,1", "11,4", "10,9"], "counter"),
    ("time.Now(): {}", ["2026-08-15 19:03:44.380956787 +0100 BST m=+15820.459842479",
                        "2026-08-15 19:07:22.717294516 +0100 BST m=+16038.796180208",
                        "2026-08-15 19:07:31.01608053 +0100 BST m=+16047.094966222"], "timestamp"),
    ("Last poll {}", ["SystemTime { tv_sec: 1765409321, tv_nsec: 215993673 }",
                      "SystemTime { tv_sec: 1765409610, tv_nsec: 186218971 }",
                      "SystemTime { tv_sec: 1765409798, tv_nsec: 543640594 }"], "timestamp"),
    ("Today is {}.", ["Sunday the 17th of May", "Monday the 18th of May", "Tuesday the 19th of May"], "date"),
    ("Cookie: connect.sid={}", ["s%3AB_kCkze8R2e_DyGF5kEG-mbH4mKHJbJU.%2BiBAwtPXB23cWu%2BJxm%2BiPBSKbuVSID5mQj8eWZy%2BBzs",
                                "s%3AD-hriMZdAc3_sbp70fMnqqBSEShmRm2n.20HG0MT63iCBzL6v5Aa%2FCGxVWEiOZBAxZ2%2F0EWYCmdY",
                                "s%3Anu1U06238vd4XZE3XJcGBASGeCIb2EMa.zDoUx%2FlWM2syxDSZ4cFdMCZceTRNlnSLLbnhLKdFRsY"], "nonce"),
    # round 15: a signed reading with its sign, a multiplier, a share of a kind (`Vol.-%`), a
    # hyphenated flag word, a few words of a state after a key, a clock's key, an unreserved `~`
    # in a nonce (RFC 7636's verifier), BEAM's inspect forms and an Elixir sigil, whole
    ("Gewichtsänderung seit gestern: {} kg", ["+0,37", "-1,12", "+0,58"], "counter"),
    ("Current surge factor: {}", ["1.4x", "1.2x", "1.5x"], "counter"),
    ("CO2 im Abgas: {} Vol.-%", ["9,8", "10,3", "9,6"], "counter"),
    ("Service mode today: {}", ["drive-thru", "dine-in", "drive-thru"], "flag"),
    ("Rührwerk 2: {}", ["Standby", "in Betrieb", "aus"], "flag"),
    ("Shift clock: {}", ["0915Z", "1140Z", "1402Z"], "value"),
    ("code_verifier: {}", ["Qm3.vX~9aLr_T0pWzK-8sJdF2hY~eN4bC6uG1oIqR5tZ7xM",
                           "w~Kp2Ld8.Zr0sQ_fN3vB9xY-cT6mH1jE4gA7uR~oI5kWsD",
                           "T7~nB4qX.eL1zR8_kP0vW3-mY6cJ9hF2sD5aG~uK8oN1tQ"], "nonce"),
    ("Handled by process {}", ["#PID<0.4411.0>", "#PID<0.5120.0>", "#PID<0.5987.0>"], "instance"),
    ("Monitor {} is active", ["#Reference<0.1203.4456.7781>", "#Reference<0.3921.1180.2046>",
                              "#Reference<0.2211.9093.4410>"], "token"),
    ("Last sync {}", ["~U[2026-03-02 08:11:05.123456Z]", "~U[2026-03-02 08:14:41.908212Z]",
                      "~U[2026-03-02 08:20:17.004991Z]"], "timestamp"),
    # round 16: readings listed with decimals, a code drawn again in its shape (both whole), a
    # weekday before a numeric date and RFC 850's, IEC 61131-3 literals, SNMP TimeTicks, a signed
    # hex digest, a German compound counter
    ("load average: {}", ["0.52, 0.58, 0.59", "0.61, 0.60, 0.60", "0.48, 0.57, 0.59"], "counter"),
    ("Nächste Kuh an Box 1: {}", ["DE 05 311 20917", "DE 05 742 61833", "DE 05 118 09452"], "value"),
    ("Report generated {}", ["Wed 10/13/2026 17:38:58.53", "Thu 10/14/2026  6:58:06.02",
                             "Thu 10/14/2026  7:12:44.90"], "timestamp"),
    ("Cookie expires {}", ["Tuesday, 05-Nov-26 14:15:26 GMT", "Wednesday, 06-Nov-26 09:01:11 GMT",
                           "Wednesday, 06-Nov-26 11:47:03 GMT"], "timestamp"),
    ("PLC clock {}", ["TOD#14:32:07.123", "TOD#14:32:09.870", "TOD#14:33:01.004"], "time"),
    ("Last cycle {}", ["DT#2026-05-05-14:32:07.123", "DT#2026-05-05-14:32:09.870", "DT#2026-05-05-14:33:01.004"],
     "timestamp"),
    ("sysUpTime.0 = Timeticks: {}", ["(46912013) 5 days, 10:18:40.13", "(46912977) 5 days, 10:18:49.77",
                                     "(46914102) 5 days, 10:19:01.02"], "timestamp"),
    ("Join hash {}", ["-4f1a09c3b2e8d7a6f5e4c3b2a1908f7e6d5c4b3a", "-0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a39281",
                      "3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a"], "hex"),
    ("Druckzähler: {}", ["10412", "10415", "10421"], "counter"),
    # round 17: durations a clock measures (to a fraction of a second, a countdown's minutes and
    # seconds, a time since), a duration after a counter's key, a `hrs` clock, an ISO date with its
    # weekday, Go's RubyDate, a state's code with its text, a URI's chain of keys
    ("CPU: {}", ["3min 12.448s", "3min 14.902s", "3min 19.017s"], "elapsed"),
    ("Countdown to doors: {}", ["9 min 12 s", "8 min 47 s", "8 min 05 s"], "elapsed"),
    ("Hilfsfrist verbleibend: {}", ["6 min 02 s", "5 min 41 s", "5 min 09 s"], "counter"),
    ("Last backup finished {} ago", ["5h 7min", "5h 12min", "5h 31min"], "elapsed"),
    ("Alarm received at {}", ["0657 hrs", "0712 hrs", "0740 hrs"], "time"),
    ("Shift plan for {}", ["2026-09-04 (Fri)", "2026-09-05 (Sat)", "2026-09-06 (Sun)"], "date"),
    ("Build started {}", ["Sun Jun 07 13:00:00 +0100 2026", "Sun Jun 07 13:04:51 +0100 2026",
                          "Sun Jun 07 13:09:12 +0100 2026"], "timestamp"),
    ("FMS-Status: {}", ["8 (Ankunft am Transportziel)", "1 (Einsatzbereit über Funk)", "2 (Einsatzbereit auf Wache)"],
     "flag"),
    ("Now playing spotify:episode:{}", ["4rOoJ6Egrf8K2IrywzwOMk", "7ouMYWpwJ422jRcDASZB7P", "2takcwOaAZWiXQijPHIx7B"],
     "nonce"),
    # round 18: readings listed whole though one changed, a German date with its clock after a
    # dash, FIX's UTCTimestamp, an ISO 8601 ordinal date and time, a dotted clock with am or pm
    ("GPS week and time of week: {}", ["2427, 109343.643", "2427, 110167.307", "2427, 110598.025"], "counter"),
    ("Schichtbeginn: {}", ["07.08.2026 - 04:25:43", "07.08.2026 - 13:59:30", "08.08.2026 - 02:11:05"], "timestamp"),
    ("FIX SendingTime: {}", ["20260712-02:30:17.703", "20260712-07:46:57.450", "20260713-08:13:54.321"], "timestamp"),
    ("Pass start {}", ["2026-036T07:06:34.627Z", "2026-036T08:41:02.118Z", "2026-036T10:15:47.930Z"], "timestamp"),
    ("Last delivery at {}", ["11.32am", "2.05pm", "4.47pm"], "time"),
    # round 19: a date with slashes before its clock, SAP's date and clock apart, a date with its
    # clock after `@`
    ("Trace window end {}", ["2026/04/14 01:57:46.3200", "2026/04/15 00:51:06.4500", "2026/04/15 07:12:19.0100"],
     "timestamp"),
    ("Rückmeldung (SAP PP, Datum und Uhrzeit) {}", ["20261111 122318", "20261111 184557", "20261112 061204"],
     "timestamp"),
    ("Bestellung erstellt am {}", ["27. Juli 2026 @ 18:37", "28. Juli 2026 @ 08:44", "28. Juli 2026 @ 09:02"],
     "timestamp"),
    # a key line's whole value on its first change: a state of two words (with a possessive's
    # apostrophe; after a key holding a clock's colon), a number with digit groups or decimals
    # (after a currency or a scale's capitals) ending the line
    ("Result of the 2.45: {}", ["Weighed in", "Stewards' enquiry", "Weighed in"], "flag"),
    ("Grundkurs (dienstags 19:30 Uhr): {}", ["ausgebucht", "Plätze frei", "ausgebucht"], "flag"),
    ("Racegoers through the turnstiles: {}", ["6,814", "7,387", "7,902"], "counter"),
    ("Tote Placepot pool: £{}", ["55,486", "59,112", "62,642"], "counter"),
    ("Latest event magnitude: ML {}", ["0.2", "2.4", "2.5"], "counter"),
    # round 20: a long number drawn again after a key and a scale's capitals, a unit with a power
    # over another, a METAR wind group, Intl's full date with its `GMT+1`, git's date with its
    # offset after the year, `uptime`'s line
    ("Vessel in focus: MMSI {}", ["257978390", "235398212", "636350528"], "id"),
    ("Abfluss am Pegel Talmering: {} m³/s", ["652,0", "649,7", "640,7"], "counter"),
    ("Wind at the breakwater {}", ["30015KT", "32011KT", "VRB03KT"], "counter"),
    ("Generated {}", ["Monday, September 7, 2026 at 10:18:42\u202fAM GMT+1",
                      "Monday, September 7, 2026 at 10:28:17\u202fAM GMT+1",
                      "Monday, September 7, 2026 at 10:30:19\u202fAM GMT+1"], "timestamp"),
    ("Last commit: {}", ["Tue Jun 2 21:06:47 2026 +0100", "Tue Jun 2 21:21:45 2026 +0100",
                         "Tue Jun 2 21:55:23 2026 +0100"], "timestamp"),
    ("Build runner: {}", ["15:29:15 up 20 days,  8:34,  1 user,  load average: 1.03, 1.04, 0.90",
                          "15:37:56 up 20 days,  8:43,  1 user,  load average: 2.08, 1.90, 1.42",
                          "15:42:02 up 20 days,  8:47,  2 users,  load average: 2.58, 2.28, 1.70"], "reading"),
    # a key line's state of up to four words, a small number among them, on its first change
    ("Pilot boat Sea Lark: {}", ["returning to base", "on station", "returning to base"], "flag"),
    ("Lage am Pegel Talmering: {}", ["Meldestufe 1", "unter Meldestufe 1", "Meldestufe 2"], "flag"),
    # round 21: a camel-case state after a flag key, a key holding a range's dash, a key that ends
    # in brackets with the reading's unit after the number
    ("Consumer group clearair-ingest: {}", ["Stable", "PreparingRebalance", "Stable"], "flag"),
    ("Signal 4713B (lane 1, J14–J15 northbound): {}", ["blank", "Red X", "blank"], "flag"),
    ("Flow at J15 southbound (MIDAS): {} veh/h", ["3,506", "3,392", "3,803"], "counter"),
])
def test_unknown_dynamic_values_are_found_exactly(fpr, line: str, values: list[str], kind: str) -> None:
    system = SYSTEM_DE if any(w in line for w in ("Variante", "KW", "Kunde", "Auslieferung")) else SYSTEM
    bodies = [body(f"{line.format(v)}\n{system}", turns) for v, turns in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]  # the value itself, not its line
    assert all(r["span_kinds"] == [kind] for r in got)


def test_a_number_that_changes_at_one_place_on_every_request_is_a_value(fpr) -> None:
    """A bare number after a key (no form says it is per-request) changes: an edit, once. When the
    same place changes again on the next request, it is a value the client writes per request
    (round 13): the tenant's records keep where the first change was, for every pod."""
    values = ["4127", "4133", "4140", "4151"]
    bodies = [body(f"Cars on the vehicle deck: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["template_change", "dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[], ["4140"], ["4151"]]


def test_a_word_that_changes_at_one_place_again_is_a_state(fpr) -> None:
    """A word with no key or form to say it is a value changes: an edit, once. When the same place
    changes again, it is a state the client writes per request (round 15: `LOW` -> `MODERATE` ->
    `LOW`), as a number's second change is (above)."""
    values = ["LOW", "MODERATE", "LOW", "HIGH"]
    bodies = [body(f"The bird hazard on the field is {v} according to the tower.\n{SYSTEM}", t)
              for v, t in zip(values, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["template_change", "dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[], ["LOW"], ["HIGH"]]


def test_a_state_of_two_words_that_ends_the_system_message(fpr) -> None:
    """A key line's whole value of one or two words, the system message's last line: the value
    ends with the message, not with the template text the engine renders after it (round 16)."""
    states = ["mechanical", "mechanical", "free cooling", "mechanical"]
    bodies = [body(f"{SYSTEM}\nCooling mode: {v}", t) for v, t in zip(states, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == [None, "dynamic_head", "dynamic_head"], got
    assert [r["spans"] for r in got] == [[], [states[2]], [states[3]]]


@pytest.mark.parametrize("line,old,new", [
    ("Max results per page: {}", "15", "30"),  # a setting: round, ungrouped
    ("Version: {}", "3.2", "4.3"),  # a release
    ("Engine: {}", "4.3.2", "5.4.3"),  # a release's three parts
    ("Max stake: £{} per bet", "2,500", "5,000"),  # the number does not end the line
])
def test_a_settings_number_ending_a_key_line_stays_an_edit(fpr, line: str, old: str, new: str) -> None:
    bodies = [body(f"{line.format(v)}\n{SYSTEM}", t) for v, t in zip([old, new], conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


def test_one_word_changed_inside_a_keys_phrase_is_that_word_not_the_phrase(fpr) -> None:
    """`ATIS: information Foxtrot is current` -> `Golf`: the phrase stays, a word of it changed; a
    state of several words is read whole only where the phrases differ at their first or last word
    (round 20). The word's first change is the edit it looks like, the next one a value."""
    letters = ["Echo", "Foxtrot", "Golf", "Hotel"]
    bodies = [body(f"ATIS: information {v} is current\n{SYSTEM}", t) for v, t in zip(letters, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["spans"] for r in got] == [[], ["Golf"], ["Hotel"]], got


def test_a_long_number_edited_once_after_a_key_stays_an_edit(fpr) -> None:
    """A setting's long number (`100000` -> `200000`: most digits kept) is no id drawn again."""
    bodies = [body(f"Max tokens per day: {v}\n{SYSTEM}", t) for v, t in zip(["100000", "200000"], conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


def test_a_one_letter_key_glued_to_its_value_is_no_part_of_it(fpr) -> None:
    """A printer's M105 reply (`T:214.8 /215.0`): the value starts after its one-letter key, as
    after a longer glued key (round 18); one of a status line's four readings changed, written with
    decimals, is a value on its first change (round 22: `status_readings`), the number alone."""
    values = ["214.8", "214.3", "213.9", "214.6"]
    bodies = [body(f"Hotend: ok T:{v} /215.0 B:60.1 /60.0\n{SYSTEM}", t) for v, t in zip(values, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head", "dynamic_head"], got
    assert [r["spans"] for r in got] == [["214.3"], ["213.9"], ["214.6"]]


def test_a_number_edited_once_stays_an_edit(fpr) -> None:
    values = ["4127", "4133", "4133", "4133"]
    bodies = [body(f"Cars on the vehicle deck: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(4), strict=True)]
    assert causes(fpr, bodies) == ["template_change", None, None]


def test_a_value_in_a_sentence_of_the_first_user_messages_context_block(fpr) -> None:
    """One token that reads as a value (a digit, an id's separators) changes in place in the first
    user message while the turns after it stay: the client refreshed a value it injects there, not
    a person editing a turn (round 12); a changed word there stays a history edit (above)."""
    names = ["brave_newton", "quiet_curie", "eager_turing", "bold_hopper"]

    def first(name: str) -> str:
        return f"<context>\nThe newest container is named {name}.\nBranch: main\n</context>\n" + TASK

    bodies = [body(CODER, [first(n), *t[1:]]) for n, t in zip(names, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head"] * 3, got
    assert [r["spans"] for r in got] == [[n] for n in names[1:]]


def test_cells_of_a_csv_row_in_the_first_user_messages_context_block(fpr) -> None:
    """A historian export pasted into the first user message: a cell that changes in place is a
    value, a word (a selector's state) or a number with the cell before it ending in a digit
    (round 14: `PLC2,89` is two cells, not one number)."""
    rows = [("HAND", "89", "0.47"), ("AUTO", "98", "0.41"), ("HAND", "105", "0.44"), ("AUTO", "107", "0.52")]

    def first(selector: str, seq: str, chlorine: str) -> str:
        return ("<export>\ntag,description,value,unit\n"
                f"P2_SELECTOR,Feed pump 2 selector,{selector},\n"
                f"PLC2_SEQ,NDATA sequence of PLC2,{seq},\n"
                f"FW_CL2,Final water free chlorine,{chlorine},mg/l\n</export>\n" + TASK)

    for column in range(3):
        values = [r[column] for r in rows]
        cells = [tuple(v if c == column else rows[0][c] for c in range(3)) for v in values]
        bodies = [body(CODER, [first(*cell), *t[1:]]) for cell, t in zip(cells, conversation(4), strict=True)]
        got = run(fpr, bodies)
        assert [r["cause"] for r in got] == ["dynamic_head"] * 3, (column, got)
        assert [r["spans"] for r in got] == [[v] for v in values[1:]], column


def test_a_word_of_a_report_in_capitals_in_the_first_user_messages_context_block(fpr) -> None:
    """A machine's report in capitals pasted into the first user message (a D-ATIS): a word that
    changes in place there is a value, not a person's edit of their turn (round 15)."""
    levels = ["LOW", "MODERATE", "LOW", "HIGH"]

    def first(level: str) -> str:
        return f"<atis>\nINFO K 1020Z\nRWY 24 IN USE\nBIRD ACTIVITY {level}\nQNH 1011\n</atis>\n" + TASK

    bodies = [body(CODER, [first(v), *t[1:]]) for v, t in zip(levels, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head"] * 3, got
    assert [r["spans"] for r in got] == [[v] for v in levels[1:]]


def test_oracle_date_rolling_over_without_a_cue(fpr) -> None:
    """Oracle's `DD-MON-RR` date a day later is a clock's date, not an edit (round 10)."""
    dates = ["Berth schedule for 16-APR-26", "Berth schedule for 16-APR-26", "Berth schedule for 17-APR-26"]
    bodies = [body(f"{d}\n{SYSTEM}", t) for d, t in zip(dates, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == [None, "dynamic_head"]
    assert got[1]["spans"] == ["17-APR-26"] and got[1]["span_kinds"] == ["date"]


def test_date_rolling_over_at_midnight(fpr) -> None:
    dates = ["Heute ist der 14.04.2026.", "Heute ist der 14.04.2026.", "Heute ist der 15.04.2026."]
    bodies = [body(f"{d}\n{SYSTEM_DE}", t) for d, t in zip(dates, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == [None, "dynamic_head"]
    assert got[1]["spans"] == ["15.04.2026"] and got[1]["span_kinds"] == ["date"]


def test_a_value_that_ends_the_system_text_is_read_to_the_end_of_its_message(fpr) -> None:
    """A flag on the last line of the system text: its line ends with the message, not with the
    template text that follows it (the conversation starts one exchange in: a value there costs
    only when reusable text followed it)."""
    values = ["beta", "stable", "beta"]
    bodies = [body(f"{SYSTEM}release channel: {v}", t) for v, t in zip(values, conversation(4)[1:], strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"] and [r["spans"] for r in got] == [["stable"], ["beta"]]


def test_a_date_without_a_cue_that_moves_on_by_a_day_is_a_clock(fpr) -> None:
    """No "today" cue, but the date moved forward by a day between two requests: a clock's date,
    in any numeric or written form and any spelling of its month (Austria's `Jänner`, Dutch
    `mei`); moved by months, or edited into no date, it is an edit."""
    for dates in (["04/14/2026", "04/14/2026", "04/15/2026"], ["14 April 2026", "14 April 2026", "15 April 2026"],
                  ["15. Jänner 2026", "15. Jänner 2026", "16. Jänner 2026"], ["5 mei 2026", "5 mei 2026", "6 mei 2026"]):
        bodies = [body(f"Prices as listed on {d}, all taxes included.\n{SYSTEM}", t)
                  for d, t in zip(dates, conversation(3), strict=True)]
        got = run(fpr, bodies)
        assert [r["cause"] for r in got] == [None, "dynamic_head"] and got[1]["spans"] == [dates[2]], got
    for new in ("2024-06-15", "3135-14-12"):
        bodies = [body(f"Prices valid from {d}, all taxes included.\n{SYSTEM}", t)
                  for d, t in zip(["2024-03-01", new, new], conversation(3), strict=True)]
        assert causes(fpr, bodies) == ["template_change", None]


def test_a_weekday_and_its_day_without_a_year_moving_on_together_is_a_clock(fpr) -> None:
    """A rota's `Thu 22/05` -> `Fri 23/05` (`Montag, 3.8.` -> `Dienstag, 4.8.`, Italian's Friday to
    Saturday): no year and no cue, but the weekday moved on with the day, as a clock's today does
    (round 15); a day moved without its weekday is an edit."""
    for days in (["Thu 22/05", "Thu 22/05", "Fri 23/05"], ["Montag, 3.8.", "Montag, 3.8.", "Dienstag, 4.8."],
                 ["venerdì, 4.12.", "venerdì, 4.12.", "sabato, 5.12."]):
        bodies = [body(f"Bookings shown for {d}\n{SYSTEM}", t) for d, t in zip(days, conversation(3), strict=True)]
        got = run(fpr, bodies)
        assert [r["cause"] for r in got] == [None, "dynamic_head"] and got[1]["spans"] == [days[2]], got
    days = ["Thu 22/05", "Thu 29/05", "Thu 29/05"]
    bodies = [body(f"Bookings shown for {d}\n{SYSTEM}", t) for d, t in zip(days, conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["template_change", None]


def test_a_number_or_a_sentence_after_a_key_edited_once_is_no_value(fpr) -> None:
    """Only one word or an id is read as a key's per-request value: a bare number (a limit), a
    version or a value of several words changed after a key is an edit."""
    for old, new in (("Max results: 5", "Max results: 10"), ("Catalogue: v7", "Catalogue: v8"),
                     ("Tone: friendly and brief", "Tone: formal and brief")):
        convo = conversation(3)
        bodies = [body(f"{old}\n{SYSTEM}", convo[0]), body(f"{new}\n{SYSTEM}", convo[1]), body(f"{new}\n{SYSTEM}", convo[2])]
        assert causes(fpr, bodies) == ["template_change", None], (old, new)


# ------------------------------------------------------------------ tools
def test_tools_listed_in_system_text_in_another_order(fpr) -> None:
    entries = ["- filesystem.read_file(path: str): read a text file.", "- git.status(): show the working tree.",
               "- browser.open(url: str): open a page.", "- browser.search(query: str): search the web."]
    orders = [entries, entries[1:2] + entries[:1] + entries[2:], entries[1:2] + entries[:1] + entries[2:]]
    bodies = [body(f"{CODER}\nYou can call these tools:\n" + "\n".join(o), t)
              for o, t in zip(orders, conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def reordered_listing_causes(fpr: Fingerprinter, entries: list[str], heading: str, order: list[int]) -> list[str | None]:
    """The causes of a conversation whose system text lists `entries` under `heading`, then in
    `order` on the next two requests."""
    moved = [entries[k] for k in order]
    bodies = [body(f"{SYSTEM}\n{heading}:\n" + "\n".join(o) + "\nAnswer briefly.", t)
              for o, t in zip([entries, moved, moved], conversation(3), strict=True)]
    return causes(fpr, bodies)


TAGGED_TOOLS = {
    "tag-with-name": ['<tool name="orders.lookup">Find an order by number.</tool>',
                      '<tool name="orders.cancel">Cancel an order that has not shipped.</tool>',
                      '<tool name="returns.open">Open a return.</tool>',
                      '<tool name="shipping.track">Tracking events of a parcel.</tool>'],
    "self-closing-with-id": ['<command id="refund" args="order, amount"/>', '<command id="resend" args="order"/>',
                             '<command id="address_change" args="order, address"/>', '<command id="note" args="text"/>'],
    "tag-blocks": [f"<tool_description>\n<tool_name>{n}</tool_name>\n<description>{d}</description>\n</tool_description>"
                   for n, d in (("lookup_order", "Find an order."), ("create_return", "Open a return."),
                                ("track_shipment", "Track a parcel."), ("update_address", "Change the address."))],
    "bold-names": ["- **lookup_order**: find an order by number", "- **create_return**: open a return",
                   "- **track_shipment**: tracking events", "- **update_address**: change the address"],
    "table-rows": ["| `lookup_order` | find an order |", "| `create_return` | open a return |",
                   "| `track_shipment` | tracking events |", "| `update_address` | change the address |"],
    "slash-commands": ["/refund <order> <amount> - refund an order", "/resend <order> - send the parcel again",
                       "/address <order> - change the delivery address", "/note <text> - add a note to the case"],
}


@pytest.mark.parametrize("form", sorted(TAGGED_TOOLS))
def test_tools_listed_in_system_text_as_tags_or_markdown_in_another_order(fpr, form: str) -> None:
    """Whatever markup sets the tool's name apart (a tag's attribute, a tag of its own, bold, a table
    cell), entries reordered in the system text are a tool reorder, also when an entry spans lines."""
    assert reordered_listing_causes(fpr, TAGGED_TOOLS[form], "Tools", [2, 0, 1, 3]) == ["tool_order", None]


COLUMN_TOOLS = {
    "http-routes": ["GET /orders/{id} - one order with its lines", "POST /returns - open a return (order, reason)",
                    "GET /parcels/{id}/events - tracking events of a parcel", "PATCH /orders/{id} - change the address"],
    "cli-help": ["  order-show <id>        one order with its lines", "  return-open <id> <why>  open a return",
                 "  parcel-track <id>      tracking events of a parcel", "  address-set <id> <adr> change the address"],
    "django-help": ["    order_show", "    return_open", "    parcel_track", "    address_set"],  # round 14
    "arrow-list": ["* order_show -> One order with its lines.", "- return_open -> Open a return.",
                   "* parcel_track -> Tracking events of a parcel.", "- address_set -> Change the address."],
    "rails-tasks": ["bin/rails orders:show[id]        # One order with its lines",
                    "bin/rails returns:open[id,why]    # Open a return",
                    "bin/rails parcels:track[id]       # Tracking events of a parcel",
                    "bin/rails orders:readdress[id]    # Change the address"],
    "tab-separated": ["order_show\tid\tone order with its lines", "return_open\tid, reason\topen a return",
                      "parcel_track\tid\ttracking events of a parcel", "address_set\tid, address\tchange the address"],
}


@pytest.mark.parametrize("form", sorted(COLUMN_TOOLS))
def test_tools_listed_as_routes_or_in_columns_in_another_order(fpr, form: str) -> None:
    """Tools written as HTTP routes, as a CLI's help (arguments, then a gap before the description)
    or as a tab-separated table, reordered: a tool reorder."""
    assert reordered_listing_causes(fpr, COLUMN_TOOLS[form], "Commands", [1, 3, 0, 2]) == ["tool_order", None]


# four tools of a shop, (name, description): the entries of the block forms below
ORDER_TOOLS = (("order_show", "One order with its lines."), ("return_open", "Open a return."),
               ("parcel_track", "Tracking events."), ("address_set", "Change the address."))
BLOCK_TOOLS = {
    # round 9: blocks that name their tool inside (a tag, a declared type, `let name = "x"`),
    # whatever separates them
    "xml-function-blocks": [f"<function>\n<name>{n}</name>\n<description>{d}</description>\n<parameters>\n"
                            f"<parameter>\n<name>order</name>\n<type>string</type>\n</parameter>\n</parameters>\n</function>"
                            for n, d in ORDER_TOOLS],
    "agent-name-blocks": [f"Agent name: {n}\nAgent description: {d}\n" for n, d in ORDER_TOOLS],
    "r-tool-calls": [f'chat$register_tool(tool(\n  {n},\n  "{d}",\n  arguments = list()\n))\n' for n, d in ORDER_TOOLS],
    "csharp-factory-calls": [f'    AIFunctionFactory.Create(\n        (string order) => shop.RunAsync(order),\n        "{n}",\n        "{d}"),'
                             for n, d in ORDER_TOOLS],
    "php-tool-chains": [f"    Tool::as('{n}')\n        ->for('{d}')\n        ->withStringParameter('order', 'Order number')\n"
                        f"        ->using($this->shop->{n.split('_')[0]}(...)),"
                        for n, d in ORDER_TOOLS],
    "ruby-classes": [f'class {n.title().replace("_", "")} < Agent::Tool\n  description "{d}"\n  param :order, desc: "Order number"\nend\n'
                     for n, d in ORDER_TOOLS],
    "swift-structs": [f'struct {n.title().replace("_", "")}Tool: Tool {{\n    let name = "{n}"\n    let description = "{d}"\n\n'
                      f"    struct Arguments {{\n        var order: String\n    }}\n}}\n"
                      for n, d in ORDER_TOOLS],
    "csharp-kernel": [f'    [KernelFunction("{n}"), Description("{d}")]\n    public async Task<string> {n.title().replace("_", "")}Async(string order)'
                      for n, d in ORDER_TOOLS],
    "go-types": [f'type {n.title().replace("_", "")} struct{{ db *sql.DB }}\n\n'
                 f'func ({n.title().replace("_", "")}) Name() string {{ return "{n}" }}\n\n'
                 f'func ({n.title().replace("_", "")}) Description() string {{ return "{d}" }}\n'
                 for n, d in ORDER_TOOLS],
    # round 14: Java SDK builders (`.name("x")`), Rust's `impl Tool for X` with its `const NAME`
    "java-builders": [f'params.addTool(ChatCompletionTool.builder()\n        .function(FunctionDefinition.builder()\n'
                      f'                .name("{n}")\n                .description("{d}")\n'
                      f'                .parameters(FunctionParameters.builder()\n'
                      f'                        .putAdditionalProperty("type", JsonValue.from("object"))\n'
                      f'                        .putAdditionalProperty("required", JsonValue.from(List.of("order")))\n'
                      f'                        .build())\n                .build())\n'
                      f'        .build());\n' for n, d in ORDER_TOOLS],
    "rust-impls": [f'impl Tool for {n.title().replace("_", "")} {{\n    const NAME: &\'static str = "{n}";\n'
                   f'    type Error = ShopError;\n}}\n' for n, d in ORDER_TOOLS],
    # round 15: the MCP Java SDK's tool specifications, each a constructor given the name first
    "java-mcp-specs": [f'var {n.replace("_", "")}Spec = new McpServerFeatures.SyncToolSpecification(\n'
                       f'        new McpSchema.Tool("{n}", "{d}", """\n'
                       f'                {{ "type": "object", "properties": {{ "order": {{ "type": "string" }} }} }}\n'
                       f'                """),\n        (exchange, args) -> shop.call("{n}", args));\n'
                       for n, d in ORDER_TOOLS],
    # round 16: gptel's `gptel-make-tool` forms, each naming its tool after the keyword `:name`
    "gptel-elisp": [f'(gptel-make-tool\n :name "{n}"\n :function #\'shop/{n.replace("_", "-")}\n'
                    f' :description "{d}"\n :args (list \'(:name "order" :type string))\n :category "shop")\n'
                    for n, d in ORDER_TOOLS],
    # round 17: Cloudflare Code Mode's TypeScript API, each tool a member whose type is a function
    "codemode-ts": [f'  /**\n   * {d}\n   */\n  {n}: (input: {{\n    order: string;\n  }}) => Promise<unknown>;'
                    for n, d in ORDER_TOOLS],
    # round 18: Clojure maps with keyword keys (openai-clojure), PHP arrays (openai-php/client)
    "clojure-maps": [f'   {{:type "function"\n    :function {{:name "{n}"\n               :description "{d}"\n'
                     f'               :parameters {{:type "object" :properties {{:order {{:type "string"}}}}}}}}}}'
                     for n, d in ORDER_TOOLS],
    "php-arrays": [f"    [\n        'type' => 'function',\n        'function' => [\n            'name' => '{n}',\n"
                   f"            'description' => '{d}',\n            'parameters' => ['type' => 'object'],\n"
                   f"        ],\n    ]," for n, d in ORDER_TOOLS],
    "toml-tables": [f'[[tools]]\nname = "{n}"\ndescription = "{d}"\nargs = ["order"]'
                    for n, d in ORDER_TOOLS],
    "java-annotated": [f'    @Tool(description = "{d}")\n    String {n}(String order);'
                       for n, d in (("orderShow", "One order with its lines."), ("returnOpen", "Open a return."),
                                    ("parcelTrack", "Tracking events."), ("addressSet", "Change the address."))],
    "name-key-blocks": [f"Tool Name: {n}\nTool Arguments: {{'order': {{'type': 'str'}}}}\nTool Description: {d}"
                        for n, d in ORDER_TOOLS],
    "quoted-name-blocks": [f"> Tool Name: {n}\nTool Description: {n}(order: str) -> str\n{d}\n"
                           f'Tool Args: {{"properties": {{"order": {{"type": "string"}}}}}}\n'
                           for n, d in ORDER_TOOLS],
    "code-name-entries": [f"- {n}: {d}\n    Takes inputs: {{'order': {{'type': 'string'}}}}\n    Returns an output of type: string"
                          for n, d in ORDER_TOOLS],
}


@pytest.mark.parametrize("form", sorted(BLOCK_TOOLS))
def test_tools_described_in_blocks_in_another_order(fpr, form: str) -> None:
    """Agent frameworks describe each tool in a block of lines: a line naming it (after a name key,
    or as code), then its arguments and description. Blocks reordered are a tool reorder."""
    assert reordered_listing_causes(fpr, BLOCK_TOOLS[form], "You have access to these tools", [1, 3, 0, 2]) == ["tool_order", None]


NUMBERED_TOOLS = {  # numbered by position: a reorder moves the entries, the numbers stay
    "numbered-sentences": [f"({{i}}) {n}, whose description is <desc>{d}</desc>. It takes arguments {{{{'order': "
                           "{{'type': 'string'}}}} in JSON format." for n, d in (
                               ("order_show", "One order with its lines."), ("return_open", "Open a return."),
                               ("parcel_track", "Tracking events."), ("address_set", "Change the address."))],
    "numbered-commands": [f'{{i}}. {n}: {d}, args: "order": "<order>"' for n, d in (
        ("order_show", "Show an order"), ("return_open", "Open a return"), ("parcel_track", "Track a parcel"),
        ("address_set", "Change the address"))],
    # round 14: a banner that opens each block, numbered by position (OpenHands' function calling)
    "numbered-banners": [f"---- BEGIN FUNCTION #{{i}}: {n} ----\nDescription: {d}\nParameters:\n"
                         f"  (1) order (string, required): the order number\n---- END FUNCTION #{{i}} ----\n"
                         for n, d in ORDER_TOOLS],
}


@pytest.mark.parametrize("form", sorted(NUMBERED_TOOLS))
def test_tools_numbered_by_position_in_another_order(fpr, form: str) -> None:
    """Frameworks number their tool lists by position (DSPy's `(1) name, ...`, AutoGPT's `1. name:`):
    reordered, the entries move and the numbers stay, and it is a tool reorder (on this pod: another
    pod, comparing line keys, reads an edit; docs/diagnosis.md)."""
    entries = NUMBERED_TOOLS[form]

    def listing(order: list[int]) -> str:
        return "\n".join(entries[k].format(i=i + 1) for i, k in enumerate(order))

    orders = [[0, 1, 2, 3], [1, 3, 0, 2], [1, 3, 0, 2]]
    bodies = [body(f"{SYSTEM}\nCommands:\n{listing(o)}\nAnswer briefly.", t) for o, t in zip(orders, conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def test_tool_schemas_in_an_mcp_result_or_gemini_declarations_in_another_order(fpr) -> None:
    """JSON tool schemas inside a wrapper (MCP's `tools/list` result, Gemini's
    `function_declarations`, Bedrock Converse's `toolSpec`) are found and compared like a plain list."""
    mcp = [{"name": f["function"]["name"], "description": f["function"]["description"],
            "inputSchema": f["function"]["parameters"]} for f in TOOLS]
    gemini = [{"name": f["function"]["name"], "description": f["function"]["description"],
               "parameters": {"type": "OBJECT", "properties": {"order": {"type": "STRING"}}}} for f in TOOLS]
    for wrap in (lambda ts: json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": ts}}),
                 lambda ts: json.dumps({"function_declarations": ts}, indent=2),
                 lambda ts: "{\"tools\": [\n" + ",\n".join(json.dumps({"toolSpec": t}) for t in ts) + "\n]}"):  # Bedrock
        for tools in (mcp, gemini):
            swapped = [tools[2], tools[0], tools[1], tools[3]]
            bodies = [body(f"{SYSTEM}\nTools:\n{wrap(o)}\nAnswer briefly.", t)
                      for o, t in zip([tools, swapped, swapped], conversation(3), strict=True)]
            assert causes(fpr, bodies) == ["tool_order", None]


CODE_TOOLS = {
    "python": ['def find_order(number: str) -> dict:\n    """Find an order by its number."""',
               'def cancel_order(number: str) -> bool:\n    """Cancel an order that has not shipped."""',
               'async def open_return(number: str, reason: str) -> dict:\n    """Open a return."""',
               'def track(parcel: str) -> list:\n    """Tracking events of a parcel."""'],
    "go": ["// FindOrder finds an order by its number.\nfunc FindOrder(number string) (Order, error)",
           "// CancelOrder cancels an order that has not shipped.\nfunc CancelOrder(number string) error",
           "// OpenReturn opens a return.\nfunc OpenReturn(number, reason string) (Return, error)",
           "// Track lists the tracking events of a parcel.\nfunc Track(parcel string) ([]Event, error)"],
}


@pytest.mark.parametrize("form", sorted(CODE_TOOLS))
def test_tools_declared_as_code_in_the_system_text_in_another_order(fpr, form: str) -> None:
    """Tools written as function declarations (keywords before the name and its parameters, a
    doc line with each) and reordered are a tool reorder, not an edit of the system text."""
    assert reordered_listing_causes(fpr, CODE_TOOLS[form], "You may call", [1, 3, 0, 2]) == ["tool_order", None]


def test_rules_with_bold_headings_reordered_are_a_template_change(fpr) -> None:
    rules = ["- **Tone**: friendly and precise, never pushy.", "- **Length**: at most three sentences per answer.",
             "- **Returns**: accepted within 60 days for unused items.", "- **Escalation**: warranty disputes go to a human."]
    convo = conversation(2)
    bodies = [body(f"{SYSTEM}\n" + "\n".join(o), t) for o, t in zip([rules, rules[::-1]], convo, strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


def test_tool_entries_swapped_whose_names_look_like_flags(fpr) -> None:
    entries = [f'<function>{{"name": "{n}", "description": "tool {n}"}}</function>' for n in "abc"]
    orders = [entries, [entries[1], entries[0], entries[2]]]
    bodies = [body("<functions>\n" + "\n".join(o) + f"\n</functions>\n{SYSTEM}", t)
              for o, t in zip(orders, conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["tool_order"]


def schemas_in_text(order: list[dict], form: str) -> str:
    if form == "indented":
        return "# Tools\nYou may call these functions:\n" + "\n".join(json.dumps(t, indent=2) for t in order)
    if form == "one-line-array":
        return "Available tools (JSON): " + json.dumps(order)
    if form == "mcpb":  # a desktop extension's manifest.json: its tools by name and description only (round 17)
        return "Tools of the installed extension (manifest.json):\n" + json.dumps({
            "manifest_version": "0.2", "name": "shop", "version": "1.0.0",
            "tools": [{"name": t["function"]["name"], "description": t["function"]["description"]} for t in order]},
            indent=2)
    if form == "ultravox":  # Ultravox's selectedTools: temporary tools with dynamic parameters (round 17)
        return '"selectedTools": ' + json.dumps([{"temporaryTool": {
            "modelToolName": t["function"]["name"], "description": t["function"]["description"],
            "dynamicParameters": [{"name": k, "location": "PARAMETER_LOCATION_BODY", "schema": v, "required": True}
                                  for k, v in t["function"]["parameters"]["properties"].items()]}} for t in order], indent=2)
    if form == "openrpc":  # an OpenRPC document's methods, params as content descriptors (round 16)
        return "The gateway's JSON-RPC methods (openrpc.json):\n" + json.dumps({
            "openrpc": "1.3.2", "info": {"title": "shop", "version": "1.0.0"},
            "methods": [{"name": t["function"]["name"], "description": t["function"]["description"],
                         "params": [{"name": k, "schema": v} for k, v in t["function"]["parameters"]["properties"].items()],
                         "result": {"name": "result", "schema": {"type": "object"}}} for t in order]}, indent=2)
    if form == "python-repr":  # ToolLLaMA: a list of dicts printed with `repr`
        return "You have access to the following APIs: " + repr([t["function"] for t in order])
    return "<tools>\n" + "\n".join(json.dumps({"name": t["function"]["name"], "description": t["function"]["description"],
                                                "input_schema": t["function"]["parameters"]}) for t in order) + "\n</tools>"


@pytest.mark.parametrize("form", ["indented", "one-line-array", "anthropic-lines", "python-repr", "openrpc", "mcpb",
                                  "ultravox"])
def test_tool_schemas_serialised_into_the_system_text_in_another_order(fpr, form: str) -> None:
    """A client that writes its tool schemas as JSON into the system text (not `tools`) and
    reorders them: a tool-order break wherever the schemas sit."""
    convo = conversation(3)
    swapped = [TOOLS[2], TOOLS[0], TOOLS[1], TOOLS[3]]
    bodies = [body(f"{CODER}\n{schemas_in_text(o, form)}\n{SYSTEM}", t)
              for o, t in zip([TOOLS, swapped, swapped], convo, strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def test_tool_schemas_serialised_into_the_first_user_message_in_another_order(fpr) -> None:
    convo = conversation(3)
    swapped = [TOOLS[1], TOOLS[0], *TOOLS[2:]]
    bodies = [body(CODER, [f"{schemas_in_text(o, 'indented')}\n\n{TASK}", *t[1:]])
              for o, t in zip([TOOLS, swapped, swapped], convo, strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def test_a_json_config_reordered_in_the_system_text_is_a_template_change(fpr) -> None:
    """Reordered JSON objects that are no tool schemas (no parameter schema) are an edit."""
    teams = [{"name": n, "owner": f"{n}-lead", "channel": f"#{n}"} for n in ("billing", "search", "infra")]

    def system(order: list[dict]) -> str:
        return f"{CODER}\nTeams:\n" + "\n".join(json.dumps(t, indent=2) for t in order) + f"\n{SYSTEM}"

    convo = conversation(2)
    assert causes(fpr, [body(system(teams), convo[0]), body(system(teams[::-1]), convo[1])]) == ["template_change"]


def test_rules_reordered_in_system_text_are_a_template_change(fpr) -> None:
    lines = SYSTEM.strip().split("\n")
    other = "\n".join([lines[0], lines[2], lines[1], *lines[3:]])
    assert causes(fpr, [body(SYSTEM, conversation(2)[0]), body(other, conversation(2)[1])]) == ["template_change"]


def test_nested_key_and_swapped_adjacent_reorders(fpr) -> None:
    nested = copy.deepcopy(TOOLS)
    params = nested[2]["function"]["parameters"]
    params["properties"] = dict(reversed(list(params["properties"].items())))
    swapped = [TOOLS[0], TOOLS[2], TOOLS[1], TOOLS[3]]
    for alt in (nested, swapped):
        convo = conversation(3)
        bodies = [body(SYSTEM, convo[0], TOOLS), body(SYSTEM, convo[1], alt), body(SYSTEM, convo[2], TOOLS)]
        assert causes(fpr, bodies) == ["tool_order", "tool_order"]  # flipping back breaks again
        stateless = [body(SYSTEM, [q], t) for q, t in zip(QUESTIONS, (TOOLS, alt, TOOLS), strict=False)]
        assert causes(fpr, stateless) == ["tool_order", "tool_order"]


def test_date_inside_a_tool_description(fpr) -> None:
    def tools_on(day: str) -> list[dict]:
        out = copy.deepcopy(TOOLS)
        out[0]["function"]["description"] = f"Look up an order. Orders placed before {day} are archived."
        return out

    convo = conversation(3)
    days = ["Today is 2026-04-14", "Today is 2026-04-14", "Today is 2026-04-15"]
    got = run(fpr, [body(SYSTEM, t, tools_on(d)) for t, d in zip(convo, days, strict=True)])
    assert [r["cause"] for r in got] == [None, "dynamic_head"] and got[1]["spans"] == ["2026-04-15"]


# ------------------------------------------------------------------ several causes
def test_reorder_plus_new_tool(fpr) -> None:
    extra = tool("cancel_order", order_number={"type": "string"})
    convo = conversation(2)
    got = run(fpr, [body(SYSTEM, convo[0], TOOLS), body(SYSTEM, convo[1], TOOLS[1:] + TOOLS[:1] + [extra])])
    assert got[0]["cause"] == "tool_order"
    assert [f["cause"] for f in got[0]["secondary"]] == ["template_change"]


def test_dynamic_value_plus_edit_further_down(fpr) -> None:
    convo = conversation(2)
    edited = SYSTEM.replace("within 60 days", "within 30 days")
    got = run(fpr, [body(f"Current time: 2026-04-14T09:31:07Z\n{SYSTEM}", convo[0]),
                    body(f"Current time: 2026-04-14T09:32:55Z\n{edited}", convo[1])])
    assert got[0]["cause"] == "dynamic_head" and got[0]["spans"] == ["2026-04-14T09:32:55Z"]
    assert [f["cause"] for f in got[0]["secondary"]] == ["template_change"]


def test_dynamic_value_plus_front_trim(fpr) -> None:
    turns = [f"Turn {k}: " + "details about the order and the parcel. " * 4 for k in range(12)]
    got = run(fpr, [body(f"Current time: 2026-04-14T09:31:07Z\n{SYSTEM}", turns[:9]),
                    body(f"Current time: 2026-04-14T09:32:55Z\n{SYSTEM}", turns[4:11])])
    assert got[0]["cause"] == "dynamic_head"
    assert [f["cause"] for f in got[0]["secondary"]] == ["front_trim"]


def test_two_dynamic_values(fpr) -> None:
    convo = conversation(2)
    got = run(fpr, [body(f"Current time: 2026-04-14T09:31:07Z\n{SYSTEM}trace_id=4f1c2a9be07d3c55\nMore rules.", convo[0]),
                    body(f"Current time: 2026-04-14T09:32:55Z\n{SYSTEM}trace_id=9ab03e7c11d2f0a4\nMore rules.", convo[1])])
    assert got[0]["spans"] == ["2026-04-14T09:32:55Z"]
    assert got[0]["secondary"] == [{"cause": "dynamic_head", "spans": ["9ab03e7c11d2f0a4"], "span_kinds": ["id"]}]


# ------------------------------------------------------------------ trailing system message, edits, look-alikes
def test_trailing_system_message_after_the_history(fpr) -> None:
    for trailing in ("Reminder: answer in at most three sentences.",
                     "Reminder: answer in at most three sentences.\nCurrent time: {}"):
        bodies = [body(SYSTEM, t, trailing=trailing.format(f"2026-04-14T09:3{i}:07Z"))
                  for i, t in enumerate(conversation(4))]
        assert causes(fpr, bodies) == [None, None, None]


@pytest.mark.parametrize(("old", "new"), [
    ("within 60 days", "within 30 days"),  # a number in prose
    ("API version: v2.14.3", "API version: v2.15.0"),  # a version bump
    ("These policies were last revised on 2024-03-01.", "These policies were last revised on 2025-04-02."),
    ("Index build 20240101T1200Z", "Index build 58120934T7731Z"),  # a timestamp's shape, edited into no timestamp
    ("Firmware v1.2.0-0-g8e41c0d", "Firmware v2.0.0-3-g3f9a2b1"),  # another release, not a build of the same one
    ("Tarifstand 04.05.26 um 10:15", "Tarifstand 23.12.37 um 19:11"),  # a valid stamp, years on: edited (round 12)
    ("Slots are held until 10:00 each day.", "Slots are held until 11:00 each day."),  # a rule's hour (round 13)
    ("Lifts stop when the wind is above 12.5 m/s.", "Lifts stop when the wind is above 10.5 m/s."),  # a threshold
    ("Raise a P2 when a rack inlet is above 27 °C.", "Raise a P2 when a rack inlet is above 25 °C."),  # in °C (round 16)
])
def test_edits_that_only_look_dynamic(fpr, old: str, new: str) -> None:
    system = (f"API version: v2.14.3\nThese policies were last revised on 2024-03-01.\nIndex build 20240101T1200Z\n"
              f"Firmware v1.2.0-0-g8e41c0d\nTarifstand 04.05.26 um 10:15\nSlots are held until 10:00 each day.\n"
              f"Lifts stop when the wind is above 12.5 m/s.\nRaise a P2 when a rack inlet is above 27 °C.\n{SYSTEM}")
    convo = conversation(3)
    bodies = [body(system, convo[0]), body(system.replace(old, new), convo[1]), body(system.replace(old, new), convo[2])]
    assert causes(fpr, bodies) == ["template_change", None]


def test_static_look_alikes_raise_no_alarm(fpr) -> None:
    heads = ["Support reference: 7f3a9c1e-2b4d-4e6f-8a0b-1c2d3e4f5a6b\nStore id: 48213\n",
             "Gültig ab 01.01.2025.\nTarifversion: 3.2.1\n", "Knowledge cutoff: October 2023.\nBuild 1700000000\n"]
    for head in heads:
        assert causes(fpr, [body(head + SYSTEM, t) for t in conversation(4)]) == [None] * 3
        assert causes(fpr, [body(head + SYSTEM, [q]) for q in QUESTIONS[:4]]) == ["new_session"] * 3


# ------------------------------------------------------------------ round 22: status lines, named blocks, kept turns
@pytest.mark.parametrize(("line", "values", "spans"), [
    # readings redrawn together: the value, whole
    ("Tug Harbour Star: {}", ["4.6 nm off, SOG 9.8 kn", "4.1 nm off, SOG 10.2 kn", "3.5 nm off, SOG 10.4 kn"], None),
    ("Wind at the quay: {}", ["SW 5, gusting 7", "W 5, gusting 6", "W 6, gusting 8"], None),  # a direction with speeds
    ("Last query (prod): {}", ["rows_read=1204 rows_written=0 duration=0.2210ms", "rows_read=88 rows_written=3 "
                               "duration=0.0912ms", "rows_read=4411 rows_written=0 duration=0.7305ms"], None),
    ("Keep replies short. Wind at buoy B2: {}", ["SW 5, gusting 7", "SW 6, gusting 8", "S 6, gusting 9"],
     None),  # after the line's sentence
    # one reading of several changed: the number alone
    ("Press 3: ok P:{} /180.0 bar, cycle 41 s", ["162.4", "171.0", "158.8"], ["171.0", "158.8"]),
    # round 23: units glued to the numbers, a compass word, a zero-padded number, a line with a decimal
    # reading, a range that is no date
    ("Bins at the depot: {}", ["paper 55%, glass 76%, metal 22%", "paper 61%, glass 76%, metal 23%",
                               "paper 61%, glass 80%, metal 31%"], None),
    ("On stage: {}", ["Act One 35m 45s", "Act One 41m 40s", "Act One 44m 30s"], None),
    ("Wind am Mast: {}", ["aus Nordwest, 20 km/h (Böen 30)", "aus Nord, 22 km/h (Böen 36)",
                          "aus Nordost, 24 km/h (Böen 36)"], None),
    ("Dock 2: {}", ["truck 21, waiting 1", "truck 07, waiting 0", "truck 07, waiting 2"], ["truck 07, waiting 0", "truck 07, waiting 2"]),  # round 44: whole
    ("Humidity at the tower: {} % (dew point 13.1 °C)", ["48", "47", "51"], ["47", "51"]),
    ("orders, first page: Content-Range 0-24/{}", ["248", "252", "253"], ["252", "253"]),
])
def test_a_status_lines_readings_are_values_on_their_first_change(fpr, line: str, values: list[str],
                                                                   spans: list[str] | None) -> None:
    """A key line's value holding several numbers that changed in its numbers only (a wind's
    direction with them), one of them written to a reading's precision: a status line the client
    writes per request, a value on its first change, not the edit a rule's number is (round 22)."""
    got = assert_values_found(fpr, line, values)
    assert [r["spans"] for r in got] == [[s] for s in (spans or values[1:])]


@pytest.mark.parametrize(("old", "new"), [
    ("Note: delivery in 4 to 7 business days.", "Note: delivery in 3 to 5 business days."),  # small round numbers
    ("Front desk: open 06:15 to 20:00, last entry 19:45", "Front desk: open 06:15 to 21:00, last entry 20:45"),  # hours
    ("Rate: 59 € for 45 minutes", "Rate: 64 € for 45 minutes"),  # a price: two digits
    ("Lab limits: NH4-N 10 mg/l, valid from 01.01.2025", "Lab limits: NH4-N 12 mg/l, valid from 01.07.2026"),  # dated
    ("Runtime: Koha 24.11.03, 2 servers", "Runtime: Koha 25.05.01, 2 servers"),  # a release
    ("Client: timeout=30s retries=3", "Client: timeout=60s retries=3"),  # a round setting with its unit glued
])
def test_a_rules_numbers_edited_in_a_key_line_stay_an_edit(fpr, old: str, new: str) -> None:
    bodies = [body(f"{v}\n{SYSTEM}", t) for v, t in zip([old, new], conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


@pytest.mark.parametrize(("line", "values"), [
    ("Next tram: {}", [f"14:10 to Harbour Road, doors close in {m} min" for m in (17, 12, 9)]),  # counted down: the status, whole (round 44)
    ("Waiting time at the gate: ca. {} min", ["25", "20", "35"]),  # an approximation after the key
])
def test_a_time_counted_down_or_approximated_after_a_key_is_a_value(fpr, line: str, values: list[str]) -> None:
    assert_values_whole(fpr, line, values)


def test_a_state_counted_in_its_first_word_is_a_value(fpr) -> None:
    """`2 pending` -> `up to date`: a state whose words change, one side counted (round 22)."""
    states = ["2 pending", "up to date", "1 pending"]
    bodies = [body(f"Schema migrations (prod): {v}\n{SYSTEM}", t) for v, t in zip(states, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"], got
    assert [r["spans"] for r in got] == [["up to date"], ["1 pending"]]


def test_a_counted_number_changed_alone_stays_an_edit(fpr) -> None:
    """`2 per call` -> `3 per call`: the words stay, the number of a rule changed."""
    bodies = [body(f"Retries: {v}\n{SYSTEM}", t) for v, t in zip(["2 per call", "3 per call"], conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


SCRIPT_BLOCKS = ["  build\n    vite build", "  db:reset\n    prisma migrate reset --force",
                 "  lint:fix\n    eslint . --fix", "  e2e\n    playwright test --project chromium"]


@pytest.mark.parametrize("form", ["script-help", "named-blocks", "webhook-json", "plugin-manifest"])
def test_named_blocks_in_the_system_text_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Entries of several lines that each open with their name alone on a line (a package's scripts
    as `npm run` lists them; skills whose name tag holds the name on a line of its own), or JSON
    objects whose parameter schema sits deeper than `parameters` (a webhook's body schema), moved
    as wholes: the tools the agent may run, in another order (round 22)."""
    if form == "script-help":
        entries, heading = SCRIPT_BLOCKS, "Scripts available via `npm run-script`"
    elif form == "named-blocks":
        entries = [f"<skill>\n<name>\n{n}\n</name>\n<description>\n{d}\n</description>\n</skill>" for n, d in [
            ("invoice-audit", "Checks an invoice against its order lines."),
            ("refund-draft", "Drafts a refund for a damaged parcel."),
            ("carrier-claim", "Files a claim with the carrier for a lost parcel."),
            ("stock-check", "Reads the stock of a product in every warehouse.")]]
        heading = "Skills"
    elif form == "plugin-manifest":  # a plugin's manifest lists its tools under a key of its own (`api`)
        def manifest(order: list[int]) -> str:
            return json.dumps({"identifier": "shop", "api": [{"url": f"https://api.example.test/{TOOLS[k]['function']['name']}",
                                                              **TOOLS[k]["function"]} for k in order],
                               "version": "1"}, indent=2)
        convo = conversation(3)
        bodies = [body(f"{SYSTEM}\nPlugin manifest:\n{manifest(o)}\nAnswer briefly.", t)
                  for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=True)]
        assert causes(fpr, bodies) == ["tool_order", None]
        return
    else:
        entries = [json.dumps({"type": "webhook", "name": t["function"]["name"], "description": t["function"]["description"],
                               "api_schema": {"url": f"https://api.example.test/{t['function']['name']}", "method": "POST",
                                              "request_body_schema": t["function"]["parameters"]}}, indent=2)
                   for t in TOOLS]
        heading = "Webhook tools"
    assert reordered_listing_causes(fpr, entries, heading, [2, 0, 3, 1]) == ["tool_order", None]


def test_paragraphs_of_rules_in_another_order_stay_a_template_change(fpr) -> None:
    """Blocks of prose moved as wholes name nothing: an edit of the system text."""
    paragraphs = ["Returns\n  Unused items within 60 days.", "Shipping\n  Four to seven business days.",
                  "Escalation\n  Warranty disputes go to a human.", "Tone\n  Friendly and precise."]
    assert reordered_listing_causes(fpr, paragraphs, "Policies", [2, 0, 3, 1])[0] == "template_change"


def _kept_history(summary: dict[str, Any], keep_from: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A history of six exchanges, then the same with a summary before its newest messages kept as
    they were (from `keep_from` on) and the conversation gone on by one exchange."""
    msgs = agent_history(6)
    later = [{"role": "assistant", "content": "Reply 7: the invoice tests pass now."},
             {"role": "user", "content": "Then migrate the credit notes the same way."}]
    return msgs, [summary, *msgs[keep_from:], *later]


@pytest.mark.parametrize("shape", ["summary-as-system-message", "summary-as-user-message", "first-message-kept"])
def test_a_compaction_that_keeps_the_newest_messages_is_a_compaction(fpr, shape: str) -> None:
    """A summary opens the history (a system message after the prompt, or a user message before a
    kept reply) and the newest messages follow as they were, most of the history gone: a
    compaction, not a front trim (round 22)."""
    text = "Summary of the conversation so far: the invoice module is migrated, its tests pass."
    if shape == "summary-as-system-message":
        before, after = _kept_history({"role": "system", "content": text}, 9)
    elif shape == "first-message-kept":  # the task kept, the summary as the assistant's message after it
        before, after = _kept_history({"role": "assistant", "content": text}, 10)
        after = [before[0], *after]
    else:
        before, after = _kept_history({"role": "user", "content": text}, 10)
    bodies = [Gen.body(CODER, before[:11], None, None), Gen.body(CODER, before, None, None),
              Gen.body(CODER, after, None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_window_that_drops_its_oldest_exchange_under_a_summary_stays_a_front_trim(fpr) -> None:
    """A summary in the place of the one exchange a sliding window dropped: most of the history is
    kept, a front trim (a summary memory buffer trims on every request once it is full)."""
    before, after = _kept_history({"role": "system", "content": "Summary: the user asked to migrate invoices."}, 3)
    bodies = [Gen.body(CODER, before[:11], None, None), Gen.body(CODER, before, None, None),
              Gen.body(CODER, after, None, None)]
    assert causes(fpr, bodies) == [None, "front_trim"]


def test_a_window_that_notes_its_cut_in_the_first_reply_stays_a_front_trim(fpr) -> None:
    """The task and the first reply kept, a note that history was removed appended to that reply,
    half of the messages after them gone: nothing stands in for them, a front trim (round 23)."""
    msgs = agent_history(6)
    note = {"role": "assistant", "content": msgs[1]["content"] + "\n\n[NOTE] Some earlier history was removed."}
    later = [{"role": "assistant", "content": "Reply 7: the invoice tests pass now."},
             {"role": "user", "content": "Then migrate the credit notes the same way."}]
    after = [msgs[0], note, *msgs[7:], *later]
    bodies = [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None), Gen.body(CODER, after, None, None)]
    assert causes(fpr, bodies) == [None, "front_trim"]



# ------------------------------------------------------------------ round 24
def test_a_key_lines_value_changed_in_many_tokens_again_is_a_value(fpr) -> None:
    """A key line's value that changed in several tokens and in no shape a rule knows is an edit the
    first time; when its key's value changes again on the next request, it is a value the client
    writes per request, whole (round 24: the place of a change is its key, not only its token)."""
    values = ["web-2 to eu-west in 41 s (7 files)", "api-1 to us-east in 63 s (12 files)",
              "web-3 to eu-north in 38 s (4 files)", "worker to ap-south in 52 s (9 files)"]
    bodies = [body(f"Last deploy: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(4), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["template_change", "dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[], [values[2]], [values[3]]]


def test_a_value_found_at_a_key_keeps_its_place_for_the_next_change(fpr) -> None:
    """A clock read in a queue's line is a value; the next request writes the same key's value in
    another shape (no clock in it): still that key's value, changed again (round 24). The queue's
    status is short: the clock is read with it, whole (round 44)."""
    values = ["2 waiting, oldest since 09:41", "2 waiting, oldest since 09:55", "nobody waiting"]
    bodies = [body(f"Callback queue: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]


def test_an_edit_made_once_at_a_key_stays_an_edit(fpr) -> None:
    """A key line's value rewritten once (a rule's sentence) stays an edit: nothing changed there
    before."""
    values = ["answer in English, briefly.", "answer in the customer's language, in full sentences."]
    bodies = [body(f"Language: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


@pytest.mark.parametrize(("line", "values"), [
    # a state with its reason in brackets on either side
    ("Kiln 2: {}", ["firing", "cooling (door shut)", "firing"]),
    # a tally: every count changed, each of something named after it
    ("Tickets: {}", ["14 open, 9 resolved", "12 open, 11 resolved", "13 open, 11 resolved"]),
    ("Car park: {}", ["Deck A 41 free, Deck B 7 free, Deck C 19 free", "Deck A 38 free, Deck B 12 free, Deck C 16 free",
                      "Deck A 30 free, Deck B 12 free, Deck C 16 free"]),
    # a counted state with what it counts in brackets
    ("Boats out: {}", ["none", "2 boats (Kestrel, Tern)", "none"]),
])
def test_states_and_tallies_on_their_first_change_are_values(fpr, line: str, values: list[str]) -> None:
    """Round 24: a key line's state with a reason in brackets, a tally of named counts, a count with
    what it counts in brackets are values on their first change (the whole value: the second
    change's span is its key's value once its key changed before)."""
    got = assert_values_found(fpr, line, values)
    assert got[0]["spans"] == [values[1]]


def test_a_rules_count_changed_alone_in_a_tally_stays_an_edit(fpr) -> None:
    """A limit raised among others (`5 uploads, 20 downloads` -> `10 uploads, 20 downloads`): one
    count of several changed, a rule's edit."""
    values = ["5 uploads, 20 downloads", "10 uploads, 20 downloads"]
    bodies = [body(f"Daily limits: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


def test_values_found_one_after_another_in_one_key_line_are_one_value(fpr) -> None:
    """Two readings of one line changed (a temperature, then a weight): the line's value, whole, not
    a value and a secondary finding (round 24)."""
    values = ["1.182 °C, 2,4 t im Ofen", "1.196 °C, 2,9 t im Ofen", "1.205 °C, 3,3 t im Ofen"]
    bodies = [body(f"Schmelze Ofen 1: {v}\n{SYSTEM_DE}", t) for v, t in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]
    assert [r["secondary"] for r in got] == [[], []]


def test_a_hash_in_a_preview_urls_host_is_the_value(fpr) -> None:
    """A preview deployment's URL holds a new hash in its host per build: the hash, not the host,
    is the value (round 24)."""
    hashes = ["q7x2kd9pm", "b3nw8r1tz", "m9c4vy2ke"]
    bodies = [body(f"Staging: https://orders-{h}-acme-team.vercel.app\n{SYSTEM}", t)
              for h, t in zip(hashes, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[hashes[1]], [hashes[2]]]


APEX_ACTIONS = [
    f"public with sharing class {name} {{\n    @InvocableMethod(label='{label}' description='{text}')\n"
    f"    public static List<String> run(List<String> orders) {{\n        return OrderService.{method}(orders);\n    }}\n}}\n"
    for name, label, text, method in [("LookupOrder", "Lookup Order", "Find an order by number.", "lookup"),
                                      ("CreateReturn", "Create Return", "Open a return for an order.", "openReturn"),
                                      ("TrackShipment", "Track Shipment", "Tracking events of a parcel.", "track"),
                                      ("UpdateAddress", "Update Address", "Change the delivery address.", "readdress")]]


def test_apex_actions_in_another_order_are_a_tool_order(fpr) -> None:
    """Classes declared with modifiers before `class` (Apex's `with sharing`), one per action, moved
    as wholes: the agent's actions in another order (round 24)."""
    assert reordered_listing_causes(fpr, APEX_ACTIONS, "Actions (Apex)", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_plugins_functions_without_parameters_in_another_order_are_a_tool_order(fpr) -> None:
    """A plugin manifest lists its functions under `functions`, by name and description only (their
    parameters live in an API description elsewhere): reordered, a tool order (round 24)."""
    def manifest(order: list[int]) -> str:
        fns = [{"name": TOOLS[k]["function"]["name"], "description": TOOLS[k]["function"]["description"]} for k in order]
        return json.dumps({"schema_version": "v2", "name_for_human": "Shop", "functions": fns}, indent=2)
    bodies = [body(f"{SYSTEM}\nPlugin:\n{manifest(o)}\nAnswer briefly.", t)
              for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def test_a_compaction_whose_summary_the_model_acknowledges_is_a_compaction(fpr) -> None:
    """The summary as a user message, the model's acknowledgement after it, then the newest
    messages as they were (Gemini CLI's compression): a compaction, not a front trim (round 24)."""
    text = "<state_snapshot>The invoice module is migrated and its tests pass.</state_snapshot>"
    before, after = _kept_history({"role": "user", "content": text}, 10)
    after = [after[0], {"role": "assistant", "content": "Got it. Thanks for the additional context!"}, *after[1:]]
    bodies = [Gen.body(CODER, before[:11], None, None), Gen.body(CODER, before, None, None),
              Gen.body(CODER, after, None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_summary_appended_to_the_system_prompt_with_the_history_gone_is_a_compaction(fpr) -> None:
    """A running summary kept at the end of the system prompt, the history dropped, a new question:
    a compaction (round 24)."""
    msgs = agent_history(6)
    summary = "\n\nSummary of the session so far: the invoice module is migrated, its tests pass, credit notes are next."
    bodies = [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
              Gen.body(CODER + summary, [{"role": "user", "content": "Now migrate the credit notes."}], None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_rule_appended_to_the_system_prompt_over_a_conversation_that_goes_on_is_a_template_change(fpr) -> None:
    """Text added at the end of the system prompt while the history is sent on: an edit of the
    system prompt, not a compaction."""
    msgs = agent_history(6)
    rule = "\n4. Never push to the main branch; open a pull request and wait for a review."
    more = [*msgs, {"role": "assistant", "content": "Reply 7: the invoice tests pass now."},
            {"role": "user", "content": "Then migrate the credit notes the same way."}]
    bodies = [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
              Gen.body(CODER + rule, more, None, None)]
    assert causes(fpr, bodies) == [None, "template_change"]


# ------------------------------------------------------------------ round 25
WP_ABILITIES = [
    f"\twp_register_ability(\n\t\t'northwind/{slug}',\n\t\tarray(\n\t\t\t'label'       => __( '{label}', 'northwind' ),\n"
    f"\t\t\t'description' => __( '{text}', 'northwind' ),\n\t\t)\n\t);\n"
    for slug, label, text in [("lookup-order", "Lookup order", "Find an order by number."),
                              ("create-return", "Create return", "Open a return for an order."),
                              ("track-shipment", "Track shipment", "Tracking events of a parcel."),
                              ("update-address", "Update address", "Change the delivery address.")]]
JULIA_TOOLS = [
    f'"""\n    {name}({args})\n\n{text}\n"""\n{name}({args}) = ShopAPI.{name}(; {names})\n'
    for name, args, names, text in [("lookup_order", "number::String", "number", "Find an order by number."),
                                    ("create_return", "number::String, reason::String", "number, reason",
                                     "Open a return for an order."),
                                    ("track_shipment", "tracking_id::String", "tracking_id", "Tracking events of a parcel."),
                                    ("readdress", "number::String, address::String", "number, address",
                                     "Change the delivery address.")]]


@pytest.mark.parametrize("form", ["wordpress-abilities", "julia-functions"])
def test_tools_registered_by_a_namespaced_name_or_defined_in_one_line_in_another_order(fpr, form: str) -> None:
    """Abilities registered by a quoted `plugin/ability` name alone on its line (WordPress's
    Abilities API), and functions defined in one line by assignment after their docstring (Julia,
    PromptingTools.jl), moved as wholes: a tool order (round 25)."""
    entries = WP_ABILITIES if form == "wordpress-abilities" else JULIA_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_summary_as_a_system_message_before_the_system_prompt_is_a_compaction(fpr) -> None:
    """A `[Summary: …]` system message put before the system prompt, the newest exchange kept and
    the conversation gone on (SillyTavern's summary): a compaction (round 25)."""
    msgs = agent_history(6)
    summary = {"role": "system", "content": "[Summary: the invoice module is migrated and its tests pass; "
                                            "the credit notes are next, in the same way.]"}
    later = [{"role": "assistant", "content": "Reply 7: the invoice tests pass now."},
             {"role": "user", "content": "Then migrate the credit notes the same way."}]
    after = [{"role": "system", "content": CODER}, *msgs[-1:], *later]
    bodies = [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
              {**Gen.body(CODER, after[1:], None, None), "messages": [summary, *after]}]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_system_message_added_before_the_prompt_over_a_conversation_that_goes_on_is_a_template_change(fpr) -> None:
    """A system message put before the system prompt while the whole history is sent on: an edit."""
    msgs = agent_history(6)
    note = {"role": "system", "content": "Note for this deployment: never push to the main branch; open a pull request."}
    more = [*msgs, {"role": "assistant", "content": "Reply 7: the invoice tests pass now."},
            {"role": "user", "content": "Then migrate the credit notes the same way."}]
    bodies = [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
              {**Gen.body(CODER, more, None, None), "messages": [note, {"role": "system", "content": CODER}, *more]}]
    assert causes(fpr, bodies) == [None, "template_change"]


@pytest.mark.parametrize(("line", "values"), [
    # one reading with its words: signed, or to two decimals
    ("Level at the outfall: {} on the gauge board, falling", ["+12 mm", "-4 mm", "+7 mm"]),
    ("Drained since 05:30: {} Ml to the river", ["1.27", "1.64", "1.91"]),  # a clock in the key
    # nothing to count, then counts
    ("Lift queue: {}", ["no one waiting", "2 waiting upstairs, 1 below", "no one waiting"]),
])
def test_one_reading_or_counts_after_nothing_on_their_first_change_are_values(fpr, line: str, values: list[str]) -> None:
    """Round 25: a key's one reading, signed or to two decimals, and counts that replace a state in
    words, are values on their first change."""
    assert_values_found(fpr, line, values)


@pytest.mark.parametrize(("line", "old", "new"), [
    ("Pallets per bay: {} on the floor, none stacked", "1,500", "1,200"),  # `1,500`: thousands, unsigned
])
def test_a_settings_one_number_among_words_stays_an_edit(fpr, line: str, old: str, new: str) -> None:
    """One number changed among words that stay, unsigned and in thousands (not two decimals): a rule's."""
    bodies = [body(f"{line.format(v)}\n{SYSTEM}", t) for v, t in zip([old, new], conversation(2), strict=True)]
    assert causes(fpr, bodies) == ["template_change"]


@pytest.mark.parametrize(("line", "values"), [
    ("Mission clock: {}", ["2026-278 11:51:55 BST", "2026-278 11:59:41 BST", "2026-278 12:11:13 BST"]),  # ISO ordinal, a space
    ("Session cookie expires {}", ["Sat, 25-Apr-2026 23:50:06 GMT", "Sat, 25-Apr-2026 23:50:32 GMT",
                                   "Sun, 26-Apr-2026 00:01:10 GMT"]),  # PHP's setcookie, a four-digit year
])
def test_timestamps_in_round_25s_forms_are_found_whole(fpr, line: str, values: list[str]) -> None:
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]


def test_a_value_found_again_wider_in_its_key_line_is_one_value(fpr) -> None:
    """A number of a key line's value found first, then the line's whole value found from the same
    place as a secondary value: one value, the line's (round 25; round 24 merged only values found
    one after another)."""
    values = ["418 of 2,250 at the gates (19%)", "655 of 2,250 at the gates (29%)", "1,020 of 2,250 at the gates (45%)"]
    bodies = [body(f"Tickets scanned: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [(r["cause"], r["spans"], r["secondary"]) for r in got] == [("dynamic_head", [values[1]], []),
                                                                     ("dynamic_head", [values[2]], [])]


# ------------------------------------------------------------------ round 26
MATLAB_TOOLS = [f'% {n}\nf = openAIFunction("{n}", "{d}");\nf = addParameter(f, "{p}", type="string");\ntools(end+1) = f;\n'
                for n, d, p in [("lookup_order", "Find an order by number.", "number"),
                                ("create_return", "Open a return for an order.", "number"),
                                ("track_shipment", "Tracking events of a parcel.", "tracking_id"),
                                ("update_address", "Change the delivery address.", "address")]]
WOLFRAM_TOOLS = [f'  LLMTool[\n    {{"{n}", "{d}"}},\n    {{"{p}" -> <|"Interpreter" -> "String", "Required" -> True|>}},\n'
                 f'    ShopTools`{n}\n  ],'
                 for n, d, p in [("lookup_order", "Find an order by number.", "number"),
                                 ("create_return", "Open a return for an order.", "number"),
                                 ("track_shipment", "Tracking events of a parcel.", "tracking_id"),
                                 ("update_address", "Change the delivery address.", "address")]]


@pytest.mark.parametrize("form", ["matlab-functions", "wolfram-llmtools"])
def test_tools_built_by_an_assigned_call_or_a_named_brace_list_in_another_order(fpr, form: str) -> None:
    """Tools built by a call assigned to a variable with the name first (MATLAB's `f =
    openAIFunction("name", …)`), or declared by a brace list that opens with the quoted name
    (Wolfram's `LLMTool[{"name", "…"}, …]`), moved as wholes: a tool order (round 26)."""
    entries = MATLAB_TOOLS if form == "matlab-functions" else WOLFRAM_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


@pytest.mark.parametrize(("line", "values"), [
    # a possessive key: its apostrophe belongs to the key
    ("Today's call: {}", ["NO SAILING", "SAILING AS PLANNED", "NO SAILING"]),
    # a state with its detail after a comma
    ("Swing bridge: {}", ["open to road traffic", "closed, boats passing through", "open to road traffic"]),
])
def test_a_state_after_a_possessive_key_or_with_its_detail_is_a_value_on_its_first_change(fpr, line: str,
                                                                                           values: list[str]) -> None:
    """Round 26: a key in the possessive (`Today's call:`) is a key, and a state may carry its detail
    after a comma: values on their first change, whole."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Report filed {}", ["031415Z MAR 27", "031622Z MAR 27", "040807Z MAR 27"]),  # a military date-time group
    ("Last backup: {} ago", ["2 h 41 min", "2 h 58 min", "3 h 12 min"]),  # hours and minutes, not a clock
])
def test_a_date_time_group_and_an_hours_duration_are_found_whole(fpr, line: str, values: list[str]) -> None:
    """Round 26: NATO's date-time group (DDHHMMZ MON YY) is a timestamp, and `2 h 58` that a
    clock's pattern reads is the duration `2 h 58 min`."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]


def test_a_value_in_a_welcome_message_before_the_first_user_message_is_a_value(fpr) -> None:
    """A chat widget opens the conversation with its own message (an assistant message before the
    first user message) holding live status lines: a number changed there is a value the client
    refreshes, not an edit of the history (round 26)."""
    def welcome(free: int) -> dict[str, str]:
        return {"role": "assistant", "content": f"Hello! I'm the Northwind assistant.\nParcels in transit: {free}\n"
                                                "Ask me about orders, returns and delivery."}
    convo = conversation(3)
    bodies = [Gen.body(SYSTEM, [welcome(n), *[{"role": "user" if i % 2 == 0 else "assistant", "content": x}
                                              for i, x in enumerate(turns)]], None, None)
              for n, turns in zip([4127, 4133, 4140], convo, strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"], got
    assert [r["spans"] for r in got] == [["4133"], ["4140"]]


def test_a_key_lines_value_in_braces_is_what_the_braces_hold(fpr) -> None:
    """A value a client writes in braces (a voice agent's top expressions, `{very tired, …}`): the
    span is what the braces hold, as it is for a quoted value (round 26). Since round 65 its first
    change is read too: three states set apart by commas are a state with two details."""
    values = ["{quite calm, slightly curious, very patient}", "{very tired, slightly impatient, quite doubtful}",
              "{quite calm, slightly amused, very patient}"]
    bodies = [body(f"Caller expressions: {v}\n{SYSTEM}", t) for v, t in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"]
    assert [r["spans"] for r in got] == [[values[1][1:-1]], [values[2][1:-1]]]


# ------------------------------------------------------------------ round 27
def test_schema_org_actions_in_another_order_are_a_tool_order(fpr) -> None:
    """A JSON-LD thing's `potentialAction` list (named actions with their targets, no parameter
    schema) written into the system text and reordered: a tool order (round 27)."""
    actions = [{"@type": "SearchAction", "name": "Find an order", "target": "https://shop.example/orders?q={number}",
                "query-input": "required name=number"},
               {"@type": "ReturnAction", "name": "Open a return", "target": "https://shop.example/returns/new"},
               {"@type": "TrackAction", "name": "Track a parcel", "target": "https://shop.example/track/{id}"},
               {"@type": "UpdateAction", "name": "Change the address", "target": "https://shop.example/address"}]

    def ld(order: list[int]) -> str:
        return json.dumps({"@context": "https://schema.org", "@type": "Store", "name": "Northwind",
                           "potentialAction": [actions[k] for k in order]}, indent=2)
    bodies = [body(f"{SYSTEM}\nActions:\n{ld(o)}\nAnswer briefly.", t)
              for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def test_a_state_whose_detail_and_reason_change_with_it_is_a_value(fpr) -> None:
    """`Spalt offen, nachgeführt` -> `Spalt zu (Regenmelder)`: the state (`offen` -> `zu`) changed with
    its detail; a word they share does not make it a word swapped in a phrase (round 27)."""
    values = ["Spalt offen, nachgeführt", "Spalt zu (Regenmelder)", "Spalt offen, nachgeführt"]
    bodies = [body(f"Kuppel 2: {v}\n{SYSTEM_DE}", t) for v, t in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"], got
    assert got[0]["spans"] == [values[1]]


def _asked_summary(primer: bool) -> list[dict]:
    """A long history, then a history that opens with a question, a long reply and a user message:
    opencode's compaction (`primer` False), or a conversation whose primer the client sent before."""
    msgs = agent_history(6)
    ask = {"role": "user", "content": "What did we do so far?"}
    summary = {"role": "assistant", "content": "We migrated the invoice module: the models, the views and their "
                                               "tests, which pass now; the credit notes are next, in the same way, "
                                               "then the reminders. Nothing is deployed yet; the branch is "
                                               "invoice-migration and the pull request is a draft."}
    go_on = {"role": "user", "content": "Continue if you have next steps"}
    first = [ask, summary, *msgs] if primer else msgs
    return [Gen.body(CODER, first[:11], None, None), Gen.body(CODER, first, None, None),
            Gen.body(CODER, [ask, summary, go_on], None, None)]


def test_a_summary_asked_for_and_kept_as_the_reply_is_a_compaction(fpr) -> None:
    """The history replaced by a question, the summary as the model's reply and a request to go on
    (opencode's compaction): a compaction (round 27)."""
    assert causes(fpr, _asked_summary(primer=False)) == [None, "compaction"]


def test_a_primer_the_client_sent_before_does_not_make_a_compaction(fpr) -> None:
    """The same short history, but its question and reply opened the earlier requests too (a primer
    the client always sends): a new conversation over the shared head, not a compaction."""
    assert causes(fpr, _asked_summary(primer=True))[-1] != "compaction"


# ------------------------------------------------------------------ round 28
HTTP_FILE = ["### Find an order\n# @name findOrder\nGET {{shop}}/orders/{{number}}\nAccept: application/json\n",
             "### Open a return\n# @name openReturn\nPOST {{shop}}/returns\nContent-Type: application/json\n\n"
             '{\n  "order": "{{number}}",\n  "reason": "{{reason}}"\n}\n',
             "### Track a parcel\n# @name trackParcel\nGET {{shop}}/parcels/{{tracking}}/events\n",
             "### Change the address\n# @name changeAddress\nPATCH {{shop}}/orders/{{number}}\n"
             "Content-Type: application/json\n\n{\n  \"address\": \"{{address}}\"\n}\n"]


def test_requests_of_an_http_client_file_in_another_order_are_a_tool_order(fpr) -> None:
    """A request file of an editor's HTTP client (`### title`, `# @name x`, then the request line to
    a variable host) written into the system text as the agent's tools, its requests moved: a tool
    order (round 28)."""
    assert reordered_listing_causes(fpr, HTTP_FILE, "Requests (shop.http)", [2, 0, 3, 1]) == ["tool_order", None]


@pytest.mark.parametrize(("line", "values"), [
    # a state's word, then a reading that changes on its own: the state and its reading, whole
    ("Mixer 1: {}", ["running 42 rpm", "running 47 rpm", "running 45 rpm"]),
    # a state replaced by another with its reading (or the reverse)
    ("Dryer 2: {}", ["idle", "heating, 64 °C", "idle"]),
])
def test_a_state_with_its_reading_is_one_value_on_its_first_change(fpr, line: str, values: list[str]) -> None:
    """Round 28: a key line's value that is a state's word and a reading with its unit is the
    line's value, whole, on its first change, as a state alone is."""
    assert_values_whole(fpr, line, values)


def test_a_rule_sentence_with_a_distance_is_still_an_edit(fpr) -> None:
    """The guard: `Note: within 10 km.` -> `within 15 km.` is a rule's sentence edited (its full stop),
    not a state's reading."""
    values = ["within 10 km.", "within 15 km.", "within 15 km."]
    bodies = [body(f"{SYSTEM}Note: {v}\nAnswer briefly and politely to every customer.", t)
              for v, t in zip(values, conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Build host: {}, 3 users", ["up 12 days,  4:05", "up 12 days,  4:19", "up 12 days,  4:31"]),  # uptime(1)
    ("Stand {}", ["14:02:10 MEZ, Fr 06.03.26", "14:09:44 MEZ, Fr 06.03.26", "14:15:02 MEZ, Fr 06.03.26"]),  # clock, then date
    ("Grid draw: {}", ["3.21 MW of 5.00 MW", "3.35 MW of 5.00 MW", "3.30 MW of 5.00 MW"]),  # a reading and its capacity
])
def test_values_in_round_28s_forms_are_found_whole(fpr, line: str, values: list[str]) -> None:
    """Round 28: uptime's `up N days, H:MM`, a clock with its date after it, a reading with the
    capacity it is read against: each one value, whole."""
    assert_values_whole(fpr, line, values)


def test_a_value_found_again_wider_from_before_it_is_one_value(fpr) -> None:
    """A number of a key line's value found first, then the line's whole value, which opens before
    that number, as a secondary value: one value, the line's (round 28; round 25 merged only a
    wider value that opened at the number)."""
    values = ["press 6 of 14, 326 kg/h", "press 8 of 14, 348 kg/h", "press 10 of 14, 358 kg/h"]
    bodies = [body(f"{SYSTEM}Line 3: {v}\nAnswer briefly and politely to every customer.", t)
              for v, t in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [(r["cause"], r["spans"], r["secondary"]) for r in got][0] == ("dynamic_head", [values[1]], [])


# ------------------------------------------------------------------ round 29
BLUEPRINT = [f"## {n} [/tools/{n}]\n\n### Call {n} [POST]\n{d}\n\n+ Request (application/json)\n"
             f"    + Attributes\n        + {p} (string, required)\n"
             for n, d, p in [("lookup_order", "Find an order by its number.", "number"),
                             ("create_return", "Open a return for an order.", "number"),
                             ("track_shipment", "Tracking events of a parcel.", "tracking_id"),
                             ("update_address", "Change the delivery address.", "address")]]


def test_resources_of_an_api_description_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as an API description's resources (a heading with the resource's route or
    the action's method in brackets, API Blueprint's `## name [/tools/name]`), moved: a tool order
    (round 29)."""
    assert reordered_listing_causes(fpr, BLUEPRINT, "Tools (tools.apib)", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_window_that_keeps_a_long_head_and_drops_from_the_middle_is_a_front_trim(fpr) -> None:
    """A context window that keeps every first message it had (here five: longer than the first
    exchange) and drops the oldest turns after them (AutoGen's token-limited context): the
    conversation goes on after the cut, a front trim (round 29)."""
    msgs = agent_history(8)
    head, rest = msgs[:5], msgs[5:]
    bodies = [Gen.body(CODER, [*head, *rest[:n]], None, None) for n in (5, 7)] + \
             [Gen.body(CODER, [*head, *rest[2:9]], None, None)]
    assert causes(fpr, bodies) == [None, "front_trim"]


def test_a_summary_asked_for_by_a_system_instruction_is_a_compaction(fpr) -> None:
    """The history replaced by an instruction to summarise in a system message of its own, the
    summary as the model's reply and the next user message (Pydantic AI's summarizing history
    processor): a compaction (round 29)."""
    msgs = agent_history(6)
    ask = {"role": "system", "content": "Summarise the conversation so far for the next model call. Keep open "
                                        "tasks, file names and decisions; leave out greetings."}
    summary = {"role": "assistant", "content": "We migrated the invoice module: the models, the views and their "
                                               "tests, which pass now; the credit notes are next, in the same way, "
                                               "then the reminders. Nothing is deployed yet; the branch is "
                                               "invoice-migration and the pull request is a draft. Open "
                                               "questions: whether the old PDF layout stays for credit notes, "
                                               "and who reviews the migration of the tax tables."}
    nxt = {"role": "user", "content": "Start on the credit notes."}
    bodies = [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
              Gen.body(CODER, [ask, summary, nxt], None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


@pytest.mark.parametrize(("line", "values"), [
    # a payment's codes, each drawn again or risen
    ("Last card payment: {}", ["auth 4KQ9ZT, trace 301772", "auth M7XW2P, trace 301779", "auth QPLRTV, trace 301781"]),
    # a run's day and its clock
    ("Proofing room: {}", ["day 3, 09:41", "day 3, 10:02", "day 3, 10:17"]),
])
def test_values_in_round_29s_forms_are_found_whole(fpr, line: str, values: list[str]) -> None:
    """Round 29: a key line's codes that all changed as draws or a rising sequence, and a run's
    day with its clock: one value each, whole."""
    assert_values_whole(fpr, line, values)


# ------------------------------------------------------------------ round 30
WIT_TOOLS = ["  /// Find an order by its number.\n  /// `number`: e.g. NW-48213\n"
             "  lookup-order: func(number: string) -> result<string, string>;\n",
             "  /// Open a return for an order.\n  /// `reason`: one of damaged, wrong-size, other\n"
             "  create-return: func(number: string, reason: option<string>) -> result<string, string>;\n",
             "  /// Tracking events of a parcel.\n  /// `tracking-id`: the carrier's number\n"
             "  track-shipment: func(tracking-id: string) -> result<string, string>;\n",
             "  /// Pending orders of the store.\n  /// `days`: 1 to 30\n"
             "  pending-orders: func(days: option<u32>) -> result<string, string>;\n"]


def test_functions_of_a_wit_interface_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools exported as a WebAssembly component's WIT interface (`name: func(…)`, names in kebab
    case, doc comments above), moved: a tool order (round 30)."""
    assert reordered_listing_causes(fpr, WIT_TOOLS, "interface tools {", [2, 0, 3, 1]) == ["tool_order", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Last reservation: #{}", ["RS-4410-KW", "RS-4413-KW", "RS-4420-KW"]),  # the one number of a code, risen
    # a number after its sign, risen: with the guest's word and the sign, the whole value since round 83 (as the
    # labels of `heldout29`'s `Check-in #606` and `heldout30`'s `Fahrt Nr. 590` have it)
    ("Letzter Einlass: {}", ["Gast #4410", "Gast #4417", "Gast #4431"]),
    ("Gate pass: Code {}", ["QWRT-7HKD", "ZPLM-XC4B", "HJ3K-WQRT"]),  # a code in capitals, drawn again
    ("Weir gate: {}", ["hydraulic fault", "12 % open", "hydraulic fault"]),  # a state, then a reading and its state
])
def test_values_in_round_30s_forms_are_values_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """Round 30: a booking code's one number that rose, a ticket number after `#` that rose, an
    entry code in capitals drawn again, a state replaced by a reading with its state's word."""
    assert_values_whole(fpr, line, values)



# ------------------------------------------------------------------ round 31
def _summary_opens(summary: str) -> list[dict]:
    """A long history, then the history replaced by `summary` as the model's message, the previous
    request's newest user message kept after it, its answer and a new question."""
    msgs = agent_history(6)
    return [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
            Gen.body(CODER, [{"role": "assistant", "content": summary}, msgs[-1],
                             {"role": "assistant", "content": "Done: the credit notes use the new layout now."},
                             {"role": "user", "content": "Now the reminders, please."}], None, None)]


def test_a_long_summary_that_opens_the_history_as_the_models_message_is_a_compaction(fpr) -> None:
    """Google ADK's sliding-window compaction: the summary is a model message with nothing before
    it, then the newest messages as they were: a compaction (round 31)."""
    summary = ("Summary of the earlier events: the invoice module was migrated, its models, views and tests; "
               "the tests pass; the credit notes were started in the same way and their layout question is "
               "open; nothing is deployed; the branch is invoice-migration and its pull request is a draft "
               "waiting for a review of the tax tables.")
    assert causes(fpr, _summary_opens(summary)) == [None, "compaction"]


def test_a_short_greeting_before_the_same_question_is_no_compaction(fpr) -> None:
    """The guard: a short message of the model opening the history (a widget's greeting) is no
    summary, whatever follows it."""
    assert causes(fpr, _summary_opens("Hi! How can I help?"))[-1] != "compaction"


@pytest.mark.parametrize(("line", "values", "spans"), [
    # a time ago, its unit abbreviated; in German, `vor` before it (a short status: whole since round 44)
    ("Dock sync: last report {} s ago", ["119", "56", "141"], ["last report 56 s ago", "last report 141 s ago"]),
    ("Eisfläche: letzte Aufbereitung vor {} min", ["69", "9", "24"],
     ["letzte Aufbereitung vor 9 min", "letzte Aufbereitung vor 24 min"]),
    ("On air: {}", ["Automation", "Live: Breakfast", "Silence alarm"], ["Live: Breakfast", "Silence alarm"]),  # a state's detail after a colon
    # four decimals after a comma (its word before it taken in, as a state's is: round 28)
    ("Leitwarte: Tag {}", ["194,9653", "194,9721", "194,9804"], ["Tag 194,9721", "Tag 194,9804"]),
])
def test_values_in_round_31s_forms_are_values_on_their_first_change(fpr, line: str, values: list[str],
                                                                     spans: list[str]) -> None:
    """Round 31: a time ago with its unit abbreviated (`119 s ago`, `vor 69 min`), a state with its
    detail after a colon, a reading with four decimals after a decimal comma."""
    got = assert_values_found(fpr, line, values)
    assert [r["spans"] for r in got] == [[spans[0]], [spans[1]]]


def test_a_four_decimal_number_moved_years_on_is_an_edit(fpr) -> None:
    """The guard: a serial date with five decimals edited years on (`46023,25000` -> `57134,36111`)
    moved far more than a reading does: an edit."""
    values = ["46023,25000", "57134,36111", "57134,36111"]
    bodies = [body(f"{SYSTEM}Template valid from serial {v}\nAnswer briefly.", t)
              for v, t in zip(values, conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["template_change", None]


# ------------------------------------------------------------------ round 32
NU_TOOLS = [f'# {d}\nexport def "tool {n}" [\n    {p}: string  # {h}\n]: nothing -> any {{\n'
            f'    http post --content-type application/json $"($env.TOOLS_URL)/{n}" {{{p}: ${p}}}\n}}\n'
            for n, d, p, h in [("lookup_order", "Find an order by its number.", "number", "e.g. NW-48213"),
                               ("create_return", "Open a return for an order.", "number", "the order"),
                               ("track_shipment", "Tracking events of a parcel.", "tracking_id", "the carrier's"),
                               ("update_address", "Change the delivery address.", "address", "one line")]]


def test_commands_of_a_nushell_module_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as a Nushell module's custom commands (`export def "tool name" [`, a quoted
    name and its parameters in brackets), moved: a tool order (round 32)."""
    assert reordered_listing_causes(fpr, NU_TOOLS, "Tool commands (tools.nu)", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_minimum_after_ab_edited_is_an_edit(fpr) -> None:
    """`Fahren erst ab 1,40 m` -> `1,45 m`: a rule's minimum after German `ab` (from) edited once,
    not a measurement (round 32)."""
    values = ["1,40", "1,45", "1,45"]
    bodies = [body(f"{SYSTEM_DE}- Kinder fahren erst ab {v} m Körpergröße allein.\nAntworte kurz.", t)
              for v, t in zip(values, conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["template_change", None]


def _tool_turns(results: list[str]) -> list[dict]:
    """A user turn, then a tool call and its result per entry of `results`, then a reply each."""
    msgs: list[dict] = [{"role": "user", "content": TASK}]
    for k, result in enumerate(results):
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"path": "m{k}.py"}}'}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": f"call_{k}", "content": result},
                 {"role": "assistant", "content": f"Module {k} read; it calls the legacy API once."}]
    return msgs


HANDLER_RESULTS = [f"def handler_{k}(request):\n    return legacy(request)\n" * 6 for k in range(3)]


def first_results_replaced(replacements: list[str]) -> list[dict]:
    """Three requests of an agent reading HANDLER_RESULTS, the third with its first results replaced
    in place by `replacements` and a new question."""
    ask = {"role": "user", "content": "Now port the third module."}
    results = HANDLER_RESULTS
    return [Gen.body(CODER, _tool_turns(results[:2]), None, None), Gen.body(CODER, _tool_turns(results), None, None),
            Gen.body(CODER, [*_tool_turns(replacements + results[len(replacements):]), ask], None, None)]


def test_old_tool_results_cleared_in_place_are_a_compaction(fpr) -> None:
    """Old tool results replaced by one placeholder, every turn kept (Anthropic's context editing,
    Claude Code's microcompaction): paid once, a compaction (round 32)."""
    assert causes(fpr, first_results_replaced(["[Old tool result content cleared]"] * 2)) == [None, "compaction"]


def test_a_tool_result_refreshed_with_new_values_is_no_compaction(fpr) -> None:
    """The guard: a tool result re-sent with other values of about its length (a prefetched result
    refreshed) is no compaction."""
    results = [f"stock of warehouse {k}: 1{k}4 units\n" * 6 for k in range(3)]
    refreshed = [results[0].replace("units", "pcs."), *results[1:]]
    ask = {"role": "user", "content": "And warehouse 3?"}
    bodies = [Gen.body(CODER, _tool_turns(results[:2]), None, None), Gen.body(CODER, _tool_turns(results), None, None),
              Gen.body(CODER, [*_tool_turns(refreshed), ask], None, None)]
    assert causes(fpr, bodies)[-1] != "compaction"


# ------------------------------------------------------------------ round 33
KDL_TOOLS = ['tool "lookup_order" description="Find an order by its number." {\n'
             '    param "number" type="string" required=#true\n}',
             'tool "create_return" description="Open a return for an order." {\n'
             '    param "number" type="string" required=#true\n    param "reason" type="string" required=#false\n}',
             'tool "pending_orders" description="Orders not shipped yet."',
             'tool "track_shipment" description="Tracking events of a parcel." {\n'
             '    param "tracking_id" type="string" required=#true\n}']
CUE_TOOLS = ["// Find an order by its number.\n#lookup_order: {\n\tnumber!: string // e.g. NW-48213\n}\n",
             "// Open a return for an order.\n#create_return: {\n\tnumber!: string\n\treason?: \"damaged\" | \"other\"\n}\n",
             "// Orders not shipped yet.\n#pending_orders: {}\n",
             "// Tracking events of a parcel.\n#track_shipment: {\n\ttracking_id!: string\n}\n"]


@pytest.mark.parametrize("form", ["kdl-nodes", "cue-definitions"])
def test_tools_as_named_blocks_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as blocks that a keyword and a quoted name open (KDL nodes, with children or
    none) or as definitions named after `#` (CUE, an empty struct too), moved: a tool order (round 33)."""
    entries = KDL_TOOLS if form == "kdl-nodes" else CUE_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


# ------------------------------------------------------------------ round 34
def _env_block(value: str) -> str:
    return ("<environment_context>\n  <cwd>/srv/shop</cwd>\n  <approval_policy>on-request</approval_policy>\n"
            f"  <last_deploy>{value}</last_deploy>\n  <shell>bash</shell>\n</environment_context>")


def test_a_tag_line_of_a_context_block_sent_as_an_earlier_user_message_is_a_value(fpr) -> None:
    """A coding agent sends its instructions and its environment block as user messages of their
    own before the user's words, re-rendered on every request (Codex CLI): a tag line's content that
    changed there, in more than one token, is a per-request value, whole (round 34)."""
    values = ["build 2361 · blue", "build 2364 · green", "build 2370 · blue"]
    instructions = {"role": "user", "content": "<user_instructions>\nRun the tests before you finish.\n</user_instructions>"}
    bodies = [Gen.body(CODER, [instructions, {"role": "user", "content": _env_block(v)},
                               *[{"role": "user" if i % 2 == 0 else "assistant", "content": x} for i, x in enumerate(turns)]],
                       None, None) for v, turns in zip(values, conversation(3), strict=True)]
    got = run(fpr, bodies)
    assert [r["cause"] for r in got] == ["dynamic_head", "dynamic_head"], got
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]]


CRON_TOOLS = ["15 2 * * * /srv/shop/bin/manage export_orders --since yesterday",
              "*/10 * * * * /srv/shop/bin/manage sync_stock",
              "@reboot /srv/shop/bin/start-worker",
              "0 6 * * 1-5 /srv/shop/bin/manage send_digest  # the morning digest"]


def test_a_cron_tables_jobs_in_another_order_are_a_tool_order(fpr) -> None:
    """The jobs an agent may run, listed as a cron table's lines (`crontab -l`: five schedule fields
    or an `@` nickname, then the command), moved: a tool order (round 34)."""
    assert reordered_listing_causes(fpr, CRON_TOOLS, "Scheduled jobs (crontab -l)", [2, 0, 3, 1]) == ["tool_order", None]


# ------------------------------------------------------------------ round 35
RECORD_TOOLS = ['[ { name = "lookup_order"\n  , summary = "Find an order by its number."\n  , args = [ "number" ]\n  }',
                ', { name = "create_return"\n  , summary = "Open a return for an order."\n  , args = [ "number", "reason" ]\n  }',
                ', { name = "pending_orders"\n  , summary = "Orders not shipped yet."\n  , args = [] : List Text\n  }',
                ', { name = "track_shipment"\n  , summary = "Tracking events of a parcel."\n  , args = [ "tracking_id" ]\n  }']
ALIAS_TOOLS = ["alias nw-orders='bin/manage orders --open'", "alias nw-stock='bin/manage stock --low'",
               "alias nw-refund='bin/manage refund --dry-run'", "abbr -a nw-ship bin/manage ship --today"]


@pytest.mark.parametrize("form", ["records-with-leading-commas", "shell-aliases"])
def test_tools_as_records_or_command_aliases_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as a list of records whose first field is the name, commas leading (Dhall's,
    Elm's style), or the commands a team runs as shell aliases, moved: a tool order (round 35).
    The first record keeps its place: the list's opening bracket stays with it."""
    entries = RECORD_TOOLS if form == "records-with-leading-commas" else ALIAS_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [0, 3, 1, 2]) == ["tool_order", None]


def test_exported_settings_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: a shell's exported settings moved name no command: a template change."""
    entries = ["export SHOP_REGION=eu-west", "export SHOP_CURRENCY=EUR", "export SHOP_LOCALE=de_DE",
               "export SHOP_TIMEZONE=Europe/Berlin"]
    assert reordered_listing_causes(fpr, entries, "Environment", [2, 0, 3, 1]) == ["template_change", None]


CONDENSE_SUMMARY = ("The user asked to port the billing module off the legacy API. Modules 0 and 1 were read: both "
                    "call legacy.charge once, in handle(). The agent replaced the call in module 0 with "
                    "payments.charge, ran the tests (green) and was about to start on module 1.")


def _condensed(summary: str) -> list[dict]:
    """The first user message kept, the model's call of a condense tool with the summary as its
    arguments, the tool's answer, then the next user message (Cline's condense)."""
    call = {"id": "call_condense", "type": "function",
            "function": {"name": "condense", "arguments": json.dumps({"context": summary})}}
    return [{"role": "user", "content": TASK}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_condense", "content": "The summary was accepted; go on from it."},
            {"role": "user", "content": "Now port module 1."}]


def test_a_summary_in_a_tool_calls_arguments_after_the_task_is_a_compaction(fpr) -> None:
    """The task kept, the rest of the history replaced by the model's call of a tool whose arguments
    hold the summary and the tool's answer (Cline's condense): a compaction (round 35)."""
    results = [f"def handle_{k}(order):\n    return legacy.charge(order)\n" * 4 for k in range(3)]
    bodies = [Gen.body(CODER, _tool_turns(results[:2]), None, None), Gen.body(CODER, _tool_turns(results), None, None),
              Gen.body(CODER, _condensed(CONDENSE_SUMMARY), None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_the_same_task_started_over_with_a_short_call_is_no_compaction(fpr) -> None:
    """The guard: the same first message, then a call that reads a file (short arguments) and its
    result: a new conversation's path, no summary stands in for the dropped turns."""
    results = [f"def handle_{k}(order):\n    return legacy.charge(order)\n" * 4 for k in range(3)]
    restart = _condensed("x")
    restart[1]["tool_calls"][0]["function"] = {"name": "read_file", "arguments": '{"path": "m9.py"}'}
    restart[2]["content"] = "def handle_9(order):\n    return payments.charge(order)\n"
    bodies = [Gen.body(CODER, _tool_turns(results[:2]), None, None), Gen.body(CODER, _tool_turns(results), None, None),
              Gen.body(CODER, restart, None, None)]
    assert causes(fpr, bodies)[-1] != "compaction"


@pytest.mark.parametrize(("line", "values"), [
    ("Clock face: {}", ["IT IS TWENTY PAST NINE", "IT IS HALF PAST NINE", "IT IS TEN TO TEN"]),
    ("Uhr am Empfang: {}", ["Es ist Viertel nach drei", "Es ist halb vier", "Es ist fünf vor vier"]),
])
def test_a_clock_in_words_after_a_key_is_a_value_on_its_first_change(fpr, line: str, values: list[str]) -> None:
    """A time of day in words as a word clock or a speaking clock says it, a key line's whole value:
    a per-request value, whole, on its first change (round 35)."""
    assert_values_whole(fpr, line, values)


def test_an_opening_hour_in_words_edited_in_a_sentence_stays_an_edit(fpr) -> None:
    """The guard: a rule's time in words inside its sentence, edited once, is no clock."""
    got = run_value_line(fpr, "Opening hours: {}, Monday to Saturday", ["from nine o'clock", "from ten o'clock",
                                                                         "from ten o'clock"])
    assert [r["cause"] for r in got][0] == "template_change"


def test_a_records_rising_id_with_its_note_in_brackets_is_a_value_on_its_first_change(fpr) -> None:
    """The newest record's id, risen, with what it is in brackets (`SR-00412 (printer jam)` ->
    `SR-00415 (password reset)`): a per-request value, whole, on its first change (round 35)."""
    values = ["SR-00412 (printer jam)", "SR-00415 (password reset)", "SR-00419 (new laptop)"]
    assert_values_whole(fpr, "Newest ticket: {}", values)


def test_an_id_with_its_note_edited_to_an_older_one_stays_an_edit(fpr) -> None:
    """The guard: a reference edited to an older record (its number fell) with another note is no
    sequence that moved on."""
    got = run_value_line(fpr, "Example ticket: {}", ["SR-00412 (printer jam)", "SR-00208 (password reset)",
                                                     "SR-00208 (password reset)"])
    assert [r["cause"] for r in got][0] == "template_change"


@pytest.mark.parametrize(("line", "values"), [
    ("Kiln 2: {}", ["firing for 3 hrs 12 mins", "firing for 3 hrs 40 mins", "firing for 4 hrs 5 mins"]),
    ("Backofen: {}", ["heizt seit 1 Std. 05 Min.", "heizt seit 1 Std. 32 Min.", "heizt seit 2 Std. 01 Min."]),
])
def test_a_state_held_for_a_time_of_two_parts_is_a_value_whole(fpr, line: str, values: list[str]) -> None:
    """A key's state and how long it has held, in hours and minutes (`seit`, `for`; `Std.`, `Min.`):
    a per-request value, the state with its time, on its first change (round 35)."""
    assert_values_whole(fpr, line, values)


# ------------------------------------------------------------------ round 36
CONFIG_BLOCK_TOOLS = ['  lookup_order {\n    description = "Find an order by its number."\n    params { number { type: "string" } }\n  }',
                      '  create_return {\n    description = "Open a return for an order."\n    params {\n      number { type: "string" }\n    }\n  }',
                      '  pendingOrders {\n    description = "Orders not shipped yet."\n    params {}\n  }',
                      '  track-shipment {\n    description = "Tracking events of a parcel."\n    params { tracking_id { type: "string" } }\n  }']
GIT_ALIAS_TOOLS = ["alias.st status --short", "alias.last log -1 HEAD --stat", "alias.ship !bin/release --tag",
                   "alias.undo reset --soft HEAD~1"]


@pytest.mark.parametrize("form", ["config-blocks", "git-aliases"])
def test_tools_as_config_blocks_or_git_aliases_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as a config file's blocks that a name written as code opens (HOCON's, an
    nginx-style file's), or as git's aliases the way `git config --get-regexp '^alias\\.'` prints
    them, moved: a tool order (round 36)."""
    entries = CONFIG_BLOCK_TOOLS if form == "config-blocks" else GIT_ALIAS_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_configs_sections_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: a config's sections named by plain words (`server {`, `logging {`) moved name no
    tool: a template change."""
    entries = ['server {\n  port = 8080\n}', 'logging {\n  level = "info"\n}', 'cache {\n  ttl = 60\n}',
               'limits {\n  burst = 20\n}']
    assert reordered_listing_causes(fpr, entries, "Settings", [2, 0, 3, 1]) == ["template_change", None]


def _replies(results: list[str | None]) -> list[dict]:
    """`_tool_turns`' conversation with each exchange's own question; an exchange's tool call and
    result are left out where its result is None."""
    msgs: list[dict] = []
    for k, result in enumerate(results):
        msgs.append({"role": "user", "content": f"{TASK} Part {k}."})
        if result is not None:
            call = {"id": f"call_{k}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"path": "m{k}.py"}}'}}
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{k}", "content": result}]
        msgs.append({"role": "assistant", "content": f"Module {k} read; it calls the legacy API once."})
    return msgs


def test_tool_calls_and_results_pruned_from_the_history_are_a_compaction(fpr) -> None:
    """Every tool call and result before the new question dropped, every other message kept in its
    place (the Vercel AI SDK's `pruneMessages`): paid once, a compaction (round 36)."""
    results = [f"def handle_{k}(order):\n    return legacy.charge(order)\n" * 4 for k in range(3)]
    ask = {"role": "user", "content": "Now port module 1."}
    bodies = [Gen.body(CODER, [*_replies(results[:2]), {"role": "user", "content": f"{TASK} Part 2."}], None, None),
              Gen.body(CODER, [*_replies(results), ask], None, None),
              Gen.body(CODER, [*_replies([None] * 3), ask, {"role": "assistant", "content": "Ported."},
                               {"role": "user", "content": "And module 2?"}], None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_the_answered_exchanges_tool_call_dropped_is_no_compaction(fpr) -> None:
    """The guard: a client that drops the current exchange's tool call and result once the model
    answered it drops nothing older: no compaction."""
    results = [f"def handle_{k}(order):\n    return legacy.charge(order)\n" * 4 for k in range(2)]
    first = _replies([None, None])[:3]
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "m1.py"}'}}
    bodies = [Gen.body(CODER, [*first, {"role": "assistant", "content": None, "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_1", "content": results[1]}], None, None),
              Gen.body(CODER, [*first, {"role": "assistant", "content": "Module 1 read."},
                               {"role": "user", "content": "And module 2?"}], None, None)]
    assert causes(fpr, bodies)[-1] != "compaction"


def test_a_clock_in_words_ending_its_sentence_is_a_value_on_its_first_change(fpr) -> None:
    """A speaking clock's sentence with its full stop, the hour alone too (`Es ist neun.`): a
    per-request value, whole, on its first change (round 36)."""
    values = ["Es ist neun.", "Es ist Viertel nach neun.", "Es ist halb zehn."]
    assert_values_whole(fpr, "Uhrzeit: {}", values)


@pytest.mark.parametrize("values", [["loading cars for the crossing", "tied up at the pier", "sailing to the island now"],
                                    ["shunting in the sidings", "sidings being cleared now", "coupling the night train"]])
def test_a_state_of_up_to_five_words_replaced_by_another_is_a_value(fpr, values: list[str]) -> None:
    """A key's state of up to five words replaced by another with fewer than half of its words in
    common: a per-request value, whole, on its first change (round 36)."""
    assert_values_whole(fpr, "Ferry: {}", values)


def test_a_rule_of_four_words_with_half_of_them_kept_stays_an_edit(fpr) -> None:
    """The guard: a phrase of four words that keeps two of them (`answer in plain English` ->
    `answer in short sentences`) was edited, not replaced."""
    got = run_value_line(fpr, "Style: {}", ["answer in plain English", "answer in short sentences",
                                            "answer in short sentences"])
    assert [r["cause"] for r in got][0] == "template_change"


# ------------------------------------------------------------------ round 37
SECTION_TOOLS = {
    "kind-and-name": ["[tool:lookup_order]\ndescription = Find an order by its number.\nparam.number.type = string\n",
                      "[tool:create_return]\ndescription = Open a return for an order.\nparam.number.type = string\n",
                      "[tool:pending_orders]\ndescription = Orders not shipped yet.\n",
                      "[tool:track_shipment]\ndescription = Tracking events of a parcel.\nparam.tracking_id.type = string\n"],
    "quoted-name": ['[tool "lookup_order"]\n\tdescription = Find an order by its number.\n',
                    '[tool "create_return"]\n\tdescription = Open a return for an order.\n',
                    '[tool "pending_orders"]\n\tdescription = Orders not shipped yet.\n',
                    '[tool "track_shipment"]\n\tdescription = Tracking events of a parcel.\n'],
}


@pytest.mark.parametrize("form", list(SECTION_TOOLS))
def test_tools_as_config_sections_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as a config file's sections whose header names the entry with its kind
    (configparser's `[tool:name]`, git config's `[tool "name"]`), moved: a tool order (round 37)."""
    assert reordered_listing_causes(fpr, SECTION_TOOLS[form], "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_configs_plain_sections_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: a config's sections named by plain words (`[server]`, `[logging]`) moved name no
    tool: a template change."""
    entries = ["[server]\nport = 8080\n", "[logging]\nlevel = info\n", "[cache]\nttl = 60\n", "[limits]\nburst = 20\n"]
    assert reordered_listing_causes(fpr, entries, "Settings", [2, 0, 3, 1]) == ["template_change", None]


# ------------------------------------------------------------------ round 38
def test_messages_cut_in_place_to_a_budget_are_a_compaction(fpr) -> None:
    """Every long message of the history cut to its first words, nothing dropped or summarised
    (AutoGen's message token limiter): paid once, a compaction (round 38)."""
    results = [f"def handle_{k}(order):\n    return legacy.charge(order)\n" * 4 for k in range(3)]
    full = [*_replies(results), {"role": "user", "content": "Now port module 1."}]
    cut = [dict(m, content=m["content"][:40]) if isinstance(m.get("content"), str) and len(m["content"]) > 40 else m
           for m in full]
    bodies = [Gen.body(CODER, [*_replies(results[:2]), {"role": "user", "content": f"{TASK} Part 2."}], None, None),
              Gen.body(CODER, full, None, None),
              Gen.body(CODER, [*cut, {"role": "assistant", "content": "Ported."}, {"role": "user", "content": "And 2?"}],
                       None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_message_rewritten_shorter_is_no_compaction(fpr) -> None:
    """The guard: an earlier message rewritten in other, fewer words is no cut to its start."""
    results = [f"def handle_{k}(order):\n    return legacy.charge(order)\n" * 4 for k in range(3)]
    full = [*_replies(results), {"role": "user", "content": "Now port module 1."}]
    edited = [dict(m, content="Port part one.") if m.get("content") == f"{TASK} Part 0." else m for m in full]
    edited = [dict(m, content="Port part two.") if m.get("content") == f"{TASK} Part 1." else m for m in edited]
    bodies = [Gen.body(CODER, [*_replies(results[:2]), {"role": "user", "content": f"{TASK} Part 2."}], None, None),
              Gen.body(CODER, full, None, None),
              Gen.body(CODER, [*edited, {"role": "assistant", "content": "Ported."}, {"role": "user", "content": "And 2?"}],
                       None, None)]
    assert causes(fpr, bodies)[-1] != "compaction"


@pytest.mark.parametrize("values", [
    ["2026-07-16T09:31:07.114Z info: orders: synced 12 orders", "2026-07-16T09:34:52.908Z warn: stock: feed late by 3s",
     "2026-07-16T09:40:01.377Z info: orders: synced 4 orders"],
    ["16.07.2026 09:31:07,114 [main] INFO  d.n.Sync - Bestellungen abgeglichen",
     "16.07.2026 09:34:52,908 [pool-2-thread-1] WARN  d.n.Lager - Meldung verspätet",
     "16.07.2026 09:40:01,377 [main] INFO  d.n.Sync - Bestellungen abgeglichen"],
])
def test_a_log_line_whose_stamp_and_message_changed_is_a_value_whole(fpr, values: list[str]) -> None:
    """A key line's value that a timestamp opens, the stamp moved on and the message after it
    changed too: a log line the client writes per request, whole, on its first change (round 38)."""
    assert_values_whole(fpr, "Log: {}", values)


def test_a_state_held_for_days_and_hours_is_a_value_whole(fpr) -> None:
    """A key's state and how long it has held in days and hours (`Tg.`, `days`): a per-request
    value, the state with its time, on its first change (round 38)."""
    values = ["brennt seit 6 Tg. 22 Std.", "brennt seit 7 Tg. 2 Std.", "brennt seit 7 Tg. 5 Std."]
    assert_values_whole(fpr, "Ofen: {}", values)


# ------------------------------------------------------------------ round 39
ORG_TOOLS = ["* lookup_order\n:PROPERTIES:\n:REQUIRED: number\n:END:\nFind an order by its number.\n- number :: string",
             "* create_return\n:PROPERTIES:\n:REQUIRED: number\n:END:\nOpen a return for an order.\n- number :: string",
             "* pending_orders\n:PROPERTIES:\n:REQUIRED: nil\n:END:\nOrders not shipped yet.",
             "* track_shipment\n:PROPERTIES:\n:REQUIRED: tracking_id\n:END:\nTracking events of a parcel.\n- tracking_id :: string"]
MACRO_TOOLS = ["st=git status -sb", "t=dotnet test Shop.sln --no-restore $*", "mig=dotnet ef migrations add $1",
               "pub=dotnet publish src\\Shop.Web -c Release"]


@pytest.mark.parametrize("form", ["org-headings", "command-macros"])
def test_tools_as_org_headings_or_command_macros_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as an Org file's headings that hold a name written as code (a property drawer
    and text below each), or as command macros the way `doskey /macros` prints them (`name=command
    args`), moved: a tool order (round 39)."""
    entries = ORG_TOOLS if form == "org-headings" else MACRO_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_configs_key_value_lines_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: a config's `key=value` lines (one value each, no command) moved name no tool."""
    entries = ["port=8080", "region=eu-west", "currency=EUR", "timezone=Europe/Berlin"]
    assert reordered_listing_causes(fpr, entries, "Settings", [2, 0, 3, 1]) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Log: {}", ["[09:31:07 INF] Orders synced", "[09:34:52 WRN] Stock feed late by 3s", "[09:40:01 INF] Orders synced"]),
    ("Varnish: coat 1 in the cabinet, {}", ["PT5H4M", "PT5H50M", "PT6H17M"]),
    ("Flights: {}", ["GO, surface wind 4 kt", "HOLD, awaiting pilot", "NO-GO, gusts 18 kt"]),
    ("Dampf: {}", ["Stumpen im Dampf seit 3′33″", "Stumpen im Dampf seit 4′59″", "Stumpen im Dampf seit 6′12″"]),
])
def test_round_39s_values_are_values_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 39 reads: a log line whose clock,
    read to the second, opens it in brackets; a time taken as an ISO 8601 duration in hours and
    minutes; a state whose detail holds a reading; minutes and seconds written with primes."""
    assert_values_found(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Opening: {}", ["09:00 weekdays only", "10:00 weekends too", "10:00 weekends too"]),
    ("Reminder: {} before the tour", ["PT1H30M", "PT1H45M", "PT1H45M"]),
])
def test_a_rules_hour_or_round_duration_edited_stays_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: a rule's hour with its words edited (no seconds: no log's clock), a reminder's
    round duration in its sentence edited."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change"


# ------------------------------------------------------------------ round 40
DIRECTIVE_TOOLS = [".. py:function:: find_invoice(number)\n\n   An invoice by its number.\n\n   :param number: e.g. RE-1042",
                   ".. py:function:: open_tickets(team=None)\n\n   Tickets still open.\n\n   :type team: str",
                   ".. function:: refund(order, amount)\n\n   Refund part of an order.",
                   ".. py:function:: carrier_status()\n\n   Whether the carriers' APIs answer."]


def test_tools_declared_by_markup_directives_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as a markup file's directives that declare a function by its name written
    as code (`.. py:function:: find_invoice(number)`, a field list below each) moved: a tool order
    (round 40)."""
    assert reordered_listing_causes(fpr, DIRECTIVE_TOOLS, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_directives_that_name_files_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: directives that name a file or nothing (an image, a note) moved declare no tool."""
    entries = [".. image:: shop-logo.png\n\n   The logo.", ".. note::\n\n   Prices include VAT.",
               ".. image:: opening-hours.png\n\n   The hours.", ".. warning::\n\n   No refunds on sale items."]
    assert reordered_listing_causes(fpr, entries, "Notes", [2, 0, 3, 1]) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Last delivery: {}", ["TR4471/dock 2", "TR4476/dock 5", "TR4479/dock 1"]),
    ("Letzte Bestellung: {}", ["B-2026/1187 (Ersatzteil)", "B-2026/1190 (Wartung)", "B-2026/1191 (Wartung)"]),
    ("Current ticket: {}", ["Nr. 5512 (printer jam)", "Nr. 5513 (printer jam)", "Nr. 5516 (VPN)"]),
])
def test_the_newest_entry_a_key_names_is_a_value_whole_on_its_first_change(fpr, line: str, values: list[str]) -> None:
    """A `key: value` line whose key names the newest entry of a series (`Last …`, `Letzte …`,
    `Current …`) holds whichever entry came last: on its first change a value, the entry with its
    note whole, whether its number alone or more of it changed (round 40)."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Max retries: {}", ["3 per call", "5 per call", "5 per call"]),
    ("Last admission: {}", ["17:30, 45 min before closing", "18:00, 30 min before closing",
                            "18:00, 30 min before closing"]),
])
def test_a_settings_number_or_a_last_admissions_hour_edited_stay_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: a setting's key names no newest entry; a `Last …` key whose value holds a clock
    and small numbers, no entry's number, is a rule edited."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


@pytest.mark.parametrize(("line", "values"), [
    ("Remittance reference: {}", ["RF18 5390 0754 7034", "RF71 ZK2M 91QD 8", "RF09 L4TR 2VX8 P33K 7"]),
    ("Shot clock: {}", ["quarter 2, 24 s on the clock", "quarter 2, 11 s on the clock", "quarter 3, 20 s on the clock"]),
])
def test_round_40s_values_are_values_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 40 reads: a reference written as
    an IBAN or a creditor reference is (two letters, two check digits, groups of four), drawn again
    at another length; a countdown's seconds with their unit, `on the clock`."""
    assert_values_found(fpr, line, values)


def context_block_causes(fpr: Fingerprinter, lines: list[str], values: list[str]) -> list[str | None]:
    """The causes of a conversation whose first user message opens with a `<workspace>` block
    holding `lines`, `{}` in one of them filled with each of `values` in turn."""
    def first(value: str) -> str:
        block = "\n".join(line.format(value) for line in lines)
        return f"<workspace>\n{block}\n</workspace>\n\n" + TASK

    return causes(fpr, [body(CODER, [first(v), *t[1:]]) for v, t in zip(values, conversation(3), strict=True)])


@pytest.mark.parametrize("values", [["cue 14 GO, sound 7", "cue 16 standby, sound 9", "cue 17 GO, sound 9"],
                                    ["Act II, scene 3 running", "curtain down, notes", "Act II, scene 1 running"],
                                    ["ch 1-4 @ 80% 20% 0 0", "ch 1-4 @ 80% 0 35% 0", "ch 1-4 @ 60% 0 35% 10%"]])
def test_a_key_lines_value_in_a_context_block_of_the_first_user_message_is_a_value(fpr, values: list[str]) -> None:
    """An agent's context block (a tag alone on its line opens it, another closes it) refreshed on
    every request: a `key: value` line in it whose value changed in more than one word is a value,
    not the person editing their turn (round 40)."""
    lines = ["repo: ticketing (main)", "django: 5.1.4", "stage: {}", "open file: seats/views.py"]
    assert context_block_causes(fpr, lines, values) == ["dynamic_head", "dynamic_head"]


def test_a_key_line_rewritten_after_the_context_block_closed_is_no_value(fpr) -> None:
    """The guard: a `key: value` line of the person's own text, after the block closed, rewritten,
    is what it was before round 40 (the person's own message changed), not a value."""
    def first(goal: str) -> str:
        return f"<workspace>\nrepo: ticketing (main)\ndjango: 5.1.4\n</workspace>\n\nGoal: {goal}\n" + TASK

    goals = ["keep row C in the stalls", "move row C to the balcony", "move row C to the balcony"]
    bodies = [body(CODER, [first(g), *t[1:]]) for g, t in zip(goals, conversation(3), strict=True)]
    assert causes(fpr, bodies)[0] not in ("dynamic_head", None)


# ------------------------------------------------------------------ round 41
PROLOG_TOOLS = ["%! order_lookup(+Number:string) is det.\n%\n%  One order with its lines.\ntool(order_lookup,\n     [ number-string\n     ],\n     [number]).",
                "%! return_open(+Number:string, ?Reason:atom) is det.\n%\n%  Open a return.\ntool(return_open,\n     [ number-string,\n       reason-atom\n     ],\n     [number]).",
                "%! pending_orders is det.\n%\n%  Orders not shipped yet.\ntool(pending_orders, [], []).",
                "%! parcel_track(+Code:string) is det.\n%\n%  Tracking events of a parcel.\ntool(parcel_track,\n     [ code-string\n     ],\n     [code])."]
SUDO_TOOLS = ["    (root) NOPASSWD: /usr/bin/systemctl restart shop-web", "    (postgres) NOPASSWD: /usr/bin/pg_dump shop",
              "    (deploy) NOPASSWD: /opt/shop/bin/release --env prod", "    (root) NOPASSWD: /usr/sbin/nginx -s reload"]


@pytest.mark.parametrize("form", ["logic-facts", "allowed-commands"])
def test_tools_as_logic_facts_or_allowed_commands_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as a logic program's facts whose first argument is the tool's name, each under
    a structured comment that declares it with its modes (`%! order_lookup(+Number:string) is
    det.`), or as the commands a user may run, each named by its executable's path in a `bin`
    directory after whom it runs as (`(root) NOPASSWD: /usr/bin/systemctl restart shop-web`), moved:
    a tool order (round 41)."""
    entries = PROLOG_TOOLS if form == "logic-facts" else SUDO_TOOLS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_list_of_file_paths_in_another_order_stays_a_template_change(fpr) -> None:
    """The guard: paths that name files and folders, not executables in a `bin` directory, moved."""
    entries = ["    (read) /srv/shop/config/prices.yaml", "    (read) /srv/shop/templates/invoice.html",
               "    (write) /var/log/shop/orders.log", "    (read) /etc/shop/carriers.json"]
    assert reordered_listing_causes(fpr, entries, "Files", [2, 0, 3, 1]) == ["template_change", None]


# ------------------------------------------------------------------ round 42
DEVICE_TOOLS = ["AT+RATE=<baud>      set the serial rate", "AT+TEMP?            the probe's temperature",
                "AT+RESET            restart the logger", "MEAS:VOLT:DC?       read the supply voltage"]


def test_a_devices_commands_listed_with_their_help_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as a device's commands the way its help lists them (capitals joined by a
    command sign, an argument or a query, then what each does), moved: a tool order (round 42)."""
    assert reordered_listing_causes(fpr, DEVICE_TOOLS, "Commands", [2, 0, 3, 1]) == ["tool_order", None]


def test_time_zones_aligned_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: time zones in capitals with their sign, aligned on two spaces or more before the
    offices in them, moved: they name no command."""
    entries = ["UTC+1        the Berlin and Paris offices", "UTC+2        the Athens office",
               "UTC-5        the New York office", "UTC+9        the Tokyo office"]
    assert reordered_listing_causes(fpr, entries, "Offices", [2, 0, 3, 1]) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Last frame: CRC-16 {}", ["0x3A9F", "0xE27C", "0x5B14"]),
    ("Work order: {}", ["WO-26-417 (pump P3, bay 2)", "WO-26-419 (valve V7, bay 5)", "WO-26-420 (pump P1, bay 1)"]),
])
def test_round_42s_values_are_values_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 42 reads: a checksum written as a
    hex literal, drawn again; a record's code whose last number rose a little (a year before it),
    with a note that changed too."""
    assert_values_found(fpr, line, values)


def test_a_standards_number_that_jumped_with_its_note_stays_an_edit(fpr) -> None:
    """The guard: a code's last number that jumped (another standard), its note with it, edited."""
    got = run_value_line(fpr, "Standard: {}", ["EN-26-1090 (steel, execution)", "EN-26-1993 (steel, design)",
                                               "EN-26-1993 (steel, design)"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 43
ML_TOOLS = ["(** One order with its lines. *)\nval order_show :\n  number:string -> string Lwt.t",
            "(** Open a return.\n    @param reason one of damaged, late *)\nval return_open :\n  number:string -> ?reason:string -> unit -> string Lwt.t",
            "(** Orders not shipped yet. *)\nval pending_orders : unit -> string Lwt.t",
            "(** Tracking events of a parcel. *)\nval parcel_track :\n  code:string -> string Lwt.t"]
USAGE_TOOLS = ["  shopctl order show <number>", "  shopctl return open <number> [--reason=<why>]",
               "  shopctl orders pending [--since=<date>]", "  shopctl parcel track <code> (--dhl | --ups)"]
STEP_TOOLS = ["Order Show\n    [Documentation]    One order with its lines.\n    ...    - ``number`` (string)\n"
              "    [Arguments]    ${number}\n    ${result}=    Call Tool    order_show    number=${number}\n"
              "    RETURN    ${result}",
              "Return Open\n    [Documentation]    Open a return.\n    ...    - ``number`` (string)\n"
              "    [Arguments]    ${number}\n    ${result}=    Call Tool    return_open    number=${number}\n"
              "    RETURN    ${result}",
              "Pending Orders\n    [Documentation]    Orders not shipped yet.\n    ${result}=    Call Tool    pending_orders\n"
              "    RETURN    ${result}",
              "Parcel Track\n    [Documentation]    Tracking events of a parcel.\n    ...    - ``code`` (string)\n"
              "    [Arguments]    ${code}\n    ${result}=    Call Tool    parcel_track    code=${code}\n"
              "    RETURN    ${result}"]


@pytest.mark.parametrize("form", ["ml-interface", "usage-lines", "keyword-steps"])
def test_tools_as_ml_values_usage_lines_or_keyword_steps_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as an ML-family interface's values with their types (`val order_show :`), as a
    program's usage lines (`  shopctl return open <number> [--reason=<why>]`), or as keywords
    whose step calls the tool by name and keeps its result (`${result}=    Call Tool    order_show`),
    moved: a tool order (round 43)."""
    entries = {"ml-interface": ML_TOOLS, "usage-lines": USAGE_TOOLS, "keyword-steps": STEP_TOOLS}[form]
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_rules_with_placeholders_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: indented rules holding placeholders in angle brackets, words after them, moved:
    no program's usage lines."""
    entries = ["  reply to <customer> within <hours> hours", "  greet <customer> by name",
               "  quote <order> before any refund", "  close <ticket> when the parcel arrived"]
    assert reordered_listing_causes(fpr, entries, "Rules", [2, 0, 3, 1]) == ["template_change", None]


# ------------------------------------------------------------------ round 44
@pytest.mark.parametrize(("line", "values"), [
    ("Boiler: {}", ["heating, ready in 1 h 12 min", "heating, ready in 1 h 05 min", "heating, ready in 0 h 58 min"]),
    ("Lift: {}", ["14 of 20 chairs running today", "15 of 20 chairs running today", "17 of 20 chairs running today"]),
    ("Order: {}", ["SO-26-00418 · two pallets", "SO-26-00419 · two pallets", "SO-26-00421 · two pallets"]),
    # round 12 read the count alone (`219/450`)
    ("Parking deck: {}", ["212/450 spaces taken", "219/450 spaces taken", "231/450 spaces taken"]),
])
def test_a_short_status_whose_number_changed_is_a_value_whole(fpr, line: str, values: list[str]) -> None:
    """A short status after a label of a word or two, whose number alone changed: a time running in
    its words, a count with words of its own, or an entry's id with what it is after it. The client
    writes the status whole on each request: the span is the whole value (round 44)."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Car deck space left on the next sailing: {}", ["228 lane metres", "196 lane metres", "190 lane metres"]),
    ("Context: {}", ["14.2k of the 128k window", "20.9k of the 128k window", "25.6k of the 128k window"]),
    ("Timing: {}", ["retrieval;dur=114.1 done", "retrieval;dur=232.3 done", "retrieval;dur=298.5 done"]),
])
def test_a_number_after_a_long_key_a_meters_unit_or_its_own_key_is_read_alone(fpr, line: str, values: list[str]) -> None:
    """The guards: a number after a key of more than two words, one beside its unit and a single word,
    or one after a key of its own in the value is read alone, as before round 44."""
    got = assert_values_found(fpr, line, values)
    assert [r["spans"] for r in got] == [[v.split(";dur=")[-1].split(" ")[0]] for v in values[1:]], got


@pytest.mark.parametrize(("line", "values"), [
    ("Bakery: {}", ["baking, side-loading the deck", "cooling on the racks", "last batch 17:00"]),
    ("Funicular: {}", ["paused, gusts above 40 mph at the top", "running every 6 min", "paused, wind 45 mph"]),
    ("Hall: {}", ["12 in the hall, 4 waiting, 1 desk open", "15 in the hall, 6 waiting, 2 desks open",
                  "9 in the hall, 2 waiting, 2 desks open"]),
    ("Cars: {}", ["Anna 1,240 kg at the top, Berta 310 kg below; 6 up, 4 down",
                  "Berta 980 kg at the top, Anna 450 kg below; 7 up, 5 down",
                  "Anna 1,020 kg at the top, Berta 200 kg below; 8 up, 5 down"]),
    ("Next tram: {}", ["Anna departs 09:12 (in 3 min)", "Berta departs 09:20 (in 4 min)", "Berta departs 09:20 (in 2 min)"]),
    ("Kiln: {}", ["day 3 of 7, 52 h 10 min since lighting", "day 3 of 7, 52 h 24 min since lighting",
                  "day 3 of 7, 53 h 02 min since lighting"]),
])
def test_round_44s_statuses_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request statuses in forms round 44 reads, each whole: a state
    with a hyphenated detail, a detail with a reading, or a clock; counts whose nouns agree with
    them; two named things that traded places with their readings; a running time with one of its
    words changed, or alone."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Returns: {}", ["accepted within 30 days, receipt needed", "accepted within 14 days, receipt needed",
                     "accepted within 14 days, receipt needed"]),
    ("Ferries: {}", ["Anna 12 cars, Berta 9 cars", "Anna 14 cars, Clara 9 cars", "Anna 14 cars, Clara 9 cars"]),
])
def test_a_rules_number_or_a_name_edited_with_a_count_stays_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: a rule whose number changed in its phrase; a name replaced, not traded, beside
    counts."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


def _restored(files: int) -> list[dict]:
    """After a compaction, Claude Code's summary as the first user message, then the files read
    last restored as Read calls and their results, each a user message of its own."""
    msgs = [{"role": "user", "content": "This session is being continued from a previous conversation that ran "
                                        "out of context. The conversation is summarized below:\nInvoices half migrated; "
                                        "tests green up to module 3."}]
    for k in range(files):
        path = f"/home/dev/billing/m{k}.py"
        msgs += [{"role": "user", "content": f'Called the Read tool with the following input: {{"file_path":"{path}"}}'},
                 {"role": "user", "content": f'Result of calling the Read tool: {{"filePath":"{path}","content":"'
                                             + "def charge(order):\\n    return api.invoice(order)\\n" * 40 + '"}'}]
    return msgs


def test_a_summary_followed_by_the_files_read_last_restored_is_a_compaction(fpr) -> None:
    """Claude Code's compaction restores the files read last after the summary, as user messages of
    their own: more text than the short turns replaced, yet the history lost half of its messages
    and only user messages are new: a compaction (round 44)."""
    history = agent_history(6)
    bodies = [Gen.body(CODER, history[:11], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, [*_restored(2), {"role": "user", "content": "Go on with module 4."}], None, None)]
    assert sum(len(m["content"]) for m in bodies[2]["messages"][1:]) > sum(len(m["content"]) for m in history)
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_new_conversation_with_one_short_message_after_a_long_one_stays_a_new_session(fpr) -> None:
    """The guard: a new conversation of one message after a long one, no summary before it."""
    history = agent_history(6)
    bodies = [Gen.body(CODER, history[:11], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, [{"role": "user", "content": "Write a haiku about invoices."}], None, None)]
    assert causes(fpr, bodies)[-1] == "new_session"


# ------------------------------------------------------------------ round 45
COMMAND_FILES = [f"`.cursor/commands/{n}.md`\n```markdown\n---\ndescription: {d}\n---\nRun {n} for $1.\n```"
                 for n, d in (("order-show", "One order with its lines."), ("return-open", "Open a return."),
                              ("parcel-track", "Tracking events of a parcel."), ("stock-count", "Stock of an item."))]
SHELL_FUNCTIONS = [f"function {n} {{\n    <#\n    .SYNOPSIS\n    {d}\n    #>\n    [CmdletBinding()]\n    param(\n"
                   f"        [Parameter(Mandatory)]\n        [string]$Id\n    )\n    Send-ToolCall -Tool {t} -Arguments $PSBoundParameters\n}}"
                   for n, d, t in (("Get-OrderShow", "One order.", "order_show"), ("New-ReturnOpen", "Open a return.", "return_open"),
                                   ("Get-ParcelTrack", "Tracking events.", "parcel_track"), ("Get-StockCount", "Stock of an item.", "stock_count"))]


@pytest.mark.parametrize("form", ["command-files", "shell-functions"])
def test_tools_as_command_files_or_shell_functions_in_another_order_are_a_tool_order(fpr, form: str) -> None:
    """Tools written as an editor's command files, each named by its path written as code in a
    hidden folder (`` `.cursor/commands/order-show.md` `` over its front matter), or as a shell's
    functions declared by keyword and name before their body's brace (PowerShell's `function
    Get-OrderShow {`), moved: a tool order (round 45)."""
    entries = COMMAND_FILES if form == "command-files" else SHELL_FUNCTIONS
    assert reordered_listing_causes(fpr, entries, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


def test_calls_of_functions_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: steps that call functions (no keyword declares them, no brace opens a body),
    moved."""
    entries = ["Invoke-Tool -Name 'order_show' -Id 5", "Invoke-Tool -Name 'return_open' -Id 7",
               "Invoke-Tool -Name 'parcel_track' -Id 9", "Invoke-Tool -Name 'stock_count' -Id 2"]
    assert reordered_listing_causes(fpr, entries, "Steps", [2, 0, 3, 1]) == ["template_change", None]


def rebuilt_history(history: list[dict], summary: str, question: str) -> list[dict]:
    """Codex CLI's compacted history: the previous history's user messages in order, every reply
    and tool result dropped, then the summary as a user message, then the new question."""
    return [*(m for m in history if m["role"] == "user"), {"role": "user", "content": summary},
            {"role": "user", "content": question}]


def test_the_user_messages_kept_every_reply_dropped_and_a_summary_after_them_is_a_compaction(fpr) -> None:
    """The history rebuilt from the user messages, every reply gone, the summary after them: a
    compaction, whatever share of the messages is left (round 45)."""
    history = agent_history(3)
    summary = "Another model worked on this; its summary: invoices half migrated, tests green."
    bodies = [Gen.body(CODER, history[:5], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, rebuilt_history(history, summary, "Go on with module 4."), None, None)]
    assert len(bodies[2]["messages"]) * 2 > len(bodies[1]["messages"])  # fewer than half of the messages gone
    assert causes(fpr, bodies) == [None, "compaction"]


def test_the_user_messages_resent_without_replies_and_nothing_new_is_no_compaction(fpr) -> None:
    """The guard: a client that re-sends the user messages without the replies and adds nothing
    stands no summary in for them."""
    history = agent_history(3)
    bodies = [Gen.body(CODER, history[:5], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, [m for m in history if m["role"] == "user"], None, None)]
    assert causes(fpr, bodies)[-1] != "compaction"


@pytest.mark.parametrize(("line", "values"), [
    ("Oven: {}", ["batch 2 of the day, 37 min in the oven", "batch 2 of the day, 41 min in the oven",
                  "batch 2 of the day, 48 min in the oven"]),
    ("Next ferry: {}", ["14:20 (car deck full), in 12 min", "14:50 (foot passengers only), in 31 min",
                        "14:50 (foot passengers only), in 27 min"]),
    ("Werkstatt: {}", ["Kurs 10 Uhr: noch 25 Min., Schleifen", "Kurs 10 Uhr: noch 12 Min., Polieren und Fassen",
                       "Kurs 10 Uhr: noch 7 Min., Polieren und Fassen"]),
    ("Tour: {}", ["Harbour walk 58 (12 guests, guide Ana)", "Harbour walk 59 (9 guests, guide Ben)",
                  "Harbour walk 60 (14 guests, guide Ana)"]),
    ("Bikes: {}", ["30 out, 12 in the shed, 2 in repair", "30 out, 13 in the shed, 1 in repair",
                   "29 out, 14 in the shed, 1 in repair"]),
    ("Kitchen: {}", ["oven on, bread proving", "line cleaned for the gluten-free bake", "oven on, rolls proving"]),
])
def test_round_45s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 45 reads, each whole: minutes alone
    running in a status's words (not round), a running time beside a note or a state that changed
    with it, German `noch … Min.`, a running number with its words and a note, counts of which two
    changed, a state of six words."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Breaks: {}", ["a pause of 15 min after each session", "a pause of 20 min after each session",
                    "a pause of 20 min after each session"]),
    ("Guided tours: {}", ["Harbour walk 58 (Mondays only)", "Harbour walk 72 (Mondays only)", "Harbour walk 72 (Mondays only)"]),
    ("Edition: {}", ["Harbour guide 4 (2024 print)", "Harbour guide 5 (2026 print)", "Harbour guide 5 (2026 print)"]),
])
def test_a_rules_round_minutes_or_a_number_that_jumped_or_is_dated_stay_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: round minutes in a rule changed; a number with its note that jumped, not rose;
    an edition's number that rose with a year in its note."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 46
@pytest.mark.parametrize(("line", "values"), [
    ("Court 2: {}", ["booked until 19:30 (doubles), next slot in 14 min", "booked until 19:30 (doubles), next slot in 9 min",
                     "booked until 19:30 (doubles), next slot in 3 min"]),
    ("Last job: {}", ["job 26-0412 (boiler service, 2 engineers, van 3)", "job 26-0413 (gas safety check, 1 engineer, van 1)",
                      "job 26-0415 (boiler service, 1 engineer, van 2)"]),
    ("Last card payment: {}", ["£14.80, Visa contactless ending 4411, auth code 7KQ2ZP",
                               "£9.35, Mastercard contactless ending 0273, auth code Q81MX4",
                               "£22.10, Visa contactless ending 9127, auth code 5TR0WB"]),
    ("Letzte Überweisung: {}", ["120,00 € (SEPA), Referenz K7QX2M9PLT4WZ8RA", "75,50 € (SEPA), Referenz 3HD9QW1ZXM7PLK2C",
                                "210,00 € (SEPA), Referenz W8ZT5NRQ2LM4XK9D"]),
    ("Röster 2: {}", ["7. Charge von 12, seit 9 Min. in der Trommel, nächste in 6 Min.",
                      "8. Charge von 12, seit 2 Min. in der Trommel, nächste in 13 Min.",
                      "8. Charge von 12, seit 7 Min. in der Trommel, nächste in 8 Min."]),
])
def test_round_46s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 46 reads, each whole: a status of
    up to 56 characters; a running number after a year's series with its note; the newest entry a
    `Last …` key names, up to 64 characters, or holding a reference drawn at random; a status line
    whose numbers changed with a time running in it."""
    assert_values_whole(fpr, line, values)


def test_a_status_lines_round_times_changed_with_its_count_stay_an_edit(fpr) -> None:
    """The guard: the same line whose running time changed to round minutes only (a rule's times are
    round), its count with it: what it was before round 46."""
    got = run_value_line(fpr, "Röster 2: {}", ["7. Charge von 12, seit 10 Min. in der Trommel, nächste in 5 Min.",
                                                "8. Charge von 12, seit 20 Min. in der Trommel, nächste in 15 Min.",
                                                "8. Charge von 12, seit 20 Min. in der Trommel, nächste in 15 Min."])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 47
def chat_commands(kind: int = 1) -> list[str]:
    """A chat app's commands as its bot registers them, one JSON object each (Discord's application
    commands: a numeric command type, options each named with a numeric type, or none)."""
    commands = [{"name": "order_show", "type": kind, "description": "One order with its lines.",
                 "options": [{"type": 3, "name": "number", "description": "e.g. 48213", "required": True}]},
                {"name": "pending_orders", "type": kind, "description": "Orders not shipped yet."},
                {"name": "parcel_track", "type": kind, "description": "Tracking events of a parcel.",
                 "options": [{"type": 3, "name": "code", "description": "The carrier's code", "required": True}]},
                {"name": "opening_hours", "type": kind, "description": "Today's opening hours."}]
    return [json.dumps(c, indent=2) for c in commands]


def test_a_chat_apps_commands_as_its_bot_registers_them_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as a chat app's commands in JSON, as a bot registers them (a command type,
    typed options or none), moved: a tool order (round 47)."""
    assert reordered_listing_causes(fpr, chat_commands(), "Commands", [2, 0, 3, 1]) == ["tool_order", None]


def test_named_records_of_another_numeric_type_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: named records with a description and a numeric type that is no command's (a
    catalogue's), without options, moved."""
    entries = [json.dumps({"name": n, "type": 7, "description": d}, indent=2) for n, d in (
        ("Harbour mug", "Stoneware, 300 ml."), ("Tide chart", "A year of tides."),
        ("Gull print", "A4, signed."), ("Rope coaster", "Set of four."))]
    assert reordered_listing_causes(fpr, entries, "Shop", [2, 0, 3, 1]) == ["template_change", None]


def test_a_running_status_long_only_by_its_note_is_a_value_whole_on_its_first_change(fpr) -> None:
    """A status whose time runs, longer than a status is read whole only by its note in brackets:
    its notes aside it is short, a value whole (round 47)."""
    values = [f"Smoker 1 (brisket, 6.2 kg, butcher paper): resting, done in {m} min" for m in (14, 9, 3)]
    assert_values_whole(fpr, "Pit: {}", values)


# ------------------------------------------------------------------ round 48
PROMPT_FILES = [f"# .assist/prompts/{n}.toml  (/{n})\ndescription = \"{d}\"\nprompt = \"\"\"\nCall the `{n.replace('-', '_')}` "
                f"tool for the request below.\n\nRequest: {{{{args}}}}\n\"\"\"\n"
                for n, d in (("order-show", "One order with its lines."), ("return-open", "Open a return."),
                             ("parcel-track", "Tracking events of a parcel."), ("stock-count", "Stock of an item."))]


def test_tools_as_files_each_opened_by_a_comment_with_its_path_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as files, one per tool, each opened by a comment holding the file's path in a
    folder (`# .assist/prompts/order-show.yaml`, as Gemini CLI's custom commands are dumped), moved:
    a tool order (round 48)."""
    assert reordered_listing_causes(fpr, PROMPT_FILES, "Commands", [2, 0, 3, 1]) == ["tool_order", None]


def test_paragraphs_opened_by_comments_without_a_path_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: rules in paragraphs, each opened by a comment that names no file, moved."""
    entries = [f"# {h}\n{t}\n" for h, t in (("Returns", "Within 60 days, unused."), ("Shipping", "Four to seven days."),
                                            ("Warranty", "Two years on seams."), ("Tone", "Friendly and brief."))]
    assert reordered_listing_causes(fpr, entries, "Rules", [2, 0, 3, 1]) == ["template_change", None]


def manifest_causes(fpr: Fingerprinter, key: str, items: list[dict[str, Any]]) -> list[str | None]:
    """The causes of a conversation whose system text holds a manifest listing `items` under `key`,
    then the same items in another order on the next two requests."""
    moved = [items[k] for k in (2, 0, 3, 1)]
    texts = [json.dumps({"name": "front-desk", "title": "Front Desk", key: listed}, indent=2)
             for listed in (items, moved, moved)]
    return causes(fpr, [body(f"{SYSTEM}\nThe extension's package.json:\n```json\n{text}\n```\nAnswer briefly.", t)
                        for text, t in zip(texts, conversation(3), strict=True)])


def test_a_manifests_commands_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as a launcher extension's manifest, its `commands` each named (with typed
    arguments or none), moved: a tool order (round 48)."""
    commands = [{"name": "order-show", "title": "Order Show", "description": "One order.", "mode": "no-view",
                 "arguments": [{"name": "number", "placeholder": "48213", "type": "text", "required": True}]},
                {"name": "pending-orders", "title": "Pending Orders", "description": "Orders not shipped.", "mode": "view"},
                {"name": "parcel-track", "title": "Parcel Track", "description": "Tracking events.", "mode": "no-view",
                 "arguments": [{"name": "code", "placeholder": "Code", "type": "text", "required": True}]},
                {"name": "opening-hours", "title": "Opening Hours", "description": "Today's hours.", "mode": "view"}]
    assert manifest_causes(fpr, "commands", commands) == ["tool_order", None]


def test_a_manifests_named_products_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: named records under another key (a shop's products: no parameters), moved."""
    products = [{"name": n, "price": p, "description": d} for n, p, d in (
        ("Harbour mug", 12, "Stoneware."), ("Tide chart", 8, "A year of tides."),
        ("Gull print", 25, "A4, signed."), ("Rope coaster", 6, "Set of four."))]
    assert manifest_causes(fpr, "products", products) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Last café payment: {}", ["£4.20 (flat white, oat), Zettle KQ7RWMXT2B", "£11.80 (two lunches), Zettle 3PZHAVNC9W",
                               "£11.80 (two lunches), Zettle T8MXQERB4K"]),
    ("Pool: {}", ["race 12 (6 swimmers) in the water, finish in 4 min", "race 12 leaving the pool, race 13 on the blocks at 15:40",
                  "race 13 (8 swimmers) in the water, finish in 7 min"]),
    ("Ferries: {}", ["evening crossing out, back 21:10; next sailing at 07:45 (in 11 h 42 min)",
                     "evening crossing out, back 21:10; next sailing at 07:45 (in 11 h 23 min)",
                     "evening crossing out, back 21:10; next sailing at 07:45 (in 11 h 13 min)"]),
])
def test_round_48s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 48 reads, each whole: the newest
    payment whose reference of ten capitals and digits was drawn again, its note before it changed
    or not; a running series' status rewritten as its item moves on (the first change at a
    bracket); a status long only by the countdown in brackets that ends it."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Last voucher: {}", ["£10 (spring offer), code SPRING24X", "£15 (summer offer), code SUMMER24X",
                          "£15 (summer offer), code SUMMER24X"]),
    ("Session 2: {}", ["doors at 18:00, talk at 18:30", "doors at 19:00, talk at 19:30, bring your ticket",
                       "doors at 19:00, talk at 19:30, bring your ticket"]),
])
def test_a_code_edited_or_a_series_items_clocks_moved_without_a_running_time_stay_an_edit(fpr, line: str,
                                                                                         values: list[str]) -> None:
    """The guards: the newest entry's code edited in a few letters, not drawn again; the same item
    of a series whose clocks changed, no time running in it."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


TEMPLATED_SENTENCES = [f"The tool {n} is available.\n{d}\nArguments: {a}" for n, d, a in (
    ("order_show", "One order with its lines.", "number"), ("return_open", "Open a return.", "number, reason"),
    ("parcel_track", "Tracking events of a parcel.", "code"), ("stock_count", "Stock of an item.", "sku"))]


def test_blocks_rendered_from_one_template_around_a_code_name_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools in a notation no rule names, blocks of several lines each opened by the same line but
    for the tool's name written as code (`The tool order_show is available.`), moved: what a client
    renders with one loop over its tools, a tool order (round 48)."""
    assert reordered_listing_causes(fpr, TEMPLATED_SENTENCES, "Tools", [2, 0, 3, 1]) == ["tool_order", None]


@pytest.mark.parametrize("entries", [
    ["Prefer order_show for a single order.", "Prefer return_open once the customer agrees.",
     "Prefer parcel_track when a parcel is late.", "Prefer stock_count before promising an item."],
    ["When an order is late, check parcel_track first.\nApologise once.", "Refunds go through return_open.\nNever promise a date.",
     "Stock questions: call stock_count.\nRound down.", "The customer's order is in order_show.\nRead it before answering."],
], ids=["one-line-rules", "paragraphs"])
def test_rules_that_name_code_moved_as_lines_or_paragraphs_stay_a_template_change(fpr, entries: list[str]) -> None:
    """The guards: rules of one line each from one template around a code name (no blocks), and
    paragraphs naming code in sentences of their own (no template), moved."""
    assert reordered_listing_causes(fpr, entries, "Rules", [2, 0, 3, 1]) == ["template_change", None]


# ------------------------------------------------------------------ round 49
BOX_TABLE = ["│ deploy        │ cmd       │ Ship the site to the server          │",
             "│ fmt           │ cmd       │ Format the code                      │",
             "│ docs          │ shell     │ Build the docs into site/            │",
             "│ seed          │ composite │ Load the demo data                   │"]


def test_tools_as_rows_of_a_box_drawn_table_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools as the rows of a table drawn in box-drawing characters, each named in its first cell
    (PDM's `pdm run --list`), moved: a tool order, as a table drawn with `|` is (round 49)."""
    assert reordered_listing_causes(fpr, BOX_TABLE, "Scripts", [2, 0, 3, 1]) == ["tool_order", None]


def test_rows_of_a_box_drawn_table_of_opening_hours_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: a box-drawn table whose first cells are words of prose (days), moved."""
    rows = ["│ Monday    │ 9–17 │", "│ Tuesday   │ 9–17 │", "│ Wednesday │ 9–13 │", "│ Saturday  │ 10–16 │"]
    assert reordered_listing_causes(fpr, rows, "Hours", [2, 0, 3, 1]) == ["template_change", None]


OPENER = "The following is a conversation with an AI assistant. "


def test_another_agent_whose_prompt_opens_with_the_same_sentence_is_a_new_conversation(fpr) -> None:
    """Two agents whose system prompts open with the same canned sentence and share nothing else,
    not a whole line: switching to the other with a new question is a new conversation (round 49)."""
    other = (f"{OPENER}The assistant answers in plain words for children.\n"
             "You answer for the Harbour Kite School: lessons, rentals and the weather window.\n"
             "- Never book a lesson above 25 knots.\n- Keep answers short.\n")
    first = f"{OPENER}The assistant tone is technical.\n{SYSTEM}"
    a = conversation(2)
    assert causes(fpr, [body(first, a[0]), body(first, a[1]), body(other, ["Can I book a lesson on Sunday?"])]) \
        == [None, "new_session"]


def test_a_prompt_edited_in_its_first_line_keeping_its_other_lines_stays_a_template_change(fpr) -> None:
    """The guard: the same opener, its first line edited and every other line kept, with a new
    question: an edited template."""
    first, edited = f"{OPENER}The assistant tone is technical.\n{SYSTEM}", f"{OPENER}The assistant tone is warm.\n{SYSTEM}"
    a = conversation(2)
    assert causes(fpr, [body(first, a[0]), body(first, a[1]), body(edited, ["Can I change the address?"])]) \
        == [None, "template_change"]


@pytest.mark.parametrize(("line", "values"), [
    ("Letzte Zahlung: {}", ["48,90 € (Wanderschuhe, Größe 42), PayPal 3f2a9c1e-7b4d-4e8a-9c2f-1d5e6a7b8c9d",
                            "129,00 € (Regenjacke, Damen M), PayPal 8c1b2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e",
                            "129,00 € (Regenjacke, Damen M), PayPal c4d5e6f7-a8b9-4c0d-9e1f-2a3b4c5d6e7f"]),
    ("Last repair: {}", ["RP-0412: Fender Rhodes / new tines", "RP-0415: Wurlitzer 200A / reed", "RP-0417: Hohner Clavinet / strings"]),
    ("Kennels: {}", ["small dogs 3, big dogs 5, out walking 2, collected 1", "small dogs 3, big dogs 4, out walking 3, collected 1",
                     "small dogs 2, big dogs 4, out walking 3, collected 2"]),
    ("Bolts: {}", ["Wool Navy 12,5 m | Tweed Grey 8,0 m | Linen Sand 30,5 m | Cord Olive 4,0 m",
                   "Wool Navy 12,5 m | Tweed Grey 6,5 m | Linen Sand 30,5 m | Cord Olive 4,0 m",
                   "Wool Navy 11,0 m | Tweed Grey 6,5 m | Linen Sand 30,5 m | Cord Olive 4,0 m"]),
    ("Brand: {}", ["Auftrag 26/118, Luftklappe auf, Ofen 310 °C, noch 0:04 h", "Auftrag 26/119, Anheizen mit Buche, Ofen 520 °C, noch 1:15 h",
                   "Auftrag 26/119, Anheizen mit Buche, Ofen 548 °C, noch 1:02 h"]),
    ("Courier: {}", ["[11:05] delivering at Ludlow (two boxes, one fragile), back ~11:40",
                     "[11:17] delivering at Ludlow (two boxes, one fragile), back ~11:40",
                     "[11:29] delivering at Ludlow (two boxes, one fragile), back ~11:40"]),
])
def test_round_49s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 49 reads, each whole: the newest
    payment whose UUID makes it long (a token drawn at random counts as one character); the newest
    job whose number ends in a colon; a tally of counts after their names, two changed; readings
    with names and units set apart by bars, one changed; a series' status after a year's series
    with hours and minutes left; a status long only by its notes in brackets."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Last update: {}", ["replaced the pump seal on unit 204 and flushed the whole line with clean water",
                         "replaced the pump seal on unit 207 and flushed the whole line with warm water",
                         "replaced the pump seal on unit 207 and flushed the whole line with warm water"]),
    ("Limits: {}", ["small dogs 2, big dogs 4, puppies 6", "small dogs 2, big dogs 5, puppies 6", "small dogs 2, big dogs 5, puppies 6"]),
])
def test_a_long_entry_of_prose_or_one_count_of_a_tally_changed_stay_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: a newest entry long in words, not in a random token; a tally of which one count
    changed."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


def test_a_dated_status_long_by_its_notes_keeps_its_running_time_alone(fpr) -> None:
    """The guard: a log-like status with a date in it, long only by its notes, is not read whole:
    its time alone, as before round 49."""
    values = [f"active (running) since Tue 2026-05-05 09:12:44 BST; {t} ago" for t in ("4h 38min", "4h 47min", "4h 58min")]
    got = assert_values_found(fpr, "Service: {}", values)
    assert [r["spans"] for r in got] == [["4h 47min"], ["4h 58min"]]


# ------------------------------------------------------------------ round 50
@pytest.mark.parametrize(("line", "values"), [
    ("Bays: {}", ["10:42 · Bay 1 Fiesta (MOT) waiting · Bay 2 Corsa (brakes) on the lift (25') · Bay 3 Polo (tyres) done",
                  "10:49 · Bay 1 Fiesta (MOT) on the lift (4') · Bay 2 Corsa (brakes) on the lift (32') · Bay 3 empty",
                  "10:57 · Bay 1 Fiesta (MOT) on the lift (12') · Bay 2 Corsa (brakes) road test · Bay 3 empty"]),
    ("Fähre: {}", [f"Stand {c} Uhr – nächste Abfahrt ab Glückstadt 14:30, Deck voll, Wagen warten am Anleger"
                   for c in ("14:07", "14:16", "14:24")]),
    ("Seats: {}", ["21/40 · sopranos 6/10, mezzos 3/5, altos 5/10, tenors 4/10, baritones 0/5, basses 1/5",
                   "21/40 · sopranos 6/10, mezzos 3/5, altos 5/10, tenors 4/10, baritones 1/5, basses 0/5",
                   "21/40 · sopranos 6/10, mezzos 3/5, altos 5/10, tenors 4/10, baritones 0/5, basses 1/5"]),
    ("Round: {}", ["stop 3/7 · driving to Hebden Bridge, 17 min · clock 10:02",
                   "stop 3/7 · unloading at Hebden Bridge, 8 min left · clock 10:19",
                   "stop 4/7 · driving to Mytholmroyd, 13 min · clock 10:31"]),
])
def test_round_50s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 50 reads, each whole: a status
    stamped with its clock first, as long as its entries make it, after an "as of" word too; a
    tally of fractions with its total first, two changed; a series' status whose minutes alone run."""
    assert_values_whole(fpr, line, values)


def test_a_dated_status_stamped_with_its_clock_keeps_its_clock_alone(fpr) -> None:
    """The guard: a status stamped with its clock but holding a date, longer than a status is read
    whole: a log line's clock alone, as before round 50."""
    values = [f"{c} · 2026-05-05 · /srv/data copied to the NAS, 3 files skipped, 12 warnings" for c in ("10:42", "10:47", "10:53")]
    got = assert_values_found(fpr, "Backup: {}", values)
    assert [r["spans"] for r in got] == [["10:47"], ["10:53"]]


# ------------------------------------------------------------------ round 51
def test_a_summary_as_one_new_model_message_before_the_next_user_message_is_a_compaction(fpr) -> None:
    """The history after the system prompt replaced by one model message holding the summary (the
    Continue CLI's `[COMPACTED HISTORY]` marker line before it), then the user's next message: a
    compaction (round 51)."""
    history = agent_history(4)
    summary = {"role": "assistant", "content": "[COMPACTED HISTORY]\nThe invoices module is half migrated; tests green; "
                                               "next: module 4, then the export job."}
    bodies = [Gen.body(CODER, history[:7], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, [summary, {"role": "user", "content": "Go on with module 4."}], None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


MAN_PAGES = [f'.TH {n.upper()} 1 2026-03-02 "shoptools 1.2" "Shop Tools Manual"\n.SH NAME\n{n} \\- {d}\n.SH SYNOPSIS\n'
             f'.B {n}\n.BI \\-\\-{a} " {a}"\n.SH OPTIONS\n.TP\n.BI \\-\\-{a} " {a}"\n{d}\n'
             for n, d, a in (("ordershow", "One order with its lines.", "number"), ("returnopen", "Open a return.", "number"),
                             ("parceltrack", "Tracking events of a parcel.", "code"), ("stockcount", "Stock of an item.", "sku"))]


def test_tools_as_manual_pages_in_another_order_are_a_tool_order(fpr) -> None:
    """Tools written as their manual pages in troff, each opened by its title line (`.TH ORDERSHOW 1
    …`), moved: a tool order (round 51)."""
    assert reordered_listing_causes(fpr, MAN_PAGES, "Manual pages", [2, 0, 3, 1]) == ["tool_order", None]


def test_sections_of_one_manual_page_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: the sections of one manual page (`.SH DESCRIPTION`, `.SH NOTES`, …) moved."""
    sections = [f".SH {h}\n{t}\n" for h, t in (("DESCRIPTION", "Shows the shop's orders."), ("NOTES", "Prices include VAT."),
                                               ("BUGS", "None known."), ("AUTHOR", "The shop's team."))]
    assert reordered_listing_causes(fpr, sections, "Manual", [2, 0, 3, 1]) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Van: {}", ["14:36 — drop 6/9 Kirkby Lonsdale: 2 parcels left, ~7 min to go — then Sedbergh",
                 "14:44 — round paused, driver on a break", "14:53 — drop 7/9 Sedbergh: 3 parcels left — then Dent"]),
    ("Register: {}", ["present 26/30 · excused 0 · instruments out 33/40", "present 28/33 · excused 1 · instruments out 33/40",
                      "present 29/33 · excused 1 · instruments out 34/40"]),
    ("Kurse: {}", ["Au 999,9 – 98,77 €/g · Ag 999 – 1,402 €/g · Pt 950 – 29,15 €/g",
                   "Au 999,9 – 98,91 €/g · Ag 999 – 1,399 €/g · Pt 950 – 29,15 €/g",
                   "Au 999,9 – 99,02 €/g · Ag 999 – 1,395 €/g · Pt 950 – 29,20 €/g"]),
    ("Last request: {}", [f"{r} trace|YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo0MjEx|bookings-web-{w}|{h}|api|" for r, w, h in (
        ("GET /bookings/availability/next-week 200", 2, "3c1f9a7be2d44e0fa61c2b8d9e7f1a05"),
        ("POST /bookings/holds/confirm-all 201", 1, "9d2e7b1c4a5f4e8b9c0d1e2f3a4b5c6d"),
        ("GET /members/renewals/overdue 200", 3, "e4f5a6b7c8d94e0f8a1b2c3d4e5f6a7b"))]),
])
def test_round_51s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 51 reads, each whole: a status stamped
    with its clock first rewritten as its clock moved on; a tally set apart by dots; a board of
    readings with decimals, two changed; the newest request with its ids drawn at random, up to 72
    characters with each id counted as one."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Last error: {}", ['level=ERROR thread=#main-7 message="feed timed out" retry=3 backoff=250ms',
                        'level=ERROR thread=#main-9 message="feed refused" retry=1 backoff=500ms',
                        'level=ERROR thread=#main-9 message="feed refused" retry=1 backoff=500ms']),
    ("Hours: {}", ["Mon–Fri 9–17 · Sat 10–14 · Sun closed", "Mon–Fri 8–18 · Sat 10–16 · Sun closed",
                   "Mon–Fri 8–18 · Sat 10–16 · Sun closed"]),
])
def test_a_logged_line_under_a_latest_key_or_whole_hours_in_parts_stay_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: a structured log line's fields under a `Last …` key are no entry; a rule's whole
    hours in parts set apart by dots are no board of readings."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 52
CHAIN = ("The following is a conversation between a customer and the assistant of a bicycle workshop. The "
         "assistant answers from the workshop's records and says so when it does not know.\n\nConversation so far:")
EXCHANGES = [("Customer: Is my gravel bike ready for collection?", "Assistant: Not yet, the rear hub is still being rebuilt."),
             ("Customer: How much will the hub rebuild cost?", "Assistant: The quote says £85 for parts and labour."),
             ("Customer: Can you also true the front wheel?", "Assistant: Yes, truing is £15 and takes a day."),
             ("Customer: When do you close on Saturday?", "Assistant: At four in the afternoon."),
             ("Customer: Do you sell tubeless sealant?", "Assistant: We stock two brands, from £9 a bottle."),
             ("Customer: Will it be done by Friday then?", "Assistant: Friday noon, if the spokes arrive on Thursday.")]
DIGEST = ("Summary: the customer's gravel bike is in for a rear hub rebuild quoted at £85 and a front wheel "
          "truing at £15; the workshop closes at four on Saturdays.")


def transcript_body(lines: list[str], question: str) -> dict:
    """A chain that keeps the conversation as a transcript in one user message, a line per turn,
    then the new question and the open reply line."""
    return Gen.body(SYSTEM, [{"role": "user", "content": "\n".join([CHAIN, *lines, question, "Assistant:"])}], None, None)


def said(upto: int) -> list[str]:
    """The transcript's lines of the first `upto` exchanges."""
    return [line for exchange in EXCHANGES[:upto] for line in exchange]


def test_a_transcript_in_one_message_that_grows_in_place_continues(fpr) -> None:
    """Each request's one user message is the previous one with the reply and a new question added:
    the previous prompt is where the new one starts, nothing is lost (round 52)."""
    bodies = [transcript_body(said(k), EXCHANGES[k][0]) for k in range(4)]
    assert causes(fpr, bodies) == [None, None, None]


def test_a_summary_line_in_place_of_a_transcripts_first_lines_is_a_compaction(fpr) -> None:
    """The transcript's first exchanges replaced by a summary line, the newest ones kept, the
    conversation going on: a compaction; then it grows in place again (round 52)."""
    bodies = [transcript_body(said(3), EXCHANGES[3][0]), transcript_body(said(4), EXCHANGES[4][0]),
              transcript_body([DIGEST, *said(5)[4:]], EXCHANGES[5][0]),
              transcript_body([DIGEST, *said(6)[4:]], "Customer: Thanks, see you Friday.")]
    assert causes(fpr, bodies) == [None, "compaction", None]


def test_a_transcript_cut_at_the_front_without_a_summary_is_no_compaction(fpr) -> None:
    """The guard: a window over the transcript's newest lines (no summary in place of the dropped
    ones) is no compaction."""
    bodies = [transcript_body(said(4), EXCHANGES[4][0]), transcript_body(said(5)[4:], EXCHANGES[5][0])]
    assert causes(fpr, bodies)[0] != "compaction"


def test_a_question_put_before_the_same_pasted_lines_is_no_compaction(fpr) -> None:
    """The guard: a new long first line before the same pasted lines, nothing after them (a question
    put before a document) reads as before, not as a summary in place of a first line."""
    doc = [f"Clause {k}: the lessee keeps the premises in good repair and returns them swept." for k in range(12)]
    questions = ["Summarise the repair obligations of this lease for the tenant in plain words please.",
                 "Which clauses of this lease would let the landlord charge for redecoration at the end?"]
    bodies = [Gen.body(SYSTEM, [{"role": "user", "content": "\n".join([q, *doc])}], None, None) for q in questions]
    assert causes(fpr, bodies) == ["question_first"]


@pytest.mark.parametrize(("line", "values"), [
    ("Proofs: {}", [f"https://www.dropbox.com/scl/fi/{a}/JOB-{n}_proofs.zip?rlkey={k}&dl=0" for a, n, k in (
        ("rd64x0cik0lw2ac8y2ape", 4833, "kk4or550hcyfzx8ijz77lrful"), ("1bman743ikhlfintm91e9", 4784, "knj6o2jp7y7mejcaxqezci7jg"),
        ("6ajt3cl9jjjfpunxqmifq", 4887, "dfmo9uuxxsakzqf4odultqx19"))]),
    ("Card reader: {}", ["{5D0C2A41-7E3B-4F19-A8C6-2B9E7F1D3A60} · $212.40 · DECLINED",
                         "{9A7E1C03-2F64-4B8D-B1E5-6C3D8F2A9B17} · $96.00 · APPROVED",
                         "{C2F8B6D4-1A93-4E7C-9D05-7B2E4A6C8F31} · $1,480.00 · APPROVED"]),
    ("Last ticket order: {}", ["box office / spring gala · order K7Q2M · 2× stalls · paid",
                               "box office / spring gala · order X3BNW · 4× circle · paid",
                               "box office / spring gala · order 9TZRC · 1× box · pending"]),
    ("Letzter Bon: {}", [f"{a} € · TSE-Transaktion {t} · Signaturzähler {c} · {s}" for a, t, c, s in (
        ("12,50", 80412, 61207, "MEQCIF7x2kP9+Lm4Qz8rT1vB6nW3yH5cJ0aD2eG7uS4/AiB9kX1mZ3qR6tV8wY0pC2fH4jL7nQ5sU9"),
        ("7,90", 80415, 61212, "MEUCIQD3vK8pX1mZ7qT4wR9yB2nC6hJ0fL5sA8gE3uV/1AiA7kM2xP9zQ4tW6rY0cB3nH8jF5sL1vD"),
        ("31,00", 80419, 61218, "MEQCIB6nW2yH8cJ4aD0eG5uS9kX3mZ7qR1tV/pC4fH6jL8nQ2sU0AiA5xK9mZ1qR3tV7wY2pC6fH0jL4n"))]),
    ("Rooms: {}", ["lab 3/4, studio 5/8, hall 0/20, store 2/2", "lab 3/4, studio 6/8, hall 0/20, store 2/2", "lab 4/4, studio 6/8, hall 0/20, store 2/2"]),
])
def test_round_52s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 52 reads, each whole: a link drawn
    again in more than one part; a payment's id with its amount and result, changed too; the newest
    entry with a five-character order code drawn again; a receipt with its base64 signature (a token
    counted as one character); a tally of named shares of a capacity, one of them changed."""
    assert_values_whole(fpr, line, values)


def test_a_link_that_changed_in_one_path_segment_keeps_that_segment_alone(fpr) -> None:
    """The guard: a link whose one path segment was drawn again, the rest unchanged, is that
    segment (a build scan's id), as before round 52."""
    values = [f"https://scans.example.org/s/{s}/overview" for s in ("k4v8q2mx7zc1t", "w9c3x7kq1mz5b", "r2t6m0xq8kc4v")]
    got = assert_values_found(fpr, "Scan: {}", values)
    assert [r["spans"] for r in got] == [["w9c3x7kq1mz5b"], ["r2t6m0xq8kc4v"]]


# ------------------------------------------------------------------ round 53
@pytest.mark.parametrize(("line", "values"), [
    ("Slipway board: {}", ["14:06 · 4/11 dinghies out · next due in: Kestrel at 14:30",
                           "14:13 · 4/11 dinghies out · next due in: Kestrel at 14:30",
                           "14:21 · 5/11 dinghies out · next due in: Kestrel at 14:30"]),
    ("Survey link: {}", [f"https://forms.example.org/f/8kQz2LmW4pXr/edit?token={t}" for t in (
        "b7Yt2KqLm9xZ4vWp8sRn3cHd6fJg1aQe", "Xq3mV8nK1zLp6wRt4yHs9dBf2cGj7aNe", "Lp9wR2tY6uQm3xKz8vHn1sBd4fCg7jAe")]),
    ("Last MRI series: {}", [f"Aera 1.5T · knee sag PD · Series UID 2.25.{u}" for u in (
        "283650113961774206659112845771909431172", "104475209913376085263177045312984460021",
        "227813460097352619908823374561020774395")]),
    ("Kennels: {}", ["boarding 8 · walked 3 · groomed 2 · collected 8", "boarding 9 · walked 3 · groomed 2 · collected 8",
                     "boarding 9 · walked 4 · groomed 2 · collected 8"]),
])
def test_round_53s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 53 reads, each whole: a board stamped
    with its clock whose status opens with a count; a link whose query token was drawn again; the
    newest entry holding a number of 17 digits or more (a DICOM UID); a tally of named counts, one
    of them changed."""
    assert_values_whole(fpr, line, values)


def test_a_rules_time_edited_to_the_hour_or_half_stays_an_edit(fpr) -> None:
    """The guard (and round 53's look-alike): a rule's return time edited from the half hour to the
    hour is an edit, not a clock; a clock after a "now" cue on the half hour is still one."""
    rule = "Boats must be back at the jetty by {}; late returns are charged £20 a half hour."
    assert [r["cause"] for r in run_value_line(fpr, rule, ["17:30", "18:00", "18:00"])][0] == "template_change"
    assert_values_whole(fpr, "Current time: {}", ["10:00", "10:30", "11:00"])


def test_a_summary_as_a_system_message_where_there_was_none_is_a_compaction(fpr) -> None:
    """A conversation sent without a system prompt gains one holding the summary, before its newest
    turns: a compaction (LangGraph's summary pattern; round 53)."""
    history = agent_history(4)
    summary = {"role": "system", "content": "Summary of the conversation so far: the invoices module is half migrated, "
                                            "the tests are green, and module 4 comes next."}
    bodies = [Gen.body(None, history[:7], None, None), Gen.body(None, history, None, None),
              Gen.body(None, [summary, *history[-2:], {"role": "user", "content": "Go on with module 4."}], None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_new_conversation_under_a_first_system_prompt_stays_a_new_session(fpr) -> None:
    """The guard: where there was no system prompt, a new conversation that opens with one and keeps
    none of the earlier turns is a new conversation, not a compaction."""
    history = agent_history(4)
    system = {"role": "system", "content": "You are a careful migration assistant for the billing service. Answer in "
                                           "short steps and name the files you touch."}
    bodies = [Gen.body(None, history, None, None),
              Gen.body(None, [system, {"role": "user", "content": "How do I start a new migration?"}], None, None)]
    assert causes(fpr, bodies) == ["new_session"]


FISH_COMPLETIONS = [f"# {n}\ncomplete -c shopctl -n __fish_use_subcommand -a {n} -d '{d}'\n"
                    f"complete -c shopctl -n '__fish_seen_subcommand_from {n}' -l {a} -x -d 'required'"
                    for n, d, a in (("ordershow", "One order with its lines", "number"), ("returnopen", "Open a return", "number"),
                                    ("parceltrack", "Tracking events of a parcel", "code"), ("stockcount", "Stock of an item", "sku"))]


def test_tools_as_shell_completions_in_another_order_are_a_tool_order(fpr) -> None:
    """A CLI's subcommands written as its fish completion file, a block per subcommand, moved: a
    tool order (round 53)."""
    assert reordered_listing_causes(fpr, FISH_COMPLETIONS, "Completions of the shop CLI", [2, 0, 3, 1]) == ["tool_order", None]


# ------------------------------------------------------------------ round 54
def test_the_history_replaced_by_one_user_message_holding_a_tagged_summary_is_a_compaction(fpr) -> None:
    """Every message after the system prompt replaced by one user message that is a `<summary>`
    element, the next turn left to the model (the Anthropic SDKs' tool runner): a compaction; the
    session then goes on from it (round 54)."""
    history = agent_history(4)
    summary = {"role": "user", "content": "<summary>\n## Task\nMigrate the invoices module to the new ledger API.\n"
                                          "## State\nModules 1 to 3 are migrated and their tests are green; module 4 "
                                          "still calls the old client in two places.\n## Next\nPort module 4, then the "
                                          "export job, then remove the old client.\n</summary>"}
    reply = {"role": "assistant", "content": "Porting module 4: the two calls to the old client are in billing/sync.py."}
    bodies = [Gen.body(CODER, history[:7], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, [summary], None, None),
              Gen.body(CODER, [summary, reply, {"role": "user", "content": "Go on."}], None, None)]
    assert causes(fpr, bodies) == [None, "compaction", None]


def test_a_new_conversation_that_opens_with_a_pasted_document_stays_a_new_session(fpr) -> None:
    """The guard: a new conversation whose one message is a document in markup and a question after
    it is no summary standing alone."""
    history = agent_history(4)
    doc = ("<document>\n" + "\n".join(f"Clause {k}: the lessee keeps the premises in good repair." for k in range(8))
           + "\n</document>\nWhich clauses bind the lessee?")
    bodies = [Gen.body(CODER, history, None, None), Gen.body(CODER, [{"role": "user", "content": doc}], None, None)]
    assert causes(fpr, bodies) == ["new_session"]


@pytest.mark.parametrize(("line", "values"), [
    ("Bürotafel: {}", ["07.13 Uhr · Büro zu · unterwegs: Säntis-Tour (Urs), zurück ca. 16.40",
                       "07.21 Uhr · Büro zu · unterwegs: Säntis-Tour (Urs), zurück ca. 16.40",
                       "07.34 Uhr · Büro offen · unterwegs: Säntis-Tour (Urs), zurück ca. 16.40"]),
    ("Last inspection logged: {}", ["inspection number 5521 0934 7712 · class B · PASS, 2 advisories on the rear brakes",
                                    "inspection number 5521 1187 2045 · class B · FAIL (headlamp aim, repaired within the hour)",
                                    "inspection number 5521 1190 6631 · class C · PASS"]),
    ("Letzte Rechnung: {}", ["QR-Rechnung CHF 480.00 · Referenz 00 00000 31852 20260 00000 41175 · bezahlt",
                             "QR-Rechnung CHF 1'120.00 · Referenz 00 00000 72044 20260 00000 41209 · offen",
                             "QR-Rechnung CHF 95.00 · Referenz 00 00000 18876 20260 00000 41230 · bezahlt"]),
    ("Letzter Upload: {}", ["Praxis am Markt · https://we.tl/t-Qm7xKd2pLs · 3 Dateien, 48,2 MB",
                            "Dr. Lange & Partner · https://we.tl/t-Zr4wNb8tYh · 1 Datei, 12,9 MB",
                            "Kieferorthopädie Süd · https://we.tl/t-Hc9vLq3mXe · 2 Dateien, 30,4 MB"]),
])
def test_round_54s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 54 reads, each whole: a board stamped
    with a clock written with a dot and `Uhr`; the newest entry written as a record, its parts set
    apart by dots, up to 96 characters; a reference of grouped digits in such a record; a link whose
    path holds a part drawn at random, counted as one token."""
    assert_values_whole(fpr, line, values)


def test_a_rules_first_time_edited_beside_readings_stays_an_edit(fpr) -> None:
    """The guard (and round 54's look-alike): a rule's first booking time edited from the hour to
    the half hour, in a line that holds readings (a duration, a price), is an edit, not a reading."""
    rule = "Note: inspections are booked from {}; the test takes about 45 minutes and the fee is £54.85."
    assert [r["cause"] for r in run_value_line(fpr, rule, ["08:00", "08:30", "08:30"])][0] == "template_change"


def test_a_status_that_ends_the_system_message_ends_before_the_templates_text(fpr) -> None:
    """A status read whole on the last line of the system message ends where the message ends, not
    with the template's closing text after it (round 54)."""
    values = ["11:29 | Elm Road 10/18 done | tank 398 L | next: Oak Drive", "11:43 | Elm Road 12/18 done | tank 374 L | next: "
              "Oak Drive", "11:48 | Elm Road 13/18 done | tank 362 L | next: Oak Drive"]
    got = run(fpr, [body(f"{SYSTEM}Van: {v}", t) for v, t in zip(values, conversation(3), strict=True)])
    assert [r["spans"] for r in got] == [[values[1]], [values[2]]], got


# ------------------------------------------------------------------ round 55
def collection(names: list[str]) -> list[str]:
    """A JSON collection's items, one per tool, each named as code by its `name` member."""
    return ["\t\t{\n" + f'\t\t\t"name": "{n}",\n\t\t\t"request": {{\n\t\t\t\t"method": "POST",\n'
            f'\t\t\t\t"url": "{{{{base}}}}/tools/{n}"\n\t\t\t}}\n\t\t}},' for n in names]


def test_json_items_named_as_code_in_another_order_are_a_tool_order(fpr) -> None:
    """A collection's requests (JSON items, each named as code by its `name` member) moved: a tool
    order (a Postman collection; round 55)."""
    items = collection(["order_show", "return_open", "parcel_track", "stock_count"])
    assert reordered_listing_causes(fpr, items, 'Tools (collection JSON):\n{\n\t"item": [', [2, 0, 3, 1]) == ["tool_order", None]


def test_json_items_named_in_words_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: JSON items named in words (offices, not tools) moved are an edited template."""
    items = ["\t\t{\n" + f'\t\t\t"name": "{n}",\n\t\t\t"city": "{c}"\n\t\t}},' for n, c in (
        ("Main office", "Leeds"), ("North depot", "York"), ("South depot", "Derby"), ("Harbour store", "Hull"))]
    assert reordered_listing_causes(fpr, items, 'Sites:\n{\n\t"item": [', [2, 0, 3, 1]) == ["template_change", None]


PLACEHOLDER = "What you remember of earlier turns:\nNothing yet."
RUNNING_SUMMARY = ("What you remember of earlier turns:\nThe task was to migrate the invoices module to the ledger API; "
                   "modules 1 and 2 are done and their tests pass, the export job still uses the old client, and the "
                   "user asked to keep the CSV columns in the same order as before.")


def noted(note: str, history: list[dict[str, str]]) -> dict:
    """A conversation with a system note after the system prompt (a running summary's place)."""
    return Gen.body(None, [{"role": "system", "content": CODER}, {"role": "system", "content": note}, *history], None, None)


def test_a_running_summary_note_rewritten_as_early_turns_go_is_a_compaction(fpr) -> None:
    """A system note after the system prompt that holds a running summary, rewritten 200 characters
    longer or more as the history's first turns are dropped: a compaction (AutoGPT's; round 55)."""
    history = agent_history(5)
    bodies = [noted(PLACEHOLDER, history[:9]), noted(PLACEHOLDER, history), noted(RUNNING_SUMMARY, history[4:])]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_note_that_first_appears_where_turns_were_dropped_stays_a_front_trim(fpr) -> None:
    """The guard: a note put after the system prompt where the first turns were, with no note there
    before, is a front trim (as round 20's labels have it)."""
    history = agent_history(5)
    note = ("Earlier in this conversation the user asked to migrate the invoices module to the ledger API and "
            "to keep the CSV columns in the same order; modules 1 and 2 were done then.")
    bodies = [Gen.body(CODER, history, None, None), noted(note, history[4:])]
    assert causes(fpr, bodies) == ["front_trim"]


@pytest.mark.parametrize(("line", "values"), [
    ("Changeover board: {}", [f"Sat {c} · Heron Cottage: {a} · Beck House: {b} · Loft: guests staying on · "
                              f"Boathouse: ready for 16:00 arrival · keys: 2 in the safe, 1 out with cleaners · linen van due 14:30"
                              for c, a, b in (("11:23", "team A cleaning, ready ~12:00", "team B cleaning, ready ~13:30"),
                                              ("11:41", "team A cleaning, ready ~12:00", "team B cleaning, ready ~13:15"),
                                              ("11:52", "team A cleaning, ready ~12:00", "team B cleaning, ready ~13:15"))]),
    ("Last channel booking: {}", ["Airbnb HMKWG60X1B · Heron Cottage · 22 Mar–27 Mar, 5 nights, 5 guests",
                                  "Airbnb HM54D1VV31 · Beck House · 14 Sep–20 Sep, 6 nights, 2 guests, 1 dog",
                                  "Airbnb HMX7Q2ZT9C · Loft · 2 Apr–4 Apr, 2 nights, 2 guests"]),
    ("Letzter Beleg: {}", [f"Beleg {n} · {a} € · _R1-AT1_KASSE-02_{n}_2026-03-02T{t}_{a}_0,00_0,00_0,00_0,00_{s}"
                           for n, a, t, s in (("5120", "12,50", "09:14:02", "Jq8x2LmZp4K=_7c1e9a0b3d_Zk3Hq9Wm2tY="),
                                              ("5123", "48,00", "09:31:47", "Pw4nV7cRt2X=_7c1e9a0b3d_Lm8Kd2Qs6vB="),
                                              ("5127", "7,90", "09:52:30", "Hx6sN1bYq8D=_7c1e9a0b3d_Tg5Wr3Pz9cM="))]),
])
def test_round_55s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 55 reads, each whole: a board stamped
    with a weekday and clock up to 240 characters; a newest entry written as a record with a drawn
    reference, up to 96 characters; a receipt with its machine-readable code counted as one token."""
    assert_values_whole(fpr, line, values)


# ------------------------------------------------------------------ round 56
ROLLING = ("Summary of the conversation so far: the user is migrating the invoices module to the ledger API; "
           "modules 1 and 2 are done and tested, and the export job still calls the old client in two places; "
           "the CSV columns must keep their order.")


def test_a_summary_opening_a_shorter_history_in_place_of_its_first_turns_is_a_compaction(fpr) -> None:
    """A user message holding the summary opens the history where its first turns were, the rest
    kept, the history shorter than before: a compaction, whatever share stays (round 56)."""
    history = agent_history(4)
    bodies = [Gen.body(CODER, history[:7], None, None), Gen.body(CODER, history, None, None),
              Gen.body(CODER, [{"role": "user", "content": ROLLING}, *history[3:]], None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_rolling_summary_rewritten_over_a_window_of_the_same_length_stays_a_front_trim(fpr) -> None:
    """The guard (issue 29: a session that trims its front on every turn is a front trim): the
    summary rewritten as the next exchange leaves a window that keeps its length is paid on every
    turn, a front trim."""
    history = agent_history(5)
    again = {"role": "user", "content": ROLLING + " Module 3 was started and its fixtures were regenerated."}
    bodies = [Gen.body(CODER, [{"role": "user", "content": ROLLING}, *history[3:]], None, None),
              Gen.body(CODER, [again, *history[5:], *agent_history(6)[11:13]], None, None)]
    assert causes(fpr, bodies) == ["front_trim"]


def test_first_turns_dropped_bare_stay_a_front_trim(fpr) -> None:
    """The guard: the first exchange dropped with nothing in its place is a front trim."""
    history = agent_history(4)
    bodies = [Gen.body(CODER, history, None, None), Gen.body(CODER, history[2:], None, None)]
    assert causes(fpr, bodies) == ["front_trim"]


def test_a_newest_entry_written_as_a_record_replaced_is_a_value_whole(fpr) -> None:
    """Under a key naming the newest entry, a record of parts set apart by dots, two parts or more
    changed, is the value whole though it holds no entry's number (round 56)."""
    assert_values_whole(fpr, "Last checkout: {}", ["60 out: T18 D3 · Ann Hale (The Anchor), board 2",
                                                    "68 out: 18 14 D18 · Tom Reed (Bridge Inn), board 1",
                                                    "82 out: T18 D14 · Ann Hale (The Anchor), board 1"])


def test_a_newest_entrys_record_with_one_part_edited_stays_an_edit(fpr) -> None:
    """The guard: one part of such a record edited (no entry's number, one part) is an edit."""
    got = run_value_line(fpr, "Last note: {}", ["kitchen closed · back at six", "kitchen closed · back at seven",
                                                "kitchen closed · back at seven"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 57
BOT_HELP = ["shopbot order <number> - Shows an order with its lines",
            "shopbot return open <number> [reason] - Opens a return for an order",
            "shopbot parcel <code> - Shows a parcel's tracking events",
            "shopbot help <query> - Displays all help commands that match <query>."]


def test_a_chat_bots_help_lines_in_another_order_are_a_tool_order(fpr) -> None:
    """A chat bot's commands as its help prints them (Hubot's `bot cmd <arg> - what it does`),
    moved: a tool order (round 57)."""
    assert reordered_listing_causes(fpr, BOT_HELP, "Commands of the shop's chat bot", [2, 0, 3, 1]) == ["tool_order", None]


def test_a_glossarys_lines_in_another_order_stay_a_template_change(fpr) -> None:
    """The guard: a glossary's `topic - what it means` lines name no command with arguments."""
    glossary = ["store credit - Given for returns after 30 days", "gift cards - Never paid out in cash",
                "price match - Only against our own web shop", "repair jobs - Sent to the maker, two weeks"]
    assert reordered_listing_causes(fpr, glossary, "Words the shop uses", [2, 0, 3, 1]) == ["template_change", None]


@pytest.mark.parametrize(("line", "values"), [
    ("Scoreboard: {}", [f"Lane 2, Tuesday league, game 1 (10 throws each): {s} · {t} to throw"
                        for s, t in (("Ann 28 · Bob 26 · Cat 26 · Dan 23", "Bob"), ("Ann 35 · Bob 33 · Cat 32 · Dan 26", "Bob"),
                                     ("Ann 38 · Bob 36 · Cat 36 · Dan 30", "Cat"))]),
    ("Match: {}", ["after end 4: Harriers 3 – 5 Rovers", "after end 6: Harriers 6 – 5 Rovers",
                   "after end 7: Harriers 8 – 5 Rovers"]),
    ("Last transfer in: {}", [f"€{a} from {n} (IBAN {i}) · remittance {r} · end-to-end id {e}"
                              for a, n, i, r, e in (("1,204.10", "Hill Farm Ltd", "IE29 AIBK 9311 5212 3456 78", "INV-2750", "E2E-71828"),
                                                    ("6,337.70", "Brook Estates", "IE64 BOFI 9000 1712 9876 54", "INV-2989", "E2E-31415"),
                                                    ("4,841.24", "Marsh End LLP", "IE12 IPBS 9906 2510 1122 33", "INV-2568", "E2E-27182"))]),
    ("Last throw: {}", ["lane 1, throw 30 (full rack): 3 pins, standing: 1, 2, 3, 4, 6, 9",
                        "lane 1, throw 26 (full rack): 6 pins, standing: 1, 6, 9",
                        "lane 2, throw 27 (full rack): 9 pins, standing: 5"]),
])
def test_round_57s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 57 reads, each whole: a tally after
    what it is of, with whose turn it is after it; a match's score after its end; a newest entry
    written as a record of up to 128 characters; a newest entry in the same words, two numbers
    or more of it changed."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Opening hours: {}", ["Mon–Fri 9 – 17 Uhr", "Mon–Fri 8 – 18 Uhr", "Mon–Fri 8 – 18 Uhr"]),
    ("Match: {}", ["Harriers 6 – 5 Rovers", "Harriers 4 – 3 Rovers", "Harriers 4 – 3 Rovers"]),
    ("Last orders: {}", ["21:30, kitchen 21:00", "22:00, kitchen 21:30", "22:00, kitchen 21:30"]),
])
def test_round_57s_look_alikes_stay_edits(fpr, line: str, values: list[str]) -> None:
    """The guards: a rule's hours name no sides of a score; a score whose counts fell was corrected;
    a newest-entry key's clocks are a rule's."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 58
VANS = [f"Sat {t} · Van 1 (North loop): {a} of 8 delivered, driver Sam, next stop Hillside Care Home, Ashby de la "
        f"Zouch · Van 2 (Canal loop): {b} of 9 delivered, driver Ola, next stop Wharf Hotel, Lock Lane, Market Harborough "
        f"· Van 3 (Valley loop): {c} of 7 delivered, driver Kim, next stop Dr Patel's surgery, Mill Road, Melton"
        for t, a, b, c in (("07:23", 0, 1, 0), ("07:35", 1, 1, 1), ("07:39", 1, 1, 1))]


SESSIONS = ["registered 18 · seen 11 · deferred 0 (late 0, unwell 0) · walk-ins 1",
            "registered 22 · seen 13 · deferred 0 (late 0, unwell 0) · walk-ins 1",
            "registered 23 · seen 14 · deferred 1 (late 1, unwell 0) · walk-ins 1"]


@pytest.mark.parametrize(("line", "values"), [
    ("Session: {}", SESSIONS),
    ("Yard: {}", ["horses turned out", "farrier's van in", "vet's round on"]),
    ("Press line: {}", ["Batch 2.114 · 380 kg cotton 60 °C · press 1 · dryer 2: 410 pieces/h",
                        "Batch 2.116 · 402 kg poly 40 °C · press 1 · dryer 2: 455 pieces/h",
                        "Batch 2.117 · 366 kg cotton 60 °C · press 2 · dryer 2: 398 pieces/h"]),
    ("Rounds: {}", VANS),
    ("Sightings: {}", ["2 seals, 0 otters, 1 heron, 4 kingfishers today", "2 seals, 1 otters, 1 heron, 4 kingfishers today",
                       "3 seals, 1 otters, 1 heron, 5 kingfishers today"]),
])
def test_round_58s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 58 reads, each whole: a tally with a
    note in brackets; a state whose words hold an apostrophe; a record whose first part names a
    running item risen a little, a reading changed with it; a board stamped with its clock, up to 320
    characters, whole when only its clock moved on; a tally of counts each before its name, one
    changed."""
    assert_values_whole(fpr, line, values)


def test_a_tally_of_limits_with_counts_before_names_stays_an_edit(fpr) -> None:
    """The guard: counts before their names under a key that names limits are a rule's (round 58)."""
    got = run_value_line(fpr, "Limits: {}", ["2 small dogs, 4 big dogs, 1 cat per room", "2 small dogs, 5 big dogs, 1 cat per room",
                                             "2 small dogs, 5 big dogs, 1 cat per room"])
    assert [r["cause"] for r in got][0] == "template_change", got


def test_a_versions_record_bumped_beside_an_edited_reading_stays_an_edit(fpr) -> None:
    """The guard: a rule's version bumped beside an edited number is no running item (round 58)."""
    got = run_value_line(fpr, "Crate rules: {}", ["v6 · 40 kg per crate · two lifters · gloves on",
                                                   "v7 · 35 kg per crate · two lifters · gloves on",
                                                   "v7 · 35 kg per crate · two lifters · gloves on"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 59
@pytest.mark.parametrize(("line", "values"), [
    ("Ticket scanned: {}", ["Ticket MUS-7QK2ZD · gallery and garden · 1 adult · scanned at the east gate",
                            "Ticket MUS-R4XW9B · garden only · 2 adults · scanned at the east gate",
                            "Ticket MUS-K8P3TV · gallery and garden · family · scanned at the river gate"]),
    ("Groups desk: {}", ["Booking GB-26-0412 · 24 pupils · pond dipping Tue 10:00",
                         "Booking GB-26-0413 · 31 pupils · bird walk Wed 09:30",
                         "Booking GB-26-0415 · 12 ramblers · history talk Thu 14:00"]),
    ("Display: {}", ["Call B112 to desk 2 · waiting 4 · wait about 10 min", "Call B113 to desk 1 · waiting 4 · wait about 10 min",
                     "Call B114 to desk 3 · waiting 3 · wait about 8 min"]),
    ("Zuletzt ausgestellt: {}", ["Geburtsurkunde zu G 311/2004 · 2 Ausfertigungen · 24,00 € · per Post",
                                 "Sterbeurkunde zu S 58/1987 · 1 Ausfertigung · 12,00 € · an das Nachlassgericht",
                                 "Eheurkunde zu E 902/2011 · 3 Ausfertigungen · 30,00 € · per Post"]),
    ("Shop: {}", ["visitors today 204 · till £312.40 · in the cafe 12 of 40", "visitors today 219 · till £355.90 · in the cafe 9 of 40",
                  "visitors today 230 · till £371.10 · in the cafe 14 of 40"]),
    ("Live score: {}", [f"Court 2 · Ann 1, Bea 0 · game 3 of 9 next · {m} min played" for m in (4, 9, 13)]),
    ("Lawns: {}", ["frost, lawns closed until 11:00", "coaching on lawn 2 this morning", "lawns open"]),
])
def test_round_59s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 59 reads, each whole: a record whose
    first part names the entry by a code drawn again, an id or a waiting ticket that rose a little,
    whatever its key; a newest entry under `Zuletzt …`; a status whose price changed with a count
    beside it; a status whose minutes played ran; states of six words and with a detail's clock."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize(("line", "values"), [
    ("Form: {}", ["Form 12 · signed by a parent · handed in at the desk", "Form 14 · signed by a guardian · handed in at the desk",
                  "Form 14 · signed by a guardian · handed in at the desk"]),
    ("Family ticket: {}", ["2 adults, 2 children for £30.00", "2 adults, 3 children for £35.00",
                           "2 adults, 3 children for £35.00"]),
])
def test_round_59s_look_alikes_stay_edits(fpr, line: str, values: list[str]) -> None:
    """The guards: a rule's record whose number is no series and names no drawn code; a price edited
    beside a small round count, a rule's."""
    got = run_value_line(fpr, line, values)
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 60
def test_old_tool_results_elided_with_their_line_counts_are_a_compaction(fpr) -> None:
    """Old tool results each replaced by a placeholder that counts what it left out (SWE-agent's
    `Old environment output: (7 lines omitted)`): one placeholder but for its numbers, a compaction
    (round 60)."""
    elided = [f"Old environment output: ({n} lines omitted)" for n in (12, 9)]
    assert causes(fpr, first_results_replaced(elided)) == [None, "compaction"]


def test_old_tool_results_rewritten_as_other_notes_are_no_compaction(fpr) -> None:
    """The guard: results rewritten as notes that differ in their words are no placeholder."""
    noted = ["Module 0 calls the legacy API once.", "Module 1 has no legacy call."]
    assert causes(fpr, first_results_replaced(noted))[-1] != "compaction"


@pytest.mark.parametrize(("line", "values"), [
    ("Parcel scanned: {}", ["PX 20418 · 2.4 kg · to Leeds · bay 3", "PX 77103 · 0.8 kg · to York · bay 1",
                            "PX 51966 · 5.1 kg · to Hull · bay 4"]),
    ("Just checked in: {}", ["RB-26-09434 · J. Moss · room 4, bed 2 · 2 nights", "RB-26-06687 · K. Ortiz · room 1, bed 1 · 3 nights",
                             "RB-26-03120 · L. Hart · room 2, bed 3 · 1 night"]),
    ("Deed roll: {}", ["No. 2886/2026 · transfer of land · 5 parties", "No. 2887/2026 · power of attorney · 1 party",
                       "No. 2889/2026 · will · 2 parties"]),
    ("Wristbands: {}", ["FW-K3TQ9A · evening unlimited · Ghost Train", "FW-R8MZ2C · afternoon unlimited · Waltzer · rides with an adult",
                        "FW-P4XN7D · junior unlimited · Teacups"]),
])
def test_round_60s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 60 reads, each whole: a newest entry
    under a key that names the event that brought it; a record named by a running number with its
    year; a record named by a drawn code that gained a part."""
    assert_values_whole(fpr, line, values)


def test_a_rules_hours_under_an_event_key_stay_an_edit(fpr) -> None:
    """The guard: a key that names an event holds a rule's hours, no entry (round 60)."""
    got = run_value_line(fpr, "Breakfast served: {}", ["07:00 to 10:00 in the orangery", "07:30 to 10:30 in the orangery",
                                                        "07:30 to 10:30 in the orangery"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 61
@pytest.mark.parametrize(("line", "values"), [
    ("Door scan: {}", ["GT-QX4R-2MZK · Quiz Night · 4 seats, table 3 · step-free", "GT-H7WN-PC3D · Open Mic · 2 seats, table 11",
                       "GT-B2KJ-9TRV · Quiz Night · 6 seats, table 1"]),
    ("Till: {}", ["tab 5120 · table 4 · 2 teas, scones", "tab 5124 · table 9 · flat white", "tab 5131 · table 1 · soup, bread"]),
    ("Field scales: {}", ["Scale 1: 0,96 kg currants, self-picked · 6,21 € · card",
                          "Scale 2: 0,88 kg currants, self-picked · 5,74 € · cash",
                          "Scale 3: 4,07 kg strawberries, self-picked · 24,02 € · card"]),
    ("Last sale: {}", ["Gate till: 2 adults · £18.00 · card · audio guide", "Gate till: annual pass shown · £0.00",
                       "Gate till: 1 child · £4.50 · cash"]),
    ("Last ticket issued: {}", ["WVR 0001175 · Return to Polmear, 2 adults · Trevarrick",
                                "WVR 0001180 · Return to Polmear, 2 adults · Trevarrick",
                                "WVR 0001184 · Return to Polmear, 2 adults · Trevarrick"]),
    ("Line: {}", ["Wed 11:04 · 10:55 from Ashby left Mill Lane, due Kingsway 11:09 · next from Ashby 11:30",
                  "Wed 11:18 · 10:55 from Ashby left Kingsway, due Town 11:19 · next from Ashby 11:30",
                  "Wed 11:21 · 10:55 from Ashby left Kingsway, due Town 11:19 · next from Ashby 11:30"]),
])
def test_round_61s_values_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """On their first change, per-request values in forms round 61 reads, each whole: a record named
    by a code whose drawn parts are short; a numbered tab; a scale's weighing with its reading in the
    first part; a newest entry's record that lost parts; an id alone changed in a newest entry's
    record; a board stamped with its clock whose first part opens with a train's time."""
    assert_values_whole(fpr, line, values)


def test_a_quarter_hours_range_that_runs_on_stays_a_value(fpr) -> None:
    """The guard: quarter hours that bound a range (a load profile's quarter) are no rule's hours."""
    assert_values_whole(fpr, "Last quarter: {}", ["10.02.2026 02:00–02:15 Uhr", "10.02.2026 02:30–02:45 Uhr",
                                                  "10.02.2026 03:00–03:15 Uhr"])


def test_a_rules_hour_edited_to_a_quarter_stays_an_edit(fpr) -> None:
    """A rule's `Doors open at 19:00.` edited to `18:45.`: both on the quarter hours, an edit (round 61)."""
    got = run_value_line(fpr, "Note: Doors open at {}.", ["19:00", "18:45", "18:45"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 62
RECAP = "\n\nThis is a summary of the chat history as a recap: "
FIRST_RECAP = (RECAP + "The user is migrating the invoices module to the ledger API; modules 1 and 2 are done and "
               "tested, the export job still calls the old client in two places, and the CSV columns must keep their order.")
SECOND_RECAP = (RECAP + "Modules 1 to 3 now use the ledger API and their tests pass; the export job was ported and its "
                "old client calls removed. Still open: the nightly report and whether the CSV header may change.")


SHORT_TURNS = [{"role": "user", "content": "Can you port module 3 next?"},
               {"role": "assistant", "content": "Module 3 is ported; its tests pass."},
               {"role": "user", "content": "And the export job?"}]


def test_a_second_recap_appended_to_the_system_message_is_a_compaction(fpr) -> None:
    """A second recap appended after the first in the system message (aichat's session compression),
    the short history before it replaced by the next question: a compaction (round 62)."""
    turns = SHORT_TURNS
    bodies = [Gen.body(CODER + FIRST_RECAP, turns[:1], None, None), Gen.body(CODER + FIRST_RECAP, turns, None, None),
              Gen.body(CODER + FIRST_RECAP + SECOND_RECAP, [{"role": "user", "content": "What is left for tonight?"}],
                       None, None)]
    assert causes(fpr, bodies) == [None, "compaction"]


def test_a_short_rule_appended_over_a_short_history_is_no_compaction(fpr) -> None:
    """The guard: a rule of one line appended to the system prompt as the short history gives way
    to a new question is no recap."""
    turns = SHORT_TURNS
    bodies = [Gen.body(CODER, turns[:1], None, None), Gen.body(CODER, turns, None, None),
              Gen.body(CODER + "\nAlways name the files you touch.", [{"role": "user", "content": "What is left?"}],
                       None, None)]
    assert causes(fpr, bodies)[-1] != "compaction"


def test_a_record_named_by_a_person_replaced_is_a_value_whole(fpr) -> None:
    """A record whose first part names a person by first name and initial, replaced with its other
    parts (a waiver signed), is the entry whole whatever its key (round 62)."""
    assert_values_whole(fpr, "Waiver: {}", ["Amy R. · adult · court 2 · by text link", "Ben T. · adult · court 4 · by email link",
                                             "Cal D. · under 18, signed by a guardian · court 1 · at the desk"])


def test_a_record_whose_person_stays_with_a_number_edited_stays_an_edit(fpr) -> None:
    """The guard: the same person with a number edited (a contact's extension) is an edit."""
    got = run_value_line(fpr, "Contact: {}", ["Anna K. · reception · ext. 12 · weekdays", "Anna K. · reception · ext. 14 · weekends",
                                               "Anna K. · reception · ext. 14 · weekends"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 63
MEMORY_SUMMARIES = [
    "The user asked for the failing invoice tests to be fixed; the agent found that the ledger client rounds "
    "totals to whole cents before tax and changed it to round after tax. The invoice tests pass now.",
    "The invoice rounding was fixed (the ledger client rounds after tax) and its tests pass. The user then asked "
    "for the export job to use the new client; the agent ported it and removed the two old client calls.",
]


def _memory_run(summary: str | None, question: str, k: int) -> list[dict]:
    """One run of an agent whose memory keeps only a summary (the BeeAI Framework's SummarizeMemory):
    the summary as the model's message, the user's question, then the run's tool call and result."""
    call = {"id": f"call_{k}", "type": "function", "function": {"name": "run_tests", "arguments": '{"path": "tests"}'}}
    memory = [{"role": "assistant", "content": summary}] if summary else []
    return [*memory, {"role": "user", "content": question}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": f"{12 + k} passed, 0 failed"}]


MEMORY_RUNS = [_memory_run(None, "Can you fix the failing invoice tests?", 0),
               _memory_run(MEMORY_SUMMARIES[0], "Now port the export job to the new client.", 1),
               _memory_run(MEMORY_SUMMARIES[1], "Is anything left that calls the old client?", 2)]


def test_a_memory_that_keeps_only_a_summary_is_a_compaction_at_each_runs_first_call(fpr) -> None:
    """The history replaced by a rewritten summary as the model's message before the next question,
    nothing of the earlier messages kept: a compaction at each run's first call, its other calls
    continue it (round 63)."""
    bodies = [Gen.body(CODER, run[:n], None, None) for run in MEMORY_RUNS for n in ((1, 3) if len(run) == 3 else (2, 4))]
    assert causes(fpr, bodies) == [None, "compaction", None, "compaction", None]


def test_a_new_conversation_opened_by_a_short_greeting_is_no_compaction(fpr) -> None:
    """The guard: a chat that opens with the model's short greeting before the user's first
    question is a new conversation, not a summary standing in for the last one."""
    first = [{"role": "user", "content": "Can you fix the failing invoice tests?"}]
    greeted = [{"role": "assistant", "content": "Hi! I'm Codewright. What should we work on today?"},
               {"role": "user", "content": "Is anything left that calls the old client?"}]
    assert causes(fpr, [Gen.body(CODER, first, None, None), Gen.body(CODER, greeted, None, None)]) == ["new_session"]


def test_a_state_whose_detail_opens_with_a_number_is_a_value_whole(fpr) -> None:
    """A state with its detail after a colon that opens with a number (`busy: 25-minute queue …`),
    and a German state of one long compound word, are values whole (round 63)."""
    assert_values_whole(fpr, "Lift status: {}", ["running", "busy: 25-minute queue at the bottom",
                                                  "closed: 40 knots on the ridge"])
    assert_values_whole(fpr, "Hallenbetrieb: {}", ["normal", "Vereinsmeisterschaft, Halle 2 gesperrt",
                                                    "Wasserschaden, nur Halle 1"])


def test_sums_of_money_counted_again_are_a_value_whole(fpr) -> None:
    """A board of sums each after its name, two or more changed (takings counted again), what it is
    of heading it: a value whole (round 63)."""
    assert_values_whole(fpr, "Takings: {}", ["tonight: bar £1,204 · kitchen £860 · raffle £212",
                                             "tonight: bar £1,388 · kitchen £947 · raffle £265",
                                             "tonight: bar £1,502 · kitchen £1,020 · raffle £281"])


def test_a_price_list_with_one_price_edited_stays_an_edit(fpr) -> None:
    """The guard: one price of a price list edited is a rule's edit."""
    got = run_value_line(fpr, "Prices: {}", ["adult £12 · child £8 · family £35", "adult £13 · child £8 · family £35",
                                             "adult £13 · child £8 · family £35"])
    assert [r["cause"] for r in got][0] == "template_change", got


def test_a_persons_piece_replaced_is_a_value_whole(fpr) -> None:
    """A record whose first part is a person's piece (`Priya's mug, …`), another person's in its
    place with its other parts: the newest entry whole (round 63)."""
    assert_values_whole(fpr, "Ready to collect: {}", ["Priya's mug, speckled glaze · rack 3 · fired Tue",
                                                      "Owen's bowl, celadon · rack 7 · fired Wed",
                                                      "Zara's vase, tenmoku · rack 1 · fired Thu"])


def test_a_numbered_items_check_replaced_is_a_value_whole(fpr) -> None:
    """A record naming an item by its number, the number and two more parts changed, each part keeping
    its label (a kayak's check, another boat's): the newest entry whole (round 63)."""
    assert_values_whole(fpr, "Kayak: {}", ["Boat 12 · size L · fleet 3 · crew Aled", "Boat 31 · size M · fleet 3 · crew Nia",
                                           "Boat 7 · size S · fleet 1 · crew Aled"])
    assert_values_whole(fpr, "Helmausgabe: {}", ["Helm 14 · Größe M · Gruppe 3 · ausgegeben von Lea",
                                                 "Helm 52 · Größe S · Gruppe 3 · ausgegeben von Tom",
                                                 "Helm 8 · Größe L · Gruppe 5 · ausgegeben von Lea"])


def test_a_numbered_plan_with_one_part_edited_stays_an_edit(fpr) -> None:
    """The guard: a numbered plan bumped with one other part edited is a rule's edit."""
    got = run_value_line(fpr, "Rota: {}", ["Plan 3 · weekdays · room 2 · by Anna", "Plan 4 · weekends · room 2 · by Anna",
                                           "Plan 4 · weekends · room 2 · by Anna"])
    assert [r["cause"] for r in got][0] == "template_change", got


def test_a_rules_bound_edited_beside_a_reading_stays_an_edit(fpr) -> None:
    """The guard: a rule's age bound after `ab` edited beside a height (`Kinder ab 8 Jahren und 1,30
    m.` -> `ab 9 Jahren und 1,35 m.`) is an edit, not a status's readings (round 63)."""
    got = run_value_line(fpr, "Hinweis: {}", ["Kinder ab 8 Jahren und 1,30 m.", "Kinder ab 9 Jahren und 1,35 m.",
                                              "Kinder ab 9 Jahren und 1,35 m."])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 64
def test_a_board_stamped_with_its_clock_and_zone_is_a_value_whole(fpr) -> None:
    """A board stamped with its clock and the clock's zone (`Sat 14:12 BST · …`, `Sa 14:12 MESZ · …`),
    only the clock moved on: the board whole, not its clock (round 64)."""
    for line, fixed in (("Beach board: {}", " · tide 3.2 m and flooding, high water 15:40 (4.1 m) · lifeguards on flags 2 and 3"),
                        ("Hafen: {}", " · Pegel 3,2 m, steigend, Hochwasser 15:40 (4,1 m) · Fähre 2 und 3 im Dienst")):
        zone = " BST" if line.startswith("Beach") else " MESZ"
        assert_values_whole(fpr, line, [f"Sa 14:{m}{zone}{fixed}" for m in ("05", "12", "20")])


def test_a_match_result_reported_for_another_match_is_a_value_whole(fpr) -> None:
    """A match's result, its sides and its sets' scores, reported for another match: the value whole
    on its first change (round 64)."""
    assert_values_whole(fpr, "Court 3 result: {}", ["Mixed doubles · Round 2: Okafor – Brandt 6:4 3:6 10:7",
                                                    "Mixed doubles · Round 2: Lindqvist – Moreau 7:5 6:2",
                                                    "Men's singles · Final: Brandt – Okafor 6:7 6:4 6:3"])


def test_a_timetables_clocks_edited_stay_an_edit(fpr) -> None:
    """The guard: a timetable's two places and departures edited is no match result (a clock has two
    digits after its colon)."""
    got = run_value_line(fpr, "Shuttle: {}", ["Station – Harbour 7:00 8:00 9:00", "Station – Harbour 7:30 8:30 9:30",
                                              "Station – Harbour 7:30 8:30 9:30"])
    assert [r["cause"] for r in got][0] == "template_change", got


def test_a_games_running_score_in_a_matchs_record_is_the_record_whole(fpr) -> None:
    """A game's running score (`1:0`) changed inside a match's record set apart by signs: the record
    whole, not the score alone (round 64)."""
    assert_values_whole(fpr, "League night: {}", ["Ladies B vs Parkside 2:1 · playing: rubber 4, 0:0 in the set",
                                                  "Ladies B vs Parkside 2:1 · playing: rubber 4, 1:0 in the set",
                                                  "Ladies B vs Parkside 2:1 · playing: rubber 4, 2:0 in the set"])


def test_a_points_table_with_numbered_names_is_a_tally_whole(fpr) -> None:
    """A tally whose names each follow their own number (a car's, `44 Okafor 212 · 7 Brandt 198 · …`)
    after what it is of, one count changed: the tally whole (round 64)."""
    assert_values_whole(fpr, "Standings: {}", [
        "Season points: 44 Okafor 212 · 7 Brandt 198 · 131 Moreau 176 · 9 Lindqvist 150",
        "Season points: 44 Okafor 212 · 7 Brandt 198 · 131 Moreau 176 · 9 Lindqvist 162",
        "Season points: 44 Okafor 230 · 7 Brandt 198 · 131 Moreau 176 · 9 Lindqvist 162"])


def test_a_record_with_every_part_replaced_is_a_value_whole(fpr) -> None:
    """A record of four parts or more, every part another (a signal box's train reports): the newest
    entry whole whatever its key (round 64)."""
    assert_values_whole(fpr, "Signal box: {}", ["Class 66 · freight Tyne Yard – Carlisle · Hexham loop · on time",
                                                "Pacer 142 · stopper Newcastle – Hexham · platform 2 · 3 late",
                                                "Sprinter 158 · express Carlisle – Leeds · through road · 1 early"])


def test_a_record_that_keeps_a_part_stays_an_edit(fpr) -> None:
    """The guard: a rule's record of four parts with three edited and one kept is an edit."""
    got = run_value_line(fpr, "Opening: {}", ["Mon–Fri 9–17 · Sat 10–14 · Sun closed · holidays closed",
                                              "Mon–Fri 8–18 · Sat 9–15 · Sun 10–13 · holidays closed",
                                              "Mon–Fri 8–18 · Sat 9–15 · Sun 10–13 · holidays closed"])
    assert [r["cause"] for r in got][0] == "template_change", got


# ------------------------------------------------------------------ round 65
def _truncated(mark: str) -> list[dict]:
    """agent_history(4) with its first message and first reply cut to their starts, `mark` after what
    each kept, then a reply and the next question."""
    msgs = copy.deepcopy(agent_history(4))
    msgs[0]["content"] = msgs[0]["content"][:60] + mark
    msgs[1]["content"] = msgs[1]["content"][:40] + mark
    return [*msgs, {"role": "assistant", "content": "The invoice client is ported."}, {"role": "user", "content": "Next?"}]


def test_messages_cut_in_place_with_a_truncation_mark_are_a_compaction(fpr) -> None:
    """Messages cut in place to their start, each with the same short mark after what was kept, an
    ellipsis in it (Langroid's ChatAgent: `... [Contents truncated!]`): a compaction (round 65)."""
    bodies = [Gen.body(CODER, agent_history(4), None, None), Gen.body(CODER, _truncated("\n... [Contents truncated!]"), None, None)]
    assert causes(fpr, bodies) == ["compaction"]


def test_messages_edited_with_a_short_note_are_no_compaction(fpr) -> None:
    """The guard: the same messages shortened with a note that is no truncation mark (no ellipsis)
    are edits, not a compaction."""
    bodies = [Gen.body(CODER, agent_history(4), None, None), Gen.body(CODER, _truncated(" (edited by the user)"), None, None)]
    assert causes(fpr, bodies) != ["compaction"]


def test_states_with_two_details_codes_seven_words_or_a_clock_are_values_whole(fpr) -> None:
    """A state with two details (`Nebelwarnung: Fähre fährt langsam, bitte Geduld`), codes among its
    words (`T3`, `A12`), seven words, or a clock inside its detail, replaced: a value whole (round 65)."""
    assert_values_whole(fpr, "Hafenbetrieb: {}", ["Sturmwarnung: Fähre fällt aus", "Nebelwarnung: Fähre fährt langsam, bitte Geduld",
                                                  "normal"])
    assert_values_whole(fpr, "Piste status: {}", ["queue at the lift: ten minutes", "T3 closed, skiers use the A12 track", "open"])
    assert_values_whole(fpr, "Yard: {}", ["full: lorries held at the gate", "vet inspecting the pens in the lairage", "open"])
    assert_values_whole(fpr, "Passstraße: {}", ["Schneefall: Kettenpflicht ab Kehre 12",
                                                "Bergrennen: bis 14:00 Uhr keine Durchfahrt für Autos", "frei"])


def test_a_board_stamped_with_its_days_date_and_clock_is_a_value_whole(fpr) -> None:
    """A board stamped with its day's date and clock (`Sa 19.12. 14:12 Uhr · …`), only the clock moved
    on: the board whole, not its date and clock (round 65)."""
    rest = " · Bühne ab 17:00 Uhr: Kinderchor · Karussell bis 20:00 Uhr"
    assert_values_whole(fpr, "Festplatz: {}", [f"Sa 19.12. 14:{m} Uhr{rest}" for m in ("05", "12", "20")])


# ------------------------------------------------------------------ round 66
TASK_TREE = [f"[09:12:03] {b} {n:<16} {d}" for b, (n, d) in zip(
    ("├──", "├──", "├──", "├──"), (("orders:sync", "Pulls the orders from the shop"), ("returns:open", "Opens the returns queue"),
                                    ("parcels:track", "Fetches the carriers' tracking events"), ("labels:print", "Prints the day's labels")),
    strict=True)]


def _listed(lines: list[str], heading: str) -> list[dict]:
    """Three requests whose system text lists `lines` under `heading`, reordered in the second."""
    return [body(f"{SYSTEM}\n{heading}\n" + "\n".join(lines[k] for k in o) + "\nAnswer briefly.", t)
            for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], conversation(3), strict=True)]


def assert_tool_orders_read(fpr, split: str, family: str) -> None:
    """Every transition a tune-side split's tenants of `family` label `tool_order` is read so."""
    path = Path(__file__).parent / "fixtures" / "diagnosis_v2" / f"{split}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    tenants = [r for r in rows if r["name"].startswith(family)]
    assert tenants
    for row in tenants:
        got = causes(fpr, row["requests"])
        assert [c for c, label in zip(got, row["labels"][1:], strict=True) if label == "tool_order"] \
            == [label for label in row["labels"][1:] if label == "tool_order"], (row["name"], got)


def test_tcl_procs_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as Tcl procedures in a namespace, each parsing its options with tcllib's cmdline
    (`proc desk::pavilion-tickets {argv} {`), one moved: a tool order change (round 66, on
    `heldout65`'s tenants, tune side since round 66)."""
    assert_tool_orders_read(fpr, "heldout65", "text_tools_tcl_cmdline_")


def test_a_task_tree_stamped_by_its_logger_reordered_is_a_tool_order_change(fpr) -> None:
    """A task list drawn as a tree, each line stamped by its logger (`[09:12:03] ├── orders:sync  …`,
    gulp's `--tasks`), reordered: a tool order change (round 66)."""
    assert causes(fpr, _listed(TASK_TREE, "Tasks (gulp --tasks):"))[0] == "tool_order"


def test_log_lines_stamped_by_their_logger_reordered_stay_a_template_change(fpr) -> None:
    """The guard: prose lines stamped by a logger, no tree's branch before them, reordered, are an
    edited template."""
    log = ["[09:12:03] Started the nightly sync of the shop", "[09:12:03] Finished reading the carriers' feeds",
           "[09:12:03] Warned about two parcels without labels", "[09:12:03] Closed the connection to the shop"]
    assert causes(fpr, _listed(log, "Last night's log:"))[0] == "template_change"


def test_a_tally_of_scores_to_one_decimal_is_a_value_whole(fpr) -> None:
    """A tally whose counts are scores to one decimal (an event's penalties, `1 Ann Okafor (KEN) 31.5
    · …`), one changed: the tally whole, not the one score (round 66)."""
    assert_values_whole(fpr, "Standings: {}", [
        "after round 2: 1 Ann Okafor (KEN) 31.5 · 2 Lena Brandt (GER) 32.0 · 3 Tom Reid (GBR) 33.8",
        "after round 2: 1 Ann Okafor (KEN) 31.5 · 2 Lena Brandt (GER) 32.0 · 3 Tom Reid (GBR) 34.1",
        "after round 2: 1 Ann Okafor (KEN) 31.9 · 2 Lena Brandt (GER) 32.0 · 3 Tom Reid (GBR) 34.1"])


def test_a_state_of_eight_words_is_a_value_whole(fpr) -> None:
    """A state of eight words, a road's code among them, replaced: a value whole (round 66)."""
    assert_values_whole(fpr, "Pool status: {}", ["lanes 1 to 4 closed: swimming gala",
                                                 "lifeguard for the gala delayed on the A40", "open"])


# ------------------------------------------------------------------ round 67
def test_racket_functions_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as Racket functions parsing their flags with `command-line` (`(define
    (standplatz-suchen argv)`), one moved: a tool order change (round 67, on `heldout66`'s tenants,
    tune side since round 67)."""
    assert_tool_orders_read(fpr, "heldout66", "text_tools_racket_cmdline_")


def test_a_board_stamped_with_its_clock_naming_its_year_is_a_value_whole(fpr) -> None:
    """A board stamped with its clock whose text names a year (`Weinfest 2027: …`), only the clock
    moved on: the board whole, not its clock; a year alone is no date (round 67)."""
    rest = " · Weinfest 2027: Stände offen · Umzug ab ca. 15:00 Uhr"
    assert_values_whole(fpr, "Festtag: {}", [f"Sa 14:{m} Uhr{rest}" for m in ("05", "12", "20")])


def test_a_log_line_with_its_full_date_is_no_board(fpr) -> None:
    """The guard: a status stamped with its clock that holds a full date (a log line's) and is longer
    than a status is not read whole."""
    rest = " · backup of 2026-05-05 finished on node 2, 48 GB written, next run tomorrow at the same time"
    got = run_value_line(fpr, "Backup: {}", [f"14:{m} · job 7{rest}" for m in ("05", "12", "20")])
    assert got[0]["spans"] != [f"14:12 · job 7{rest}"], got


# ------------------------------------------------------------------ round 68
MAKE_TARGETS = ["... import_entries", "... export_verdicts", "... print_race_cards", "... publish_results"]


def test_a_cmake_makefiles_help_targets_reordered_are_a_tool_order_change(fpr) -> None:
    """The targets a CMake-generated Makefile's `help` lists (`... publish_results`), reordered: a tool
    order change (round 68)."""
    heading = "Targets (`cmake --build build --target help`):\nThe following are some of the valid targets for this Makefile:"
    assert causes(fpr, _listed(MAKE_TARGETS, heading))[0] == "tool_order"


def test_lines_led_by_an_ellipsis_reordered_stay_a_template_change(fpr) -> None:
    """The guard: prose lines led by an ellipsis, reordered, are an edited template."""
    lines = ["... and then the doors close", "... or the bar runs out", "... but never on Sundays", "... unless it rains"]
    assert causes(fpr, _listed(lines, "House rules:"))[0] == "template_change"


def _recap_before_prompt(recap: str) -> list[dict]:
    """A conversation of six exchanges, then the same conversation gone on with `recap` as a system
    message of its own before the system prompt (NextChat's long-term memory)."""
    msgs = agent_history(6)
    more = [*msgs, {"role": "assistant", "content": "Reply 7: the invoice tests pass now."},
            {"role": "user", "content": "Then migrate the credit notes the same way."}]
    return [Gen.body(CODER, msgs[:11], None, None), Gen.body(CODER, msgs, None, None),
            {**Gen.body(CODER, more, None, None), "messages": [{"role": "system", "content": recap},
                                                               {"role": "system", "content": CODER}, *more]}]


def test_a_summary_put_before_the_system_prompt_over_the_whole_chat_is_a_compaction(fpr) -> None:
    """A summary of the chat as a system message of its own before the system prompt, the whole chat
    kept after it (NextChat's long-term memory, `This is a summary of the chat history as a recap:
    …`): a compaction, cold once (round 68)."""
    recap = ("This is a summary of the chat history as a recap: " + TASK[:96] + " Replies so far: "
             + " ".join(f"r{k}w{i}" for k in (1, 2) for i in range(6)))
    assert causes(fpr, _recap_before_prompt(recap)) == [None, "compaction"]


def test_a_long_note_put_before_the_system_prompt_over_the_whole_chat_is_a_template_change(fpr) -> None:
    """The guard: a note as long as a summary that restates nothing of the chat, put before the system
    prompt, is an edited template."""
    note = ("Note for this deployment: never push to the main branch; open a pull request, ask for a review by "
            "the platform team and wait for the nightly build before you merge anything.")
    assert causes(fpr, _recap_before_prompt(note)) == [None, "template_change"]


def test_records_of_another_entry_are_values_whole_on_their_first_change(fpr) -> None:
    """Records read whole the first time they change (round 68): a competitor's attempt with its
    measure, a long record with every part but one another (a race's verdict), and another entry's
    fields filled in (a signing queue)."""
    assert_values_whole(fpr, "Scorers' table: {}", ["Braemar stone: Ann Cole, 1st throw · 34 ft 4 in",
                                                    "Weight over the bar: Ewan McKay, 2nd throw · 15 ft 0 in",
                                                    "Open stone: Ann Cole, 1st throw · 40 ft 11 in"])
    assert_values_whole(fpr, "Verdict: {}", ["Race 70 · Diamond Sculls: Tyne RC beat Derby RC · 2 lengths · 8:24 · Berks station",
                                             "Race 108 · Visitors' Cup: Leander Club beat Bath University · 3 lengths · 6:16 · Berks station",
                                             "Race 55 · Temple Cup: Eton College beat Molesey BC · ½ length · 6:41 · Berks station"])
    assert_values_whole(fpr, "Signing tent: {}", ["Nia Rees (event 630) · queue about 150 · signing until 13:05",
                                                  "Prof. Aled Moss (event 322) · queue about 134 · signing until 12:45",
                                                  "Ben Okoro (event 105) · queue about 31 · signing until 11:10"])


def test_a_long_record_that_keeps_two_parts_is_no_value_on_its_first_change(fpr) -> None:
    """The guard: a rule's long record edited in three of its five parts, its first and fourth kept,
    is an edit on its first change."""
    got = run_value_line(fpr, "Shuttle: {}", ["Bus 7 · every 20 min · from the Market Square · via the station · last at 23:00",
                                              "Bus 7 · every 30 min · from the Town Hall · via the station · last at 22:00",
                                              "Bus 7 · every 20 min · from the Market Square · via the station · last at 23:00"])
    assert got[0]["cause"] == "template_change", got


@pytest.mark.parametrize("stamp", ["Sat 30 May 21:{}", "Mo 16:{}:57"], ids=["date-in-words", "clock-to-the-second"])
def test_a_board_stamped_with_a_date_in_words_or_seconds_is_a_value_whole(fpr, stamp: str) -> None:
    """A board stamped with its date in words (`Sat 30 May 21:59 · …`) or a clock to the second (`Mo
    16:38:57 · …`), only the clock moved on: the board whole, not its clock (round 68)."""
    rest = " · Cube: doors open for event 226, starts 22:00"
    assert_values_whole(fpr, "Stages: {}", [stamp.format(m) + rest for m in ("41", "49", "55")])


# ------------------------------------------------------------------ round 69
LABEL_KINDS = ["py_binary rule //tools:publish_results", "go_binary rule //tools:batch_sheets",
               "sh_binary rule //tools:sync_timing_loops", "py_binary rule //tools:print_passes"]


def test_a_bazel_label_kind_listing_reordered_is_a_tool_order_change(fpr) -> None:
    """Targets as `bazel query … --output=label_kind` lists them (`py_binary rule //tools:publish_results`),
    reordered: a tool order change (round 69)."""
    assert causes(fpr, _listed(LABEL_KINDS, "Tools (bazel run //tools:<name>):"))[0] == "tool_order"


@pytest.mark.parametrize("board", [
    "SA 02:{} » Main Stages Ende » Wackinger Village bis 03:00 Uhr",
    "Thu 21/05 17:{}; afternoon session in; evening entry from 17:30",
    "Wed 12 Aug 22:{}:56 SHOW DOWN at 22:30 / Esplanade clearing",
    "Bahn Echo, 10:{}:09 Uhr: Ankündigungssignal ILCA 7, Klassenflagge gesetzt, Start 11:00 Uhr",
], ids=["guillemet", "semicolon", "seconds-no-sign", "place-and-comma"])
def test_boards_stamped_in_more_ways_are_values_whole(fpr, board: str) -> None:
    """A board stamped with its clock, set apart by `»` or a `;` glued to the clock, dated with a day
    and month and a slash, its clock to the second with no sign after it, or after a place's name and
    a comma: only the clock moved on, the board whole, not its clock (round 69)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("41", "49", "55")])


def test_a_clock_without_seconds_or_a_sign_is_no_board(fpr) -> None:
    """The guard: a clock to the minute followed by words with no sign is a rule's hour, not a board's
    stamp: not read whole."""
    got = run_value_line(fpr, "Doors: {}", [f"Fri 19:{m} doors open for the evening session at the east gate"
                                            for m in ("00", "30", "45")])
    assert got[1]["spans"] != ["Fri 19:45 doors open for the evening session at the east gate"], got


STEWARD_CALLS = ["South Stand K7 → first aid, walking (steward 41)", "South Stand L2 → flash photography (steward 55)",
                 "East Stand S27 → first aid, walking (steward 38)"]


def test_a_header_line_opening_the_system_prompt_is_a_value_whole_on_its_first_change(fpr) -> None:
    """A `key: value` line that opens the system prompt, its value a short record with a number,
    replaced in more than one token: a header the client writes per request, a value whole the first
    time it changes (round 69)."""
    assert_values_whole(fpr, "Steward call: {}", STEWARD_CALLS)


def test_the_same_line_below_the_prompts_opening_is_an_edit_on_its_first_change(fpr) -> None:
    """The guard: the same line among the rules, below the prompt's opening line, is an edit the first
    time it changes."""
    got = run(fpr, [body(f"{SYSTEM}\nSteward call: {v}\nAnswer briefly.", t) for v, t in zip(STEWARD_CALLS, conversation(3), strict=True)])
    assert got[0]["cause"] == "template_change", got


def test_a_header_line_with_a_version_bumped_or_a_date_is_an_edit_on_its_first_change(fpr) -> None:
    """The guard: a header line whose words stayed and whose numbers were bumped (a version, a
    device), or that holds a date, is an edit the first time it changes."""
    got = run_value_line(fpr, "Test device: {}", ["Pixel 8, API 35, build AP4A.250205.002", "Pixel 9, API 46, build AP5A.361316.113",
                                                  "Pixel 8, API 35, build AP4A.250205.002"])
    assert got[0]["cause"] == "template_change", got
    got = run_value_line(fpr, "Fees as of: {}", ["1 Jan 2026, room 4", "2 Feb 2031, room 7", "1 Jan 2026, room 4"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 70
def test_a_pipx_listing_reordered_is_a_tool_order_change(fpr) -> None:
    """Packages as `pipx list` lists them, each with the apps it exposes under it (`   package
    carnival-radio-log 2.3.0, installed using Python 3.12.3`), moved as blocks: a tool order change
    (round 70, on `heldout69`'s tenants, tune side since round 70)."""
    assert_tool_orders_read(fpr, "heldout69", "text_tools_10")


def test_a_board_stamped_after_a_place_of_words_and_a_number_is_a_value_whole(fpr) -> None:
    """A board stamped with its place (words and a number), its date and a comma, then its clock
    (`Zoo Palast 1, 21.02., 09:13 Uhr | läuft: …`), only the clock moved on: the board whole (round 70)."""
    assert_values_whole(fpr, "Kino: {}", [f"Zoo Palast 1, 21.02., 09:{m} Uhr | läuft: „Wolfsmilch“ | Ende ca. 10:51 Uhr"
                                          for m in ("02", "13", "24")])


def test_a_log_entry_whose_running_number_rose_is_a_value_whole_on_its_first_change(fpr) -> None:
    """An entry led by its running number, risen a little, the rest changed in its words (`CAD
    5480/31Aug – Great Western Road` -> `CAD 5482/31Aug – Ladbroke Grove`): the newest entry whole, on
    its first change, whatever its key says (round 70)."""
    assert_values_whole(fpr, "Police log: {}", ["CAD 5480/31Aug – Great Western Road", "CAD 5482/31Aug – Ladbroke Grove",
                                                "CAD 5483/31Aug – Elkstone Road"])


def test_a_numbered_items_report_replaced_is_a_value_whole_on_its_first_change(fpr) -> None:
    """A numbered item and its report after a colon or an `@`, another item with three tokens of its
    report or more changed (`Door 11: returned Loggia box 23, seat 2, £36.00 – …` -> `Door 12: …`): a
    value whole on its first change (round 70)."""
    assert_values_whole(fpr, "Returns desk: {}", ["Door 11: returned Loggia box 23, seat 2, £36.00 – held for the box office",
                                                  "Door 12: returned Loggia box 21, seat 6, £85.00 – held for the box office",
                                                  "Door 12: returned Loggia box 13, seat 4, £57.00 – resold to a wheelchair user"])
    assert_values_whole(fpr, "Radio: {}", ["Steward 410 @ Elkstone Road: crowd dense, holding the junction",
                                           "Steward 396 @ Kensal Road: glass bottles being handed in",
                                           "Steward 356 @ Talbot Road: child found, taking her to the lost children point"])


def test_a_numbered_rooms_rule_edited_in_a_token_or_two_stays_an_edit(fpr) -> None:
    """The guard: a numbered item's rule with its number and one token more edited (`Room 4: projector,
    20 seats` -> `Room 5: projector, 30 seats`) is an edit on its first change."""
    got = run_value_line(fpr, "Rooms: {}", ["Room 4: projector, 20 seats, book at the desk", "Room 5: projector, 30 seats, book at the desk",
                                            "Room 4: projector, 20 seats, book at the desk"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 71
def _summary_after_pinned(summary: str) -> list[dict]:
    """agent_history(4), then the same conversation with its first three messages kept, `summary` as the
    model's message in place of the next four, the newest two kept, and a reply and a question after."""
    msgs = agent_history(4)
    kept = [*msgs[:3], {"role": "assistant", "content": summary}, *msgs[-2:],
            {"role": "assistant", "content": "Reply 5: the credit notes are next."}, {"role": "user", "content": "Go on with them."}]
    return [Gen.body(CODER, msgs, None, None), Gen.body(CODER, kept, None, None)]


def test_a_summary_between_the_first_and_the_newest_messages_is_a_compaction(fpr) -> None:
    """The first three messages kept, one new message of 200 characters or more in place of the turns
    after them, the newest kept and the conversation going on (Hermes Agent's context compressor,
    `[CONTEXT SUMMARY]: …`): a compaction (round 71)."""
    summary = "[CONTEXT SUMMARY]: " + " ".join(f"s{i}" for i in range(60))
    assert causes(fpr, _summary_after_pinned(summary)) == ["compaction"]


def test_the_first_messages_kept_with_nothing_in_place_of_the_rest_is_a_front_trim(fpr) -> None:
    """The guard: the first three and the newest messages kept with nothing new between them (a
    short note of the cut is no summary) is a front trim."""
    assert causes(fpr, _summary_after_pinned("[earlier turns omitted]")) == ["front_trim"]


def test_janet_functions_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as Janet functions on spork's argparse (`(defn lost-property`), one moved: a tool
    order change (round 71, on `heldout70`'s tenants, tune side since round 71)."""
    assert_tool_orders_read(fpr, "heldout70", "text_tools_janet_argparse_")


@pytest.mark.parametrize("board", [
    "Paulaner Festzelt · Sa 03.10. · 08:{} Uhr → Zelt öffnet um 09:00 Uhr",
    "West Holts, Sun 28 Jun 23:{} | stage closed for the night",
    "Thu 18 Jun · 11:{} · gates open · Royal Procession 14:00 · first race 2.30",
], ids=["place-dot-day-date-arrow", "place-comma-day-date", "date-dot"])
def test_boards_stamped_after_a_place_a_day_and_a_date_are_values_whole(fpr, board: str) -> None:
    """A board stamped after its place, its day's name and its date, each set apart by a dot or a
    comma, or its clock set apart by `→`: only the clock moved on, the board whole (round 71)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("41", "49", "55")])


def test_log_entries_stamped_with_a_place_and_a_clock_or_numbered_after_words_are_values_whole(fpr) -> None:
    """A report stamped with its place and clock after an `@` (`Info point Row Mead @ 23:08: …`), and a
    numbered item after words with a note in brackets (`Zugleitung an Nr. 49 (Treuer Husar): …`),
    replaced: values whole on their first change (round 71)."""
    assert_values_whole(fpr, "Welfare log: {}", ["Info point Row Mead @ 23:08: friend missing, description passed to stewards",
                                                 "Info point Spring Ground @ 10:37: phone handed in, black with a cracked screen",
                                                 "Info point Big Ground @ 15:03: sunburn, sent to the medical tent"])
    assert_values_whole(fpr, "Funk: {}", ["Zugleitung an Nr. 49 (Treuer Husar): Sanitäter an Wagen angefordert",
                                          "Zugleitung an Nr. 116 (Colonia Ahoj): Lücke schließen, Abstand zum Vorderwagen 40 m",
                                          "Zugleitung an Nr. 100 (Muuzemändelcher): Wagen steht, Reifenwechsel"])


def test_a_desks_hours_stamped_on_the_half_hour_stay_an_edit(fpr) -> None:
    """The guard: a desk's rule with its hour moved from one half hour to another (`Desk @ 09:00:
    opens` -> `@ 09:30`), its words changed, is an edit on its first change."""
    got = run_value_line(fpr, "Desk: {}", ["Info desk Main Gate @ 09:00: opens for the day", "Info desk Main Gate @ 09:30: opens after the briefing",
                                           "Info desk Main Gate @ 09:00: opens for the day"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 72
WHOLE_DIGEST = ("The customer asked after the gravel bike: the rear hub rebuild is quoted at £85 for parts and labour, "
                "truing the front wheel costs £15 and takes a day, and the workshop closes at four on Saturday.")


def test_a_summary_in_place_of_the_whole_transcript_is_a_compaction(fpr) -> None:
    """A transcript in one user message whose every line gave way to a summary line that restates
    them (not led by a speaker), then a new question and the reply's opening line (Haystack 1.x's
    ConversationSummaryMemory): a compaction (round 72)."""
    bodies = [transcript_body(said(3), EXCHANGES[3][0]), transcript_body([WHOLE_DIGEST], EXCHANGES[4][0])]
    assert causes(fpr, bodies) == ["compaction"]


@pytest.mark.parametrize("lines", [
    [],
    ["Customer: I would like to book a full service for my road bike some time next week."],
], ids=["nothing-before-the-question", "a-question-over-two-lines"])
def test_a_new_question_after_the_transcript_went_is_no_compaction(fpr, lines: list[str]) -> None:
    """The guards: the transcript gone and a new question after nothing, or a new question whose
    first line the speaker leads and a second line goes on, is a new conversation, no compaction:
    no line stands in for the dropped ones."""
    question = "Also, could you fit new brake pads while it is in, and tell me the price first?"
    if not lines:
        question = f"Customer: {question}"
    bodies = [transcript_body(said(3), EXCHANGES[3][0]), transcript_body(lines, question)]
    assert causes(fpr, bodies) != ["compaction"]


@pytest.mark.parametrize("board", [
    "So 5.7. 11:{} Uhr ▹ Spitze: Steintor ▹ Ende noch in Aufstellung",
    "RL 11:{} ▪ Code 60 im Abschnitt Hatzenbach aufgehoben, die Strecke ist wieder frei für alle Klassen",
    "Dispatch 19:{} ⇒ Standard 147 away from Talbot Square, 30 aboard, empty to Rigby Road depot",
    "WSP Koblenz 21:{} – km 590,3: Sportboot „Möwe 2“ Personalien aufgenommen",
], ids=["triangle", "square", "double-arrow", "two-words-dash"])
def test_boards_stamped_with_any_sign_after_their_clock_are_values_whole(fpr, board: str) -> None:
    """A board whose clock a sign of any kind sets apart (a triangle, a square, a double arrow) or
    whose place is two words before its clock: only the clock moved on, the board whole (round 72)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("31", "39", "44")])


def test_a_tally_of_parts_each_with_a_count_is_a_value_whole(fpr) -> None:
    """Parts set apart by dashes, each holding a count in words of its own, one count changed at a
    time: the tally whole, a value (round 72)."""
    values = [f"Führung #411 nach {laps} Runden – im Rennen 122 von 135 – Code-60-Phasen {code}"
              for laps, code in ((29, 19), (30, 19), (30, 20))]
    assert_values_whole(fpr, "Rundenzähler: {}", values)


def test_a_serial_scanned_with_its_record_is_a_value_whole(fpr) -> None:
    """A record holding a serial of one series, drawn again with the rest of the record (a gate's
    wristband scans): the newest entry whole on its first change, whatever its key (round 72)."""
    assert_values_whole(fpr, "Gate scanner: {}", ["Gate 2 Frederick Street · HG26-SP-0025343 ✗ name not matching photo ID",
                                                  "Gate 1 Hanover Street · HG26-SP-0040903 ✓ admitted with a carer",
                                                  "Gate 3 Castle Street · HG26-SP-0030404 ✗ already scanned in – re-entry refused"])


def test_opening_hours_set_apart_by_dashes_stay_an_edit(fpr) -> None:
    """The guard: a rule's hours in parts set apart by dashes, a bound edited, are no tally: a part of
    one number is a bound, not a count in words of its own."""
    got = run_value_line(fpr, "Hours: {}", ["Mon 9 – 17 · Sat 10 – 14 · Sun 11 – 13", "Mon 9 – 17 · Sat 10 – 15 · Sun 11 – 13",
                                            "Mon 9 – 17 · Sat 10 – 15 · Sun 11 – 13"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 73
FIRST_SUMMARY = ("## Conversation Summary\n* Task: migrate the billing module to the new invoice API, keeping the public "
                 "functions and their tests.\n## Key Insights\n* The invoice API replaces the billing module's old calls; "
                 "the public functions stay, and their tests keep passing.\n## Tools Executed\n* none yet")


def _first_replaced(first: str) -> list[dict]:
    """agent_history(4), then the same history with `first` in place of its first message, every later
    message kept, and a reply and a question after."""
    msgs = agent_history(4)
    again = [{"role": "user", "content": first}, *msgs[1:], {"role": "assistant", "content": "Reply 5: the invoices are next."},
             {"role": "user", "content": "Go on with them."}]
    return [Gen.body(CODER, msgs, None, None), Gen.body(CODER, again, None, None)]


def test_a_summary_in_place_of_the_first_message_is_a_compaction(fpr) -> None:
    """The first message replaced by a longer one that opens otherwise, shares none of its lines and
    restates the history (the Strands Agents SDK's SummarizingConversationManager summing up the
    oldest message), every later message kept: a compaction (round 73)."""
    assert causes(fpr, _first_replaced(FIRST_SUMMARY)) == ["compaction"]


@pytest.mark.parametrize("first", [
    "Write a changelog entry for the release of the storefront theme: the new colour palette, the larger product "
    "photos on the category pages, the sticky basket button on phones and the fixed search box on tablets, in the "
    "house style, one line per change, and nothing about the billing side at all.",
    TASK.replace("invoice API", "payments API") + "Start with the refunds.",
], ids=["another-task", "the-task-edited"])
def test_another_or_an_edited_first_message_is_no_compaction(fpr, first: str) -> None:
    """The guards: another task in the first message's place restates nothing, and the task edited
    opens as it did: an earlier turn edited, no compaction."""
    assert causes(fpr, _first_replaced(first)) != ["compaction"]


@pytest.mark.parametrize("board", [
    "Thu 18 Feb ᛫ 14:{} ᛫ longship heats at King's Staith ᛫ next: encampment open 15:30",
    "Sat 14 Nov – 14:{} GMT – return procession – State Coach: Queen Victoria Street, Mansion House next",
], ids=["runic-punctuation", "date-dash-clock"])
def test_boards_stamped_with_other_signs_are_values_whole(fpr, board: str) -> None:
    """A board whose clock runic punctuation sets apart, or whose date a dash sets apart from its
    clock: only the clock moved on, the board whole (round 73)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


@pytest.mark.parametrize(("line", "values"), [
    ("Steward radio: {}", ["Ch 2 · 10:48 · Museum Gardens: crowd building, barrier line moved back two metres",
                           "Ch 6 · 13:18 · King's Staith: pushchair blocking the exit, cleared",
                           "Ch 3 · 16:38 · Parliament Street: knife surrendered at bag search, police informed"]),
    ("Tower: {}", ["0948Z EGVA TWR ↔ GRIPN1: display complete, cleared to land runway 27",
                   "0937Z EGVA TWR ↔ LTNG21: running in from the west at 1,000 ft",
                   "1705Z EGVA TWR ↔ TYPHN1: hold at 3,000 ft, display line not clear"]),
    ("Turnierrichter: {}", ["3. Gang (15:51) – Ritter Arnulf gegen Ritter Leopold: Fehlritt, Gang wird wiederholt",
                            "11. Gang (16:21) – Ritter Hartmut gegen Ritter Leopold: Ritter Leopold aus dem Sattel gehoben",
                            "12. Gang (16:37) – Ritter Arnulf gegen Ritter Hartmut: beide Lanzen gebrochen, Gleichstand"]),
], ids=["channel-dot-clock", "zulu-clock", "numbered-pass-clock-in-brackets"])
def test_reports_stamped_first_are_values_whole_on_their_first_change(fpr, line: str, values: list[str]) -> None:
    """A report stamped near its start (a channel, a pass's number, then its clock, in brackets or in
    Zulu time), replaced by another with another clock: the newest entry of a log, whole on its first
    change (round 73)."""
    assert_values_whole(fpr, line, values)


def test_a_rules_hour_on_the_quarter_stamped_first_stays_an_edit(fpr) -> None:
    """The guard: a rule stamped with its hour on the quarter, the hour and the words edited, is an edit."""
    got = run_value_line(fpr, "Chapel: {}", ["Mass (10:30) – Sundays only, in the crypt", "Mass (11:15) – Sundays and holidays, in the nave",
                                             "Mass (11:15) – Sundays and holidays, in the nave"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 74
def test_a_rules_hour_edited_off_the_hour_in_a_listed_sentence_stays_an_edit(fpr) -> None:
    """The guard: a rule's sentence in a list whose hour, on the hour, is edited to another minute
    (`- The Midday Dance leaves the Guildhall at 12:00 and …` -> `at 12:10 …`) is an edit, no clock
    (round 74: `heldout73`'s look-alike)."""
    got = run_value_line(fpr, "- The Midday Dance leaves the Guildhall at {} and takes about an hour and a quarter.",
                         ["12:00", "12:10", "12:10"])
    assert got[0]["cause"] == "template_change", got


@pytest.mark.parametrize("board", [
    "6.XI. ⊳ 8:{} Uhr ⊳ Aufstellung, 77 Gespanne gemeldet, Abfahrt 9 Uhr",
    "SU26 day 4 (Thu 23 Jul) ∷ 09:{} BST ∷ working up from Sonning ∷ next Caversham Lock c. 10:15",
    "Flora Day ‖ 10:{} ‖ next: Children's Dance from the Guildhall at 10:40",
], ids=["roman-month", "date-in-brackets", "name-then-sign"])
def test_boards_dated_otherwise_are_values_whole(fpr, board: str) -> None:
    """A board dated with its month in Roman numerals, with its date in brackets after a name, or
    stamped after a name set apart by a sign: only the clock moved on, the board whole (round 74)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


def _summary_after_summary(summary: str) -> list[dict]:
    """An earlier summary as the model's message opening the history, then turns; then the same
    summary kept, `summary` as the model's message in place of the turns, and a new question."""
    earlier = {"role": "assistant", "content": "[CONTEXT_SUMMARY] " + FIRST_SUMMARY}
    turns = agent_history(2)[1:]
    return [Gen.body(CODER, [earlier, *turns], None, None),
            Gen.body(CODER, [earlier, {"role": "assistant", "content": summary}, {"role": "user", "content": "Go on with the invoices."}],
                     None, None)]


def test_a_summary_after_the_earlier_one_before_the_new_question_is_a_compaction(fpr) -> None:
    """An earlier summary kept, a new one in place of every turn after it, then only the new question
    (CAMEL's ChatAgent's progressive summaries): a compaction, the new summary restating the turns
    (round 74)."""
    turns = agent_history(2)[1:]
    restated = "[CONTEXT_SUMMARY] " + " ".join(str(m["content"]) for m in turns)[:600]
    assert causes(fpr, _summary_after_summary(restated)) == ["compaction"]


def test_a_new_reply_after_the_kept_summary_restating_nothing_is_no_compaction(fpr) -> None:
    """The guard: after the kept summary, a long message that restates none of the dropped turns, then
    a question, is no compaction."""
    other = ("Before we go on: the storefront theme needs a new colour palette, larger product photos on "
             "the category pages and a sticky basket button on phones; the search box on tablets is broken "
             "too, and the house style wants one line per change in the changelog.")
    assert causes(fpr, _summary_after_summary(other)) != ["compaction"]


# ------------------------------------------------------------------ round 75
def test_a_tally_set_apart_by_any_sign_is_a_value_whole(fpr) -> None:
    """A race's tally whose parts a sign of any kind sets apart (`┊`), one reading changed at a time:
    the tally whole (round 75: round 72 named the signs)."""
    values = [f"started 42 ┊ running 34 ┊ retired 8 ┊ fastest lap {lap} mph" for lap in ("133.098", "133.412", "133.905")]
    assert_values_whole(fpr, "Course car: {}", values)


@pytest.mark.parametrize("board", [
    "TT26 Sat 30 May ┊ 10:{} ┊ roads closed ┊ Superbike TT (6 laps) starts 10:30",
    "Fasnetsdienstag 17.02. ◆ 9:{} Uhr ◆ Morgensprung: Schantle am Schwarzen Tor (Block 6 von 8)",
], ids=["name-with-digits", "long-day-word"])
def test_boards_named_with_digits_or_long_words_are_values_whole(fpr, board: str) -> None:
    """A board stamped after a name holding digits or a day's word longer than twelve letters: only
    the clock moved on, the board whole (round 75)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


@pytest.mark.parametrize(("line", "values"), [
    ("Gala stewards: {}", ["Blue 9 @ Market Place 13:56: banner poles lowered under the wires",
                           "Green 26 @ Old Elvet 15:35: band halted 3 minutes to close the gap",
                           "Green 2 @ Elvet Bridge 11:44: first aider to a bandsman, heat"]),
    ("Race Control log: {}", ["Post 31 · Governor's Bridge · 15:21 · all clear, flags in",
                              "Post 54 · Bray Hill · 15:40 · all clear, flags in",
                              "Post 36 · Greeba Castle · 16:42 · yellow flags out, rider off at low speed"]),
], ids=["who-and-place-changed", "place-changed-report-kept"])
def test_reports_stamped_after_who_and_where_are_values_whole(fpr, line: str, values: list[str]) -> None:
    """A report stamped after who reports and from where, both of which may change, or whose place
    changed with its clock while the report stayed: the newest entry of a log, whole on its first
    change (round 75)."""
    assert_values_whole(fpr, line, values)


# ------------------------------------------------------------------ round 76
@pytest.mark.parametrize("board", [
    "Regatta ✧ Sat Aug 9 ✧ 2:{} p.m. EDT ✧ heat 3 of 8: junior coxed fours",
    "Harvest Fair ❖ Sat 14 Sep (Market Day) ❖ 11.{}am ❖ sheep judging in the ring ❖ next: tug of war at 2pm",
], ids=["twelve-hour-month-first", "twelve-hour-day-named-in-brackets"])
def test_boards_stamped_with_a_twelve_hour_clock_are_values_whole(fpr, board: str) -> None:
    """A board stamped with a twelve-hour clock, its month before its day or its day named in
    brackets after its date: only the clock moved on, the board whole (round 76)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


@pytest.mark.parametrize(("line", "values"), [
    ("Ring steward: {}", ["Pen 4 ❖ 10.12am ❖ ewes penned, judge on her way",
                          "Pen 9 ❖ 11.48am ❖ ram lambs out of the ring, next class called",
                          "Pen 2 ❖ 1.07pm ❖ lost lamb back with its owner"]),
    ("Festzelt: {}", ["Festzeltkellner 14 ♦ 19:42 Uhr: Maßkrüge an Tisch 5 nachgefüllt",
                      "Festzeltkellner 3 ♦ 20:16 Uhr: Bierbank an Tisch 11 gebrochen, Ersatz kommt",
                      "Festzeltkellner 8 ♦ 21:03 Uhr: Brezenkorb leer, Nachschub bestellt"]),
], ids=["twelve-hour-clock", "long-word-clock-with-uhr"])
def test_reports_stamped_with_twelve_hour_or_uhr_clocks_are_values_whole_on_their_first_change(
        fpr, line: str, values: list[str]) -> None:
    """A report stamped near its start with a twelve-hour clock, or after a word longer than twelve
    letters with a clock that says `Uhr`, replaced by another: the newest entry of a log, whole on its
    first change (round 76)."""
    assert_values_whole(fpr, line, values)


@pytest.mark.parametrize("board", [
    "Fête des Lumières ✶ sam. 7 déc. ✶ 19h{} ✶ illuminations place Bellecour ✶ prochain : concert à 21h",
    "Braderie ✶ sam. 7 sept. ✶ 14 h {} ✶ brocante rue Nationale",
    "Sanfermines ✶ 7 de julio ✶ 8:{} h ✶ encierro en la calle Estafeta",
], ids=["hours-h-minutes", "hours-spaced-h-minutes", "clock-then-h"])
def test_boards_stamped_with_an_h_clock_are_values_whole(fpr, board: str) -> None:
    """A board stamped with a clock written with `h` (French `19h12`, `14 h 30`, Spanish `8:05 h`),
    after a day's name and a month shortened with a dot: only the clock moved on, the board whole
    (round 76)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


@pytest.mark.parametrize(("line", "values"), [
    ("Radio: {}", ["Poste 3 ✶ 19h12 ✶ foule dense, barrières reculées", "Poste 7 ✶ 20h41 ✶ enfant perdu retrouvé, parents prévenus",
                   "Poste 2 ✶ 21h03 ✶ malaise, pompiers sur place"]),
    ("Radio: {}", ["Vakt 4 ✶ kl. 14.12 ✶ stången rest, dansen börjar", "Vakt 9 ✶ kl. 15.48 ✶ barn borttappat vid bryggan",
                   "Vakt 2 ✶ kl. 16.07 ✶ regnskur, tältet fullt"]),
], ids=["hours-h-minutes", "klockan-dotted"])
def test_reports_stamped_with_other_written_clocks_are_values_whole_on_their_first_change(
        fpr, line: str, values: list[str]) -> None:
    """A report stamped near its start with a clock written `19h12` or after the word for o'clock (`kl.
    14.12`), replaced by another: the newest entry of a log, whole on its first change (round 76)."""
    assert_values_whole(fpr, line, values)


def test_a_rules_twelve_hour_hours_on_the_quarter_stamped_first_stay_an_edit(fpr) -> None:
    """The guard: a rule stamped with a twelve-hour hour on the quarter, in brackets, the hour and the
    words edited, is an edit."""
    got = run_value_line(fpr, "Chapel: {}", ["Mass (10.30am) – Sundays only, in the crypt",
                                             "Mass (11.15am) – Sundays and holidays, in the nave",
                                             "Mass (11.15am) – Sundays and holidays, in the nave"])
    assert got[0]["cause"] == "template_change", got


def test_a_log_line_dated_month_first_is_its_stamp_not_a_board(fpr) -> None:
    """The guard: a log line stamped with its month first and a clock to the second, no sign after
    it (`Jul 24 15:29:20 pppd[812]: …`), is its stamp, not a board read whole."""
    got = assert_values_found(fpr, "Last event: {} pppd[812]: LCP terminated by peer",
                              ["Jul 24 15:29:20", "Jul 25 03:14:08", "Jul 25 16:32:40"])
    assert [r["spans"] for r in got] == [["Jul 25 03:14:08"], ["Jul 25 16:32:40"]]


def test_hare_subcommands_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as a Hare program's getopt subcommands, a name of one word among them
    (`("helfereinsatz", [`), one moved: a tool order change (round 76, on `heldout75`'s tenants, tune
    side since round 76)."""
    assert_tool_orders_read(fpr, "heldout75", "text_tools_hare_getopt_")


def test_elvish_functions_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as Elvish functions on the flag module, a name of one word among them (`fn
    helfereinsatz {|@argv|`), one moved: a tool order change (round 76, on `heldout75`'s tenants)."""
    assert_tool_orders_read(fpr, "heldout75", "text_tools_elvish_flag_")


def test_blocks_opened_by_one_template_around_a_quoted_word_moved_are_a_tool_order_change(fpr) -> None:
    """Blocks each opened by the same line but for a name of one word in double quotes (a Lua
    registry's `tools["refund"] = {`), one moved: a tool order change (round 76: `templated_blocks`
    took only names written as code)."""
    entries = [f'tools["{n}"] = {{\n  summary = "{d}",\n  run = desk.{n},\n}}'
               for n, d in (("refund", "Refund an order."), ("resend", "Send the parcel again."),
                            ("cancel", "Cancel an order that has not shipped."), ("track", "Tracking events."))]
    assert reordered_listing_causes(fpr, entries, "Registry", [1, 0, 2, 3]) == ["tool_order", None]


def test_rules_opened_by_one_sentence_around_a_quoted_word_moved_are_a_template_change(fpr) -> None:
    """The guard: rules each opened by the same sentence but for a quoted word (`If the customer writes
    "refund":`), one moved, are prose moved: a template change."""
    entries = [f'If the customer writes "{n}":\n  - {d}\n  - Confirm it in one sentence.'
               for n, d in (("refund", "Check the order is paid."), ("resend", "Check the parcel came back."),
                            ("cancel", "Check the order has not shipped."), ("track", "Give the carrier's link."))]
    assert reordered_listing_causes(fpr, entries, "Rules", [1, 0, 2, 3]) == ["template_change", None]


MERGED_SUMMARY = ("The user asked to migrate the billing module to the new invoice API, keeping the public functions "
                  "and their tests; the agent read the module and listed the calls that change.")


def _summary_merged(before: str) -> list[dict]:
    """agent_history(3), then its first exchange gone, `before` and a newline put at the start of the
    first user message kept, every later message kept, and a reply and a question after."""
    msgs = agent_history(3)
    kept = {"role": "user", "content": f"{before}\n{msgs[2]['content']}"}
    again = [kept, *msgs[3:], {"role": "assistant", "content": "Reply 4: the invoices are next."},
             {"role": "user", "content": "Go on with them."}]
    return [Gen.body(CODER, msgs, None, None), Gen.body(CODER, again, None, None)]


def test_a_summary_merged_into_the_first_message_kept_is_a_compaction(fpr) -> None:
    """The first exchange dropped and a summary of it put at the start of the first user message kept
    (Agent Zero's topic history, its summaries merged with the next user message): a compaction
    (round 76)."""
    assert causes(fpr, _summary_merged(MERGED_SUMMARY)) == ["compaction"]


@pytest.mark.parametrize("before", [
    "[earlier turns omitted]",
    "Before we go on: the storefront theme needs a new colour palette, larger product photos on the category "
    "pages and a sticky basket button on phones, in the house style.",
], ids=["short-note", "long-note-restating-nothing"])
def test_a_note_merged_into_the_first_message_kept_is_no_compaction(fpr, before: str) -> None:
    """The guards: a short note about the cut, or a long one that restates none of the history, put
    before the first message kept is no compaction."""
    assert causes(fpr, _summary_merged(before)) != ["compaction"]


# ------------------------------------------------------------------ round 77
@pytest.mark.parametrize("board", [
    "Fair ✺ Sat Jun 7 ✺ 10:{}a ✺ pie judging in the hall ✺ next: tractor pull at 2p",
    "Kinderfest ✺ Sa 19.07. ✺ 9{} Uhr ✺ Umzug durch die Altstadt",
], ids=["us-schedule-letter", "raised-minutes"])
def test_boards_stamped_with_a_schedules_letter_or_raised_minutes_are_values_whole(fpr, board: str) -> None:
    """A board stamped with a US schedule's clock (`10:19a`) or a poster's raised minutes (`9¹⁹ Uhr`): only
    the clock moved on, the board whole (round 77)."""
    minutes = ("11", "19", "27") if "Uhr" not in board else ("¹¹", "¹⁹", "²⁷")
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in minutes])


@pytest.mark.parametrize("board", [
    "Kermis ✺ za 12.07.2026 ✺ 14.{} uur ✺ optocht door de Hoofdstraat",
    "Carnaval ✺ 14u{} ✺ stoet vertrekt aan het station",
    "Show ✺ Sat 20th Jul ✺ 2:{} p.m. ✺ sheepdog trials in ring 2",
], ids=["dated-with-year-uur", "belgian-u", "ordinal-day"])
def test_boards_stamped_in_other_written_conventions_are_values_whole(fpr, board: str) -> None:
    """A board stamped with a Dutch `14.19 uur` after a date with its year, a Belgian `14u19`, or after a
    day's ordinal number: only the clock moved on, the board whole (round 77: written from the
    conventions, not from a split)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


def test_reports_stamped_with_raised_minutes_are_values_whole_on_their_first_change(fpr) -> None:
    """A steward's report stamped with raised minutes (`Ordner 9 ✺ 15⁴⁸ Uhr: …`), replaced by another: the
    newest entry of a log, whole on its first change (round 77)."""
    assert_values_whole(fpr, "Radio: {}", ["Ordner 4 ✺ 14¹² Uhr: Umzug steht am Marienplatz",
                                           "Ordner 9 ✺ 15⁴⁸ Uhr: Kind am Brunnen gefunden",
                                           "Ordner 2 ✺ 16⁰⁷ Uhr: Regen, Zelte voll"])


def test_a_rules_hour_given_twice_edited_on_the_half_stays_an_edit(fpr) -> None:
    """The guard: a rule's hour given in two notations, both moved from the hour to the half (`Doors open at
    6.00pm / 18.00.` -> `6.30pm / 18.30.`), is an edit (round 77: `heldout76`'s look-alike)."""
    got = run_value_line(fpr, "Note: Doors open at {}.", ["6.00pm / 18.00", "6.30pm / 18.30", "6.30pm / 18.30"])
    assert got[0]["cause"] == "template_change", got


def test_a_gdb_help_listing_reordered_is_a_tool_order_change(fpr) -> None:
    """User-defined commands as GDB's `help user-defined` lists them, `name -- first line of its help`,
    reordered: a tool order change (round 77)."""
    entries = ["order-show -- Show an order with its lines and its state.",
               "order-cancel -- Cancel an order that has not shipped.",
               "return-open -- Open a return for one line of an order.",
               "parcel-track -- Show a parcel's tracking events."]
    assert reordered_listing_causes(fpr, entries, "List of commands", [1, 0, 2, 3]) == ["tool_order", None]


def test_entries_moved_inside_a_code_block_are_a_tool_order_change(fpr) -> None:
    """A program's entries in a notation no rule names (SNOBOL-like labels here), moved inside one fenced
    code block: a tool order change (round 77: what a client renders per tool into a code block)."""
    entries = ["REFUND OUTPUT = 'refund an order' :(DESK)", "RESEND OUTPUT = 'send the parcel again' :(DESK)",
               "CANCEL OUTPUT = 'cancel an order' :(DESK)", "TRACK OUTPUT = 'tracking events' :(DESK)"]
    moved = [entries[k] for k in (1, 0, 2, 3)]
    bodies = [body(f"{SYSTEM}\nCommands:\n```\n" + "\n".join(o) + "\n```\nAnswer briefly.", t)
              for o, t in zip([entries, moved, moved], conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["tool_order", None]


def test_rules_moved_outside_a_code_block_stay_a_template_change(fpr) -> None:
    """The guard: the same lines moved after a code block closed, in the prose, are an edited template."""
    entries = ["REFUND OUTPUT = 'refund an order' :(DESK)", "RESEND OUTPUT = 'send the parcel again' :(DESK)",
               "CANCEL OUTPUT = 'cancel an order' :(DESK)", "TRACK OUTPUT = 'tracking events' :(DESK)"]
    moved = [entries[k] for k in (1, 0, 2, 3)]
    bodies = [body(f"{SYSTEM}\n```\nexample\n```\n" + "\n".join(o) + "\nAnswer briefly.", t)
              for o, t in zip([entries, moved, moved], conversation(3), strict=True)]
    assert causes(fpr, bodies) == ["template_change", None]


def test_clojure_option_specs_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as option specs for Clojure's tools.cli (`(def passen-startliste`, a name of one word
    among them), one moved: a tool order change (round 77, on `heldout76`'s tenants, tune side since round
    77)."""
    assert_tool_orders_read(fpr, "heldout76", "text_tools_tools_cli_")


SUMMARY_MARKED = ("======== CONVERSATION HISTORY SUMMARY ========\n\n## Key points so far\n- The user asked to migrate "
                  "the billing module to the new invoice API, keeping the public functions and their tests.\n- The "
                  "assistant read the module first and listed the calls that change.\n\n======== END OF SUMMARY ========")


def _summary_alone(first: str) -> list[dict]:
    """agent_history(3), then `first` as the history's only message."""
    return [Gen.body(CODER, agent_history(3), None, None), Gen.body(CODER, [{"role": "user", "content": first}], None, None)]


def test_a_summary_in_place_of_every_message_is_a_compaction(fpr) -> None:
    """Every message replaced by one user message that restates them (Suna's context manager: the
    messages summarised between its markers, the call sent with the system prompt and the summary
    alone): a compaction (round 77)."""
    assert causes(fpr, _summary_alone(SUMMARY_MARKED)) == ["compaction"]


def test_a_long_new_question_in_place_of_every_message_is_a_new_session(fpr) -> None:
    """The guard: a long first question that restates none of the history before it opens a new
    conversation."""
    question = ("Write a changelog entry for the release of the storefront theme: the new colour palette, the larger "
                "product photos on the category pages, the sticky basket button on phones and the fixed search box on "
                "tablets, in the house style, one line per change.")
    assert causes(fpr, _summary_alone(question)) == ["new_session"]


def _turns_replaced(new: str) -> list[dict]:
    """agent_history(4), then its first four messages gone and `new` as the model's message in their
    place, the rest kept, and a reply and a question after."""
    msgs = agent_history(4)
    again = [{"role": "assistant", "content": new}, *msgs[4:], {"role": "assistant", "content": "Reply 5: next."},
             {"role": "user", "content": "Go on."}]
    return [Gen.body(CODER, msgs, None, None), Gen.body(CODER, again, None, None)]


def test_the_models_summary_in_place_of_the_first_turns_is_a_compaction(fpr) -> None:
    """The first turns dropped and a message of the model's that restates them in their place, the rest
    kept and the history shorter: a compaction, whatever the summary's role (round 77)."""
    msgs = agent_history(4)
    summary = ("Summary of the earlier turns: the user asked to migrate the billing module to the new invoice API, "
               "keeping the public functions and their tests; " + " ".join(str(m["content"])[:120] for m in msgs[1:4]))
    assert causes(fpr, _turns_replaced(summary)) == ["compaction"]


def test_the_models_long_note_in_place_of_the_first_turns_restating_nothing_is_a_front_trim(fpr) -> None:
    """The guard: a long message of the model's that restates none of the turns dropped is no summary."""
    note = ("Before we go on: the storefront theme needs a new colour palette, larger product photos on the category "
            "pages and a sticky basket button on phones; the search box on tablets is broken too, and the house style "
            "wants one line per change in the changelog.")
    assert causes(fpr, _turns_replaced(note)) == ["front_trim"]


# ------------------------------------------------------------------ round 78
@pytest.mark.parametrize("board", [
    "Standings ✧ 14/08/2026 10:14:{} BST ✧ crews staging at the boathouse, first crew off at 10:30",
    "Festwoche ♫ Sa 14.08. ♫ 20.{} ♫ Domplatz: Abendkonzert ♫ ab 21.45: Feuerwerk",
    "Parade ✾ Sat Jan 1 ✾ 1:{} p.m. PT ✾ floats on Colorado Boulevard, bands at the corner",
], ids=["dated-stamp-to-the-second", "dotted-clock-after-a-date", "two-letter-zone"])
def test_boards_stamped_with_a_dated_clock_a_dotted_clock_or_a_short_zone_are_values_whole(fpr, board: str) -> None:
    """A board stamped with its date and a clock to the second set apart by signs, a clock written with
    a dot alone after a date, or a clock with a zone of two letters: only the clock moved on, the board
    whole (round 78)."""
    assert_values_whole(fpr, "Board: {}", [board.format(m) for m in ("11", "19", "27")])


def test_reports_stamped_after_a_name_of_several_words_or_a_keyed_elision_are_values_whole(fpr) -> None:
    """A stage door's calls stamped after a house's name of another length and a dotted clock before a
    colon, and stewards' calls under a key that opens with an elision's apostrophe: the newest entry,
    whole on its first change (round 78)."""
    assert_values_whole(fpr, "Stage door: {}", ["Stage door Grand Theatre ♫ 16.30: cast called to the stage",
                                                 "Stage door Small Hall ♫ 19.37: understudy on for the second act",
                                                 "Stage door Grand Theatre ♫ 21.52: curtain down, clear the corridor"])
    assert_values_whole(fpr, "'Obby 'Oss party: {}", ["Steward 12 ❀ 4.23pm ❀ crowd 3 deep by the harbour, asking people to step back",
                                                      "Steward 23 ❀ 5.52pm ❀ drums resting in the square",
                                                      "Steward 10 ❀ 6.40pm ❀ 'Oss turning into the lane by the church"])


@pytest.mark.parametrize(("line", "values"), [
    ("Note: The gates open at {}.", ["11:00 a.m. AKST", "11:30 a.m. AKST", "11:30 a.m. AKST"]),
    ("Note: The parade starts at {}.", ["8:00 a.m.", "8:10 a.m.", "8:10 a.m."]),
], ids=["hour-with-its-zone", "note-edited-off-the-hour"])
def test_a_rules_hour_in_a_note_edited_stays_an_edit(fpr, line: str, values: list[str]) -> None:
    """The guards: a rule's hour with its zone moved from the hour to the half, and a note's hour moved off
    the hour, are edits (round 78: `heldout77`'s look-alike and edits)."""
    got = run_value_line(fpr, line, values)
    assert got[0]["cause"] == "template_change", got


def test_a_table_padded_before_its_tabs_reordered_is_a_tool_order_change(fpr) -> None:
    """A listing whose cells are padded to their column's width and joined by a tab (uitable's, as `helm
    plugin list` prints it), reordered: a tool order change (round 78)."""
    entries = ["NAME       \tVERSION\tDESCRIPTION", "broadcast  \t0.9.2  \tShow the broadcast windows",
               "equestrian \t1.1.5  \tList the equestrian units", "grandstands\t2.3.0  \tShow how full each stand is"]
    assert reordered_listing_causes(fpr, entries, "Plugins", [0, 3, 1, 2]) == ["tool_order", None]


def test_julia_argparse_commands_moved_are_a_tool_order_change(fpr) -> None:
    """Tools written as a Julia program's commands on ArgParse.jl, moved inside their code block (its
    quoted option names are no JSON): a tool order change (round 78, on `heldout77`'s tenants, tune side
    since round 78)."""
    assert_tool_orders_read(fpr, "heldout77", "text_tools_argparse_jl_")


VOICE_TURNS = [("user", "Where can we watch the parade with a pushchair?"),
               ("assistant", "The stands by the harbour have step-free places; come before nine, the pavement fills early."),
               ("user", "And is there parking near the harbour?"),
               ("assistant", "No parking by the harbour on the day: use the park and ride from the showground."),
               ("user", "How often do the buses run?"),
               ("assistant", "Every ten minutes from eight until the last bus back at six."),
               ("user", "Can we bring the dog?")]


def _first_summary(first: str, earlier: str | None = None) -> list[dict]:
    """A voice bot's seven turns, its first message `earlier` or the caller's question; then its first
    three messages gone, `first` in their place, the rest kept, and a reply and a question after: the
    window keeps its length."""
    msgs = _messages(VOICE_TURNS)
    if earlier is not None:
        msgs = [{"role": "user", "content": earlier}, *msgs[1:]]
    again = [{"role": "user", "content": first}, *msgs[3:], {"role": "assistant", "content": "Dogs on leads are welcome."},
             {"role": "user", "content": "Thanks, and toilets?"}]
    return [Gen.body(CODER, msgs, None, None), Gen.body(CODER, again, None, None)]


VOICE_SUMMARY = ("Conversation summary: The caller asked where to watch the parade with a pushchair; the stands by the "
                 "harbour have step-free places and the pavement fills early, so come before nine. The caller asked "
                 "about parking near the harbour.")


def test_a_first_summary_in_place_of_the_first_turns_keeping_the_windows_length_is_a_compaction(fpr) -> None:
    """The first turns dropped and the conversation's first summary, restating them, in their place, the
    newest kept and the window of the same length (Pipecat's context summarization): a compaction
    (round 78)."""
    assert causes(fpr, _first_summary(VOICE_SUMMARY)) == ["compaction"]


def test_a_summary_rewritten_over_a_window_of_the_same_length_stays_a_front_trim(fpr) -> None:
    """The guard: where the history opened with a summary before, a summary rewritten in its place over a
    window that keeps its length is a rolling summary, paid on every turn: a front trim (issue 29)."""
    earlier = ("Conversation summary: The caller asked about tickets for the grandstand on the first day and was told "
               "that they are sold at the gate only, cash or card, and that children under five go free with an adult.")
    assert causes(fpr, _first_summary(VOICE_SUMMARY, earlier)) == ["front_trim"]


# ------------------------------------------------------------------ round 79
def test_a_record_named_by_a_long_zero_padded_number_risen_past_fifty_is_a_value_whole(fpr) -> None:
    """A hire desk's record named by a zero-padded number of six digits, risen by more than fifty but
    as a long number does (1% at most), its other parts changed: the newest entry, whole on its first
    change (round 79)."""
    assert_values_whole(fpr, "Boots hired: {}", ["Hire #048211 ✿ size 9 ✿ Lakeside shop",
                                                 "Hire #048290 ✿ size 11 ✿ Quarry Road shop",
                                                 "Hire #048355 ✿ size 7 ✿ Lakeside shop"])


def test_a_record_whose_long_number_jumped_stays_an_edit(fpr) -> None:
    """The guard: the same record whose number jumped by far more than a hire desk hands out between two
    requests is no series moving on: an edit."""
    got = run_value_line(fpr, "Boots hired: {}", ["Hire #048211 ✿ size 9 ✿ Lakeside shop",
                                                  "Hire #058211 ✿ size 11 ✿ Quarry Road shop",
                                                  "Hire #058211 ✿ size 11 ✿ Quarry Road shop"])
    assert got[0]["cause"] == "template_change", got


@pytest.mark.parametrize("calls", [
    ["Marshal 7 ◈ 09:41 CST ◈ gates A to C open, crews to their baskets",
     "Marshal 3 ◈ 09:26 CST ◈ hold: wind above limits at the north end",
     "Marshal 12 ◈ 09:53 CST ◈ first wave cleared to inflate"],
    ["Marshal 7 ◈ 09:15 CST ◈ gates A to C open, crews to their baskets",
     "Marshal 3 ◈ 09:00 CST ◈ hold: wind above limits",
     "Marshal 12 ◈ 09:45 CST ◈ first wave cleared to inflate"],
], ids=["zone-after-the-clock", "on-the-quarter-hour-every-part-another"])
def test_calls_stamped_with_a_zone_are_values_whole(fpr, calls: list[str]) -> None:
    """A field's calls stamped after who calls, with a clock that names its zone, read out of order (no
    clock that moved on a little); on the quarter hour too when who calls and the call changed in most
    of its words: the newest entry, whole on its first change (round 79)."""
    assert_values_whole(fpr, "Field calls: {}", calls)


@pytest.mark.parametrize("values", [
    ["Gate C ◈ 09:45 MDT ◈ opens for pilots and crews", "Gate A ◈ 08:00 MDT ◈ opens for pilots and crews only",
     "Gate A ◈ 08:00 MDT ◈ opens for pilots and crews only"],
    ["Gate 3 ◈ 09:45 MDT ◈ opens for pilots and crews", "Gate 3 ◈ 08:00 MDT ◈ closes to spectators at dusk",
     "Gate 3 ◈ 08:00 MDT ◈ closes to spectators at dusk"],
], ids=["most-words-kept", "who-kept"])
def test_a_rules_record_on_the_quarter_hour_edited_stays_an_edit(fpr, values: list[str]) -> None:
    """The guards: a rule's record on the quarter hour, its hour moved back, whose words mostly stayed, or
    whose gate stayed, edited: an edit (round 79)."""
    got = run_value_line(fpr, "Field rules: {}", values)
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 80
GARDEN_TURNS = [("user", "Which gate is closest to the rose garden, and is it step-free?"),
                ("assistant", "The rose garden is closest to the east gate, which has a ramp and step-free paths; the "
                              "north gate has steps, so come in by the east gate with a wheelchair or a pushchair."),
                ("user", "Are dogs allowed in the glasshouses?"),
                ("assistant", "Only assistance dogs go into the glasshouses; other dogs on leads may walk the outdoor "
                              "paths, and water bowls stand by the east gate café."),
                ("user", "When does the last tour of the glasshouses start?")]
GARDEN_SUMMARY = ("The user asked which gate is closest to the rose garden and whether it is step-free; the east gate, "
                  "with a ramp and step-free paths, is closest. The user asked whether dogs are allowed in the "
                  "glasshouses: only assistance dogs; dogs on leads may walk the outdoor paths.")


def _messages(turns: list[tuple[str, str]]) -> list[dict]:
    return [{"role": role, "content": text} for role, text in turns]


def test_the_models_summary_then_its_reply_and_the_next_question_is_a_compaction(fpr) -> None:
    """Every earlier message gone, the model's summary of them as a message of its own, then its reply
    to the last question and the next question (Microsoft.Extensions.AI's SummarizingChatReducer): a
    compaction; summed up again with the earlier summary, a compaction again (round 80)."""
    first = _messages(GARDEN_TURNS)
    second = _messages([("assistant", GARDEN_SUMMARY),
                        ("assistant", "The last glasshouse tour starts at half three from the palm house door."),
                        ("user", "Is there a café inside the gardens?")])
    third = _messages([("assistant", GARDEN_SUMMARY + " The user asked when the last glasshouse tour starts: half "
                                                      "three, from the palm house door."),
                       ("assistant", "Yes: the east gate café serves lunches and cakes until half four."),
                       ("user", "Can I book a wheelchair at the gate?")])
    assert causes(fpr, [Gen.body(CODER, m, None, None) for m in (first, second, third)]) == ["compaction", "compaction"]


def test_a_greeting_then_a_reply_and_a_question_that_restate_nothing_stay_a_new_conversation(fpr) -> None:
    """The guard: a new conversation opened by two messages of the model's, a long greeting that restates
    nothing of the conversation before, then a question: a new conversation."""
    greeting = ("Welcome to the museum's visitor desk! I can book guided tours of the galleries, tell you about "
                "today's exhibitions and family workshops, and help with tickets, lockers and accessibility "
                "services. Ask me anything about your visit today.")
    cur = _messages([("assistant", greeting), ("assistant", "What would you like to know?"),
                     ("user", "How much is a family ticket for the dinosaur exhibition?")])
    assert causes(fpr, [Gen.body(CODER, _messages(GARDEN_TURNS), None, None), Gen.body(CODER, cur, None, None)]) \
        == ["new_session"]


def test_the_models_account_of_the_first_question_in_its_place_is_a_compaction(fpr) -> None:
    """The first question alone summed up as the model's message in its place, quoted, every later
    message kept and the conversation going on: a compaction (round 80)."""
    first = _messages(GARDEN_TURNS)
    summed = _messages([("assistant", f"The user asked: “{GARDEN_TURNS[0][1]}”"), *GARDEN_TURNS[1:],
                        ("assistant", "The last tour starts at half three."), ("user", "Where does it start?")])
    assert causes(fpr, [Gen.body(CODER, first, None, None), Gen.body(CODER, summed, None, None)]) == ["compaction"]


def test_the_users_first_question_edited_stays_an_edit(fpr) -> None:
    """The guard: the user's first question edited in place, the user's still, every later message kept:
    no compaction."""
    first = _messages(GARDEN_TURNS)
    edited = _messages([("user", "Which gate is closest to the rose garden, and is it step-free for a wheelchair?"),
                        *GARDEN_TURNS[1:], ("assistant", "The last tour starts at half three."),
                        ("user", "Where does it start?")])
    assert causes(fpr, [Gen.body(CODER, first, None, None), Gen.body(CODER, edited, None, None)]) != ["compaction"]


def test_notices_stamped_with_an_hour_alone_are_values_whole(fpr) -> None:
    """A poster's notices stamped with a twelve-hour clock, the hour alone too (`11pm`), as British and
    Irish notices write it: the newest entry, whole on its first change (round 80)."""
    assert_values_whole(fpr, "Festival office: {}", ["Festival office · 4.20pm: a piper from Ennis to see the organisers",
                                                     "Festival office · 11pm: lost keys handed in at the square",
                                                     "Festival office · 9.05am: the car park by the spa is full"])


def test_a_rules_hour_alone_edited_stays_an_edit(fpr) -> None:
    """The guard: a rule stamped with an hour alone, on the hour, moved to another hour, its words the
    same: an edit."""
    got = run_value_line(fpr, "Bar rules: {}", ["Bar · 10pm: last orders at the counter",
                                                "Bar · 11pm: last orders at the counter",
                                                "Bar · 11pm: last orders at the counter"])
    assert got[0]["cause"] == "template_change", got


def test_a_board_dated_with_dashes_is_a_value_whole(fpr) -> None:
    """A fair's board stamped with its day, month and year set apart by dashes and a clock with `hrs` and
    its zone: only the clock moved on, the board whole (round 80)."""
    assert_values_whole(fpr, "You answer for the fair's office.\nFair board: {}",
                        [f"FAIR GROUND | 08-11-2027 | 22:{m} hrs IST | fair ground closes | next at 06:00 hrs: cattle show"
                         for m in ("34", "39", "46")])


# ------------------------------------------------------------------ round 81
def test_a_rules_two_twelve_hour_clocks_edited_stay_an_edit(fpr) -> None:
    """The guard (round 81: `heldout80`'s look-alikes): a rule's two twelve-hour clocks in one sentence,
    each on the quarter hour, edited: an edit, not a status's readings."""
    got = run_value_line(fpr, "Note: {}", ["The show starts at 7.00pm; guests should be seated by 6.15pm.",
                                           "The show starts at 7.30pm; guests should be seated by 6.45pm.",
                                           "The show starts at 7.30pm; guests should be seated by 6.45pm."])
    assert got[0]["cause"] == "template_change", got


def test_calls_stamped_with_a_four_figure_clock_and_h_are_values_whole(fpr) -> None:
    """Stewards' calls stamped with a four-figure clock and `H` after it, as Singapore writes it, the
    evening's hours too (`2245H`): the newest entry, whole on its first change (round 81)."""
    assert_values_whole(fpr, "Stewards: {}", ["Steward A07 | 2045H | queue at the north gate very long already",
                                              "Steward C12 | 2245H | Zone 3 full, send people to Zone 4",
                                              "Steward B02 | 2131H | lost child found at the east kiosk"])


def test_a_receipt_whose_number_rose_by_one_percent_is_a_value_whole(fpr) -> None:
    """A fair's receipt record, its number of five digits risen by more than fifty but less than 1% of
    itself, its place and amount changed: the newest entry, whole on its first change (round 81)."""
    assert_values_whole(fpr, "Kasse: {}", ["Beleg 27306 · am Riesenrad · 7,50 €",
                                        "Beleg 27371 · an der Kasse 2 · 14,00 €",
                                        "Beleg 27430 · am Riesenrad · 3,50 €"])


def test_a_board_stamped_after_an_event_and_its_days_name_is_a_value_whole(fpr) -> None:
    """A parade's board stamped after the event's name and its day's name, four words, a sign setting
    them apart: only the clock moved on, the board whole (round 81)."""
    assert_values_whole(fpr, "You answer for the parade's office.\nParade board: {}",
                        [f"CARNIVAL Boxing Day Monday ~ 5:{m} a.m. ~ Blue Dragons crossing, lap 2, at the stand"
                         for m in ("12", "19", "27")])


MEMORY_RULES = ("You answer for the garden festival's information desk.\n- Keep answers short.\n\n"
                "Use the conversation memory from the MEMORY section to provide accurate answers.\n\n"
                "---------------------\nMEMORY:\n{}\n---------------------\n\n")
MEMORY_EXCHANGES = [("Which gate is closest to the rose garden?", "The east gate, with its ramp and step-free paths."),
                    ("Are dogs allowed in the glasshouses?", "Only assistance dogs; dogs on leads may walk the paths."),
                    ("When does the last tour start?", "At half three, from the palm house door."),
                    ("Is there a café?", "Yes, by the east gate, open until half four.")]


def _memory_body(exchanges: list[tuple[str, str]], question: str) -> dict:
    """A request whose system text holds the memory's messages as `USER:` and `ASSISTANT:` lines (Spring
    AI's PromptChatMemoryAdvisor), then the new question alone."""
    lines = "\n".join(f"USER:{q}\nASSISTANT:{a}" for q, a in exchanges)
    return Gen.body(MEMORY_RULES.format(lines), [{"role": "user", "content": question}], None, None)


def test_a_memory_growing_in_the_system_text_is_no_break_and_its_window_trimmed_is_a_front_trim(fpr) -> None:
    """The conversation kept as lines of a memory section in the system text: the last exchange added
    there is the conversation going on, no break; the oldest exchange dropped as the newest is added (a
    window memory, on every turn once full) is a front trim (round 81)."""
    ex = MEMORY_EXCHANGES
    bodies = [_memory_body(ex[:1], ex[1][0]), _memory_body(ex[:2], ex[2][0]), _memory_body(ex[1:3], ex[3][0])]
    assert causes(fpr, bodies) == [None, "front_trim"]


def test_a_memory_section_edited_stays_an_edit(fpr) -> None:
    """The guard: a memory line edited in place, no exchange added: an edited system text."""
    ex = MEMORY_EXCHANGES
    edited = [ex[0], (ex[1][0], "Only assistance dogs go inside.")]
    bodies = [_memory_body(ex[:2], ex[2][0]), _memory_body(edited, ex[2][0])]
    assert causes(fpr, bodies) == ["template_change"]


# ------------------------------------------------------------------ round 82
def test_a_board_set_apart_by_double_colons_its_clock_read_out_in_words_is_a_value_whole(fpr) -> None:
    """A fair's board whose parts a doubled colon sets apart, its clock read out in words in brackets
    after it (`14:36 (halb drei)`): only the clock and its words moved on, the board whole (round 82)."""
    assert_values_whole(fpr, "You answer for the fair's office.\nMarktuhr: {}",
                        [f"Kirmes Samstag :: {c} :: Autoscooter und Riesenrad geöffnet"
                         for c in ("14:28 (halb drei)", "14:36 (halb drei)", "14:44 (Viertel vor drei)")])


def test_a_rules_hour_with_a_note_in_brackets_edited_stays_an_edit(fpr) -> None:
    """The guard: a rule's hour on the half hour with a note in brackets after it, moved to another half
    hour, its words the same: an edit."""
    got = run_value_line(fpr, "You answer for the fair's office.\nRegel: {}",
                         ["Einlass :: 14:00 (mit Ticket) :: Kinder nur mit Begleitung",
                          "Einlass :: 14:30 (mit Ticket) :: Kinder nur mit Begleitung",
                          "Einlass :: 14:30 (mit Ticket) :: Kinder nur mit Begleitung"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 83
PACKAGE_LISTING = ["[*] fairdesk-stalls-1.4.0_1    book a stall and print its permit",
                   "[-] fairdesk-lostproperty-0.2.3_2 log an item found and page its owner",
                   "[*] fairdesk-rides-2.1.7_1     show which rides run and their queues",
                   "[-] fairdesk-raffle-0.9.0_1    sell a raffle ticket and print its stub"]


@pytest.mark.parametrize("order", [[2, 0, 3, 1], [0, 2, 1, 3], [0, 2, 3, 1]])
def test_a_package_listing_marked_installed_or_not_reordered_is_a_tool_order_change(fpr, order: list[int]) -> None:
    """Packages as `xbps-query -Rs` lists them: a mark in brackets, installed or not (`[*]`, `[-]`), the
    package's name and version as one word, its description after it, the longest name set apart by one
    space only. Reordered, the longest moved alone too: a tool order change (round 83)."""
    assert reordered_listing_causes(fpr, PACKAGE_LISTING, "Tools (xbps-query -Rs fairdesk)", order) \
        == ["tool_order", None]


def test_a_checklist_marked_in_brackets_reordered_stays_an_edit(fpr) -> None:
    """The guard: a checklist's rules marked done or not in brackets (`[x] Greet …`), reordered: prose
    rules, no tools, an edited system text."""
    rules = ["[x] Greet every guest by name when you can", "[ ] Never promise a refund on the phone",
             "[x] Keep answers to three sentences", "[ ] Send lost children to the first-aid tent"]
    assert reordered_listing_causes(fpr, rules, "Checklist", [2, 0, 3, 1])[0] == "template_change"


def test_a_numbered_receipt_grouped_in_thousands_that_rose_is_a_value_whole(fpr) -> None:
    """A tent's receipt, its number after `Nr.` grouped in thousands with dots and risen a little, the
    tent the same or another (`Maß Nr. 129.846 – Festzelt Wenisch` -> `Maß Nr. 129.906 – …`, `Nr.
    320.565` -> `320.655`: more than fifty, less than 1% of itself): the newest entry, whole on its first
    change (round 83)."""
    assert_values_whole(fpr, "Ausgeschenkt: {}", ["Maß Nr. 129.846 – Festzelt Brandl", "Maß Nr. 129.906 – Festzelt Brandl",
                                                  "Maß Nr. 129.931 – Festzelt Brandl"])
    assert_values_whole(fpr, "Ausgeschenkt: {}", ["Maß Nr. 320.565 – Hofbräu-Zelt", "Maß Nr. 320.655 – Löwen-Zelt",
                                                  "Maß Nr. 320.677 – Löwen-Zelt"])


def test_an_entrys_number_after_its_sign_is_the_value_whole(fpr) -> None:
    """An entry's number after its words and its sign, alone in the value, or with what the entry is set
    apart by slashes (`Fahrt Nr. 590`, `Raffle #05153 / Miss Ba / FJ$2`), risen a little: the value whole,
    not its number alone (round 83)."""
    assert_values_whole(fpr, "Letzte Fahrt: {}", ["Fahrt Nr. 590", "Fahrt Nr. 599", "Fahrt Nr. 604"])
    assert_values_whole(fpr, "Raffle ticket sold: {}", ["Raffle #05130 / Miss Ba / FJ$2", "Raffle #05144 / Miss Ba / FJ$2",
                                                        "Raffle #05153 / Miss Ba / FJ$2"])


def test_a_room_number_after_its_sign_edited_stays_an_edit(fpr) -> None:
    """The guard: a rule's room number after `Nr.`, moved down once and kept: an edit."""
    got = run_value_line(fpr, "Fundbüro: {}", ["Raum Nr. 204 im Rathaus", "Raum Nr. 112 im Rathaus",
                                               "Raum Nr. 112 im Rathaus"])
    assert got[0]["cause"] == "template_change", got


def test_a_board_stamped_with_the_festivals_day_of_its_run_is_a_value_whole(fpr) -> None:
    """A festival's board stamped with its name, the day counted in its run in place of a date (`Day 5
    of 9`, `Tag 3 von 10`) and its clock: only the clock moved on, the board whole (round 83)."""
    assert_values_whole(fpr, "Park clock: {}", [f"Lantern Fair · Day 5 of 9 · 16:{m} WST · the mayor's parade"
                                                for m in ("02", "11", "17")])
    assert_values_whole(fpr, "Festuhr: {}", [f"Weinfest · Tag 3 von 10 · 19:{m} Uhr · Probe in Rudi's Weinstube"
                                             for m in ("04", "12", "21")])


def test_a_festivals_day_with_its_price_or_its_words_edited_stays_an_edit(fpr) -> None:
    """The guards: a programme line with the day counted in the festival's run, its price edited, or its
    clock kept and its words edited: an edit, not a board."""
    for values in (["Lantern Fair · Day 2 of 9 · adults £12 · under-fives free",
                    "Lantern Fair · Day 2 of 9 · adults £14 · under-fives free"],
                   ["Lantern Fair · Day 2 of 9 · 18:00 · doors open", "Lantern Fair · Day 2 of 9 · 18:00 · gates open"]):
        got = run_value_line(fpr, "Programme: {}", [*values, values[1]])
        assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 84
ROLE_PROMPT = "I want you to act as a {} for me{}\n\nYou answer for the festival office of the Harbour Lantern Fair.\n{}"
ROLES = [("ChatGPT-Prompt-Generator", ". I give you a topic and you write a prompt for it that starts with the role.",
          "- Keep answers short.\n- The fair opens at 10am."),
         ("LinkedIn-Ghostwriter", " and write me a new post of at most 400 words on the topic I give you.",
          "- Stalls are booked at the office.\n- Lost property goes to the first-aid tent.")]


def test_a_switch_to_an_agent_named_in_camel_case_words_is_a_new_conversation(fpr) -> None:
    """Another agent, its whole system text other, its role's name first and written in camel-case words
    joined by hyphens (`ChatGPT-Prompt-Generator` -> `LinkedIn-Ghostwriter`): a new conversation, not a
    value drawn again at its head (round 84)."""
    prompts = [ROLE_PROMPT.format(*role) for role in ROLES]
    bodies = [body(prompts[0], QUESTIONS[:1]), body(prompts[0], [*QUESTIONS[:1], "At 10am.", QUESTIONS[1]]),
              body(prompts[1], QUESTIONS[2:3])]
    assert causes(fpr, bodies) == [None, "new_session"]


def test_a_token_of_letters_that_change_case_every_letter_or_two_is_still_a_draw(fpr) -> None:
    """The guard: a session token of letters only, their case changing every letter or two, drawn again:
    still a value."""
    assert_values_found(fpr, "Session: {}", ["xKqLmZbTrWpaYhQe", "pWzRkTaLqXmYvBsN", "QmTrXaLpKzWvYbNs"])


def test_a_loggers_line_stamped_in_brackets_with_its_zone_is_a_value_whole(fpr) -> None:
    """A call logged as a logger stamps a line, the clock and its zone in brackets, then who reports and
    what (`[09:44 HKT] Festival control: lost child at …`): the newest entry, whole on its first change
    (round 84)."""
    assert_values_whole(fpr, "Control log: {}", ["[09:43 HKT] Festival control: towers inspected, all clear",
                                                 "[09:44 HKT] Festival control: lost child at the east pier",
                                                 "[10:05 HKT] Festival control: ferry queue past the barrier"])


def test_boards_set_apart_by_hyphens_typed_for_dashes_are_values_whole(fpr) -> None:
    """Boards whose stamp a hyphen or two typed for a dash sets apart, after a place, or after a day's
    name with a comma and a date (`Road board - 5:41 pm AST - …`, `Fair Sat, Jan 17 -- 12:55 PM PHT --
    …`): only the clock moved on, the board whole (round 84)."""
    assert_values_whole(fpr, "Road clock: {}", [f"Lantern road board - 5:{m} pm AST - on the judging stage: the big bands"
                                                for m in ("41", "50", "57")])
    assert_values_whole(fpr, "Dancing clock: {}", [f"Lantern Fair Sat, Jan 17 -- 12:{m} PM PHT -- Group 17 of 30 at the stage"
                                                   for m in ("51", "55", "59")])


def test_a_board_dated_with_a_days_name_a_comma_and_a_german_ordinal_is_a_value_whole(fpr) -> None:
    """A board dated as German writes it, the day's name, a comma and the day's number with its dot
    before the month (`Montag, 29. Juli`), its clock `16.04 Uhr`: only the clock moved on, the board
    whole (round 84)."""
    assert_values_whole(fpr, "Festuhr: {}", [f"Seefest | Montag, 29. Juli | 16.{m} Uhr | Hauptplatz: Chöre"
                                             for m in ("04", "09", "14")])


def test_opening_hours_set_apart_by_hyphens_edited_stay_an_edit(fpr) -> None:
    """The guard: opening hours, a range set apart by hyphens, one end moved once and kept: an edit."""
    got = run_value_line(fpr, "Hours: {}", ["Fair office - 10:00 - 18:00 daily", "Fair office - 10:00 - 18:30 daily",
                                            "Fair office - 10:00 - 18:30 daily"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 85
def test_boards_stamped_after_a_days_number_with_its_name_or_an_event_and_a_colon_are_values_whole(fpr) -> None:
    """Boards stamped after the day's number in the event's run with the day's name in brackets (`Cup
    Final Day 2 (Bank Holiday) | 3:09pm | …`), after an event on its place of five words and a colon,
    a `;` after the clock (`Boat Race Day on Windermere: 10:49 a.m. BST; …`), after an event, a comma
    and its night with a sign (`… , final night :: 8.55 p.m. :: …`), or with the clock as Austrian radio
    says it (`13 Uhr 33`): only the clock moved on, the board whole (round 85)."""
    assert_values_whole(fpr, "Ground clock: {}", [f"Cup Final Day 2 (Bank Holiday) | 3:{m}pm | afternoon session, tea at 3:40pm"
                                                  for m in ("09", "18", "21")])
    assert_values_whole(fpr, "Lake clock: {}", [f"Boat Race Day on Windermere: 10:{m} a.m. BST; race 7 of 31 on the water"
                                                for m in ("49", "52", "58")])
    assert_values_whole(fpr, "Route board: {}", [f"LANTERNS Harbour Lantern Fair, final night :: 8.{m} p.m. :: at the pier"
                                                 for m in ("55", "58")] + ["LANTERNS Harbour Lantern Fair, final night :: "
                                                                           "9.01 p.m. :: at the pier"])
    assert_values_whole(fpr, "Festuhr: {}", [f"Herbstfest am Samstag: 13 Uhr {m} – am Hauptplatz: Blasmusik"
                                             for m in ("33", "40", "47")])


def test_a_rules_hour_after_a_place_and_a_colon_edited_stays_an_edit(fpr) -> None:
    """The guards: a desk's hours after its place and a colon, and a day's opening hour after its number
    and name, moved once on the quarter hour and kept: an edit."""
    for line, values in (("Desk: {}", ["Registration desk: 10:00; closes at 16:00", "Registration desk: 10:30; closes at 16:00"]),
                         ("Programme: {}", ["Fair Day 1 (Opening Day) | 10:00am | gates open",
                                            "Fair Day 1 (Opening Day) | 10:30am | gates open"])):
        got = run_value_line(fpr, line, [*values, values[1]])
        assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 86
def test_a_ticket_numbered_after_no_and_its_code_that_rose_is_a_value_whole(fpr) -> None:
    """A ticket's record, its number after `No.` and the code it ends (`Ticket No. FAIR/27/059496 – Adult – Rs.
    50/-` -> `… 059498 – Student – Rs. 20/-`), risen a little, the rest changed too: the newest entry, whole
    on its first change; the sign and the code are no words before it (round 86)."""
    assert_values_whole(fpr, "Entry ticket: {}", ["Ticket No. FAIR/27/059496 – Adult – Rs. 50/-",
                                                   "Ticket No. FAIR/27/059498 – Student – Rs. 20/-",
                                                   "Ticket No. FAIR/27/059503 – Adult – Rs. 50/-"])


def test_a_state_naming_a_street_by_its_short_form_is_a_value_whole(fpr) -> None:
    """A route's state, one of them naming a street by its short form with a dot (`parade rolling` ->
    `streetcar back on St. Charles` -> `route cleared`): a state replaced, whole on its first change (round 86)."""
    assert_values_whole(fpr, "Route status: {}", ["parade rolling", "streetcar back on St. Charles", "route cleared"])


PLACE_STAMPED_REPORTS = {
    "at": ("Control room: {}", [f"Pier control room @ {c}: {r}" for c, r in (
        ("9:16 pm", "light drizzle, programme continues"), ("12:31 pm", "light drizzle, programme continues"),
        ("1:07 pm", "stage 2 closed for the wind"))]),
    "brackets": ("Leitstelle: {}", [f"Meldung der Festleitstelle ({c} Uhr): {r}" for c, r in (
        ("17.21", "Fundgegenstand am Eingang 4 abgegeben"), ("21.53", "Fundgegenstand am Eingang 4 abgegeben"),
        ("22.08", "Sturmwarnung für den ganzen Festplatz"))]),
}


@pytest.mark.parametrize("form", sorted(PLACE_STAMPED_REPORTS))
def test_reports_stamped_after_their_place_with_an_at_or_in_brackets_are_values_whole(fpr, form: str) -> None:
    """Reports stamped with their place, then the clock after an `@` or in brackets and a colon (`Pier
    control room @ 9:16 pm: …`, `Meldung der Festleitstelle (17.21 Uhr): …`): the newest entry, whole on its
    first change, the clock alone moved or the report too (round 86)."""
    assert_values_whole(fpr, *PLACE_STAMPED_REPORTS[form])


def test_a_tally_in_parts_set_apart_by_semicolons_is_a_value_whole(fpr) -> None:
    """A parade's tally in parts set apart by semicolons as prose sets them, one count moved on (`floats
    rolled 6/31; ladders on the neutral ground ~1,583; lost kids reunited 2` -> `~1,615`): the tally whole
    (round 86)."""
    assert_values_whole(fpr, "Parade tally: {}", ["floats rolled 6/31; ladders on the verge ~1,583; lost kids reunited 2",
                                                  "floats rolled 6/31; ladders on the verge ~1,615; lost kids reunited 2",
                                                  "floats rolled 7/31; ladders on the verge ~1,640; lost kids reunited 2"])


def test_a_price_list_in_semicolons_or_a_gate_named_by_a_saint_edited_stays_an_edit(fpr) -> None:
    """The guards: a price list set apart by semicolons with one price edited, and a meeting point whose
    saint's name was swapped inside its phrase (`St. Mary's gate` -> `St. John's gate`): edits."""
    for line, values in (("Prices: {}", ["adult £12; child £8; family £35", "adult £14; child £8; family £35"]),
                         ("Meeting point: {}", ["meet at St. Mary's gate", "meet at St. John's gate"])):
        got = run_value_line(fpr, line, [*values, values[1]])
        assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 87
MARKED_TABLE = ["i+ | fairdesk-stalls       | Book a stall and print its permit        | package",
                "i  | fairdesk-lostproperty | Log an item found and page its owner     | package",
                "i+ | fairdesk-rides        | Show which rides run and their queues    | package",
                "i+ | fairdesk-raffle       | Sell a raffle ticket and print its stub  | package"]


@pytest.mark.parametrize("order", [[2, 0, 3, 1], [1, 0, 3, 2], [0, 3, 1, 2]])
def test_a_package_table_with_a_status_column_reordered_is_a_tool_order_change(fpr, order: list[int]) -> None:
    """Packages as `zypper search` prints them, a table whose first column is the status mark (`i+`
    installed on request, `i` as a dependency), its cells joined by ` | `: the mark before the first bar is
    no part of the entry, which names its package in a cell. Reordered: a tool order change (round 87)."""
    heading = "Tools (zypper search fairdesk)\nS  | Name | Summary | Type\n---+------+---------+-----"
    assert reordered_listing_causes(fpr, MARKED_TABLE, heading, order) == ["tool_order", None]


def test_a_table_of_rules_with_a_mark_column_reordered_stays_an_edit(fpr) -> None:
    """A table of prose rules marked in a first column (`x  | Greet every guest by name | daily`), reordered:
    no tools, an edited system text. Before round 87 the mark, two spaces after it, read as a name in
    columns."""
    rules = ["x  | Greet every guest by name when you can | daily", "   | Never promise a refund on the phone | always",
             "x  | Keep answers to three sentences | always", "   | Send lost children to the first-aid tent | always"]
    assert reordered_listing_causes(fpr, rules, "Rules", [2, 0, 3, 1])[0] == "template_change"


@pytest.mark.parametrize("line", ["- Gates open at 9.30am on each show day; the grand parade starts at about {}.",
                                  "Note: the grand parade starts at about {}."])
def test_a_rules_hour_on_the_quarter_edited_off_it_stays_an_edit(fpr, line: str) -> None:
    """A rule's hour in a bulleted rule or a note, after `at about`, on the quarter hour, edited to an hour
    off it (`starts at about 10.45am` -> `11.10am`), other clocks and words before it on the line: a rule's
    hour edited, no clock read (round 87)."""
    got = run_value_line(fpr, "You answer for the show's office.\n" + line, ["10.45am", "11.10am", "11.10am"])
    assert got[0]["cause"] == "template_change", got


def test_a_log_line_in_a_list_whose_clock_moved_off_the_quarter_is_still_a_clock(fpr) -> None:
    """The guard: a bulleted line of what happened now (`- Last float passed the judges at 10:45` ->
    `10:52`), a clock that says when: a value."""
    assert_values_found(fpr, "You answer for the show's office.\n- Last update: the float passed the judges at {}",
                        ["10:45", "10:52", "10:58"])


AS_OF_REPORTS = {
    "first": ("Show ring: {}", [f"As of {c}, Class {k} of 22 is being judged in the main ring"
                                for c, k in (("10:12 a.m.", 7), ("10:19 a.m.", 7), ("10:31 a.m.", 8))]),
    "after its place": ("Show control: {}", [f"Show Control advisory as of {c}: {r}" for c, r in (
        ("6:29 a.m.", "lorry park B closed for the mud"), ("6:31 a.m.", "lorry park B closed for the mud"),
        ("6:44 a.m.", "shuttle buses running late from the station"))]),
}


@pytest.mark.parametrize("form", sorted(AS_OF_REPORTS))
def test_reports_stamped_as_of_their_clock_are_values_whole(fpr, form: str) -> None:
    """Reports stamped `as of` their clock, first or after their place, a comma or a colon after the clock
    (`As of 10:12 a.m., Class 7 of 22 is being judged …`, `Show Control advisory as of 6:29 a.m.: …`): the
    newest report, whole on its first change (round 87)."""
    assert_values_whole(fpr, *AS_OF_REPORTS[form])


# ------------------------------------------------------------------ round 88
def test_a_store_order_after_three_words_and_an_abbreviation_that_rose_is_a_value_whole(fpr) -> None:
    """A shop's newest order, its number after three words, the first an abbreviation with its dots (`F.C.S.
    store order #288269 – 3 x Finisher Jacket – $420.00` -> `#288290 – 2 x bobble hat – $64.00`), risen a
    little, the rest changed: the newest entry, whole on its first change (round 88)."""
    assert_values_whole(fpr, "Store order: {}", ["F.C.S. store order #288269 – 3 x Finisher Jacket – $420.00",
                                                 "F.C.S. store order #288290 – 2 x bobble hat – $64.00",
                                                 "F.C.S. store order #288335 – 3 x medal frame – $135.00"])
    assert_values_whole(fpr, "Store order: {}", ["Club shop order No. 4471 · 2 scarves · £30.00",
                                                 "Club shop order No. 4478 · 1 programme · £4.00",
                                                 "Club shop order No. 4490 · 3 scarves · £45.00"])


def test_a_rules_number_after_three_words_edited_stays_an_edit(fpr) -> None:
    """The guard: a meeting point's number after three words and no number's sign, edited with its note
    (`Meet at gate 212 – east side` -> `gate 214 – west side`): an edit; three words lead an entry's number
    only with its sign."""
    values = ["Meet at gate 212 – east side", "Meet at gate 214 – west side"]
    got = run_value_line(fpr, "Meeting point: {}", [*values, values[1]])
    assert got[0]["cause"] == "template_change", got


def test_a_state_opening_with_an_ordinal_is_a_value_whole(fpr) -> None:
    """A contest's state that opens with the round's ordinal (`Abreise, Shuttles fahren` -> `1. Durchgang
    läuft`, `2nd heat under way`): a state replaced, whole on its first change (round 88)."""
    assert_values_whole(fpr, "Schanzenlage: {}", ["Abreise, Shuttles fahren", "1. Durchgang läuft", "Windpause"])
    assert_values_whole(fpr, "Pool status: {}", ["warm-up lanes open", "2nd heat under way", "medal ceremony"])


def test_a_numbered_rule_edited_stays_an_edit(fpr) -> None:
    """The guard: a numbered rule after its key edited in its words (`1. Check every wristband` -> `1. Check
    every ticket`): an edit."""
    got = run_value_line(fpr, "First rule: {}", ["1. Check every wristband at the gate", "1. Check every ticket at the gate",
                                                 "1. Check every ticket at the gate"])
    assert got[0]["cause"] == "template_change", got


@pytest.mark.parametrize("line", ["Note: The youth race starts at {}.",
                                  "- The youth race starts at {}; the fun run follows from 10:00 AM."])
def test_a_rules_hour_moved_back_a_little_stays_an_edit(fpr, line: str) -> None:
    """A rule's hour in a note or a bulleted rule, off the quarter hour, moved back a few minutes (`starts
    at 9:37 AM` -> `9:35 AM`): a clock read twice never goes back, so a rule's hour edited (round 88)."""
    got = run_value_line(fpr, "You answer for the race office.\n" + line, ["9:37 AM", "9:35 AM", "9:35 AM"])
    assert got[0]["cause"] == "template_change", got


# ------------------------------------------------------------------ round 89
def test_a_board_stamped_with_its_day_and_clock_in_brackets_is_a_value_whole(fpr) -> None:
    """A board stamped with the day's short name and the clock in brackets, then its words (`[Sa 12:33]
    Kirchweih – nächster Bus ab Marktplatz in 3 Min.`), the clock alone moved on: the board whole, its
    day the stamp's own (round 89)."""
    assert_values_whole(fpr, "Festuhr: {}", ["[Sa 12:33] Kirchweih – nächster Bus ab Marktplatz in 3 Min.",
                                             "[Sa 12:37] Kirchweih – nächster Bus ab Marktplatz in 3 Min.",
                                             "[Sa 12:44] Kirchweih – nächster Bus ab Marktplatz in 6 Min."])


def test_a_board_stamped_in_brackets_whose_hour_moved_on_the_half_stays_an_edit(fpr) -> None:
    """The guard: the same stamp on a programme's rule, its hour moved from the half to the hour and the
    words the same (`[Sa 12:30] Bühne öffnet …` -> `[Sa 13:00] …`): a rule's hour edited."""
    got = run_value_line(fpr, "Programm: {}", ["[Sa 12:30] Bühne öffnet mit der Blaskapelle",
                                               "[Sa 13:00] Bühne öffnet mit der Blaskapelle",
                                               "[Sa 13:00] Bühne öffnet mit der Blaskapelle"])
    assert got[0]["cause"] == "template_change", got


def test_an_entry_numbered_after_its_sign_whose_other_numbers_changed_is_a_value_whole(fpr) -> None:
    """A shop's newest order after its sign, risen a little, its count and price changed and its words
    the same (`Shop order #318204 – 1 x rain poncho – R625` -> `#318231 – 2 x rain poncho – R1 250`, the
    thousands set apart by a space): the newest entry, whole on its first change (round 89)."""
    assert_values_whole(fpr, "Shop order: {}", ["Shop order #318204 – 1 x rain poncho – R625",
                                                "Shop order #318231 – 2 x rain poncho – R1 250",
                                                "Shop order #318260 – 3 x sun hat – R600"])


def test_a_rules_numbers_edited_in_the_same_words_without_a_sign_stay_an_edit(fpr) -> None:
    """The guard: a rule's numbers edited, its words the same and no number's sign (`Gate 212 opens 2 hours
    before – R150 parking` -> `Gate 218 opens 3 hours before – R200 parking`): an edit."""
    got = run_value_line(fpr, "Parking: {}", ["Gate 212 opens 2 hours before – R150 parking",
                                              "Gate 218 opens 3 hours before – R200 parking",
                                              "Gate 218 opens 3 hours before – R200 parking"])
    assert got[0]["cause"] == "template_change", got
