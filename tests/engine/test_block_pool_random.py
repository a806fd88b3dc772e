"""Random operation sequences on the KV-cache manager never leak or double-count blocks."""

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet_engine.core.block_pool import NULL_BLOCK_ID
from kvfleet_engine.core.kv_cache import KVCacheManager
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import Request

BLOCK_SIZE = 2
NUM_BLOCKS = 9

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 2), min_size=1, max_size=9)),
        st.tuples(st.just("step"), st.integers(0, 20), st.integers(1, 5)),
        st.tuples(st.just("free"), st.integers(0, 20)),
    ),
    max_size=60,
)


def check_invariants(kv, live):
    pool = kv.pool
    expected = [0] * NUM_BLOCKS
    expected[NULL_BLOCK_ID] = 1
    for req in live:
        for b in req.block_ids:
            expected[b] += 1
    assert pool.ref_counts() == expected
    free_ids = pool.free_block_ids_in_order()
    assert len(free_ids) == len(set(free_ids))
    assert sorted(free_ids) == [i for i in range(1, NUM_BLOCKS) if expected[i] == 0]
    for h, block in pool._cached.items():
        assert block.block_hash == h
    for req in live:  # a request's cached blocks hold exactly its tokens
        for i in range(req.num_hashed_blocks):
            block = pool.blocks[req.block_ids[i]]
            if block.block_hash is not None:
                want = req.all_token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                assert block.token_ids == array("q", want).tobytes()


@settings(max_examples=150, deadline=None)
@given(ops, st.booleans())
def test_random_operations_leak_no_blocks(operations, enable_caching):
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_caching=enable_caching)
    live: list[Request] = []
    for n, op in enumerate(operations):
        if op[0] == "add":
            req = Request(f"r{n}", op[1], SamplingParams())
            hits, num_hit = kv.get_computed_blocks(req)
            if kv.allocate_slots(req, req.num_tokens - num_hit, hits) is not None:
                req.num_computed_tokens = num_hit
                live.append(req)
        elif op[0] == "step" and live:
            req = live[op[1] % len(live)]
            if req.num_computed_tokens == req.num_tokens:
                req.append_output(op[2] % 3)
            num_new = min(op[2], req.num_tokens - req.num_computed_tokens)
            if kv.allocate_slots(req, num_new) is not None:
                req.num_computed_tokens += num_new
                kv.cache_computed_blocks(req)
        elif op[0] == "free" and live:
            kv.free(live.pop(op[1] % len(live)))
        check_invariants(kv, live)
    for req in live:
        kv.free(req)
    check_invariants(kv, [])
    assert kv.num_free_blocks == NUM_BLOCKS - 1
    assert kv.usage() == 0.0
