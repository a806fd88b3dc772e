"""`bench/operator_scale.py` at 5 pools, as CI runs it: the script works end to end
(kmock, `kvfleet operator run` in its own process, every child of every pool, its JSON)."""

from __future__ import annotations

import json
import subprocess
import sys

from k8s_pools import ROOT


def test_operator_scale_bench_runs_with_five_pools(tmp_path):
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "operator_scale.py"), "--pools", "5",
         "--hold", "1", "--settle", "1", "--idle-after", "1", "--timeout", "60",
         "--repeat", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["runs"]) == 2
    for result in report["runs"]:
        assert result["num_pools_with_all_children"] == 5
        assert result["seconds_to_all_children"] is not None
        assert 0 < result["operator_peak_rss_mb"] < 1000
        assert result["operator_tracebacks"] == 0
        assert result["api_requests"] >= 5 * 12  # every child of every pool was applied
    times = sorted(r["seconds_to_all_children"] for r in report["runs"])
    assert report["summary"]["seconds_to_all_children"] == {
        "median": sum(times) / 2, "min": times[0], "max": times[1]}
