"""`kvfleet up` refuses bad input with one line and exit code 2, and starts nothing."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")


def _up(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kvfleet_operator.cli", "up", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _bad_pool(tmp_path, text):
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "required: pool"),
        (["/no/such/pool.yaml"], "cannot read"),
        ([f"{EXAMPLES}/local-sim.yaml", "--port", "70000"], "out of range"),
        ([f"{EXAMPLES}/local-sim.yaml", "--port", "x"], "invalid int value"),
        ([f"{EXAMPLES}/vllm-unified.yaml"], "needs a Python with `vllm` installed"),
        ([f"{EXAMPLES}/local-sim.yaml", "--restart-backoff", "0"], "--restart-backoff must be"),
    ],
)
def test_bad_arguments(args, expected, tmp_path):
    proc = _up(*args, "--state-dir", str(tmp_path / "s")) if args else _up()
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        ("[1, 2]", "must be an object"),
        ("apiVersion: v1\nkind: InferencePool\n", "apiVersion"),
        (":\n  - : [", "not valid YAML"),
        ("apiVersion: kvfleet.io/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
         "spec:\n  model: {name: m, source: builtin://x}\n  engine: {kind: builtin}\n"
         "  topology: {unified: {replicas: {min: 3, max: 1}}}\n", "min"),
    ],
)
def test_bad_pools(manifest, field, tmp_path):
    proc = _up(_bad_pool(tmp_path, manifest), "--state-dir", str(tmp_path / "s"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


def test_port_in_use(busy_port, tmp_path):
    proc = _up(f"{EXAMPLES}/local-sim.yaml", "--port", str(busy_port),
               "--state-dir", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert f"port {busy_port} on 127.0.0.1 is in use" in proc.stderr
