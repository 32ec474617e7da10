"""Fingerprints: exact equality with the simulator's prompt ids, memo walk, inline new turns."""

from __future__ import annotations

import asyncio

import pytest

from app.config import Settings
from app.prefix.blocks import proxy_chain
from app.prefix.chain import ChainMemo, ChainNode, extend_node, root_node
from app.prefix.fingerprint import Fingerprinter, FingerprintState, prompt_input
from app.prefix.tokens import SegmentTokenizer
from app.prefix.tool_dump import engine_tools
from app.sim.tokens import load_tokenizer

SYSTEM = "You are a careful assistant. " * 400  # ~12 KB: bigger than the inline budget


@pytest.fixture(scope="module")
def fpr() -> Fingerprinter:
    return Fingerprinter(SegmentTokenizer.load())


def _sim_ids(body: dict) -> list[int]:
    sim = load_tokenizer(None)
    tools = engine_tools(body.get("tools"))  # as the (vLLM-flavoured) sim serves a chat body
    text = sim.render_chat(body["messages"], tools, body.get("add_generation_prompt", True),
                           **(body.get("chat_template_kwargs") or {}))
    return sim.encode(text)


BODIES = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Ünïcödé  \n\tq"}]},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                  {"role": "assistant", "content": "b <|im_end|> c"}, {"role": "user", "content": "d"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                              {"type": "text", "text": "part two"}]}],
     "add_generation_prompt": False},
]


@pytest.mark.parametrize("body", BODIES)
def test_complete_chain_equals_sim_ids(fpr: Fingerprinter, body: dict) -> None:
    fp = fpr.complete_sync(fpr.prepare(prompt_input("chat", body), 16))
    ids = _sim_ids(body)
    assert fp.complete and fp.num_tokens == len(ids)
    assert list(fp.block_hashes) == proxy_chain(ids, 16)
    assert list(fpr.prompt_ids(fp)) == ids


def test_cold_big_miss_is_deferred_then_warm_is_complete(fpr: Fingerprinter) -> None:
    # a head no other test memoised (a shared head would now be reused: cuts fall inside lines)
    body = {"messages": [{"role": "system", "content": "cold " + SYSTEM}, {"role": "user", "content": "q"}]}
    inp = prompt_input("chat", body)
    cold = fpr.prepare(inp, 16)
    assert not cold.complete and cold.num_tokens is None
    assert len(cold.block_hashes) == 0  # "<|im_start|>" alone fills no block
    asyncio.run(fpr.complete(cold))
    assert cold.complete and list(cold.block_hashes) == proxy_chain(_sim_ids(body), 16)
    warm = fpr.prepare(inp, 16)
    assert warm.complete and warm.block_hashes == cold.block_hashes
    # a new turn appended: still complete on the hot path (small segments encoded inline)
    body2 = {"messages": body["messages"] + [{"role": "assistant", "content": "answer"},
                                             {"role": "user", "content": "follow-up"}]}
    nxt = fpr.prepare(prompt_input("chat", body2), 16)
    assert nxt.complete and list(nxt.block_hashes) == proxy_chain(_sim_ids(body2), 16)
    assert nxt.block_hashes[:len(warm.block_hashes) - 1] == warm.block_hashes[:-1]


def test_salt_changes_every_block(fpr: Fingerprinter) -> None:
    inp = prompt_input("chat", {"messages": [{"role": "user", "content": "x " * 200}]})
    a = fpr.complete_sync(fpr.prepare(inp, 16, salt="tenant-a"))
    b = fpr.complete_sync(fpr.prepare(inp, 16, salt="tenant-b"))
    plain = fpr.complete_sync(fpr.prepare(inp, 16))
    assert not set(a.block_hashes) & set(b.block_hashes)
    assert list(a.block_hashes) == proxy_chain(list(fpr.prompt_ids(plain)), 16, salt="tenant-a")


def test_block_size_is_respected(fpr: Fingerprinter) -> None:
    inp = prompt_input("chat", {"messages": [{"role": "user", "content": "word " * 300}]})
    fp16 = fpr.complete_sync(fpr.prepare(inp, 16))
    fp64 = fpr.complete_sync(fpr.prepare(inp, 64))
    assert len(fp64.block_hashes) == fp16.num_tokens // 64
    assert list(fp64.block_hashes) == proxy_chain(list(fpr.prompt_ids(fp16)), 64)


