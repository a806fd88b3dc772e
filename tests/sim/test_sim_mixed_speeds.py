"""A pool of two speeds (`SimSettings.replica_profiles`, `kvfleet sim --replica-profile`)
and the router's perf model in the simulator's report: the slower replicas really are
slower, the `slo` policy learns it (per endpoint) and sends them less, and the report
carries the predictor's error and the busiest replica's share."""

import dataclasses
from pathlib import Path

from kvfleet_operator.api import load_pool
from kvfleet_sim.fleet import FleetSim, SimSettings
from kvfleet_sim.report import summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "sim" / "pools" / "fidelity-4.yaml"
SLOW = str(ROOT / "sim" / "pools" / "profiles" / "h100-llama3-8b-half-speed.json")


def steady_trace(rate=8.0, end=40.0):
    return [TraceRequest(i / rate, 2000 + 37 * (i % 50), 64) for i in range(int(rate * end))]


def run(policy: str):
    pool = load_pool(POOL)
    pool.spec.routing = dataclasses.replace(pool.spec.routing, policy=policy)
    settings = SimSettings(startup_s=0.0, measure_from_s=10.0,
                           replica_profiles=("h100-llama3-8b", SLOW))
    result = FleetSim(pool, SCALERS["fixed-max"](pool.spec), settings).run(steady_trace())
    return result, summarize(policy, result, 2.0, 0.05, start_s=10.0, end_s=40.0)


def test_slo_learns_the_slower_replicas_and_reports_its_error():
    result, s = run("slo")
    per: dict[str, list[float]] = {}
    for f in result.finished:
        per.setdefault(f.replica, []).append(f.finished - f.first_token)
    assert len(per) == 4
    # replicas 0 and 2 run the h100 profile, 1 and 3 the half-speed one
    fast = [n for n in per if int(n.rsplit("-", 1)[1]) % 2 == 0]
    slow = [n for n in per if n not in fast]
    decode = {n: sum(v) / len(v) for n, v in per.items()}
    assert min(decode[n] for n in slow) > 1.5 * max(decode[n] for n in fast)
    assert sum(len(per[n]) for n in slow) < sum(len(per[n]) for n in fast)
    assert s.ttft_mape is not None and s.tpot_mape is not None
    assert s.ttft_mape < 0.5 and s.tpot_mape < 0.5
    # the fast replicas rightly take more than a quarter each: a share, not a bound, here
    assert 1.0 <= s.max_share < 2.0


def test_a_replica_removed_keeps_its_share_of_the_predictor_error():
    """The report's MAPE is the measured window's error over every endpoint that served in
    it: one scaled down must not take its samples with it (summing the live endpoints only
    made the error fall with each scale-down, below zero on Mooncake's autoscaler rows)."""
    pool = load_pool(POOL)
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec), SimSettings(startup_s=0.0))
    sim.run(steady_trace(end=10.0))
    before = sim.perf_error()
    assert before[0][1] > 0 and before[1][1] > 0
    registry = sim.router.core.registry
    registry.endpoints, registry.retired = registry.endpoints[1:], []
    assert sim.perf_error() == before
