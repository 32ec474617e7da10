"""Fuzz the tracker's after-response path: any conversation, however it changes between requests,
is recorded, on one pod and on two pods sharing a Store (the second reads the first's digest).

The tracker runs after the response, and the stage that calls it catches what it raises so that
a served request never fails: an exception there drops the request from continuity, breaks and
the tenant's report with only a log line (and prefixgate_observation_errors_total). A month
spelling the detector knew and the day reader did not (`16. Jänner 2026`) did that to every
request whose head held it. The texts are drawn from pieces that reach the detector's, the
digest's and the diagnosis's special cases: dates and clocks in several languages and forms,
counters, ids, flags, list markers, tags, JSON, long one-line and many-line documents."""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.prefix.fingerprint import Fingerprinter, prompt_input
from app.prefix.sketch import build_sketch
from app.prefix.tokens import SegmentTokenizer
from app.prefix.tracker import TenantTracker, tenant_report
from app.state.memory import MemoryStore

PIECES = (
    "Today is", "As of", "Stand:", "16. Jänner 2026", "Sept. 9, 2026", "3 aout 2026", "5 mei 2026",
    "2026-04-14T09:31:07Z", "04/14/2026", "14.04.26", "Mon 22/05", "lunedì, 4.12.", "sabato", "Request ID:",
    "a1b2c3d4e5f6", "req_8f3a9c", "Queue depth: 9", "12/220", "41.2k of 128k", "limit: 5", "v1.2.3", "PT8M1S",
    "6,814", "-63 dBm", "18.42 kWh", "\n", "\n\n", "  ", "- item", "1. first", "(1) tool_a,", '{"a": 1}', "<tag>",
    "</tag>", "<ctx>value</ctx>", "key=value", "KW 46", "127.0.0.1:50242", "€12,50", "😀", "中文", "é", "\u2028",
    "\x00", "", "`code`", "# Heading", "* bullet", "|a|b|", "x" * 200, "word " * 50, "Earlier in this chat:",
    "Summary of the conversation so far:", "1775857905933-1", "0x1F", "3.14159", "Tuesday", "Wednesday",
    "heute", "today", "now", "uptime 13.4 hours", "ticket E-080", "E-081",
)
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool number {i}.",
                                           "parameters": {"type": "object", "properties": {}}}} for i in range(4)]


@pytest.fixture(scope="module")
def fingerprinter() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def text(rng: random.Random, n: int | None = None) -> str:
    out = " ".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12) if n is None else n))
    r = rng.random()
    if r < 0.03:
        out += " ".join(rng.choice(PIECES) for _ in range(2000))  # a document on one line
    elif r < 0.05:
        out += "\n".join(rng.choice(PIECES) for _ in range(3000))  # one of many lines
    return out


