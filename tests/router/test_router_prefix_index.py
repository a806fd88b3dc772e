import json

import pytest
from kvfleet_engine.contract import KVEvent
from kvfleet_router.prefix_index import ApproxPrefixIndex, ChainIndex, PreciseKVIndex, hash_tokens


def test_text_chain_only_full_blocks_and_prefix_property():
    idx = ApproxPrefixIndex(block_bytes=4, max_blocks_per_endpoint=100)
    a = idx.hash_text("abcdefghij")  # 2 full blocks, tail "ij" ignored
    b = idx.hash_text("abcdefgh")
    c = idx.hash_text("abcdXXgh")
    assert len(a) == 2 and a == b
    assert c[0] == a[0] and c[1] != a[1]  # chained: same first block, different second


def test_match_counts_leading_blocks_per_endpoint():
    idx = ApproxPrefixIndex(block_bytes=2, max_blocks_per_endpoint=100)
    idx.record("e0", idx.hash_text("aabbcc"))
    idx.record("e1", idx.hash_text("aabbdd"))
    assert idx.match(idx.hash_text("aabbccee")) == {"e0": 3, "e1": 2}
    assert idx.match(idx.hash_text("zz")) == {}
    assert idx.match([]) == {}


def test_lru_bound_evicts_a_chains_tail_first_and_refreshes_on_record():
    idx = ChainIndex(max_blocks_per_endpoint=3)
    idx.record("e", [1, 2, 3])
    idx.record("e", [4])  # full: the oldest is the chain's tail, block 3
    assert idx.num_blocks("e") == 3
    assert idx.match([1, 2, 3]) == {"e": 2}
    idx.record("e", [1])  # refresh the head: now 2 is the oldest
    idx.record("e", [5])
    assert idx.match([1, 2]) == {"e": 1}
    assert idx.match([4]) == {"e": 1} and idx.match([5]) == {"e": 1}
    idx.forget_endpoint("e")
    assert idx.match([1]) == {} and idx.num_blocks("e") == 0


def test_match_reports_where_each_endpoint_drops_out():
    idx = ChainIndex(max_blocks_per_endpoint=100)
    idx.record("a", [1, 2, 3, 4])
    idx.record("b", [1, 2])
    idx.record("c", [1, 2, 3])
    assert idx.match([1, 2, 3, 4, 5]) == {"a": 4, "b": 2, "c": 3}
    assert idx.match([1]) == {"a": 1, "b": 1, "c": 1}
    assert idx.match([9, 1]) == {}


def test_eviction_in_the_middle_cuts_the_prefix():
    idx = ChainIndex(max_blocks_per_endpoint=10)
    idx.record("e", [1, 2, 3])
    idx.remove("e", [2])
    assert idx.match([1, 2, 3]) == {"e": 1}


def stored(seq, hashes, tokens, parent=None, size=2):
    return KVEvent(seq=seq, type="BlockStored", block_hashes=hashes, parent_block_hash=parent,
                   token_ids=tokens, block_size=size)


def test_precise_index_rehashes_token_blocks_and_follows_removals():
    idx = PreciseKVIndex()
    assert idx.apply("e0", stored(0, [111, 222], [1, 2, 3, 4]))
    assert idx.apply("e0", stored(1, [333], [5, 6], parent=222))
    assert idx.block_sizes["e0"] == 2
    query = hash_tokens([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(query) == 3
    assert idx.match(query) == {"e0": 3}
    assert idx.apply("e0", KVEvent(seq=2, type="BlockRemoved", block_hashes=[222]))
    assert idx.match(query) == {"e0": 1}
    assert idx.apply("e0", KVEvent(seq=3, type="AllBlocksCleared", block_hashes=[]))
    assert idx.match(query) == {}


def test_precise_index_resets_on_a_sequence_gap_and_skips_orphans():
    idx = PreciseKVIndex()
    idx.apply("e0", stored(0, [1], [1, 2]))
    assert not idx.apply("e0", stored(5, [9], [7, 8], parent=42))  # gap -> reset; orphan skipped
    assert idx.match(hash_tokens([1, 2], 2)) == {}
    assert idx.match(hash_tokens([7, 8], 2)) == {}
    idx.apply("e0", stored(6, [1], [1, 2], size=0))  # no block size: ignored, not a crash
    assert idx.match(hash_tokens([1, 2], 2)) == {}
    # Fewer tokens than its blocks hold: the chain cannot be re-hashed, so it is skipped
    # (not stored under hashes of partial blocks).
    idx.apply("e0", stored(7, [1, 2], [1, 2, 3]))
    assert idx.num_blocks("e0") == 0 and idx.match(hash_tokens([1, 2, 3, 4], 2)) == {}
    idx.apply("e0", stored(8, [1, 2], [1, 2, 3, 4]))  # exactly enough: stored
    assert idx.match(hash_tokens([1, 2, 3, 4], 2)) == {"e0": 2}


def test_blocks_of_one_token_and_one_byte_are_blocks():
    idx = PreciseKVIndex()
    idx.apply("e", stored(0, [7, 8], [5, 6], size=1))
    assert idx.match(hash_tokens([5, 6], 1)) == {"e": 2}
    text = ApproxPrefixIndex(block_bytes=1, max_blocks_per_endpoint=10)
    assert len(text.hash_text("abc")) == 3
    with pytest.raises(ValueError):
        ApproxPrefixIndex(block_bytes=0)


def test_two_engines_same_tokens_match_both():
    idx = PreciseKVIndex()
    idx.apply("a", stored(0, [10], [1, 2]))
    idx.apply("b", stored(0, [99], [1, 2]))  # different engine hashes, same tokens
    assert idx.match(hash_tokens([1, 2], 2)) == {"a": 1, "b": 1}


def test_apply_line_tolerates_garbage_and_long_events():
    from kvfleet_router.kv_events import apply_line

    idx = PreciseKVIndex()
    apply_line(idx, "e", b"not json")
    apply_line(idx, "e", b'{"type": "BlockStored"}')  # no seq
    apply_line(idx, "e", b"")
    tokens = list(range(40000))  # a ~250 KB line
    line = json.dumps({"seq": 0, "type": "BlockStored", "block_hashes": list(range(2500)),
                       "token_ids": tokens, "block_size": 16}).encode()
    apply_line(idx, "e", line)
    assert idx.match(hash_tokens(tokens, 16)) == {"e": 2500}


def test_a_shared_block_keeps_its_other_owners_when_one_drops_it():
    idx = ChainIndex(max_blocks_per_endpoint=100)
    for e in ("a", "b", "c"):
        idx.record(e, [1, 2])
    idx.remove("a", [1, 2])  # two owners left: both still hold the chain
    assert idx.match([1, 2]) == {"b": 2, "c": 2}
    idx.remove("b", [2])  # one owner left of block 2
    assert idx.match([1, 2]) == {"b": 1, "c": 2}
    idx.forget_endpoint("c")
    assert idx.match([1, 2]) == {"b": 1}


def test_evicting_a_shared_block_from_one_endpoint_leaves_it_with_the_other():
    idx = ChainIndex(max_blocks_per_endpoint=2)
    idx.record("a", [1, 2])
    idx.record("b", [1, 2])
    idx.record("a", [7])  # a is full: its oldest block, 2 (the chain's tail), goes
    assert idx.match([1, 2]) == {"a": 1, "b": 2}
    idx.record("a", [8, 9])  # and now block 1 too
    assert idx.match([1, 2]) == {"b": 2}
    assert idx.num_blocks("a") == 2 and idx.num_blocks("b") == 2
