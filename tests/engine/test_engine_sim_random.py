"""Random add / abort / step / hold sequences through the whole engine leak no blocks."""

from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 3), min_size=1, max_size=30),
                  st.integers(1, 12), st.integers(-1, 2), st.booleans()),
        st.tuples(st.just("abort"), st.integers(0, 40)),
        st.tuples(st.just("release"), st.integers(0, 40)),
        st.tuples(st.just("step"), st.integers(1, 4)),
    ),
    max_size=50,
)


@settings(max_examples=60, deadline=None)
@given(ops, st.booleans(), st.integers(2, 40))
def test_random_engine_operations_leak_no_blocks(operations, caching, budget):
    clock = VirtualClock()
    config = EngineConfig(num_blocks=14, block_size=4, max_model_len=48, max_num_seqs=4,
                          max_num_batched_tokens=budget, enable_prefix_caching=caching,
                          kv_safety_margin=0.1)
    engine = LLMEngine(config, SimulatedRunner("cpu-tiny", num_blocks=14, block_size=4,
                                               time_mode="virtual", clock=clock), clock=clock)
    ids: list[str] = []
    held: set[str] = set()
    finished: set[str] = set()
    for n, op in enumerate(operations):
        if op[0] == "add":
            _, prompt, max_tokens, priority, hold = op
            rid = f"r{n}"
            engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens),
                               priority=priority, hold_kv=hold)
            ids.append(rid)
            if hold:
                held.add(rid)
        elif op[0] == "abort" and ids:
            rid = ids[op[1] % len(ids)]
            engine.abort_request(rid)  # also releases KV it held after finishing
            held.discard(rid)
        elif op[0] == "release" and held & finished:
            rid = sorted(held & finished)[op[1] % len(held & finished)]
            engine.release_held(rid)
            held.discard(rid)
        elif op[0] == "step":
            for _ in range(op[1]):
                for out in engine.step():
                    if out.is_finished:
                        finished.add(out.request_id)
                        if out.finish_reason == "abort":
                            held.discard(out.request_id)
        stats = engine.stats()
        assert 0.0 <= stats.kv_usage <= 1.0
        assert stats.num_running <= 4
    # held KV is only freed when released (the server does so on transfer or expiry), and
    # it may be what a waiting request needs: release it as it appears, then drain
    steps = 0
    while engine.has_unfinished_requests() or engine.stats().num_held:
        for rid in list(engine._held):
            engine.release_held(rid)
        engine.step()
        steps += 1
        assert steps < 2_000, "no progress"
    pool = engine.kv_cache.pool
    assert engine.stats().kv_usage == 0.0
    assert pool.num_free_blocks == 13
    assert pool.ref_counts() == [1] + [0] * 13
    assert engine.stats().num_waiting == 0 and engine.stats().num_waiting_prompt_tokens == 0
