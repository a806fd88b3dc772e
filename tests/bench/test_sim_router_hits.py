"""Smoke test of bench/sim_router_hits.py: candidate pipelines on the simulator's model of the
live router bench, over seeds and slices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "sim_router_hits.py"
TRACE = REPO.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
# `spread` has no affinity at all: its rows show the pipeline, not the pool's own policy, ran
PIPELINES = ('{"space": {"scorers": {"prefix": 1, "queue": 4, "space": 0.01}, "guard": true}, '
             '"spread": {"picker": "round-robin"}}')


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=240, cwd=REPO)


@pytest.mark.skipif(not TRACE.exists(), reason="shared/traces not beside the repository")
def test_each_policy_and_pipeline_gets_a_row_per_slice(tmp_path):
    out = tmp_path / "hits.json"
    proc = run("--num-requests", "150", "--seeds", "2", "--slice", "0:2", "--slice", "300:3",
               "--policy", "cache-aware", "--policy", "round-robin", "--pipelines", PIPELINES,
               "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert [(s["skip"], s["num_backends"]) for s in result["slices"]] == [(0, 2), (300, 3)]
    for s in result["slices"]:
        assert list(s["rows"]) == ["cache-aware", "round-robin", "space", "spread"]
        for row in s["rows"].values():
            assert len(row["hit_fraction"]) == 2
            assert all(0 <= h <= 1 for h in row["hit_fraction"])
        # round-robin spreads every prefix; the affinity policies keep most on one backend
        assert s["rows"]["round-robin"]["backends_per_shared_prefix"] > \
            s["rows"]["space"]["backends_per_shared_prefix"]
        assert s["rows"]["spread"]["backends_per_shared_prefix"] > \
            s["rows"]["cache-aware"]["backends_per_shared_prefix"]
    assert "| 300, 3 |" in out.with_suffix(".md").read_text()


def test_a_malformed_slice_is_one_line_and_exit_2():
    proc = run("--slice", "zero:4")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("--slice is SKIP:BACKENDS, two integers")
