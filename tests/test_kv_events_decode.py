"""KV event decoding (map and legacy array shapes) and the engine-hash -> proxy-hash indexer."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from app.engines.kv_event_decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventIndexer,
    decode_batch,
    salt_of,
)
from app.prefix.blocks import proxy_chain

B = 4
enc = msgspec.msgpack.encode


def stored_map(hashes, parent, tokens, **extra):
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": B, "lora_id": None, "medium": "GPU", "lora_name": None}
    ev.update(extra)
    return ev


def stored_array(hashes, parent, tokens, extra_keys=None):
    return ["BlockStored", hashes, parent, tokens, B, None, "GPU", None, extra_keys, 0]


def test_map_shape_as_vllm_0_33_sends_it():
    payload = enc([1.5, [stored_map([11, 12], None, list(range(8))), {"type": "AllBlocksCleared"}], 0])
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.dp_rank == 0
    assert batch.events[0] == BlockStored([11, 12], None, list(range(8)), B, medium="GPU", group_idx=0)
    assert batch.events[1] == AllBlocksCleared()


def test_legacy_array_shape_and_bytes_hashes():
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    payload = enc([2.0, [stored_array([h1], None, [1, 2, 3, 4]), ["BlockRemoved", [h2], "GPU"],
                         ["AllBlocksCleared"]]])
    batch = decode_batch(payload)
    assert batch.dp_rank is None
    assert batch.events[0].block_hashes == [h1] and batch.events[0].token_ids == [1, 2, 3, 4]
    assert batch.events[1] == BlockRemoved([h2], "GPU", 0)
    assert isinstance(batch.events[2], AllBlocksCleared)


def test_short_legacy_array_without_optional_tail():
    batch = decode_batch(enc([0.0, [["BlockStored", [5], None, [9, 9, 9, 9], 4, None]]]))
    assert batch.events[0].medium is None and batch.events[0].extra_keys is None


def test_unknown_event_types_are_skipped():
    batch = decode_batch(enc([0.0, [{"type": "SomethingNew", "x": 1}, ["Other"], 42], 0]))
    assert batch.events == []


def test_salt_from_vllm_extra_keys_and_from_field():
    assert salt_of(BlockStored([1], None, [0] * 4, 4, extra_keys=[["tenant-a"]])) == "tenant-a"
    assert salt_of(BlockStored([1], None, [0] * 4, 4, lora_name="lora1",
                               extra_keys=[["lora1", "tenant-b"]])) == "tenant-b"
    assert salt_of(BlockStored([1], None, [0] * 4, 4, extra_keys=[None])) is None
    assert salt_of(BlockStored([1], None, [0] * 4, 4, cache_salt="s")) == "s"


def test_indexer_continues_chains_from_parent_and_matches_proxy_chain():
    tokens = list(range(20))  # 5 blocks of 4
    idx = EventIndexer()
    up = idx.apply([BlockStored([101, 102], None, tokens[:8], B),
                    BlockStored([103, 104, 105], 102, tokens[8:20], B)])
    chain = proxy_chain(tokens, B)
    assert [h for kind, hs, _ in up.ops if kind == "add" for h in hs] == chain
    assert idx.map[105] == chain[4]
    assert up.counts == {"stored": 5}


def test_indexer_salted_chain_equals_salted_fingerprint():
    tokens = list(range(8))
    up = idx_apply([BlockStored([1, 2], None, tokens, B, extra_keys=[["tenant-a"], None])])
    assert up.ops == [("add", proxy_chain(tokens, B, salt="tenant-a"), None)]
    assert proxy_chain(tokens, B, salt="tenant-a") != proxy_chain(tokens, B)


def idx_apply(events):
    return EventIndexer().apply(events)


def test_indexer_removal_clear_orphans_and_other_tiers():
    idx = EventIndexer()
    idx.apply([BlockStored([1, 2], None, list(range(8)), B)])
    chain = proxy_chain(list(range(8)), B)
    up = idx.apply([BlockRemoved([2, 999])])
    assert up.ops == [("remove", [chain[1]], None)]
    assert up.counts == {"removed": 2}
    up = idx.apply([BlockStored([7], 12345, [1, 1, 1, 1], B)])  # parent never seen
    assert up.ops == [] and up.counts == {"orphan": 1}
    up = idx.apply([BlockStored([8], None, [], B, medium="CPU"), BlockRemoved([1], medium="CPU")])
    assert up.ops == [] and up.counts == {"ignored": 2}
    up = idx.apply([BlockStored([9], None, [5, 5, 5, 5], B), AllBlocksCleared(),
                    BlockStored([10], None, [6, 6, 6, 6], B)])
    assert up.ops == [("clear", [], None), ("add", proxy_chain([6, 6, 6, 6], B), None)]
    assert idx.map == {10: proxy_chain([6, 6, 6, 6], B)[0]}


def test_store_then_remove_in_one_batch_keeps_order():
    up = EventIndexer().apply([BlockStored([1], None, [3, 3, 3, 3], B), BlockRemoved([1])])
    assert [k for k, _, _ in up.ops] == ["add", "remove"]


@given(st.lists(st.integers(0, 50_000), min_size=4, max_size=64), st.integers(1, 4))
def test_any_split_of_a_sequence_into_events_gives_the_same_chain(tokens, cut):
    full = len(tokens) // B
    if full < 2:
        return
    cut = min(cut, full - 1)
    engine = list(range(1000, 1000 + full))
    up = EventIndexer().apply([BlockStored(engine[:cut], None, tokens[:cut * B], B),
                               BlockStored(engine[cut:], engine[cut - 1], tokens[cut * B:full * B], B)])
    assert [h for _, hs, _ in up.ops for h in hs] == proxy_chain(tokens, B)


def test_a_batch_with_an_event_no_engine_sends_is_malformed_whole():
    """Found by tests/test_kv_events_fuzz.py. Before, members were coerced (a float or string hash
    to an int, a block size "4" to 4, token ids given as bytes or with a bool, a group "0") and
    the block indexed under what no engine sent; others raised halfway through the batch (token
    ids with a float, extra_keys a map) after the hash map had already dropped the batch's
    removals. Each is now refused before anything is applied."""
    import pytest

    from app.engines.kv_event_decode import MalformedBatch

    toks = [1, 2, 3, 4]
    bent = [stored_map([1.5], None, toks), stored_map(["12"], None, toks), stored_map([True], None, toks),
            stored_map([None], None, toks), stored_map([1], "12", toks), stored_map([1], 2.0, toks),
            stored_map([1], None, bytes(toks)), stored_map([1], None, {t: 0 for t in toks}),
            stored_map([1], None, [1, 2, 3, True]), stored_map([1], None, [1, 2, 3, 1.5]),
            stored_map([1], None, [1, 2, 3, -1]), stored_map([1], None, [1, 2, 3, 2**32]),
            stored_map([1], None, toks, block_size="4"), stored_map([1], None, toks, block_size=4.0),
            stored_map([1], None, toks, block_size=None), stored_map([1], None, toks, group_idx="0"),
            stored_map([1], None, toks, lora_name=5), stored_map([1], None, toks, medium=[]),
            stored_map([1], None, toks, extra_keys={"a": 1}), stored_map([1], None, toks, cache_salt=5),
            {"type": "BlockStored", "parent_block_hash": None, "token_ids": toks, "block_size": B},
            ["BlockStored", [1], None, toks], stored_array([1], None, "abcd"),
            {"type": "BlockRemoved", "block_hashes": None}, {"type": "BlockRemoved", "block_hashes": [1], "medium": 5},
            {"type": "BlockRemoved", "block_hashes": 1}, ["BlockRemoved"], ["BlockRemoved", [1.0]]]
    for ev in bent:
        with pytest.raises(MalformedBatch):
            decode_batch(enc([0.0, [stored_map([7], None, toks), ev], 0]))
    for payload in [b"\xc1", enc([0.0, [stored_map([7], None, toks)], 0])[:-3], enc(5), enc([0.0]),
                    enc([0.0, 5, 0]), enc([0.0, "events", 0]), enc(["x", [], 0]), b"\x91" * 5000 + b"\xc0"]:
        with pytest.raises(MalformedBatch):
            decode_batch(payload)
    # what engines do send still decodes: SGLang's signed hashes, no token ids on another tier
    batch = decode_batch(enc([0, [stored_map([-5], None, toks), stored_map([6], None, None, medium="CPU")], None]))
    assert batch.events[0].block_hashes == [-5] and batch.events[1].token_ids == []
