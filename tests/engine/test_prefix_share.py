"""Peer prefix sharing in the core: export a cached run on one engine, install it on another.

Engines here are real `LLMEngine`s over the simulated runner with its KV check on (a
token is a function of the KV slots the block table points at, so wrong or missing KV
changes the output) and over the torch runner with the tiny random Llama.
"""

from __future__ import annotations

import pytest
from kvfleet_engine.core import prefix_share
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.kv_transfer import KVTransferError, make_header
from kvfleet_engine.core.prefix_share import PrefixMismatch, chained_hashes, check_export
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import PrefixKV
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock

BS = 4
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
PROMPT = [(7 * i + 3) % 250 for i in range(23)]  # 5 usable full blocks of 4, then 3 tokens


def sim_engine(num_blocks: int = 64, max_model_len: int = 128) -> LLMEngine:
    config = EngineConfig(num_blocks=num_blocks, block_size=BS, max_num_batched_tokens=64,
                          max_model_len=max_model_len, kv_safety_margin=0.0)
    clock = VirtualClock()
    runner = SimulatedRunner("cpu-tiny", num_blocks=num_blocks, block_size=BS, vocab_size=260,
                             time_mode="virtual", clock=clock)
    return LLMEngine(config, runner, eos_token_ids=(), clock=clock)


def run(engine: LLMEngine, rid: str, prompt: list[int], **kw) -> tuple[list[int], int]:
    engine.add_request(rid, prompt, SamplingParams(max_tokens=6, temperature=0), **kw)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.is_finished:
                return list(out.token_ids), out.num_cached_tokens


def exported(engine: LLMEngine, prompt: list[int], num_blocks: int) -> PrefixKV:
    out = engine.export_prefix(chained_hashes(prompt, BS, num_blocks), num_blocks)
    return PrefixKV(out.block_hashes, out.data)


def test_installed_prefix_gives_the_same_tokens_and_counts_as_a_hit():
    peer, engine, fresh = sim_engine(), sim_engine(), sim_engine()
    want, _ = run(peer, "warm", PROMPT)
    prefix = exported(peer, PROMPT, 5)
    assert len(prefix.block_hashes) == 5
    engine.drain_kv_events()
    installed = engine.add_request("r", PROMPT, SamplingParams(max_tokens=6, temperature=0),
                                   prefix_kv=prefix)
    assert (installed.num_written, installed.num_local, installed.is_no_room) == (5, 0, False)
    stored = [h for e in engine.drain_kv_events() if e.type == "BlockStored"
              for h in e.block_hashes]
    assert stored == prefix.block_hashes  # announced like any cached block
    got = None
    while got is None:
        for out in engine.step():
            if out.is_finished:
                got = out
    assert list(got.token_ids) == want == run(fresh, "f", PROMPT)[0]
    assert got.num_cached_tokens == 5 * BS
    assert engine.stats().prefix_cache_hits == 5 * BS
    assert engine._pins == {} and engine._num_pinned == 0
    assert engine.kv_cache.usage() == 0.0  # every reference handed back


def test_wrong_bytes_are_caught_by_the_output_not_hidden():
    """The simulated KV check is real: garbage bytes under the right hashes change tokens,
    which is why the importer verifies hashes and tokens before it installs anything."""
    peer, engine = sim_engine(), sim_engine()
    want, _ = run(peer, "warm", PROMPT)
    prefix = exported(peer, PROMPT, 5)
    garbage = PrefixKV(prefix.block_hashes, bytes(len(prefix.data)))
    assert run(engine, "r", PROMPT, prefix_kv=garbage)[0] != want


def test_hashes_that_are_not_the_prompts_install_nothing():
    peer, engine = sim_engine(), sim_engine()
    want, _ = run(peer, "warm", PROMPT)
    prefix = exported(peer, PROMPT, 5)
    wrong = PrefixKV([h ^ 1 for h in prefix.block_hashes], prefix.data)
    installed = engine.add_request("r", PROMPT, GREEDY, prefix_kv=wrong)
    assert installed.num_blocks == 0 and not installed.is_no_room
    # a prefix whose third hash is wrong: only the first two are used
    half = PrefixKV(prefix.block_hashes[:2] + [1, 2, 3], prefix.data)
    assert sim_engine().add_request("r", PROMPT, GREEDY, prefix_kv=half).num_written == 2
    assert run(engine, "x", PROMPT)[0] == want


def test_blocks_cached_locally_are_reused_not_overwritten():
    peer, engine = sim_engine(), sim_engine()
    want, _ = run(peer, "warm", PROMPT)
    run(engine, "local", PROMPT[:9])  # caches the first 2 blocks here
    installed = engine.add_request("r", PROMPT, GREEDY, prefix_kv=exported(peer, PROMPT, 5))
    assert (installed.num_written, installed.num_local) == (3, 2)


def test_a_prompt_shorter_than_the_hint_uses_what_it_can():
    peer = sim_engine()
    run(peer, "warm", PROMPT)
    prefix = exported(peer, PROMPT, 5)
    engine = sim_engine()
    # 12 tokens: 3 full blocks, but the last token is computed, so 2 are usable
    assert engine.add_request("r", PROMPT[:12], GREEDY, prefix_kv=prefix).num_written == 2
    assert sim_engine().add_request("s", PROMPT[:4], GREEDY, prefix_kv=prefix).num_blocks == 0


