"""`bench/sim_fidelity.py --autoscaling`: the autoscaler live (`kvfleet up`, real processes)
against the simulator on the same slice; its accounting, and a short run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kvfleet_bench.fleet_replay import Done
from kvfleet_bench.scaling_fidelity import Samples, attainment

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_code.csv"


def test_replica_seconds_integrate_the_held_replicas_over_the_window():
    s = Samples()
    for t, n in ((0.0, 1), (1.0, 3), (2.0, 2)):
        s.add(t, 100.0 + t, [{"name": f"e{i}", "role": "unified", "started_at": 90.0,
                               "state": "ready"} for i in range(n)]
              + [{"name": "router", "role": "router", "state": "ready"}])  # not billed
    assert s.counts == [1, 3, 2]
    assert s.replica_seconds(0.0, 4.0) == pytest.approx(1 + 3 + 2 * 2)
    assert s.replica_seconds(0.5, 1.5) == pytest.approx(0.5 * 1 + 0.5 * 3)
    assert s.num_changes(0.0, 4.0) == 2


def test_startups_are_the_scale_ups_start_to_ready():
    s = Samples()
    first = {"name": "e0", "role": "unified", "started_at": 10.0, "state": "ready"}
    late = {"name": "e1", "role": "unified", "started_at": 50.0, "state": "starting"}
    s.add(0.0, 49.0, [first])
    s.add(1.0, 51.0, [first, late])
    s.add(2.0, 52.5, [first, {**late, "state": "ready"}])
    s.add(3.0, 53.0, [first, {**late, "state": "ready"}])
    assert s.startups(after_monotonic=20.0) == [pytest.approx(2.5)]  # e0 came with the fleet


def test_attainment_is_the_simulators_rule_at_its_bounds():
    def done(ttft: float, tpot: float, n: int = 11) -> Done:
        return Done(0.0, ttft, ttft + tpot * (n - 1), n)

    assert attainment([done(2.0, 0.05)], 0, 2.0) == 1.0  # both at the bound: met
    assert attainment([done(2.001, 0.01)], 0, 2.0) == 0.0
    assert attainment([done(0.1, 0.0501)], 0, 2.0) == 0.0
    assert attainment([done(0.1, 0.01)], 1, 2.0) == 0.5  # a failure is a miss


@pytest.mark.skipif(not TRACE.exists(), reason="shared/traces not beside the repository")
def test_autoscaling_fidelity_short_slice(tmp_path):
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "sim_fidelity.py"), "--autoscaling", "--duration-s", "25",
         "--sim-seeds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    # exit 1 is a verdict (a gap over the tolerance on a short slice), not a broken run
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    r = json.loads(out.read_text())
    live, sim = r["live"], r["sim"]
    assert live["num_failed"] == 0 and live["num_requests"] > 50
    assert live["max_replicas"] > 1 and sim["max_replicas"] > 1  # the burst scales both
    assert r["is_startup_measured"] and 0 < r["startup_s"] < 30
    for k in ("replica_seconds", "slo_attainment"):
        assert live[k] > 0 and sim[k] > 0
        assert r["gap"][k] == pytest.approx((sim[k] - live[k]) / live[k])
    assert (proc.returncode == 1) == bool(r["over_tolerance"])
    assert "bench/README.md: section sim_fidelity left alone" in proc.stderr
