"""Tenant tracker: longest seen prefix, bounded memory, records and counters through the Store."""

from __future__ import annotations

import pytest

from app.prefix.sketch import RequestSketch
from app.prefix.tracker import (
    PAST_RECORDS,
    TenantTracker,
    longest_known_prefix,
    sample_chain,
    sampled_prefix,
    tenant_report,
)
from app.state.memory import MemoryStore


def chain(prefix: int, n: int, tag: int) -> list[int]:
    """Blocks shared by every chain with the same first `prefix` ids, then chain-specific ones."""
    return list(range(prefix)) + [tag * 1_000_000 + i for i in range(n - prefix)]


def test_longest_known_prefix_binary_search() -> None:
    known = {1, 2, 3}
    assert longest_known_prefix([1, 2, 3, 4], known) == 3
    assert longest_known_prefix([9, 8, 7], known) == 0
    assert longest_known_prefix([], known) == 0


def test_sample_gives_lower_bound() -> None:
    c = list(range(1000))
    s = sample_chain(c)
    assert len(s) <= 40 and s[0] == [0, 0] and s[-1] == [999, 999]
    assert sampled_prefix(c, s) == 1000
    other = c[:500] + [-1] * 500
    assert 256 <= sampled_prefix(other, s) <= 500


async def test_continuity_and_counters() -> None:
    store = MemoryStore()
    tr = TenantTracker(store)
    first = await tr.observe("t", chain(0, 10, 1), None, 16)
    assert first.matched_blocks == 0 and first.continuity == 0.0
    second = await tr.observe("t", chain(0, 10, 1) + [42, 43], None, 16)
    assert second.matched_blocks == 10 and abs(second.continuity - 10 / 12) < 1e-9
    other_tenant = await tr.observe("u", chain(0, 10, 1), None, 16)
    assert other_tenant.matched_blocks == 0  # tenants never see each other's history
    counters = await store.counters("t")
    assert counters["requests"] == 2 and counters["blocks"] == 22 and counters["matched_blocks"] == 10
    report = await tenant_report(store, "t")
    assert report["requests"] == 2 and abs(report["continuity"] - 10 / 22) < 1e-9


async def test_generated_blocks_count_as_history() -> None:
    tr = TenantTracker(MemoryStore())
    await tr.observe("t", [1, 2, 3], None, 16, extra_chain=[4, 5])
    obs = await tr.observe("t", [1, 2, 3, 4, 5, 6], None, 16)
    assert obs.matched_blocks == 5


@pytest.mark.parametrize("repeat", [30, 3000])  # 3000: diagnosed in a worker thread
async def test_break_is_diagnosed_and_reported(repeat: int) -> None:
    store = MemoryStore()
    tr = TenantTracker(store, show_text=False)
    body = "You are helpful. Static policy text follows.\n" * repeat
    p = RequestSketch("Current time: 2026-04-14T09:31:07Z\n" + body, kind="completions", tail_start=10_000)
    c = RequestSketch("Current time: 2026-04-14T09:33:00Z\n" + body, kind="completions", tail_start=10_000)
    await tr.observe("t", chain(0, 20, 1), p, 16)
    obs = await tr.observe("t", chain(0, 20, 2), c, 16)
    assert obs.diagnosis is not None and obs.diagnosis.cause == "dynamic_head"
    report = await tenant_report(store, "t")
    assert report["breaks_by_cause"] == {"dynamic_head": 1}
    last = report["last_breaks"][0]
    assert last["cause"] == "dynamic_head" and last["block_index"] == 0 and last["token_offset"] == 0
    assert "2026" not in last["snippet"] and "policy" not in last["snippet"] and last["spans"] == []
    assert last["span_kinds"] == ["timestamp"]


async def test_cross_pod_fallback_uses_store_samples() -> None:
    store = MemoryStore()
    await TenantTracker(store).observe("t", list(range(100)), None, 16)
    other_pod = TenantTracker(store)
    obs = await other_pod.observe("t", list(range(100)) + [7], None, 16)
    assert obs.matched_blocks == 100