def test_no_room_installs_nothing_and_the_request_still_runs():
    peer = sim_engine()
    want, _ = run(peer, "warm", PROMPT)
    engine = sim_engine(num_blocks=9, max_model_len=32)  # 8 usable; pins take at most half
    prefix = exported(peer, PROMPT, 5)
    installed = engine.add_request("r", PROMPT, GREEDY, prefix_kv=prefix)
    assert installed.is_no_room and installed.num_blocks == 0
    assert engine.kv_cache.usage() == 0.0
    engine.abort_request("r")
    assert run(engine, "again", PROMPT, prefix_kv=prefix)[0] == want


def test_pins_hold_until_admission_and_an_abort_releases_them():
    peer = sim_engine()
    run(peer, "warm", PROMPT)
    engine = sim_engine()
    engine.add_request("r", PROMPT, GREEDY, prefix_kv=exported(peer, PROMPT, 5))
    pinned = [b for _, blocks in engine._pins.values() for b in blocks]
    assert [b.ref_cnt for b in pinned] == [1] * 5
    engine.abort_request("r")
    assert [b.ref_cnt for b in pinned] == [0] * 5 and engine._num_pinned == 0
    assert engine.kv_cache.pool.num_cached_blocks == 5  # still cached, now evictable


def test_export_returns_the_leading_cached_run_only():
    peer = sim_engine(num_blocks=16, max_model_len=60)
    run(peer, "warm", PROMPT)
    hashes = chained_hashes(PROMPT, BS, 5)
    assert peer.export_prefix(hashes, 3).block_hashes == hashes[:3]  # the size cap
    assert peer.export_prefix(hashes[1:], 5).block_hashes == []  # not chained from the root
    assert peer.export_prefix([hashes[0], 12345, *hashes[2:]], 5).block_hashes == hashes[:1]
    out = peer.export_prefix(hashes, 5)
    assert out.token_ids == PROMPT[:20] and len(out.data) == 5 * BS * 8
    for i in range(10):  # other prompts evict the tail of PROMPT's chain first
        run(peer, f"o{i}", [200 + i] * 9)
    left = peer.export_prefix(hashes, 5).block_hashes
    assert left == hashes[:len(left)] and len(left) < 5


def _header(prompt, n, **kw):
    fields = dict(dtype="uint64", block_shape=[BS], num_blocks=n, token_ids=prompt[:n * BS],
                  block_size=BS, payload=bytes(8 * BS * n),
                  block_hashes=chained_hashes(prompt, BS, n), model="m")
    fields.update(kw)
    return make_header(**fields)


def test_check_export_trusts_the_prompt_not_the_peer():
    asked = chained_hashes(PROMPT, BS, 5)
    geometry = dict(asked=asked, prompt_ids=PROMPT, dtype="uint64", block_shape=[BS],
                    block_size=BS, model="m")
    assert check_export(_header(PROMPT, 3), **geometry) == 3
    assert check_export(_header(PROMPT, 0), **geometry) == 0
    other = [t + 1 for t in PROMPT]
    with pytest.raises(PrefixMismatch):  # another prompt's blocks
        check_export(_header(other, 3), **geometry)
    with pytest.raises(PrefixMismatch):  # right tokens, lying hashes
        check_export(_header(PROMPT, 3, block_hashes=[1, 2, 3]), **geometry)
    for bad in (dict(model="other"), dict(dtype="float32"), dict(block_size=8)):
        with pytest.raises(KVTransferError) as info:
            check_export(_header(PROMPT, 3, **bad), **geometry)
        assert not isinstance(info.value, PrefixMismatch)
    with pytest.raises(KVTransferError):  # more than asked
        check_export(_header(PROMPT, 5), **{**geometry, "asked": asked[:4]})


def test_num_agreeing_and_usable_blocks():
    assert prefix_share.num_agreeing([1, 2, 3], [1, 2, 4, 5]) == 2
    assert prefix_share.num_agreeing([1, 2], [1, 2, 3]) == 2
    assert [prefix_share.num_usable_blocks(n, 4) for n in (1, 4, 5, 8, 9)] == [0, 0, 1, 1, 2]


def test_torch_tiny_random_with_fetched_blocks_matches_recompute():
    torch_runner = pytest.importorskip("kvfleet_engine.runners.torch_runner")
    from kvfleet_engine.model.tiny import build_tiny_random

    model = build_tiny_random(seed=0)

    def engine() -> LLMEngine:
        config = EngineConfig(num_blocks=64, block_size=BS, max_num_batched_tokens=64,
                              max_model_len=128)
        return LLMEngine(config, torch_runner.TorchRunner(model, 64, BS), eos_token_ids=())

    peer, importer, fresh = engine(), engine(), engine()
    want, _ = run(peer, "warm", PROMPT)
    prefix = exported(peer, PROMPT, 5)
    got, cached = run(importer, "r", PROMPT, prefix_kv=prefix)
    assert (got, cached) == (want, 5 * BS)
    assert run(fresh, "f", PROMPT)[0] == want


def test_simulator_runner_without_kv_check_installs_and_serves():
    """The fleet simulator's runner stores no KV: an export is zeros, an install writes
    nothing, and requests behave as with a local prefix hit (same tokens, hit counted)."""

    def engine() -> LLMEngine:
        config = EngineConfig(num_blocks=64, block_size=BS, max_num_batched_tokens=64,
                              max_model_len=128)
        clock = VirtualClock()
        runner = SimulatedRunner("cpu-tiny", num_blocks=64, block_size=BS, vocab_size=260,
                                 time_mode="virtual", clock=clock, check_kv=False)
        return LLMEngine(config, runner, eos_token_ids=(), clock=clock)

    peer, importer = engine(), engine()
    want, _ = run(peer, "warm", PROMPT)
    prefix = exported(peer, PROMPT, 5)
    assert prefix.data == bytes(5 * BS * 8)
    assert run(importer, "r", PROMPT, prefix_kv=prefix) == (want, 5 * BS)
