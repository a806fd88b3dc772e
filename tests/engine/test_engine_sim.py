"""The step loop end to end with the simulated runner (pseudo KV, virtual time)."""

import random

import pytest
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.kv_cache import cdiv
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import PreloadedKV
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock

GREEDY = dict(temperature=0.0)


class BytesTokenizer:
    """UTF-8 bytes as token ids; 300 is EOS. Enough to drive detokenization."""

    eos_token_ids = [300]

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def build(clock=None, tokenizer=None, eos=None, vocab_size=260, **overrides):
    options = dict(num_blocks=128, block_size=4, max_num_batched_tokens=64, max_model_len=256)
    options.update(overrides)
    config = EngineConfig(**options)
    clock = clock or VirtualClock()
    runner = SimulatedRunner("cpu-tiny", num_blocks=config.num_blocks,
                             block_size=config.block_size, vocab_size=vocab_size,
                             time_mode="virtual", clock=clock)
    return LLMEngine(config, runner, tokenizer=tokenizer, eos_token_ids=eos, clock=clock)


def run_all(engine):
    finals, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.is_finished:
                finals[out.request_id] = out
        steps += 1
        assert steps < 10_000
    return finals


def workload(seed=0, n=24):
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(21)]  # a shared prefix over 5 blocks
    prompts = []
    for i in range(n):
        own = [rng.randrange(256) for _ in range(rng.randrange(1, 40))]
        prompts.append(system + own if i % 2 == 0 else own)
    return prompts


def generate(engine, prompts, max_tokens=12):
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=max_tokens, **GREEDY))
    finals = run_all(engine)
    return [finals[f"r{i}"].token_ids for i in range(len(prompts))], engine


def test_outputs_do_not_depend_on_caching_chunking_or_preemption():
    prompts = workload()
    baseline, _ = generate(build(enable_prefix_caching=False, max_num_seqs=1), prompts)
    variants = {
        "prefix caching": dict(enable_prefix_caching=True),
        "tiny chunks": dict(max_num_batched_tokens=3),
        "tiny cache": dict(num_blocks=24, max_model_len=80, kv_safety_margin=0.0),
    }
    for name, overrides in variants.items():
        got, engine = generate(build(**overrides), prompts)
        assert got == baseline, name
        stats = engine.stats()
        assert stats.kv_usage == 0.0 and stats.num_running == 0, name
        if name == "prefix caching":
            assert stats.prefix_cache_hits >= 20 * 11  # 11 later shared prompts hit 5 blocks
        if name == "tiny cache":
            assert stats.num_preemptions > 0


def test_outputs_depend_on_the_kv_blocks_hold():
    # the pseudo runner reads the previous position's slot: corrupting it changes tokens
    engine = build()
    engine.add_request("a", list(range(10)), SamplingParams(max_tokens=3, **GREEDY))
    engine.step()
    block = engine.scheduler.running[0].block_ids[-1]  # holds position 9
    engine.runner.write_blocks([block], bytes(8 * 4))
    corrupted = run_all(engine)["a"].token_ids
    clean, _ = generate(build(), [list(range(10))], max_tokens=3)
    assert corrupted[0] == clean[0][0] and corrupted[1:] != clean[0][1:]


def test_finish_reasons_length_stop_token_and_eos():
    engine = build()
    engine.add_request("len", [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY))
    out = run_all(engine)["len"]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    second = out.token_ids[1]
    engine.add_request("stop", [1, 2, 3], SamplingParams(max_tokens=4, stop_token_ids=[second],
                                                         **GREEDY))
    out = run_all(engine)["stop"]
    assert out.finish_reason == "stop" and out.token_ids == out.token_ids[:1] + [second]
    eos_engine = build(eos=[second])
    eos_engine.add_request("eos", [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY))
    assert run_all(eos_engine)["eos"].finish_reason == "stop"
    eos_engine.add_request("ign", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True,
                                                            **GREEDY))
    assert run_all(eos_engine)["ign"].finish_reason == "length"