async def test_memory_is_bounded() -> None:
    tr = TenantTracker(MemoryStore(), max_hashes=1000, tenant_max_hashes=300, max_tenants=5,
                       texts_bytes=5000, texts_per_tenant=2)
    for t in range(12):
        for r in range(4):
            sk = RequestSketch("x" * 1000, kind="completions")
            await tr.observe(f"t{t}", chain(0, 100, t * 10 + r), sk, 16)
    assert tr.hash_count <= 1000
    assert len(tr._tenants) <= 5
    assert tr._text_bytes <= 5000
    assert tr.evictions > 0
    state = tr._tenants["t11"]
    assert state.tree.size <= 300


async def test_trimmed_history_stays_prefix_closed() -> None:
    """Requests share a 60-block head; trimming the oldest ones must keep the head the newer ones
    still hold: every block the tracker knows has its parent known too, so a shared prefix is never
    reported shorter than it is (a hole at block i hides every block after it)."""
    tr = TenantTracker(MemoryStore(), tenant_max_hashes=300)
    chains = [chain(60, 100, tag) for tag in range(1, 9)]  # 60 shared + 40 own blocks each
    for c in chains:
        await tr.observe("t", c, None, 16)
    known = tr._tenants["t"].tree.held()
    assert len(known) <= 300 and tr.evictions > 0  # trimmed: 8 x 40 own blocks alone exceed 300
    for c in chains:
        kept = [h in known for h in c]
        assert kept == sorted(kept, reverse=True), "a known block whose parent was dropped"
        assert all(kept[:60]), "the head the newer requests still hold was dropped"
    assert longest_known_prefix(chains[-1], known) == 100
    assert longest_known_prefix(chain(60, 100, 99), known) == 60


async def test_two_pods_share_history_through_redis(redis_server, redis_namespace) -> None:
    from app.state.redis import RedisStore

    stores = [RedisStore(redis_server.url, namespace=redis_namespace) for _ in range(2)]
    for s in stores:
        await s.start()
    try:
        pod_a, pod_b = TenantTracker(stores[0]), TenantTracker(stores[1])
        body = "Static policy text, the same in every request.\n" * 30
        p = RequestSketch("Request ID: a81f3c9e\n" + body, kind="completions", tail_start=10_000)
        c = RequestSketch("Request ID: 77be01d4\n" + body, kind="completions", tail_start=10_000)
        await pod_a.observe("t", list(range(40)), p, 16)
        obs = await pod_b.observe("t", list(range(40)) + [99], c, 16)  # pod b never saw request 1
        assert obs.matched_blocks == 40  # found through the record's chain sample in Redis
        await pod_a.observe("t", chain(0, 40, 3), c, 16)
        report = await tenant_report(stores[1], "t")
        assert report["requests"] == 3
        assert report["breaks_by_cause"] == {"dynamic_head": 1}
        assert report["last_breaks"][0]["span_kinds"] == ["id"]
    finally:
        for s in stores:
            await s.close()


async def test_what_another_writer_left_in_redis_is_read_around(redis_server, redis_namespace) -> None:
    """A tenant's history list and counters in Redis holding what no pod writes (an entry that is
    not JSON or not an object, a record with members of other types, a counter that is no
    number: a hand edit, another version): the next request is tracked and the report is built
    from the rest, as strict JSON. Reading such a list or hash raised before."""
    import json

    from app.state.redis import RedisStore

    store = RedisStore(redis_server.url, namespace=redis_namespace)
    await store.start()
    try:
        pod = TenantTracker(store)
        body = "Static policy text, the same in every request.\n" * 30
        await pod.observe("t", list(range(40)), RequestSketch("Request ID: a81f3c9e\n" + body, kind="completions",
                                                              tail_start=10_000), 16)
        for item in (b"not json", b"[1, 2]", b'"text"', b'{"sample": 5, "turn": {"a": 1}, "blocks": "x", "cause": 7}',
                     b'{"rid": ["p", 1], "digest": [], "matched": -3, "continuity": 1e300}'):
            await store.client.rpush(store.keys.history("t"), item)
        # (fields no pod increments: Redis itself refuses HINCRBYFLOAT on a value that is no float)
        await store.client.hset(store.keys.counters("t"), mapping={"bill_s:x": "abc", "bill_tokens:x": "nan",
                                                                   "bill_breaks:x": "1", b"\xff": "1"})
        obs = await pod.observe("t", list(range(40)) + [99], RequestSketch("Request ID: 77be01d4\n" + body,
                                                                           kind="completions", tail_start=10_000), 16)
        assert obs.matched_blocks == 40
        report = await tenant_report(store, "t")
        json.dumps(report, allow_nan=False)
        assert report["requests"] == 2 and report["window"] == 4  # the pod's two and the two other objects
        assert report["bill"]["x"]["breaks"] == 1 and report["bill"]["x"]["tokens"] == 0
    finally:
        await store.close()


