"""bench/flow_control_sim.py, short: the live bench's figures from the simulator, and the
broken case (--fairness off) misses them."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "flow_control_sim.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("flow_control_sim", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tmp_path, *extra):
    out = tmp_path / "r.json"
    assert load_bench().main(["--seeds", "1", "--capacities", "4", "--measure-s", "15",
                              "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())["by_capacity"]["4"]


def test_fair_flow_control_isolates_and_shares(tmp_path):
    r = run(tmp_path)
    f = r["figures"]
    assert r["num_unexplained"] == 0
    assert f["isolation"]["a_lost"] == 0 and f["priority"]["crit_lost"] == 0
    assert f["isolation"]["a_ttft_p90_ratio"]["median"] < 1.5
    assert f["fair"]["is_share_met"] and f["fair"]["is_jain_met"]
    assert f["priority"]["is_ratio_met"]


def test_without_fairness_the_quiet_tenant_waits_behind_the_flood(tmp_path):
    f = run(tmp_path, "--fairness", "off", "--scenarios", "isolation")["figures"]
    assert f["isolation"]["a_ttft_p90_ratio"]["median"] > 10 or f["isolation"]["a_lost"] > 0
