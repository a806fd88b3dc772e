"""kvfleet_sim: the virtual-time fleet with the real engine core, router policy and autoscaler."""

import math
from pathlib import Path

import pytest
from kvfleet_operator.api import load_pool
from kvfleet_sim.fleet import FleetSim, SimError, SimSettings
from kvfleet_sim.replica import SimReplica
from kvfleet_sim.report import percentile, replica_seconds, summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

POOL = Path(__file__).resolve().parents[2] / "examples" / "local-sim.yaml"


def burst_trace(rate_low=2.0, rate_high=40.0, t_high=(10.0, 25.0), end=45.0):
    out, t = [], 0.0
    while t < end:
        out.append(TraceRequest(t, 600, 40))
        t += 1.0 / (rate_high if t_high[0] <= t < t_high[1] else rate_low)
    return out


def test_replica_runs_the_real_engine_in_virtual_time():
    pool = load_pool(POOL)
    from kvfleet_sim.fleet import engine_config

    r = SimReplica("r0", engine_config(pool), "h100-llama3-8b", 0.0, 0.0)
    r.add("a", list(range(1, 301)), 5, arrival=0.0)
    t, done = 0.0, []
    while r.engine.has_unfinished_requests():
        t, finished = r.step(t)
        done += finished
    assert [f.num_output_tokens for f in done] == [5]
    f = done[0]
    # 300 prompt tokens at 32.5 us each plus the step floor: a few ms per step, not zero.
    assert 0.005 < f.first_token - f.arrival < 0.1
    assert f.finished > f.first_token
    s = r.sample()
    assert s.num_requests == 1 and s.num_generation_tokens == 5 and s.num_running == 0
    assert len(r.itl_gaps) == 4
    # vllm:request_time_per_output_token_seconds: the request's mean over its 4 gaps, in
    # the first bucket at or above it
    mean = (f.finished - f.first_token) / 4
    assert mean == pytest.approx(sum(r.itl_gaps) / 4)
    tpot = dict(s.tpot)
    assert tpot[math.inf] == 1
    assert [n for le, n in sorted(tpot.items()) if le >= mean][0] == 1
    assert all(n == 0 for le, n in tpot.items() if le < mean)


def test_replica_exports_queue_time_as_the_server_does():
    # vllm:request_queue_time_seconds: arrival to first scheduling, observed at the
    # finish. One request scheduled at its arrival, one first stepped 0.3 s after it.
    pool = load_pool(POOL)
    from kvfleet_sim.fleet import engine_config

    r = SimReplica("r0", engine_config(pool), "h100-llama3-8b", 0.0, 0.0)
    r.add("now", list(range(1, 101)), 2, arrival=0.0)
    t = 0.0
    while r.engine.has_unfinished_requests():
        t, _ = r.step(t)
    r.add("late", list(range(1, 101)), 2, arrival=t)
    t += 0.3
    while r.engine.has_unfinished_requests():
        t, _ = r.step(t)
    buckets = dict(r.sample().queue_time)
    assert buckets[0.25] == 1 and buckets[0.5] == 2 and buckets[math.inf] == 2


@pytest.mark.parametrize("scaler", ["kvfleet", "waiting-5", "fixed-max"])
def test_every_request_finishes_with_every_scaler(scaler):
    pool = load_pool(POOL)
    trace = burst_trace()
    result = FleetSim(pool, SCALERS[scaler](pool.spec), SimSettings(startup_s=2.0)).run(trace)
    assert len(result.finished) == len(trace)
    assert all(not f.is_aborted and f.num_output_tokens == 40 for f in result.finished)
    assert all(1 <= p <= 6 for _, p, _ in result.timeline)
    s = summarize(scaler, result, ttft_slo_s=1.0, itl_slo_s=0.05)
    assert s.num_requests == len(trace) and 0 <= s.slo_attainment <= 1
    if scaler == "fixed-max":
        assert {p for _, p, _ in result.timeline} == {6}
        assert s.replica_seconds == pytest.approx(6 * result.end_s)