def _chat_sketch(system: str, *turns: str):
    from app.prefix.fingerprint import prompt_input
    from app.prefix.sketch import build_sketch

    body = {"messages": [{"role": "system", "content": system}]
            + [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]}
    text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in body["messages"]) + "<|assistant|>"
    return build_sketch(prompt_input("chat", body), text)


POLICY = "".join(f"Rule {i}: answer from the handbook and cite the section.\n" for i in range(30))


async def test_report_separates_new_conversations_from_breaks() -> None:
    store = MemoryStore()
    tr = TenantTracker(store)
    head = "Current time: 09:31:07\n" + POLICY
    for i, q in enumerate(["Where is my parcel?", "Can I return boots?", "Do you price match?"]):
        await tr.observe("t", chain(40, 44, i), _chat_sketch(head, q), 16)  # stateless: 40 shared blocks
    await tr.observe("t", chain(0, 44, 9), _chat_sketch(head.replace("09:31:07", "09:32:55"), "Where is it?"), 16)
    report = await tenant_report(store, "t")
    assert report["new_sessions"] == 2 and report["breaks"] == 1
    assert report["breaks_by_cause"] == {"new_session": 2, "dynamic_head": 1}
    assert report["unmatched_blocks"] == {"new_session": 8, "break": 44, "compaction": 0}
    assert [b["cause"] for b in report["last_breaks"]] == ["dynamic_head"]  # operators see only what to fix
    # only a break's record carries the /ui view (what `last_breaks` shows): a new conversation's
    # record stays small in the shared Store, and its view is not built on the loop
    records = await store.history_recent("t", 10)
    assert [(r.get("cause"), "view" in r, "structure" in r) for r in records] == [
        (None, False, False), ("new_session", False, False), ("new_session", False, False),
        ("dynamic_head", True, True)]


@pytest.mark.parametrize("dated", ["16. Jänner 2026", "Sept. 9, 2026", "3 aout 2026"])
async def test_a_head_dated_in_any_spelling_of_a_month_is_recorded(dated: str) -> None:
    """A system prompt dated with a month spelling the detector knew but the day reader did not
    (Austria's `Jänner`, `Sept`, French without accents) made the request's digest raise, and the
    after-response work dropped the request: no record, no continuity, no break."""
    store = MemoryStore()
    tr = TenantTracker(store)
    head = f"Prices as listed on {dated}, taxes included.\n" + POLICY
    for i, q in enumerate(["Where is my parcel?", "Can I return boots?"]):
        await tr.observe("t", chain(40, 44, i), _chat_sketch(head, q), 16)
    records = await store.history_recent("t", 10)
    assert [r.get("cause") for r in records] == [None, "new_session"]


async def test_records_hold_no_prompt_text() -> None:
    store = MemoryStore()
    tr = TenantTracker(store, show_text=False)
    await tr.observe("t", chain(0, 20, 1), _chat_sketch("Secret zebra policy.\n" + POLICY, "my password is hunter2"), 16)
    await tr.observe("t", chain(0, 20, 2), _chat_sketch("Secret zebra policy!\n" + POLICY, "my password is hunter2"), 16)
    raw = str(await store.history_recent("t", 10))
    assert "zebra" not in raw and "hunter2" not in raw and "handbook" not in raw


async def test_a_pod_without_the_previous_text_diagnoses_from_its_digest() -> None:
    """The date rolls over on request 1 (pod b): pod b never saw request 0's text, only its record."""
    store = MemoryStore()
    pod_a, pod_b = TenantTracker(store, show_text=True), TenantTracker(store, show_text=True)
    turns = ["Where is my parcel?", "It left the depot.", "When will it arrive?"]
    first = await pod_a.observe("t", chain(0, 30, 1), _chat_sketch("Heute ist der 14.04.2026.\n" + POLICY, turns[0]), 16)
    assert first.diagnosis is None
    obs = await pod_b.observe("t", chain(0, 34, 2), _chat_sketch("Heute ist der 15.04.2026.\n" + POLICY, *turns), 16)
    assert obs.diagnosis is not None and obs.diagnosis.cause == "dynamic_head"
    assert [s.text for s in obs.diagnosis.spans] == ["15.04.2026"]


