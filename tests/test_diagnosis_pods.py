"""The same diagnosis with two gateway pods: two real proxies sharing one real redis-server take
one tenant's requests in turn (pod 0, pod 1, pod 0, ...), sent with the openai client to the
simulator, and every request gets the cause, spans and secondary causes one proxy alone gives.
A pod often never saw the request the new one is compared with: it reads the tenant's history
from the Store on every request and diagnoses against the other pod's text-free digest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from tests.fixtures.diagnosis_v2.build import Gen
from tests.redis_server import RedisServer
from tests.test_diagnosis_cases import (
    BOT_HELP,
    BOX_TABLE,
    CODER,
    COMMAND_FILES,
    DIGEST,
    EXCHANGES,
    FISH_COMPLETIONS,
    MAN_PAGES,
    MEMORY_RUNS,
    PLACEHOLDER,
    PROMPT_FILES,
    ROLLING,
    RUNNING_SUMMARY,
    SESSIONS,
    SHELL_FUNCTIONS,
    SYSTEM,
    TASK,
    TEMPLATED_SENTENCES,
    TOOLS,
    agent_history,
    body,
    chat_commands,
    collection,
    conversation,
    noted,
    rebuilt_history,
    said,
    schemas_in_text,
    transcript_body,
)
from tests.test_state_proxies import settle

TUNE = Path(__file__).parent / "fixtures" / "diagnosis_v2" / "tune.jsonl"
TUNE2 = TUNE.with_name("tune2.jsonl")
# issue 29's agent patterns that need more than whole-message keys in the digest: its roles (an
# agent's pinned first exchange), its history's size and last keys (a compaction), the lines of
# the first user message (a per-request value in a context block)
AGENT_FAMILIES = ("pinned_window", "context_id", "context_date", "context_nonce", "context_timestamp",
                  "compaction_claude", "compaction_codex")


def scenarios(path: Path = TUNE, families: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The first tenant of every family (of `families`) of a tuning corpus (tune: ~25 tenants, ~80
    requests)."""
    seen: set[str] = set()
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["family"] not in seen and (families is None or row["family"] in families):
            seen.add(row["family"])
            out.append(row)
    return out


def send(pods: list, tenant: str, bodies: list[dict]) -> None:
    for i, b in enumerate(bodies):
        pod = pods[i % len(pods)]
        client = OpenAI(base_url=pod.base_url, api_key="x", max_retries=0)
        client.chat.completions.create(**{**b, "model": "sim", "max_tokens": 4},
                                       extra_headers={"x-tenant-id": tenant})
        settle(pod)  # the next turn comes after this one's after-response work, as with a user typing


def verdicts(pod, tenant: str) -> list[tuple]:
    records = asyncio.run_coroutine_threadsafe(pod.services.store.history_recent(tenant, 64), pod.server.loop).result()
    return [(r.get("cause"), tuple(r.get("spans") or ()), tuple(f["cause"] for f in r.get("secondary") or ()))
            for r in records]