def test_stream_of_outputs_adds_up_and_carries_timing():
    clock = VirtualClock(start_s=100.0)
    engine = build(clock=clock)
    engine.add_request("a", list(range(30)), SamplingParams(max_tokens=5, **GREEDY),
                       arrival_time=99.5)
    streamed, outs = [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.new_token_ids
            outs.append(out)
    assert streamed == outs[-1].token_ids and len(streamed) == 5
    assert [o.token_ids for o in outs] == [streamed[: i + 1] for i in range(5)]  # snapshots
    t = outs[-1].timing
    assert t.arrival_time == 99.5 and t.first_scheduled_time == 100.0
    assert t.first_token_time > t.first_scheduled_time  # the step took virtual time
    assert t.finished_time == t.last_token_time >= t.first_token_time
    assert outs[-1].num_prompt_tokens == 30 and outs[-1].num_cached_tokens == 0


def test_stop_strings_cut_text_and_never_stream_part_of_one():
    tok = BytesTokenizer()
    probe = build(tokenizer=tok, vocab_size=128)  # ASCII only
    probe.add_request("p", tok.encode("hello"), SamplingParams(max_tokens=20, **GREEDY))
    full = run_all(probe)["p"].text
    assert len(full) == 20
    stop = full[8:11]
    engine = build(tokenizer=tok, vocab_size=128)
    engine.add_request("s", tok.encode("hello"), SamplingParams(max_tokens=20, stop=[stop],
                                                                **GREEDY))
    streamed = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.new_text
            assert stop not in streamed
    assert out.finish_reason == "stop"
    assert out.text == streamed == full[: full.index(stop)]
    assert engine.stats().kv_usage == 0.0


def test_abort_frees_blocks_at_once_and_reports_on_the_next_step():
    engine = build()
    engine.add_request("run", list(range(20)), SamplingParams(max_tokens=50, **GREEDY))
    engine.add_request("wait", list(range(20)), SamplingParams(max_tokens=5, **GREEDY),
                       priority=9)
    engine.step()
    assert engine.stats().kv_usage > 0
    assert engine.abort_request("run") and engine.abort_request("wait")
    assert engine.stats().kv_usage == 0.0 and not engine.has_unfinished_requests()
    assert engine.stats().num_waiting == 0 and engine.stats().num_running == 0
    outs = engine.step()
    assert {(o.request_id, o.finish_reason, o.is_finished) for o in outs} == {
        ("run", "abort", True), ("wait", "abort", True)}
    assert engine.abort_request("run") is False
    engine.add_request("run", [1, 2], SamplingParams(max_tokens=1))  # the id is free again


@pytest.mark.parametrize("call, message", [
    (lambda e: e.add_request("x", [], SamplingParams()), "empty"),
    (lambda e: e.add_request("x", [1] * 250, SamplingParams(max_tokens=10)), "max_model_len"),
    (lambda e: e.add_request("dup", [1], SamplingParams()), "already in use"),
    (lambda e: e.add_request("x", [1, 999], SamplingParams()), "token id 999"),
    (lambda e: e.add_request("x", [1, -1], SamplingParams()), "token id -1"),
    (lambda e: e.add_request("x", [1, "a"], SamplingParams()), "token id 'a'"),
    (lambda e: e.add_request("", [1], SamplingParams()), "request_id"),
    (lambda e: e.add_request("x", [1], {"max_tokens": 3}), "SamplingParams"),
    (lambda e: e.add_request("x", [1], SamplingParams(), priority=1.5), "priority"),
    (lambda e: e.add_request("x", [1], SamplingParams(stop=["a"])), "tokenizer"),
    (lambda e: e.add_request("x", [1, 2], SamplingParams(),
                             preloaded_kv=PreloadedKV(3, b"")), "num_tokens"),
    (lambda e: e.add_request("x", [1, 2], SamplingParams(),
                             preloaded_kv=PreloadedKV(2, b"123")), "bytes"),
])
def test_bad_requests_get_a_clear_error_and_harm_no_other(call, message):
    engine = build()
    engine.add_request("dup", [5, 6, 7], SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError, match=message):
        call(engine)
    finals = run_all(engine)
    assert list(finals) == ["dup"] and len(finals["dup"].token_ids) == 3


def test_runner_and_config_must_agree():
    config = EngineConfig(num_blocks=64, block_size=4, max_model_len=128)
    with pytest.raises(ValueError, match="block_size"):
        LLMEngine(config, SimulatedRunner("cpu-tiny", num_blocks=64, block_size=8))
    with pytest.raises(ValueError, match="KV blocks"):
        LLMEngine(config, SimulatedRunner("cpu-tiny", num_blocks=32, block_size=4))


def test_hold_kv_keeps_blocks_until_released():
    engine = build()
    prompt = list(range(1, 11))
    engine.add_request("p", prompt, SamplingParams(max_tokens=1, **GREEDY), hold_kv=True)
    out = run_all(engine)["p"]
    assert out.finish_reason == "length"
    blocks = engine.get_held_blocks("p")
    assert len(blocks) == cdiv(10, 4) and engine.get_held_num_tokens("p") == 10
    assert engine.stats().kv_usage == pytest.approx(3 / 127) and engine.stats().num_held == 1
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("p", prompt, SamplingParams())
    engine.release_held("p")
    assert engine.stats().kv_usage == 0.0
    with pytest.raises(KeyError, match="no KV is held"):
        engine.get_held_blocks("p")
    with pytest.raises(KeyError):
        engine.release_held("p")


@pytest.mark.parametrize("num_preloaded", [8, 10, 12])  # a block boundary, mid-block, all
def test_preloaded_kv_continues_exactly_like_unified_serving(num_preloaded):
    prompt = list(range(3, 15))  # 12 tokens, 3 blocks of 4
    unified, _ = generate(build(), [prompt], max_tokens=6)

    prefill = build()
    prefill.add_request("h", prompt, SamplingParams(max_tokens=1, **GREEDY), hold_kv=True)
    first = run_all(prefill)["h"].token_ids
    assert first == unified[0][:1]
    blocks = prefill.get_held_blocks("h")[: cdiv(num_preloaded, 4)]
    data = prefill.runner.read_blocks(blocks)
    prefill.release_held("h")

    decode = build()
    decode.add_request("d", prompt, SamplingParams(max_tokens=6, **GREEDY),
                       preloaded_kv=PreloadedKV(num_preloaded, data))
    out = run_all(decode)["d"]
    assert out.token_ids == unified[0]
    stats = decode.stats()
    assert stats.prefix_cache_queries == 0 and stats.prefix_cache_hits == 0
    assert stats.kv_usage == 0.0

    garbage = build()
    garbage.add_request("g", prompt, SamplingParams(max_tokens=6, **GREEDY),
                        preloaded_kv=PreloadedKV(num_preloaded, bytes(len(data))))
    assert run_all(garbage)["g"].token_ids != unified[0]  # the preload is really used


def test_priority_orders_admission_through_the_engine():
    engine = build(max_num_seqs=1, aging_seconds=None)
    engine.add_request("low", [1, 2, 3], SamplingParams(max_tokens=2), priority=5)
    engine.add_request("high", [4, 5, 6], SamplingParams(max_tokens=2), priority=-1)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.is_finished]
    assert order == ["high", "low"]


