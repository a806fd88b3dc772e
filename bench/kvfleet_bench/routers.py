"""The routers under test, each a real process on 127.0.0.1, registered by name.

- `direct`: no router; the load generator spreads requests over the backends itself.
- `kvfleet`: `.venv/bin/kvfleet router --config F --host 127.0.0.1 --port N --admin-token-file T`.
- `sglang`, `vllm`: the Rust peers from bench/.venv-peers (bench/setup_peers.sh).

A target is "name:policy", e.g. "kvfleet:cache-aware" or "sglang:cache_aware".
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kvfleet_bench import procs

PEERS_VENV = procs.BENCH_DIR / ".venv-peers"
KVFLEET_BIN = Path(sys.executable).parent / "kvfleet"
# sglang-router fetches a tokenizer from a hub when a worker reports a model path; a closed
# local port makes any such attempt fail at once (the machine is offline anyway).
PEER_ENV = {"HF_ENDPOINT": "http://127.0.0.1:9", "RUST_LOG": "warn"}


@dataclass(slots=True)
class RouterProcess:
    target: str
    urls: list[str]  # where the load generator sends requests (several only for direct)
    proc: subprocess.Popen | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)


Launcher = Callable[..., RouterProcess]


def is_peer_venv_ready() -> bool:
    bin_dir = PEERS_VENV / "bin"
    return (bin_dir / "python").exists() and (bin_dir / "vllm-router").exists()


def is_kvfleet_router_available() -> bool:
    return (procs.REPO_DIR / "router" / "kvfleet_router" / "cli.py").exists()


def launch_direct(policy: str, backends: list[str], workdir: Path, cpus: str | None):
    return RouterProcess(target=f"direct:{policy}", urls=list(backends))


def _wait_workers(url: str, num_backends: int) -> bool:
    body = json.loads(procs.http_get(f"{url}/workers"))
    workers = body.get("workers", [])
    return len(workers) >= num_backends and all(w.get("is_healthy", True) for w in workers)


def launch_sglang(
    policy: str, backends: list[str], workdir: Path, cpus: str | None,
    extra_args: list[str] | None = None,
) -> RouterProcess:
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        str(PEERS_VENV / "bin" / "python"), "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *backends,
        "--policy", policy, "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(procs.free_port()), "--max-concurrent-requests", "-1",
        "--log-level", "warn", *(extra_args or []),
    ]
    proc = procs.start(cmd, workdir / f"sglang-{policy}.log", cpus, PEER_ENV)
    # It serves before registration finishes: wait until every worker is listed.
    procs.wait_until(lambda: _wait_workers(url, len(backends)), proc, "sglang-router", 60)
    return RouterProcess(target=f"sglang:{policy}", urls=[url], proc=proc)


def launch_vllm(policy: str, backends: list[str], workdir: Path, cpus: str | None):
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        str(PEERS_VENV / "bin" / "vllm-router"),
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *backends,
        "--policy", policy, "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(procs.free_port()), "--max-concurrent-requests", "100000",
        "--log-level", "warning",
    ]
    proc = procs.start(cmd, workdir / f"vllm-{policy}.log", cpus, PEER_ENV)
    procs.wait_until(partial(procs.http_get, f"{url}/v1/models"), proc, "vllm-router", 60)
    return RouterProcess(target=f"vllm:{policy}", urls=[url], proc=proc)


def kvfleet_config(
    backends: list[str], policy: str, endpoint: dict | None = None,
    sections: dict[str, dict] | None = None,
) -> dict:
    """A static pool in the schema of router/kvfleet_router/config.py (kvfleet.io/router/v1).

    `endpoint` adds fields to every endpoint (e.g. capacity); `sections` merge into the
    top-level sections (e.g. prefix={"block_bytes": 64}).
    """
    config: dict = {
        "version": 1,
        "endpoints": [
            {"name": f"b{i}", "url": url, "role": "unified", "state": "active", **(endpoint or {})}
            for i, url in enumerate(backends)
        ],
        "policy": {"name": policy},
    }
    for section, values in (sections or {}).items():
        config.setdefault(section, {}).update(values)
    return config


def launch_kvfleet(
    policy: str, backends: list[str], workdir: Path, cpus: str | None,
    endpoint: dict | None = None, sections: dict[str, dict] | None = None,
) -> RouterProcess:
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = workdir / f"kvfleet-{policy}.json"  # JSON is YAML, so load_file reads it
    config_path.write_text(json.dumps(kvfleet_config(backends, policy, endpoint, sections)))
    token_path = workdir / "admin-token"
    if not token_path.exists():
        token_path.write_text(secrets.token_hex(16))
        token_path.chmod(0o600)
    # the console script when installed next to this Python, else the same entry point
    entry = [str(KVFLEET_BIN)] if KVFLEET_BIN.exists() else [sys.executable, "-m",
                                                              "kvfleet_operator.cli.main"]
    cmd = [
        *entry, "router", "--config", str(config_path), "--host", "127.0.0.1",
        "--port", str(port), "--admin-token-file", str(token_path),
    ]
    proc = procs.start(cmd, workdir / f"kvfleet-{policy}.log", cpus)
    procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "kvfleet router", 60)
    return RouterProcess(target=f"kvfleet:{policy}", urls=[url], proc=proc)


LAUNCHERS: dict[str, Launcher] = {
    "direct": launch_direct,
    "kvfleet": launch_kvfleet,
    "sglang": launch_sglang,
    "vllm": launch_vllm,
}


def parse_target(target: str) -> tuple[str, str]:
    name, _, policy = target.partition(":")
    if name not in LAUNCHERS:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(LAUNCHERS)}")
    return name, policy or "default"


def launch(
    target: str,
    backends: list[str],
    workdir: Path,
    cpus: str | None,
    options: dict[str, dict] | None = None,
) -> RouterProcess:
    """Start a target; `options[router name]` goes to that router's launcher as keywords."""
    name, policy = parse_target(target)
    return LAUNCHERS[name](policy, backends, workdir, cpus, **(options or {}).get(name, {}))


def available_targets(targets: list[str]) -> tuple[list[str], dict[str, str]]:
    """The targets that can run here, and why each other one is skipped."""
    keep: list[str] = []
    skipped: dict[str, str] = {}
    for target in targets:
        name, _ = parse_target(target)
        if name in ("sglang", "vllm") and not is_peer_venv_ready():
            skipped[target] = "bench/.venv-peers missing; run bench/setup_peers.sh"
        elif name == "kvfleet" and not is_kvfleet_router_available():
            skipped[target] = "kvfleet_router.cli not in this build yet"
        else:
            keep.append(target)
    return keep, skipped