def agent_scenarios() -> list[tuple[str, list[dict]]]:
    """Issue 29's agent patterns the digest can follow (tests/test_diagnosis_cases.py): a sliding
    window that keeps the first user message, tool schemas written as indented JSON into the
    system text and reordered, a system note after the system prompt where the dropped exchanges
    were."""
    msgs = agent_history(9)
    window = [Gen.body(CODER, msgs[:n] if n == 7 else [msgs[0], *msgs[:n][-5:]], None, None) for n in (7, 9, 11, 13)]
    swapped = [TOOLS[2], TOOLS[0], TOOLS[1], TOOLS[3]]
    schemas = [body(f"{CODER}\n{schemas_in_text(o, 'indented')}\n{SYSTEM}", t)
               for o, t in zip([TOOLS, swapped, swapped], conversation(3), strict=True)]
    # a client that drops its oldest exchange and says so in a system note after its system prompt
    exchanges = [("Do you repair e-bikes?", "Yes, all brands."), ("How long does a service take?", "Two days."),
                 ("Can I book online?", "Yes, on the website."), ("What does it cost?", "From 89 euros."),
                 ("Is Saturday possible?", "Yes, until noon.")]

    def chat(note: str | None, first: int, last: int) -> dict:
        history = [m for q, a in exchanges[first:last] for m in ({"role": "user", "content": q},
                                                                 {"role": "assistant", "content": a})]
        notes = [] if note is None else [{"role": "system", "content": note}]
        return {"messages": [{"role": "system", "content": SYSTEM}, *notes, *history[:-1]]}

    note = "Earlier in this chat the customer asked whether e-bikes are repaired here (yes, all brands)."
    noted = [chat(None, 0, 3), chat(note, 1, 4), chat(note, 1, 5)]
    # Codex CLI's rebuilt history: the user messages kept, every reply dropped, the summary after them (round 45)
    short = agent_history(3)
    rebuilt = [Gen.body(CODER, short[:5], None, None), Gen.body(CODER, short, None, None),
               Gen.body(CODER, rebuilt_history(short, "Summary: invoices half migrated, tests green.", "Go on."), None, None)]
    return [("agent-window", window), ("agent-schemas", schemas), ("agent-note", noted), ("agent-rebuilt", rebuilt)]


def test_two_pods_agree_on_agents_patterns(sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0)
    alone = proxy_factory(sim)
    pods = [proxy_factory(sim, state=redis_proc.url) for _ in range(2)]
    expected = {"agent-window": [None, "front_trim", "front_trim", "front_trim"],
                "agent-schemas": [None, "tool_order", None], "agent-note": [None, "front_trim", None],
                "agent-rebuilt": [None, None, "compaction"]}
    for tenant, bodies in agent_scenarios():
        send([alone], tenant, bodies)
        send(pods, tenant, bodies)
        one, two = verdicts(alone, tenant), verdicts(pods[0], tenant)
        assert [v[0] for v in one] == expected[tenant], one
        assert one == two, (tenant, one, two)


