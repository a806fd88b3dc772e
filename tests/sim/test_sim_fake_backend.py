"""The simulator's model of the router benchmark's fake backend (kvfleet_sim/fake_backend.py)
against the fake backend itself (bench/kvfleet_bench/fake_backend.py, prefix_cache.py)."""

from __future__ import annotations

import random
from array import array

import pytest
from kvfleet_bench.prefix_cache import LRUPrefixCache
from kvfleet_bench.traces import prompt_text
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.sim_runner import VirtualClock
from kvfleet_router.prefix_index import ApproxPrefixIndex
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import prompt_bytes
from kvfleet_sim.fake_backend import FakeBackendEngine, FakeBackendModel
from kvfleet_sim.trace import TraceRequest, prompt_tokens


def conversations(seed: int, n: int) -> list[tuple[int, ...]]:
    """Multi-turn prompts: each turn extends an earlier one by a few new hash ids."""
    rng = random.Random(seed)
    out: list[tuple[int, ...]] = []
    next_id = 0
    for _ in range(n):
        base = rng.choice(out) if out and rng.random() < 0.6 else ()
        new = tuple(range(next_id, next_id + rng.randint(1, 6)))
        next_id += len(new)
        out.append(base + new)
    return out


def engine(model: FakeBackendModel, now: list[float]) -> FakeBackendEngine:
    return FakeBackendEngine(model, VirtualClock(0.0), lambda: now[0])


def test_its_cache_hits_what_the_fake_backends_cache_hits():
    """Same prompts in the same order: the same hits, block for block, under an LRU bound
    small enough to evict (a chain's head goes first, as the fake backend's store order
    makes it)."""
    block_chars, block_tokens, bound = 64, 8, 40
    live = LRUPrefixCache(bound, block_chars)
    sim = engine(FakeBackendModel(bound, block_tokens, 0.0, 0.0), [0.0])
    live_hits, sim_hits = [], []
    for i, ids in enumerate(conversations(1, 300)):
        live_hits.append(live.lookup_and_store(prompt_text(ids, block_chars)).num_hit_blocks)
        before = sim.kv_cache.prefix_cache_hits
        req = TraceRequest(0.0, len(ids) * block_tokens, 1, ids, block_tokens)
        sim.add_request(f"r{i}", prompt_tokens(req, i, 10**6), SamplingParams(max_tokens=1))
        sim_hits.append((sim.kv_cache.prefix_cache_hits - before) // block_tokens)
    assert sum(live_hits) > 50  # the sequence reuses prefixes, and the bound evicts some
    assert sim_hits == live_hits


def test_each_request_takes_its_own_time_with_no_batching():
    p, d = 0.004, 0.002
    now = [1.0]
    eng = engine(FakeBackendModel(100, 4, p, d, step_s=0.5), now)
    eng.add_request("a", list(range(12)), SamplingParams(max_tokens=10))  # 3 blocks missed
    now[0] = 1.01
    eng.add_request("b", list(range(8)), SamplingParams(max_tokens=1))  # 2 blocks, both hit
    assert eng.stats().num_running == 2 and eng.stats().num_waiting == 0
    assert eng.stats().kv_usage == pytest.approx(5 / 100)
    eng.clock.now_s = 1.01
    done = {}
    while eng.has_unfinished_requests():
        start = eng.clock.now_s  # the fleet releases what a step answers at its start
        for out in eng.step():
            done[out.request_id] = (start, len(out.token_ids))
    # answered at their own completion time, not earlier (nor a step later)
    assert done["a"][0] == pytest.approx(1.0 + 3 * p + 10 * d, abs=1e-9)
    assert done["b"][0] == pytest.approx(1.01 + 1 * d, abs=1e-9)  # not behind "a"
    assert done["a"][1] == 10 and done["b"][1] == 1
    assert eng.stats().kv_usage == 0.0


def test_a_hash_id_is_as_many_bytes_to_the_router_both_ways():
    """Live a hash id is `block_chars` characters of text; in the simulator `block_chars / 8`
    token ids, which the router packs 8 bytes each: its prefix index sees as many blocks."""
    block_chars = 512
    size = block_chars // array("q").itemsize
    ids = (3, 1, 4, 1, 5)
    req = TraceRequest(0.0, len(ids) * size, 1, ids, size)
    tokens = prompt_tokens(req, 0, 10**6)
    idx = ApproxPrefixIndex()
    sim_blocks = idx.hash_bytes(prompt_bytes(RequestInfo(prompt_token_ids=tokens)))
    live_blocks = idx.hash_text(prompt_text(ids, block_chars))
    assert len(sim_blocks) == len(live_blocks) == len(ids) * block_chars // idx.block_bytes
    # shared hash ids, shared leading blocks
    other = prompt_tokens(TraceRequest(0.0, 3 * size, 1, (3, 1, 9), size), 1, 10**6)
    again = idx.hash_bytes(prompt_bytes(RequestInfo(prompt_token_ids=other)))
    k = 2 * block_chars // idx.block_bytes
    assert again[:k] == sim_blocks[:k] and again[k] != sim_blocks[k]
