"""The cost model, the simulated runner's clocks, and fitting a profile from timings."""

import json

import pytest
from kvfleet_engine.core.runner_base import ScheduledSeq, StepBatch
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners import calibrate
from kvfleet_engine.runners.cost_model import CostProfile, load_profile, step_time
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock, build_simulated_runner

P = CostProfile("t", overhead_s=0.001, floor_s=0.004, prefill_s_per_token=1e-4,
                decode_s_per_seq=2e-4, s_per_kv_token=1e-6)


def seq(n, start, n_out, rid="a"):
    return ScheduledSeq(rid, [1] * n, start, list(range(1, 1 + (start + n) // 4 + 1)),
                        True, SamplingParams(), num_output_tokens=n_out)


def test_prefill_costs_per_uncached_token_above_the_floor():
    t = step_time(P, StepBatch([seq(100, 0, 0)]))
    assert t == pytest.approx(0.001 + 100 * 1e-4 + 100 * 1e-6)


def test_prefill_attention_pairs_grow_with_the_square_of_a_chunk():
    quad = CostProfile("q", overhead_s=0, floor_s=0, prefill_s_per_token=0, decode_s_per_seq=0,
                       s_per_kv_token=0, prefill_s_per_pair=1e-6)
    assert step_time(quad, StepBatch([seq(4, 0, 0)])) == pytest.approx(10e-6)  # 1+2+3+4
    assert step_time(quad, StepBatch([seq(2, 10, 0)])) == pytest.approx((2 * 10 + 3) * 1e-6)
    assert step_time(quad, StepBatch([seq(1, 10, 1)])) == 0.0  # decode: memory-bound term only


def test_small_steps_cost_the_floor():
    assert step_time(P, StepBatch([seq(1, 10, 1)])) == pytest.approx(0.001 + 0.004 + 11e-6)


def test_decode_grows_with_batch_and_kv_tokens():
    batch = StepBatch([seq(1, 999, 5, rid=str(i)) for i in range(64)])
    assert step_time(P, batch) == pytest.approx(0.001 + 64 * 2e-4 + 64 * 1000 * 1e-6)
    small = StepBatch([seq(1, 99, 5, rid=str(i)) for i in range(64)])
    assert step_time(P, small) < step_time(P, batch)


def test_mixed_batch_shares_one_compute_term():
    batch = StepBatch([seq(50, 0, 0, "p"), seq(1, 9, 1, "d")])
    assert step_time(P, batch) == pytest.approx(0.001 + (50e-4 + 2e-4) + (50 + 10) * 1e-6)


def test_runner_time_modes():
    clock = VirtualClock(5.0)
    virtual = SimulatedRunner(P, num_blocks=64, block_size=4, time_mode="virtual", clock=clock)
    virtual.execute(StepBatch([seq(100, 0, 0)]))
    assert clock() == pytest.approx(5.0 + virtual.last_step_s)
    slept = []
    sleeper = SimulatedRunner(P, num_blocks=64, block_size=4, time_mode="sleep",
                              sleep=slept.append)
    sleeper.execute(StepBatch([seq(100, 0, 0)]))
    assert len(slept) == 1 and 0 < slept[0] <= sleeper.last_step_s
    reporter = SimulatedRunner(P, num_blocks=64, block_size=4)
    reporter.execute(StepBatch([seq(100, 0, 0)]))
    assert reporter.total_step_s == reporter.last_step_s > 0 and reporter.num_steps == 1
    with pytest.raises(ValueError, match="VirtualClock"):
        SimulatedRunner(P, time_mode="virtual")
    with pytest.raises(ValueError, match="time_mode"):
        SimulatedRunner(P, time_mode="fast")
    assert build_simulated_runner("cpu-tiny", 32, 16).time_mode == "sleep"


def test_runner_checks_transfer_payloads():
    runner = SimulatedRunner(P, num_blocks=8, block_size=4)
    assert runner.kv_block_shape() == ("uint64", [4])
    with pytest.raises(ValueError, match="do not fill"):
        runner.write_blocks([1], b"\0" * 31)
    with pytest.raises(ValueError, match="out of range"):
        runner.read_blocks([8])
    with pytest.raises(ValueError, match="out of range"):
        runner.read_blocks([0])  # the null block is never transferred


@pytest.mark.parametrize("data, message", [
    ({"overhead_s": -1}, "overhead_s"),
    ({"bogus": 1}, "unknown keys"),
])
def test_bad_profile_files_are_rejected(tmp_path, data, message):
    good = {"name": "x", "overhead_s": 0, "floor_s": 0, "prefill_s_per_token": 0,
            "decode_s_per_seq": 0, "s_per_kv_token": 0}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**good, **data}))
    with pytest.raises(ValueError, match=message):
        load_profile(str(path))


def test_fit_recovers_the_parameters_that_made_the_timings():
    truth = dict(overhead_s=0.002, prefill_s_per_token=5e-5, decode_s_per_seq=3e-5,
                 s_per_kv_token=2e-7, prefill_s_per_pair=3e-8)

    def decode_time(batch, ctx):
        return (truth["overhead_s"] + truth["decode_s_per_seq"] * batch
                + truth["s_per_kv_token"] * batch * (ctx + 1))

    decode = {b: decode_time(b, calibrate.DECODE_CONTEXT) for b in calibrate.DECODE_BATCHES}
    kv = {c: decode_time(calibrate.KV_BATCH, c) for c in calibrate.KV_CONTEXTS}
    prefill = {n: truth["overhead_s"] + (truth["prefill_s_per_token"] + truth["s_per_kv_token"])
               * n + truth["prefill_s_per_pair"] * n * (n + 1) / 2
               for n in calibrate.PREFILL_CHUNKS}
    fitted = calibrate.fit_profile(decode, kv, prefill)
    for key, value in truth.items():
        assert fitted[key] == pytest.approx(value, rel=1e-6), key
    assert fitted["floor_s"] == 0.0


def test_linear_fit_needs_distinct_points():
    assert calibrate.linear_fit([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError):
        calibrate.linear_fit([1, 1], [2, 3])


def test_measure_times_every_point_of_a_runner():
    runner = SimulatedRunner(P, num_blocks=2048, block_size=16)
    timings = calibrate.measure(runner, repeats=1)
    assert set(timings["decode"]) == set(calibrate.DECODE_BATCHES)
    assert set(timings["prefill"]) == set(calibrate.PREFILL_CHUNKS)
    assert all(0 < t < 1 for points in timings.values() for t in points.values())