def test_two_pods_alternating_give_the_answers_of_one(sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    sim = sim_factory(replicas=2, time_scale=0.0)
    alone = proxy_factory(sim, hygiene={"show_text": True})
    pods = [proxy_factory(sim, state=redis_proc.url, hygiene={"show_text": True}) for _ in range(2)]
    rows = scenarios()
    assert len(rows) >= 18
    differ = []
    for row in rows:
        tenant = row["name"]
        send([alone], tenant, row["requests"])
        send(pods, tenant, row["requests"])
        one, two = verdicts(alone, tenant), verdicts(pods[0], tenant)
        assert len(one) == len(two) == len(row["requests"])
        differ += [(tenant, i, a, b) for i, (a, b) in enumerate(zip(one, two, strict=True)) if a != b]
    assert differ == []
    stateless = next(r for r in rows if r["family"] == "stateless")
    for pod in (*pods, alone):  # every pod reports the same; new conversations are not breaks
        report = httpx.get(f"{pod.url}/hygiene/tenants/{stateless['name']}", timeout=10).json()
        assert report["new_sessions"] == len(stateless["requests"]) - 1 and report["breaks"] == 0
        assert report["last_breaks"] == []


def test_two_pods_agree_on_compactions_pinned_exchanges_and_context_block_values(
        sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    """The second tuning pool's agent patterns, each answered as labelled by one proxy and by two
    pods alternating (the second pod diagnoses against the first one's digest)."""
    sim = sim_factory(replicas=2, time_scale=0.0)
    alone = proxy_factory(sim, hygiene={"show_text": True})
    pods = [proxy_factory(sim, state=redis_proc.url, hygiene={"show_text": True}) for _ in range(2)]
    rows = scenarios(TUNE2, AGENT_FAMILIES)
    assert {r["family"] for r in rows} == set(AGENT_FAMILIES)
    for row in rows:
        tenant = row["name"]
        send([alone], tenant, row["requests"])
        send(pods, tenant, row["requests"])
        one, two = verdicts(alone, tenant), verdicts(pods[0], tenant)
        assert [v[0] for v in one] == row["labels"], (tenant, one)
        assert one == two, (tenant, one, two)


def shape_scenarios() -> list[tuple[str, list[dict], list[str | None]]]:
    """Values told by their line's form or their shape, not their key's words (tests/
    test_diagnosis_cases.py): one word or an id as a key line's whole value, an id ending in `-`, a
    date without a cue that moves on by a day (in the system text, and in the first user message's
    context block), and such a date moved by months (an edit); tools declared by markup directives
    moved and the newest entry a `Last …` key names, whole, but an id in a link there the id alone
    (round 40); commands allowed to run, named by their executables' paths, moved, and the newest
    entry whole though its note holds a range (round 41)."""
    convo = conversation(4)

    def sys_line(line: str, values: list[str]) -> list[dict]:
        return [body(f"{line.format(v)}\n{SYSTEM}", t) for v, t in zip(values, convo, strict=False)]

    def context(line: str, values: list[str]) -> list[dict]:
        return [body(CODER, [f"<context>\nWorking directory: /repo\n{line.format(v)}\nBranch: main\n</context>\n{TASK}",
                             *t[1:]]) for v, t in zip(values, convo, strict=False)]

    days = ["04/14/2026", "04/14/2026", "04/15/2026", "04/15/2026"]
    return [
        ("key-word", sys_line("release channel: {}", ["beta", "stable", "beta"]), [None, "dynamic_head", "dynamic_head"]),
        ("key-id", sys_line("Retry token: {}", ["q8ZtR2mXw0Lp-", "Hc41vNk9sTbE_", "x7Yq0PaL2mW-"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("rolled-date", sys_line("Prices as listed on {}, all taxes included.", days), [None, None, "dynamic_head", None]),
        ("moved-date", sys_line("Prices as listed on {}, all taxes included.", ["03/01/2024", "06/15/2024", "06/15/2024"]),
         [None, "template_change", None]),
        ("context-date", context("Listed on {}", days), [None, None, "dynamic_head", None]),
        ("countdown", sys_line("Budget remaining: {} tokens", ["120000", "113512", "107004"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("trace-root", sys_line("X-Trace-Id: Root={}", ["1-65f1a2b3-4c5d6e7f8a9b0c1d2e3f4a5b",
                                                         "1-65f1a2c9-9d8c7b6a5f4e3d2c1b0a9f8e",
                                                         "1-65f1a2f0-0a1b2c3d4e5f6a7b8c9d0e1f"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("context-base32", context("Instance key {}", ["JBSWYQKLMNOPRSTU", "MZXW6YTBOI3DEMRS", "NBSWY3DPEB3W64TM"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("amount", sys_line("Remaining balance for this key: ${}", ["12.40", "12.05", "11.71"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("requests-left", sys_line("You have {} requests left.", ["30", "29", "28"]), [None, "dynamic_head", "dynamic_head"]),
        ("tag-flag", sys_line("<verbosity>{}</verbosity>", ["terse", "verbose", "terse"]), [None, "dynamic_head", "dynamic_head"]),
        ("label-flag", sys_line("Region {}", ["West", "East", "West"]), [None, "dynamic_head", "dynamic_head"]),
        ("arrow-flag", sys_line("active profile -> {}", ["fast", "thorough", "fast"]), [None, "dynamic_head", "dynamic_head"]),
        ("schemas-one-line", [body(f"{SYSTEM}[AVAILABLE_TOOLS]{json.dumps(o)}[/AVAILABLE_TOOLS]", t) for o, t in zip(
            [TOOLS, [TOOLS[2], TOOLS[0], TOOLS[1], TOOLS[3]], [TOOLS[2], TOOLS[0], TOOLS[1], TOOLS[3]]], convo, strict=False)],
         [None, "tool_order", None]),
        ("trace-key", sys_line("Trace-Context: {}", ["0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736",
                                                      "5e2a1d7c9b8f4e3a2d1c0b9a8f7e6d5c"]), [None, "dynamic_head", "dynamic_head"]),
        ("elapsed", context("<session_elapsed>{}</session_elapsed>", ["3m 12s", "4m 55s", "7m 02s"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("share-left", sys_line("{}% of the monthly quota is left.", ["64", "61", "57"]), [None, "dynamic_head", "dynamic_head"]),
        ("table-share", context("| Share used | {} % |", ["38,9", "40,4", "43,0"]), [None, "dynamic_head", "dynamic_head"]),
        ("port", sys_line("Inspector at 127.0.0.1:{}", ["51234", "53871", "49822"]), [None, "dynamic_head", "dynamic_head"]),
        ("jaeger", sys_line("uber-trace-id: {}", ["a05979de10090a82:d85dd8157c063cde:0:1", "480fb395119e67fb:f91f1d28a98b2df5:0:1",
                                                  "5e2a1d7c9b8f4e3a:a1b2c3d4e5f60718:0:1"]), [None, "dynamic_head", "dynamic_head"]),
        ("wamid", context("Reply to {}", ["wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTg0QkE5RkQ3MjA5RTFEAA==",
                                         "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQ0RDc1QzE4QTlCMjcwRjNFAA==",
                                         "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQ5RTIxRjM0QjhBNzYwQzJBAA=="]),
         [None, "dynamic_head", "dynamic_head"]),
        ("position", sys_line("Vehicle position: {}", ["48.13712,11.57542", "48.13804,11.57391", "48.13911,11.57205"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("fraction", sys_line("Iteration {}", ["7/30", "8/30", "9/30"]), [None, "dynamic_head", "dynamic_head"]),
        ("countdown-duration", sys_line("x-ratelimit-reset-requests: {}", ["1m12.5s", "1m03.2s", "58.1s"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("pod", context("Handled by pod {}", ["api-gateway-7d9f8b6c5d-x2k4q", "api-gateway-7d9f8b6c5d-m8wzt",
                                              "api-gateway-7d9f8b6c5d-p5rtv"]), [None, "dynamic_head", "dynamic_head"]),
        # round 9: readings, times ago, ISO durations, stream ids, structured booleans, hour offsets,
        # yearless stamps, weak ETags, base64 JSON, tools as blocks of XML
        ("timing-key", sys_line("x-envoy-upstream-service-time-ms: {}", ["418", "1203", "377"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("reading", sys_line("Battery temperature {} °C", ["31.7", "33.2", "32.9"]), [None, "dynamic_head", "dynamic_head"]),
        ("time-ago", sys_line("The cache was warmed {} minutes ago.", ["3", "11", "26"]), [None, "dynamic_head", "dynamic_head"]),
        ("iso-duration", sys_line("Conversation age: {}", ["PT2M13S", "PT5M40S", "PT9M2S"]), [None, "dynamic_head", "dynamic_head"]),
        ("stream-id", sys_line("Kafka offset token {}", ["1767225600123-0", "1767225604551-3", "1767225611002-1"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("structured-boolean", context("Save-Data: {}", ["?0", "?1", "?0"]), [None, "dynamic_head", "dynamic_head"]),
        ("hour-offset", sys_line("Rendered at {}", ["2026-02-03 08:15:09.512+01", "2026-02-03 08:16:44.073+01",
                                                    "2026-02-03 08:19:02.930+01"]), [None, "dynamic_head", "dynamic_head"]),
        ("yearless-stamp", sys_line("Preise Stand {}", ["14.02., 07:45", "14.02., 09:12", "14.02., 11:30"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("weak-etag", sys_line("If-Match: {}", ['W/"1f4a-Qm9vdHN0cmFwIGNhY2hl0A"', 'W/"1f52-ZmlsZSBsaXN0aW5nIHYyB9"',
                                                'W/"1f60-c3RhdGUgc25hcHNob3Q3x"']), [None, "dynamic_head", "dynamic_head"]),
        ("jwt", context("Authorization: Bearer {}", ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIiwiaWF0IjoxNzY3MjI1NjAwfQ.a1B2c3D4e5F6g7H8",
                                                     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIiwiaWF0IjoxNzY3MjI1NjYwfQ.Z9y8X7w6V5u4T3s2",
                                                     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIiwiaWF0IjoxNzY3MjI1NzIwfQ.k1L2m3N4o5P6q7R8"]),
         [None, "dynamic_head", "dynamic_head"]),
        # round 10
        ("size-left", sys_line("Scratch space left: {}", ["2.4T", "2.3T", "2.1T"]), [None, "dynamic_head", "dynamic_head"]),
        ("wait-range", sys_line("Wartezeit an der Kasse: {} Minuten", ["5–10", "10–15", "0–5"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("hours-minutes", sys_line("ETA at the gate in {}.", ["4h 12m", "3h 58m", "3h 41m"]), [None, "dynamic_head", "dynamic_head"]),
        ("log-stamp", context("Log: {} [main] INFO", ["Mar-03 09:12:44.120", "Mar-03 09:15:02.981", "Mar-03 09:21:30.007"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("oracle", sys_line("SYSTIMESTAMP -> {}", ["03-MAR-26 09.12.44.120000 AM +01:00", "03-MAR-26 09.15.02.981000 AM +01:00",
                                                   "03-MAR-26 09.21.30.007000 AM +01:00"]), [None, "dynamic_head", "dynamic_head"]),
        ("german-date", sys_line("Serverzeit: {}", ["Do 3. Dez 09:12:44 CET 2026", "Do 3. Dez 09:15:02 CET 2026",
                                                    "Do 3. Dez 09:21:30 CET 2026"]), [None, "dynamic_head", "dynamic_head"]),
        ("key-clock-uhr", sys_line("Uhrzeit am Empfang: {}", ["09:12:44 Uhr", "09:15:02 Uhr", "09:21:30 Uhr"]),
         [None, "dynamic_head", "dynamic_head"]),
        # round 11
        ("unit-after-key", sys_line("Pegel Maxau: {} cm", ["512", "508", "497"]), [None, "dynamic_head", "dynamic_head"]),
        ("tag-reading", context("<Lautheit>{} LUFS</Lautheit>", ["-23,4", "-19,8", "-21,1"]), [None, "dynamic_head", "dynamic_head"]),
        ("current-value", sys_line("Current bid: £{}", ["4,300", "4,700", "5,200"]), [None, "dynamic_head", "dynamic_head"]),
        ("clock-then-date", sys_line("system__time: {}", ["Tuesday, 09:12 3 March 2026", "Tuesday, 09:40 3 March 2026",
                                                          "Tuesday, 10:05 3 March 2026"]), [None, "dynamic_head", "dynamic_head"]),
        ("url-segment", sys_line("Build scan: https://scans.example.com/s/{}", ["q7x2mf9k3ab4c", "z8n1vk5p0dq2e", "m3c9wt4h7jr6f"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("xml-tool-blocks", [body(f"{SYSTEM}\n<tools>\n" + "\n".join(XML_TOOLS[k] for k in o) + "\n</tools>\nAnswer briefly.", t)
                             for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)],
         [None, "tool_order", None]),
        # round 40
        ("latest-entry", sys_line("Last delivery: {}", ["TR4471/dock 2", "TR4476/dock 5", "TR4479/dock 1"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("latest-id-in-link", sys_line("Last search: /catalogue/search?sid={}", ["scs_1773303933246", "scs_1773304804893",
                                                                                  "scs_1773305011201"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("directive-tools", [body(f"{SYSTEM}\nTools:\n" + "\n\n".join(DIRECTIVE_TOOLS[k] for k in o) + "\nAnswer briefly.", t)
                             for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)],
         [None, "tool_order", None]),
        # round 41
        ("latest-entry-noted", sys_line("Letzte Lieferung: {}", ["L-2026/0412 (Kiefer 1,50–1,75 m)",
                                                                 "L-2026/0415 (Fichte 1,75–2,00 m)",
                                                                 "L-2026/0418 (Kiefer 2,00–2,50 m)"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("allowed-commands", [body(f"{SYSTEM}\nCommands you may run:\n" + "\n".join(SUDO_TOOLS[k] for k in o) + "\nAnswer briefly.", t)
                              for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)],
         [None, "tool_order", None]),
        # round 45
        *((name, [body(f"{SYSTEM}\nTools:\n" + "\n\n".join(entries[k] for k in o) + "\nAnswer briefly.", t)
                  for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)], [None, "tool_order", None])
          for name, entries in (("command-files", COMMAND_FILES), ("shell-functions", SHELL_FUNCTIONS),
                                ("chat-commands", chat_commands()),  # round 47
                                ("prompt-files", PROMPT_FILES), ("templated-blocks", TEMPLATED_SENTENCES),  # round 48
                                ("box-table", BOX_TABLE),  # round 49
                                ("man-pages", MAN_PAGES))),  # round 51
        # round 52: a tally with one share of a capacity changed; a transcript in one message, grown in place and compacted
        ("one-count-tally", sys_line("Rooms: {}", ["lab 3/4, studio 5/8, hall 0/20, store 2/2", "lab 3/4, studio 6/8, hall 0/20, store 2/2",
                                                   "lab 4/4, studio 6/8, hall 0/20, store 2/2"]), [None, "dynamic_head", "dynamic_head"]),
        ("transcript", [transcript_body(said(3), EXCHANGES[3][0]), transcript_body(said(4), EXCHANGES[4][0]),
                        transcript_body([DIGEST, *said(5)[4:]], EXCHANGES[5][0]),
                        transcript_body([DIGEST, *said(6)[4:]], "Customer: Thanks, see you Friday.")],
         [None, None, "compaction", None]),
        # round 53: a board stamped with its clock, opening with a count; a link's query token; a tally, one
        # count changed; a summary as a system message where there was none; a CLI's fish completions moved
        ("stamped-count", sys_line("Slipway board: {}", ["14:06 · 4/11 dinghies out · next due in: Kestrel at 14:30",
                                                         "14:13 · 4/11 dinghies out · next due in: Kestrel at 14:30",
                                                         "14:21 · 5/11 dinghies out · next due in: Kestrel at 14:30"]),
         [None, "dynamic_head", "dynamic_head"]),
        ("query-token", sys_line("Survey link: {}", [f"https://forms.example.org/f/8kQz2LmW4pXr/edit?token={t}" for t in (
            "b7Yt2KqLm9xZ4vWp8sRn3cHd6fJg1aQe", "Xq3mV8nK1zLp6wRt4yHs9dBf2cGj7aNe", "Lp9wR2tY6uQm3xKz8vHn1sBd4fCg7jAe")]),
         [None, "dynamic_head", "dynamic_head"]),
        ("kennels", sys_line("Kennels: {}", ["boarding 8 · walked 3 · groomed 2 · collected 8",
                                             "boarding 9 · walked 3 · groomed 2 · collected 8",
                                             "boarding 9 · walked 4 · groomed 2 · collected 8"]), [None, "dynamic_head", "dynamic_head"]),
        ("summary-system", [Gen.body(None, agent_history(4)[:7], None, None), Gen.body(None, agent_history(4), None, None),
                            Gen.body(None, [{"role": "system", "content": "Summary of the conversation so far: the invoices "
                                             "module is half migrated, the tests are green, and module 4 comes next."},
                                            *agent_history(4)[-2:], {"role": "user", "content": "Go on with module 4."}],
                                     None, None)], [None, None, "compaction"]),
        ("fish-completions", [body(f"{SYSTEM}\nCompletions:\n" + "\n".join(FISH_COMPLETIONS[k] for k in o) + "\nAnswer briefly.", t)
                              for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)],
         [None, "tool_order", None]),
        # round 54: the history replaced by one user message holding a tagged summary
        ("tagged-summary", [Gen.body(CODER, agent_history(4)[:7], None, None), Gen.body(CODER, agent_history(4), None, None),
                            Gen.body(CODER, [{"role": "user", "content": "<summary>\n## Task\nMigrate the invoices module "
                                              "to the new ledger API.\n## State\nModules 1 to 3 are migrated and their "
                                              "tests are green; module 4 still calls the old client in two places.\n"
                                              "## Next\nPort module 4, then the export job.\n</summary>"}], None, None)],
         [None, None, "compaction"]),
        # round 55: JSON items named as code moved; a running summary note rewritten as early turns go
        ("json-items", [body(f'{SYSTEM}\nTools (collection JSON):\n{{\n\t"item": [\n' + "\n".join(ITEMS[k] for k in o)
                             + "\n\t]\n}\nAnswer briefly.", t)
                        for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)],
         [None, "tool_order", None]),
        ("running-summary", [noted(PLACEHOLDER, agent_history(5)[:9]), noted(PLACEHOLDER, agent_history(5)),
                             noted(RUNNING_SUMMARY, agent_history(5)[4:])], [None, None, "compaction"]),
        # round 56: a summary opening a shorter history in place of its first turns
        ("summary-heads", [Gen.body(CODER, agent_history(4)[:7], None, None), Gen.body(CODER, agent_history(4), None, None),
                             Gen.body(CODER, [{"role": "user", "content": ROLLING}, *agent_history(4)[3:]], None, None)],
         [None, None, "compaction"]),
        # round 57: a tally after what it is of, longer than a short line; a match's score; a chat bot's commands moved
        ("tally-heading", sys_line("Scoreboard: {}", [f"Lane 2, Tuesday evening league, game 1 (10 throws each): {s} · "
                                                      "Bartholomew to throw" for s in TALLIES]),
         [None, "dynamic_head", "dynamic_head"]),
        ("score", sys_line("Match: {}", ["after end 4: Harriers 3 – 5 Rovers", "after end 6: Harriers 6 – 5 Rovers",
                                         "after end 7: Harriers 8 – 5 Rovers"]), [None, "dynamic_head", "dynamic_head"]),
        ("bot-help", [body(f"{SYSTEM}\nCommands of the shop's chat bot:\n" + "\n".join(BOT_HELP[k] for k in o)
                           + "\nAnswer briefly.", t)
                      for o, t in zip([[0, 1, 2, 3], [2, 0, 3, 1], [2, 0, 3, 1]], convo, strict=False)],
         [None, "tool_order", None]),
        # round 58: a tally with a note in brackets; counts each before its name, one changed
        ("tally-note", sys_line("Session: {}", SESSIONS), [None, "dynamic_head", "dynamic_head"]),
        ("counted-names", sys_line("Sightings: {}", ["2 seals, 0 otters, 1 heron, 4 kingfishers today",
                                                     "2 seals, 1 otters, 1 heron, 4 kingfishers today",
                                                     "3 seals, 1 otters, 1 heron, 5 kingfishers today"]),
         [None, "dynamic_head", "dynamic_head"]),
        # round 63: a memory that keeps only a summary, rewritten at each run's first call
        ("summary-memory", [Gen.body(CODER, run[:n], None, None) for run in MEMORY_RUNS
                            for n in ((1, 3) if len(run) == 3 else (2, 4))], [None, None, "compaction", None, "compaction", None]),
    ]


TALLIES = ["Annabel 28 · Bartholomew 26 · Catherine 26 · Dominic 23", "Annabel 35 · Bartholomew 33 · Catherine 32 · Dominic 26",
           "Annabel 38 · Bartholomew 36 · Catherine 36 · Dominic 30"]
ITEMS = collection(["order_show", "return_open", "parcel_track", "stock_count"])
SUDO_TOOLS = ["    (root) NOPASSWD: /usr/bin/systemctl restart shop-web", "    (postgres) NOPASSWD: /usr/bin/pg_dump shop",
              "    (deploy) NOPASSWD: /opt/shop/bin/release --env prod", "    (root) NOPASSWD: /usr/sbin/nginx -s reload"]
DIRECTIVE_TOOLS = [f".. py:function:: {n}\n\n   {d}" for n, d in (
    ("order_show(number)", "One order with its lines."), ("return_open(number)", "Open a return."),
    ("parcel_track(code)", "Tracking events."), ("address_set(number, address)", "Change the address."))]
XML_TOOLS = [f"<function>\n<name>{n}</name>\n<description>{d}</description>\n<parameters>\n<parameter>\n"
             f"<name>order</name>\n<type>string</type>\n</parameter>\n</parameters>\n</function>"
             for n, d in (("order_show", "One order with its lines."), ("return_open", "Open a return."),
                          ("parcel_track", "Tracking events."), ("address_set", "Change the address."))]


STATUSES = [("Lift: {}", ["14 of 20 chairs running today", "15 of 20 chairs running today", "17 of 20 chairs running today"]),
            ("Boiler: {}", ["heating, ready in 1 h 12 min", "heating, ready in 1 h 05 min", "heating, ready in 0 h 58 min"]),
            ("Order: {}", ["SO-26-00418 · two pallets", "SO-26-00419 · two pallets", "SO-26-00421 · two pallets"]),
            # round 46: a status line whose numbers changed with a time running in it
            ("Röster 2: {}", ["7. Charge von 12, seit 9 Min. in der Trommel, nächste in 6 Min.",
                              "8. Charge von 12, seit 2 Min. in der Trommel, nächste in 13 Min.",
                              "8. Charge von 12, seit 7 Min. in der Trommel, nächste in 8 Min."])]


def test_two_pods_read_a_short_status_whole(sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    """A short status whose number changed is a value whole on both paths (round 44): the second pod,
    holding only the first one's digest, widens the number it finds to the line's whole value."""
    sim = sim_factory(replicas=2, time_scale=0.0)
    alone = proxy_factory(sim, hygiene={"show_text": True})
    pods = [proxy_factory(sim, state=redis_proc.url, hygiene={"show_text": True}) for _ in range(2)]
    convo = conversation(3)
    for k, (line, values) in enumerate(STATUSES):
        bodies = [body(f"{line.format(v)}\n{SYSTEM}", t) for v, t in zip(values, convo, strict=True)]
        send([alone], f"status-{k}", bodies)
        send(pods, f"status-{k}", bodies)
        one, two = verdicts(alone, f"status-{k}"), verdicts(pods[0], f"status-{k}")
        assert [v[:2] for v in one] == [(None, ()), ("dynamic_head", (values[1],)), ("dynamic_head", (values[2],))], one
        assert one == two, (line, one, two)


def test_two_pods_agree_on_values_told_by_shape_and_dates_that_roll_over(
        sim_factory, proxy_factory, redis_proc: RedisServer) -> None:
    """The second pod has only the first one's digest: it reads the value from the current prompt
    and the previous date from the day numbers the digest keeps."""
    sim = sim_factory(replicas=2, time_scale=0.0)
    alone = proxy_factory(sim, hygiene={"show_text": True})
    pods = [proxy_factory(sim, state=redis_proc.url, hygiene={"show_text": True}) for _ in range(2)]
    for tenant, bodies, labels in shape_scenarios():
        send([alone], tenant, bodies)
        send(pods, tenant, bodies)
        one, two = verdicts(alone, tenant), verdicts(pods[0], tenant)
        assert [v[0] for v in one] == labels, (tenant, one)
        assert one == two, (tenant, one, two)
