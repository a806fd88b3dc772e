"""`kvfleet up` refuses bad input with one line and exit code 2, and starts nothing."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")


def _up(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", "up", *args],
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


def test_a_vllm_pool_needs_a_python_with_vllm(tmp_path, monkeypatch):
    monkeypatch.delenv("KVFLEET_VLLM_PYTHON", raising=False)
    pool = _bad_pool(tmp_path, (Path(EXAMPLES) / "vllm-unified.yaml").read_text()
                     .replace("blockSize: 16", "blockSize: 32"))  # fmt: skip
    proc = _up(pool, "--state-dir", str(tmp_path / "s"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "needs a Python with `vllm` installed" in lines[0]
    assert "KVFLEET_VLLM_PYTHON" in lines[0]


def test_a_vllm_pool_with_a_block_size_the_cpu_backend_cannot_use(tmp_path):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has a GPU: vLLM would not run on its CPU backend")
    proc = _up(f"{EXAMPLES}/vllm-unified.yaml", "--state-dir", str(tmp_path / "s"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "spec.engine.blockSize: 16 cannot run on vLLM's CPU backend" in lines[0]
