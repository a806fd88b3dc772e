"""Pools that pass every up-front check but whose engines cannot start: `kvfleet up` keeps
retrying with backoff, and the user is told why, in the engine's own words, as `Degraded`
in status, as a warning event, and in `kvfleet status`. Also the bad pools `up` rejects up
front (unknown model or profile, owned flags, too few KV blocks), with one line."""

import subprocess
import sys

import pytest
import yaml
from e2e_fleet import POOLS

pytestmark = pytest.mark.slow


def _pool(tmp_path, **engine):
    manifest = yaml.safe_load((POOLS / "sim-unified.yaml").read_text())
    manifest["spec"]["engine"].update(engine)
    manifest["spec"]["engine"] = {k: v for k, v in manifest["spec"]["engine"].items()
                                  if v is not None}  # None: leave the field unset
    manifest["spec"]["topology"]["unified"]["replicas"] = {"min": 1, "max": 2}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _degraded(state):
    return next((c for c in state.get("status", {}).get("conditions", [])
                 if c["type"] == "Degraded"), {})  # fmt: skip


@pytest.mark.parametrize("engine,why", [
    ({"args": ["--frobnicate"]}, "unrecognized arguments: --frobnicate"),
    # Without numBlocks the KV size is the engine's to find: only the engine can say.
    ({"maxModelLen": 1000000, "numBlocks": None},
     "max_model_len 1000000 does not fit in the KV cache"),
])  # fmt: skip
def test_an_engine_that_cannot_start_surfaces_as_degraded_with_its_reason(
        tmp_path, start_fleet, engine, why):
    path = _pool(tmp_path, **engine)
    fleet = start_fleet(str(path))
    state = fleet.wait_for("Degraded with the engine's reason",
                           lambda s: why in _degraded(s).get("message", ""), 60)
    degraded = _degraded(state)
    assert degraded["status"] == "True" and degraded["reason"] == "ReplicaFailed"
    assert any(why in e["message"] and e.get("type") == "Warning" for e in state["events"])
    assert "OpenAI endpoint" not in fleet.output()  # never announced: nothing serves
    status = subprocess.run(
        [sys.executable, "-m", "kvfleet_operator.cli.main", "status", "--state-dir",
         str(fleet.state_dir)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0 and f"why: exited with 2: kvfleet engine: {why}" in status.stdout
    # The backoff keeps trying (the fix may be a file the engine reads): restarts go on.
    fleet.wait_for("a restart", lambda s: any(r.get("num_restarts", 0) >= 1
                                              for r in s.get("replicas", [])), 30)  # fmt: skip


@pytest.mark.parametrize("engine,expected", [
    ({"profile": "b200-llama4"}, "spec.engine.profile: unknown profile 'b200-llama4'"),
    ({"args": ["--port", "1"]}, "spec.engine.args: must not set --port"),
    ({"numBlocks": 2}, "spec.engine.numBlocks: 2 blocks of 16 tokens hold 16 tokens"),
])  # fmt: skip
def test_bad_pools_are_refused_up_front(tmp_path, engine, expected):
    path = _pool(tmp_path, **engine)
    proc = subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", "up", str(path),
                           "--state-dir", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