def test_kv_events_and_stats_follow_the_cache():
    engine = build()
    prompt = list(range(40, 57))  # 17 tokens: 4 full blocks
    engine.add_request("a", prompt, SamplingParams(max_tokens=1, **GREEDY))
    run_all(engine)
    engine.add_request("b", prompt, SamplingParams(max_tokens=1, **GREEDY))
    run_all(engine)
    events = engine.drain_kv_events()
    assert [e.seq for e in events] == list(range(len(events)))
    stored = [h for e in events if e.type == "BlockStored" for h in e.block_hashes]
    assert len(stored) == 4 and len(set(stored)) == 4
    stats = engine.stats()
    assert stats.prefix_cache_queries == 34 and stats.prefix_cache_hits == 16
    assert stats.num_gpu_blocks == 128 and stats.block_size == 4
    assert stats.num_prompt_tokens == 34 and stats.num_generation_tokens == 2
    t = stats.timings
    assert t.num_steps == 2 and t.execute_s > 0 and 0 < t.overhead_fraction < 1
    more = build()
    more.add_request("c", prompt, SamplingParams(max_tokens=1))
    run_all(more)
    assert more.drain_kv_events()[0].seq == 0  # per-engine sequence


def test_a_rejected_preload_aborts_only_its_request():
    class RejectingRunner(SimulatedRunner):
        def write_blocks(self, block_ids, data):
            raise ValueError("corrupt payload")

    clock = VirtualClock()
    config = EngineConfig(num_blocks=64, block_size=4, max_model_len=64)
    engine = LLMEngine(config, RejectingRunner("cpu-tiny", num_blocks=64, block_size=4,
                                               time_mode="virtual", clock=clock), clock=clock)
    engine.add_request("ok", [1, 2, 3], SamplingParams(max_tokens=2, **GREEDY))
    engine.add_request("bad", [1, 2, 3, 4, 5], SamplingParams(max_tokens=2, **GREEDY),
                       preloaded_kv=PreloadedKV(4, bytes(8 * 4)))
    finals = run_all(engine)
    assert finals["bad"].finish_reason == "abort"
    assert finals["ok"].finish_reason == "length" and len(finals["ok"].token_ids) == 2
    assert engine.stats().kv_usage == 0.0


def test_abort_of_a_held_request_releases_its_kv():
    engine = build()
    engine.add_request("p", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1), hold_kv=True)
    run_all(engine)
    assert engine.stats().num_held == 1 and engine.stats().kv_usage > 0
    assert engine.abort_request("p") is True
    assert engine.stats().num_held == 0 and engine.stats().kv_usage == 0.0
    assert engine.step() == []  # it had finished: no second final output


def test_step_reports_idle_when_held_kv_leaves_no_room():
    """A step that can run nothing says so, so the server's engine thread waits, not spins."""
    engine = build(eos=(), block_size=4, num_blocks=6, max_model_len=16, kv_safety_margin=0.0)
    params = SamplingParams(max_tokens=1, temperature=0)
    engine.add_request("held", list(range(1, 16)), params, hold_kv=True)
    run_all(engine)
    assert not engine.is_last_step_idle
    engine.add_request("blocked", list(range(20, 35)), params)
    engine.step()
    assert engine.is_last_step_idle and engine.has_unfinished_requests()
    engine.release_held("held")
    engine.step()
    assert not engine.is_last_step_idle