def test_completions_and_token_ids(fpr: Fingerprinter) -> None:
    fp = fpr.complete_sync(fpr.prepare(prompt_input("completions", {"prompt": "hello " * 50}), 16))
    ids = load_tokenizer(None).encode("hello " * 50)
    assert fp.num_tokens == len(ids) and list(fp.block_hashes) == proxy_chain(ids, 16)
    fp_ids = fpr.prepare(prompt_input("completions", {"prompt": list(range(40))}), 16)
    assert fp_ids.complete and list(fp_ids.block_hashes) == proxy_chain(list(range(40)), 16)
    assert prompt_input("chat", {"messages": []}) is None


def test_extend_node_matches_chain_over_concatenation() -> None:
    ids = list(range(100))
    node = root_node("s", 16)
    chain: list[int] = []
    for cut in (3, 17, 40, 100):
        node = extend_node(node, ids[node.num_tokens:cut])
        chain.extend(node.hashes)
    assert chain == proxy_chain(ids, 16, salt="s")
    assert len(node.tail) == 100 % 16


def test_output_extension(fpr: Fingerprinter) -> None:
    inp = prompt_input("chat", {"messages": [{"role": "user", "content": "tell me " * 30}]})
    fp = fpr.complete_sync(fpr.prepare(inp, 16))
    out = list(fpr.encode_text(" The cache is warm when the prefix is stable"))
    assert list(fpr.extend_with_output(fp, out)) == proxy_chain(list(fpr.prompt_ids(fp)) + out, 16)


def test_from_settings_modes() -> None:
    exact = Fingerprinter.from_settings(Settings())
    assert exact.mode == "exact"
    approx = Fingerprinter.from_settings(Settings(prefix={"mode": "approx"}))
    assert approx.mode == "approx"
    fp = approx.complete_sync(approx.prepare(prompt_input("chat", {"messages": [{"role": "user", "content": "abcd" * 100}]}), 16))
    assert fp.complete and fp.num_tokens and fp.num_tokens < 130
    broken = Fingerprinter.from_settings(Settings(tokenizer="/nonexistent/dir"))
    assert broken.mode == "approx"
    with pytest.raises(FileNotFoundError):
        Fingerprinter.from_settings(Settings(tokenizer="/nonexistent/dir", prefix={"mode": "exact"}))


def test_token_id_prompt_hashes_only_the_inline_budget_on_the_hot_path() -> None:
    """Token-id prompts get the chat path's budget: at most inline_hash_tokens hashed in prepare
    (on the event loop), the rest in the worker pool; the completed chain is exact."""
    fpr = Fingerprinter(SegmentTokenizer.load(), inline_hash_tokens=1024)
    ids = [(i * 7919) % 50_000 for i in range(100_000)]
    fp = fpr.prepare(prompt_input("completions", {"prompt": ids}), 16)
    assert fp.state is FingerprintState.IDS and not fp.complete
    assert list(fp.block_hashes) == proxy_chain(ids[:1024], 16)  # the leading part, exact
    asyncio.run(fpr.complete(fp))
    assert fp.complete and fp.num_tokens == len(ids) and list(fp.block_hashes) == proxy_chain(ids, 16)
    small = fpr.prepare(prompt_input("completions", {"prompt": ids[:1000]}), 16)
    assert small.complete and list(small.block_hashes) == proxy_chain(ids[:1000], 16)
    fpr.close()


def test_chain_memo_eviction_frees_the_nodes() -> None:
    """An evicted chain state is freed: no descendant keeps its ancestors alive, so the memo's
    byte count is what the chain states really hold."""
    import gc
    import weakref

    memo = ChainMemo(max_bytes=20_000)
    node = memo.root(None, 16)
    refs: list[weakref.ref[ChainNode]] = []
    for turn in range(200):  # one long conversation: each state grows from the previous one
        child = extend_node(node, list(range(turn, turn + 48)))
        memo.put(node, f"turn {turn}", child)
        refs.append(weakref.ref(child))
        node = child
    del node, child
    gc.collect()
    alive = sum(1 for r in refs if r() is not None)
    assert memo.evictions > 0 and memo.bytes <= 20_000
    assert alive == len(memo)  # only what the memo still holds
