"""`kvfleet sim run --rollout-at ...`: a rollout mid-replay, its outcome in the table and the
JSON, and one-line errors for scenarios that cannot run."""

import json
from pathlib import Path

import pytest
import yaml
from kvfleet_operator.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool_path(tmp_path):
    m = yaml.safe_load((ROOT / "examples" / "local-sim.yaml").read_text())
    m["spec"]["topology"]["unified"]["replicas"] = {"min": 2, "max": 2}
    m["spec"]["rollout"] = {"steps": [{"weight": 25, "durationSeconds": 5},
                                      {"weight": 50, "durationSeconds": 5}]}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(m))
    return str(path)


@pytest.fixture
def trace_path(tmp_path):
    # 20 requests a second for 50 s (Azure CSV)
    rows = [f"2023-11-16 18:00:{i // 20:02d}.{(i % 20) * 5:02d}00000,600,40\n"
            for i in range(20 * 50)]
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    return str(path)


def sim_args(trace, pool, *extra):
    return ["sim", "run", "--trace", trace, "--pool", pool, "--start-s", "0", "--warmup-s",
            "0", "--duration-s", "50", "--compress", "1", "--startup-s", "2",
            "--scaler", "fixed-max", *extra]


def test_a_slower_build_rolled_out_by_canary_is_rolled_back(trace_path, pool_path, tmp_path,
                                                            capsys):
    out_json = tmp_path / "r.json"
    rc = cli.main(sim_args(trace_path, pool_path, "--rollout-at", "5", "--rollout-slowdown",
                           "2", "--rollout-strategy", "canary", "--json", str(out_json)))
    assert rc == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("rollout ("))
    assert "canary" in line and "at 5 s: RolledBack: RollbackSLO" in line
    assert "ttftP90Seconds" in line and "failed requests 0" in line
    assert "(new) |" in out  # the per-revision table marks the new revision
    data = json.loads(out_json.read_text())
    rollout = data["runs"][0]["rollout"]
    assert rollout["status"]["phase"] == "RolledBack"
    assert rollout["scenario"] == {"at_s": 5.0, "profile": None, "slowdown": 2.0,
                                   "strategy": "canary"}
    assert rollout["revisions"][rollout["to_revision"]]["replicas_at_end"] == 0
    assert data["args"]["rollout_at"] == 5.0 and data["args"]["rollout_slowdown"] == 2.0


def test_without_a_rollout_the_json_is_as_before(trace_path, pool_path, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    assert cli.main(sim_args(trace_path, pool_path, "--duration-s", "5",
                             "--json", str(out_json))) == 0
    assert "rollout (" not in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert "rollout" not in data["runs"][0]
    assert not any(k.startswith("rollout") for k in data["args"])


@pytest.mark.parametrize("extra,match", [
    (["--rollout-slowdown", "2"], "--rollout-slowdown needs --rollout-at"),
    (["--rollout-at", "5", "--rollout-slowdown", "0"], "slowdown"),
    (["--rollout-at", "5", "--rollout-profile", "nonesuch"], "unknown profile"),
    (["--rollout-at", "5", "--rollout-strategy", "yolo"], "invalid choice"),
    (["--rollout-at", "5", "--optimum"], "reactive scalers"),
])
def test_bad_rollouts_are_one_line(extra, match, trace_path, pool_path, capsys):
    assert cli.main(sim_args(trace_path, pool_path, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