def conversation(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(the system messages, the history ending with a user turn)."""
    system = [{"role": "system", "content": text(rng, rng.randint(0, 20))}] if rng.random() < 0.9 else []
    if rng.random() < 0.2:
        system.append({"role": "system", "content": text(rng)})
    turns: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 6)):
        user: Any = text(rng)
        if rng.random() < 0.15:
            user = [{"type": "text", "text": text(rng)}, {"type": "text", "text": text(rng)}]
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": text(rng)}]
        if rng.random() < 0.15:
            turns[-1]["tool_calls"] = [{"id": "c1", "type": "function",
                                        "function": {"name": "tool_1", "arguments": '{"q": "x"}'}}]
            turns.append({"role": "tool", "tool_call_id": "c1", "content": text(rng)})
    turns.append({"role": "user", "content": text(rng)})
    return system, turns


def next_request(rng: random.Random, system: list[dict], turns: list[dict]) -> tuple[list[dict], list[dict]]:
    """The conversation's next request: a changed system line, the next turn, a front trim (with a
    system note or not), an edited turn, a compaction, or another conversation."""
    system, turns = [dict(m) for m in system], [dict(t) for t in turns]
    r = rng.random()
    if r < 0.25 and system:
        m = rng.choice(system)
        m["content"] = text(rng, 3) + " " + m["content"][rng.randint(0, len(m["content"])):]
    elif r < 0.5:
        turns += [{"role": "assistant", "content": text(rng)}, {"role": "user", "content": text(rng)}]
    elif r < 0.65 and len(turns) > 2:
        turns = turns[2:]
        if rng.random() < 0.5:
            system.append({"role": "system", "content": text(rng)})
    elif r < 0.8:
        rng.choice(turns)["content"] = text(rng)
    elif r < 0.9:
        turns = [{"role": "user", "content": "Summary: " + text(rng, 20)}, {"role": "user", "content": text(rng)}]
    else:
        return conversation(rng)
    return system, turns


async def observe_all(fpr: Fingerprinter, rng: random.Random) -> tuple[int, list[int]]:
    """One tenant's requests through one tracker and through two alternating on one Store, and a
    completions tenant's; returns how many were sent and how many each Store recorded."""
    one, shared = MemoryStore(), MemoryStore()
    alone, pods = TenantTracker(one), [TenantTracker(shared), TenantTracker(shared)]
    system, turns = conversation(rng)
    tools = TOOLS[:rng.randint(1, 4)] if rng.random() < 0.3 else None
    sent = rng.randint(2, 6)
    for i in range(sent):
        if i:
            system, turns = next_request(rng, system, turns)
            tools = tools[::-1] if tools and rng.random() < 0.2 else tools
        inp = prompt_input("chat", {"messages": system + turns, **({"tools": tools} if tools else {})})
        fp = fpr.complete_sync(fpr.prepare(inp, 16))
        sketch = build_sketch(inp, fp.text or "")
        await alone.observe("t", fp.block_hashes, sketch, 16)
        await pods[i % 2].observe("t", fp.block_hashes, sketch, 16)
    completions = MemoryStore()
    tracker = TenantTracker(completions)
    for _ in range(3):
        inp = prompt_input("completions", {"prompt": text(rng, 20) + "\n\n" + text(rng)})
        fp = fpr.complete_sync(fpr.prepare(inp, 16))
        await tracker.observe("c", fp.block_hashes, build_sketch(inp, fp.text or ""), 16)
    recorded = [len(await store.history_recent(tenant, 64))
                for store, tenant in ((one, "t"), (shared, "t"), (completions, "c"))]
    return sent, recorded


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))  # a seed: the conversations' texts are too large to draw piece by piece
def test_any_conversation_is_recorded_on_one_pod_and_on_two(fingerprinter: Fingerprinter, seed: int) -> None:
    sent, recorded = asyncio.run(observe_all(fingerprinter, random.Random(seed)))
    assert recorded == [sent, sent, 3]


JSON_VALUES: list[Any] = [None, True, -1, 0, 2**70, 1.5, float("nan"), float("inf"), "", "x", "12", "pod:7", ":",
                          [], [1, "a"], [[1, 2, 3]], {}, {"a": None}, {"lines": 5}]


def bent_record(rng: random.Random, rec: dict[str, Any]) -> Any:
    """A copy of `rec` as a pod of another version (or a bug) might have written it: fields
    replaced by any JSON value, the digest's members too, or no object at all."""
    if rng.random() < 0.05:
        return rng.choice(JSON_VALUES)
    out = dict(rec)
    digest = dict(out["digest"]) if isinstance(out.get("digest"), dict) else None
    for _ in range(rng.randint(1, 4)):
        if digest is not None and rng.random() < 0.5:
            digest[rng.choice(sorted(digest) or ["lines"])] = rng.choice(JSON_VALUES)
        else:
            out[rng.choice(sorted(out) or ["seq"])] = rng.choice(JSON_VALUES)
    if digest is not None and "digest" in out and isinstance(out["digest"], dict):
        out["digest"] = digest
    return out


async def observe_beside_bent_records(fpr: Fingerprinter, rng: random.Random) -> tuple[int, int]:
    """Two pods on one Store; after each request a third party appends a bent copy of its record.
    Returns (requests sent, records the two pods wrote)."""
    store = MemoryStore()
    pods = [TenantTracker(store), TenantTracker(store)]
    system, turns = conversation(rng)
    sent, recorded = rng.randint(2, 6), 0
    for i in range(sent):
        if i:
            system, turns = next_request(rng, system, turns)
        inp = prompt_input("chat", {"messages": system + turns})
        fp = fpr.complete_sync(fpr.prepare(inp, 16))
        pod = pods[i % 2]
        await pod.observe("t", fp.block_hashes, build_sketch(inp, fp.text or ""), 16)
        newest = (await store.history_recent("t", 1))[-1]
        recorded += str(newest.get("rid")).startswith(f"{pod.pod}:")  # this request's own record
        await store.history_append("t", bent_record(rng, newest))
        json.dumps(await tenant_report(store, "t"), allow_nan=False)  # served as strict JSON
    return sent, recorded


@settings(max_examples=int(os.environ.get("PREFIXGATE_TRACKER_FUZZ", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_a_record_another_pod_bent_is_read_as_unknown(fingerprinter: Fingerprinter, seed: int) -> None:
    """Records in the shared Store come from other pods, maybe of another version: whatever one
    holds, the next request is diagnosed and recorded, and the tenant's report is built."""
    sent, recorded = asyncio.run(observe_beside_bent_records(fingerprinter, random.Random(seed)))
    assert recorded == sent
