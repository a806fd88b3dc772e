"""Block pool and KV-cache manager on tiny configs: exact block ids, no torch."""

import pytest
from kvfleet_engine.core.block_pool import NULL_BLOCK_ID, BlockPool, hash_block_tokens
from kvfleet_engine.core.kv_cache import KVCacheManager
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import Request


def make_request(rid, tokens):
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def compute(kv, request, num_tokens):
    """What the engine does after a step: tokens computed, full blocks registered."""
    request.num_computed_tokens += num_tokens
    kv.cache_computed_blocks(request)


# --- the pool alone ---


def test_block_zero_is_reserved_and_never_handed_out():
    pool = BlockPool(num_blocks=4, block_size=2)
    assert pool.num_free_blocks == 3
    assert [b.block_id for b in pool.allocate(3)] == [1, 2, 3]
    assert pool.num_free_blocks == 0
    assert pool.blocks[NULL_BLOCK_ID].ref_cnt == 1
    with pytest.raises(ValueError, match="cannot allocate"):
        pool.allocate(1)


def test_freed_blocks_are_reused_in_lru_order():
    pool = BlockPool(num_blocks=6, block_size=2)
    a = pool.allocate(2)  # 1, 2
    b = pool.allocate(1)  # 3
    pool.free(reversed(a))  # 2 then 1 join the tail, behind never-used 4, 5
    pool.free(b)
    assert pool.free_block_ids_in_order() == [4, 5, 2, 1, 3]
    assert [blk.block_id for blk in pool.allocate(4)] == [4, 5, 2, 1]


def test_reference_counts_keep_shared_blocks_out_of_the_free_queue():
    pool = BlockPool(num_blocks=4, block_size=2)
    (blk,) = pool.allocate(1)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free([blk])
    assert blk.ref_cnt == 1 and 1 not in pool.free_block_ids_in_order()
    pool.free([blk])
    assert blk.ref_cnt == 0 and pool.free_block_ids_in_order()[-1] == 1
    with pytest.raises(ValueError, match="double free"):
        pool.free([blk])


def test_lookup_verifies_tokens_and_parent_not_just_the_hash():
    pool = BlockPool(num_blocks=4, block_size=2)
    (blk,) = pool.allocate(1)
    h = hash_block_tokens(None, [7, 8])
    assert pool.cache_blocks([blk], [h], None, [[7, 8]]) == 1
    assert pool.lookup(h, None, [7, 8]) is blk
    assert pool.lookup(h, None, [7, 9]) is None  # a collision would not alias
    assert pool.lookup(h, 12345, [7, 8]) is None


def test_chained_hash_depends_on_parent_and_is_stable():
    a = hash_block_tokens(None, [1, 2])
    assert a == hash_block_tokens(None, [1, 2])
    assert a != hash_block_tokens(None, [2, 1])
    assert hash_block_tokens(a, [3, 4]) != hash_block_tokens(None, [3, 4])
    assert 0 <= a < 2**63
    # pinned value: routers and other processes must compute the same number
    assert a == hash_block_tokens(None, (1, 2))


# --- the manager: allocate, free, prefix hits, eviction ---


def test_allocate_covers_tokens_and_free_returns_blocks_tail_first():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    req = make_request("a", [1, 2, 3, 4, 5])
    assert kv.get_computed_blocks(req) == ([], 0)
    assert kv.allocate_slots(req, 5) == [1, 2, 3]
    assert req.block_ids == [1, 2, 3]
    assert kv.usage() == pytest.approx(3 / 7)
    compute(kv, req, 5)
    kv.free(req)
    assert req.block_ids == []
    assert kv.pool.free_block_ids_in_order() == [4, 5, 6, 7, 3, 2, 1]
    assert kv.usage() == 0.0


def test_growing_a_request_allocates_only_when_a_block_fills():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("a", [1, 2, 3])
    assert kv.allocate_slots(req, 3) == [1]
    compute(kv, req, 3)
    req.append_output(9)
    assert kv.allocate_slots(req, 1) == []  # position 3 still fits in block 1
    compute(kv, req, 1)
    req.append_output(10)
    assert kv.allocate_slots(req, 1) == [2]
    assert req.block_ids == [1, 2]