def test_kvfleet_scales_up_on_the_burst_and_back_down():
    pool = load_pool(POOL)
    result = FleetSim(pool, SCALERS["kvfleet"](pool.spec), SimSettings(startup_s=2.0)).run(
        burst_trace(end=80.0)
    )
    during = [p for t, p, _ in result.timeline if 12 <= t < 25]
    after = [p for t, p, _ in result.timeline if t >= 70]
    assert max(during) >= 2, result.reasons
    assert after and after[-1] < max(during), result.reasons
    assert any("scale up" in r for _, r in result.reasons)
    assert any("scale down" in r for _, r in result.reasons)


def test_non_simulated_pools_are_refused():
    pool = load_pool(POOL.parent / "local-cpu.yaml")
    with pytest.raises(SimError, match="simulated"):
        FleetSim(pool, SCALERS["kvfleet"](pool.spec), SimSettings())
    with pytest.raises(SimError):
        SimSettings(scrape_interval_s=0)


@pytest.mark.parametrize(
    "values,q,expected", [([], 50, None), ([3, 1, 2], 50, 2), ([1, 2, 3, 4], 90, 4)]
)
def test_percentile(values, q, expected):
    got = percentile(values, q)
    assert (got != got) if expected is None else got == expected  # NaN for no values


def test_replica_seconds_clip_to_the_window():
    assert replica_seconds([(0, 10), (5, 30), (40, 50)], start=5, end=20) == 5 + 15


def test_a_window_that_ends_idle_is_paid_for_to_its_end(tmp_path):
    """Requests stop 20 s before the measured window ends: every scaler still pays for the
    whole window (the replay ran only to its last request, so a fixed-at-max fleet looked
    smaller than its maximum and a scaler that held replicas through the idle tail paid
    nothing for them)."""
    from kvfleet_sim.run import Variant, run_variants

    rows = [f"2023-11-16 18:00:{t:02d}.0000000,300,10\n" for t in range(20)]  # 0-19 s
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    runs, _, _ = run_variants(str(path), [Variant(str(POOL), "fixed-max")], start_s=5.0,
                              duration_s=35.0, warmup_s=5.0, compress=1.0,
                              settings=SimSettings(startup_s=1.0))  # fmt: skip
    (run,) = runs
    assert run.result.end_s >= 40.0  # the window's end, past the last request (19 s)
    assert run.summary.replica_seconds == pytest.approx(6 * 35.0)
    assert run.summary.mean_replicas == pytest.approx(6.0)


def test_scale_to_zero_and_back_on_held_requests():
    import yaml
    from kvfleet_operator.api import parse_pool

    manifest = yaml.safe_load(POOL.read_text())
    manifest["spec"]["topology"]["unified"]["replicas"]["min"] = 0
    manifest["spec"]["autoscaling"]["scaleToZero"] = {"enabled": True, "idleSeconds": 5}
    pool = parse_pool(manifest)
    trace = [TraceRequest(t / 4, 200, 10) for t in range(20)]  # 0-5 s
    trace += [TraceRequest(60 + t / 4, 200, 10) for t in range(8)]  # 60-62 s, after idling
    result = FleetSim(pool, SCALERS["kvfleet"](pool.spec), SimSettings(startup_s=3.0)).run(trace)
    assert len(result.finished) == len(trace) and not any(f.is_aborted for f in result.finished)
    at_zero = [t for t, p, _ in result.timeline if p == 0]
    assert at_zero and min(at_zero) < 60, result.reasons
    assert any("held" in r for _, r in result.reasons), result.reasons
    late = [f for f in result.finished if f.arrival >= 60]
    # The first late request waited for a replica to start: TTFT includes the 3 s start-up.
    assert (
        min(f.first_token - f.arrival for f in late)
        < 3.0
        < max(f.first_token - f.arrival for f in late)
    )