async def test_many_conversations_on_one_tenant_are_no_false_breaks() -> None:
    """Twenty users' chats interleaved: each one's previous request is gone from the four texts a
    tenant keeps and from the records read back, yet a continuing chat is no break (only its head
    can be compared)."""
    users = PAST_RECORDS + 4
    tr = TenantTracker(MemoryStore(), texts_per_tenant=4)
    history: dict[int, list[str]] = {u: [] for u in range(users)}
    causes = []
    for turn in range(3):
        for u in range(users):
            history[u] += [f"user {u} asks question {turn} about order {1000 + u}"]
            obs = await tr.observe("t", chain(40, 44 + 8 * turn, u * 10 + turn), _chat_sketch(POLICY, *history[u]), 16)
            causes.append(obs.diagnosis.cause if obs.diagnosis else None)
            history[u] += [f"answer {turn} for user {u}"]
    assert set(causes[users:]) <= {None}  # turn 0 of each user: a new conversation; then continuing chats
    assert set(causes[1:users]) == {"new_session"}


async def test_a_continuing_conversation_is_not_diagnosed_and_a_break_is_off_the_loop(monkeypatch) -> None:
    """Turns that continue the conversation in full cost no diagnosis; a changed system prompt of a
    large prompt pair is diagnosed in the diagnosis thread, not on the event loop's thread."""
    import threading

    from app.prefix import tracker as tracker_module
    threads: list[str] = []
    real = tracker_module.diagnose

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(tracker_module, "diagnose", spy)
    tr = TenantTracker(MemoryStore())
    turns: list[str] = []
    full: list[int] = []
    for k in range(6):  # each turn's chain holds the whole previous prompt's chain
        turns += [f"question {k} about order {4000 + k}"]
        full = full + [10_000 * (k + 1) + i for i in range(8)]
        obs = await tr.observe("t", full, _chat_sketch(POLICY, *turns), 16)
        assert obs.diagnosis is None
        turns += [f"answer {k}"]
    assert tr.diagnoses == 0 and threads == []
    edited = [7] + full[1:]  # the system prompt changed: block 0 differs
    big = POLICY * 40  # over INLINE_DIAGNOSE_CHARS with the previous prompt: a diagnosis thread's job
    obs = await tr.observe("t", edited, _chat_sketch("Edited. " + big, *turns[:-1]), 16)
    assert obs.diagnosis is not None and obs.diagnosis.cause == "template_change"
    assert tr.diagnoses == 1 and threads and all(t.startswith("prefixgate-diagnose") for t in threads)
    assert threading.current_thread().name not in threads


@pytest.mark.parametrize("repeat", [1, 40])  # 40: a prompt pair diagnosed in the diagnosis thread
async def test_a_diagnosis_that_raises_leaves_the_request_recorded_undiagnosed(monkeypatch, caplog, repeat: int) -> None:
    """A bug in the diagnosis (it raised on a prompt it was not written for) costs that request its
    cause, never its record: the continuity and the chain are kept, the record says `diagnosed:
    false`, the failure is counted, and the log names where it raised without the exception's
    message (which may quote the prompt)."""
    from app.prefix import tracker as tracker_module

    def broken(*args, **kwargs):
        raise ValueError("invalid literal for int(): 'SECRET-PROMPT-TEXT'")

    monkeypatch.setattr(tracker_module, "diagnose", broken)
    store = MemoryStore()
    tr = TenantTracker(store)
    await tr.observe("t", chain(0, 20, 1), _chat_sketch(POLICY * repeat, "first question"), 16)
    obs = await tr.observe("t", [7] + chain(1, 20, 1), _chat_sketch("Edited. " + POLICY * repeat, "first question"), 16)
    assert obs.diagnosis is None and obs.continuity == 0.0
    records = await store.history_recent("t", 8)
    assert len(records) == 2 and records[-1]["diagnosed"] is False
    assert tr.diagnoses_failed == 1
    assert "ValueError" in caplog.text and "SECRET-PROMPT-TEXT" not in caplog.text