def test_prefix_hit_shares_blocks_and_counts_references():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    kv.allocate_slots(a, 5)
    compute(kv, a, 5)  # blocks 1, 2 are full and cached; 3 is partial
    b = make_request("b", [1, 2, 3, 4, 9, 9])
    hits, num_hit = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [1, 2] and num_hit == 4
    assert kv.allocate_slots(b, 2, hits) == [4]
    assert b.block_ids == [1, 2, 4]
    assert [kv.pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    kv.free(a)
    assert [kv.pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [1, 1, 0]
    assert kv.pool.free_block_ids_in_order()[-1] == 3


def test_a_hit_always_leaves_the_last_token_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    a = make_request("a", [1, 2, 3, 4])
    kv.allocate_slots(a, 4)
    compute(kv, a, 4)
    same = make_request("b", [1, 2, 3, 4])
    hits, num_hit = kv.get_computed_blocks(same)
    assert [h.block_id for h in hits] == [1] and num_hit == 2


def test_freed_cached_blocks_are_revived_by_a_hit_then_evicted_in_lru_order():
    kv = KVCacheManager(num_blocks=5, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    kv.allocate_slots(a, 5)  # 1, 2, 3
    compute(kv, a, 5)
    kv.free(a)
    assert kv.pool.free_block_ids_in_order() == [4, 3, 2, 1]
    b = make_request("b", [1, 2, 3, 4, 6])
    hits, num_hit = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [1, 2] and num_hit == 4
    assert kv.allocate_slots(b, 1, hits) == [4]  # revived 1, 2 leave the free queue
    assert kv.pool.free_block_ids_in_order() == [3]
    kv.free(b)  # tail first: 4, then 2, 1
    assert kv.pool.free_block_ids_in_order() == [3, 4, 2, 1]
    kv.drain_events()
    c = make_request("c", [9, 9, 9, 9, 9, 9, 9])
    assert kv.allocate_slots(c, 7) == [3, 4, 2, 1]  # evicts block 2's hash, then 1's
    removed = [e for e in kv.drain_events() if e.type == "BlockRemoved"]
    assert removed[0].block_hashes == [a.block_hashes[1], a.block_hashes[0]]
    assert kv.get_computed_blocks(make_request("d", [1, 2, 3, 4, 5])) == ([], 0)


def test_allocate_slots_returns_none_and_changes_nothing_when_full():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3, 4])
    assert kv.allocate_slots(a, 4) == [1, 2]
    b = make_request("b", [5, 6, 7])
    assert kv.allocate_slots(b, 3) is None
    assert b.block_ids == [] and kv.num_free_blocks == 1
    assert kv.allocate_slots(b, 2, num_reserved_blocks=1) is None  # margin respected
    assert kv.allocate_slots(b, 2) == [3]


def test_revived_hits_count_against_free_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    kv.allocate_slots(a, 5)
    compute(kv, a, 5)
    kv.free(a)  # all 3 free; 1 and 2 are cached
    big = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hits, _ = kv.get_computed_blocks(big)
    assert [h.block_id for h in hits] == [1, 2]
    # 2 revived + 3 new > 3 free: refused, and the hits stay free and cached
    assert kv.allocate_slots(big, 5, hits) is None
    assert kv.num_free_blocks == 3 and kv.pool.num_cached_blocks == 2


def test_prefix_caching_off_never_hits_or_emits():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_caching=False)
    a = make_request("a", [1, 2, 3, 4, 5])
    kv.allocate_slots(a, 5)
    compute(kv, a, 5)
    assert kv.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5])) == ([], 0)
    assert kv.drain_events() == []


def test_events_carry_chained_hashes_and_consecutive_seq():
    kv = KVCacheManager(num_blocks=8, block_size=2, clock=lambda: 42.0)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    kv.allocate_slots(a, 6)
    compute(kv, a, 3)  # one block full
    compute(kv, a, 3)  # two more
    events = kv.drain_events()
    assert [e.seq for e in events] == [0, 1]
    h1 = hash_block_tokens(None, [1, 2])
    h2 = hash_block_tokens(h1, [3, 4])
    h3 = hash_block_tokens(h2, [5, 6])
    assert events[0].type == "BlockStored" and events[0].block_hashes == [h1]
    assert events[0].parent_block_hash is None and events[0].token_ids == [1, 2]
    assert events[1].block_hashes == [h2, h3] and events[1].parent_block_hash == h1
    assert events[1].token_ids == [3, 4, 5, 6] and events[1].block_size == 2
    assert events[1].timestamp == 42.0
    assert kv.drain_events() == []


def test_duplicate_content_keeps_one_cache_entry():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    a = make_request("a", [1, 2, 3])
    b = make_request("b", [1, 2, 3])
    kv.allocate_slots(a, 3)
    kv.allocate_slots(b, 3)  # admitted in the same step: no hit yet
    compute(kv, a, 3)
    compute(kv, b, 3)
    assert kv.pool.num_cached_blocks == 1
    assert kv.pool.blocks[a.block_ids[0]].block_hash is not None
    assert kv.pool.blocks[b.block_ids[0]].block_hash is None
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 7


def test_pending_events_are_bounded_and_leave_a_seq_gap():
    kv = KVCacheManager(num_blocks=8, block_size=1, max_pending_events=2)
    for i in range(3):
        r = make_request(str(i), [i + 10, 0])
        kv.allocate_slots(r, 2)
        compute(kv, r, 1)
    assert [e.seq for e in kv.drain_events()] == [1, 2]
