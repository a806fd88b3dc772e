"""The routers under test, each a real process on 127.0.0.1, registered by name.

- `direct`: no router; the load generator spreads requests over the backends itself.
- `kvfleet`: `.venv/bin/kvfleet router --config F --host 127.0.0.1 --port N --admin-token-file T`.
- `sglang`, `vllm`: the Rust peers from bench/.venv-peers (bench/setup_peers.sh).
- `kvfleet-replicas3`: three kvfleet routers of one pool (one admin token, one config with
  `exchange: {enabled: true, peers: [the three]}`) behind Envoy as an L4 balancer
  (kvfleet_bench.replicas); `kvfleet-replicas3-noexchange`: the same with the exchange off.
- `kvfleet-w2`: one kvfleet router with `--workers 2` (skipped where the router lacks it).
- `aiohttp-floor`: kvfleet_bench.floor_proxy, aiohttp's server and kvfleet's upstream
  client with nothing between them (the least an aiohttp router can spend per request).

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
from typing import Any

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
    replica_set: Any = None  # a replicas.ReplicaSet (balancer + replicas) for those targets

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def router_pids(self) -> list[int]:
        """Every router process (each replica of a replica set; not the balancer)."""
        if self.replica_set is not None:
            return self.replica_set.pids()
        return [self.pid] if self.pid else []

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
        if self.replica_set is not None:
            self.replica_set.stop()


Launcher = Callable[..., RouterProcess]


def is_peer_venv_ready() -> bool:
    bin_dir = PEERS_VENV / "bin"
    return (bin_dir / "python").exists() and (bin_dir / "vllm-router").exists()


def is_kvfleet_router_available() -> bool:
    return (procs.REPO_DIR / "router" / "kvfleet_router" / "cli.py").exists()


def launch_direct(policy: str, backends: list[str], workdir: Path, cpus: str | None):
    return RouterProcess(target=f"direct:{policy}", urls=list(backends))


def launch_floor(policy: str, backends: list[str], workdir: Path, cpus: str | None):
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "kvfleet_bench.floor_proxy", "--port", str(port), *backends]
    proc = procs.start(cmd, workdir / "aiohttp-floor.log", cpus)
    procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "aiohttp floor", 60)
    return RouterProcess(target=f"aiohttp-floor:{policy}", urls=[url], proc=proc)


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


def admin_token_file(workdir: Path) -> Path:
    """One admin token per run directory: every kvfleet router of a run is of one pool."""
    token_path = workdir / "admin-token"
    if not token_path.exists():
        token_path.write_text(secrets.token_hex(16))
        token_path.chmod(0o600)
    return token_path


def kvfleet_command(config_path: Path, port: int, token_path: Path,
                    extra_args: list[str] | None = None) -> list[str]:
    # the console script when installed next to this Python, else the same entry point
    entry = [str(KVFLEET_BIN)] if KVFLEET_BIN.exists() else [sys.executable, "-m",
                                                              "kvfleet_operator.cli.main"]
    return [
        *entry, "router", "--config", str(config_path), "--host", "127.0.0.1",
        "--port", str(port), "--admin-token-file", str(token_path), *(extra_args or []),
    ]


def launch_kvfleet(
    policy: str, backends: list[str], workdir: Path, cpus: str | None,
    endpoint: dict | None = None, sections: dict[str, dict] | None = None,
    extra_args: list[str] | None = None, name: str = "kvfleet",
) -> RouterProcess:
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    config_path = workdir / f"{name}-{policy}.json"  # JSON is YAML, so load_file reads it
    config_path.write_text(json.dumps(kvfleet_config(backends, policy, endpoint, sections)))
    cmd = kvfleet_command(config_path, port, admin_token_file(workdir), extra_args)
    proc = procs.start(cmd, workdir / f"{name}-{policy}.log", cpus)
    procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "kvfleet router", 60)
    return RouterProcess(target=f"{name}:{policy}", urls=[url], proc=proc)


def launch_kvfleet_workers(
    num_workers: int, policy: str, backends: list[str], workdir: Path, cpus: str | None,
    endpoint: dict | None = None, sections: dict[str, dict] | None = None,
) -> RouterProcess:
    """`kvfleet router --workers N`: N processes on one port (SO_REUSEPORT)."""
    return launch_kvfleet(policy, backends, workdir, cpus, endpoint, sections,
                          ["--workers", str(num_workers)], f"kvfleet-w{num_workers}")


def launch_kvfleet_replicas(
    num_replicas: int, is_exchange: bool, policy: str, backends: list[str], workdir: Path,
    cpus: str | None, endpoint: dict | None = None, sections: dict[str, dict] | None = None,
) -> RouterProcess:
    from kvfleet_bench import replicas

    rs = replicas.ReplicaSet.start(num_replicas, is_exchange, policy, backends, workdir, cpus,
                                   endpoint, sections)
    return RouterProcess(target=f"{rs.name}:{policy}", urls=[rs.balancer.url],
                         replica_set=rs)


LAUNCHERS: dict[str, Launcher] = {
    "direct": launch_direct,
    "kvfleet": launch_kvfleet,
    "sglang": launch_sglang,
    "vllm": launch_vllm,
    "kvfleet-replicas3": partial(launch_kvfleet_replicas, 3, True),
    "kvfleet-replicas3-noexchange": partial(launch_kvfleet_replicas, 3, False),
    "kvfleet-w2": partial(launch_kvfleet_workers, 2),
    "aiohttp-floor": launch_floor,
}
# options for "kvfleet" (e.g. router_options) apply to these kvfleet variants too
KVFLEET_VARIANTS = ("kvfleet-replicas3", "kvfleet-replicas3-noexchange", "kvfleet-w2")


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
    key = "kvfleet" if name in KVFLEET_VARIANTS else name
    return LAUNCHERS[name](policy, backends, workdir, cpus, **(options or {}).get(key, {}))


def kvfleet_router_help() -> str:
    """`kvfleet router --help`, once per process (which flags this build has)."""
    global _HELP
    if _HELP is None:
        entry = [str(KVFLEET_BIN)] if KVFLEET_BIN.exists() else [
            sys.executable, "-m", "kvfleet_operator.cli.main"]
        try:
            proc = subprocess.run([*entry, "router", "--help"], capture_output=True, text=True,
                                  timeout=60, cwd=procs.REPO_DIR)
            _HELP = proc.stdout
        except (OSError, subprocess.TimeoutExpired):
            _HELP = ""
    return _HELP


_HELP: str | None = None


def is_exchange_available() -> bool:
    """The state exchange of issue 29 is wired into the router (exchange.py, used by app.py)."""
    pkg = procs.REPO_DIR / "router" / "kvfleet_router"
    app = pkg / "app.py"
    return (pkg / "exchange.py").exists() and app.exists() and "Exchange(" in app.read_text()


def available_targets(targets: list[str]) -> tuple[list[str], dict[str, str]]:
    """The targets that can run here, and why each other one is skipped."""
    keep: list[str] = []
    skipped: dict[str, str] = {}
    for target in targets:
        name, _ = parse_target(target)
        if name in ("sglang", "vllm") and not is_peer_venv_ready():
            skipped[target] = "bench/.venv-peers missing; run bench/setup_peers.sh"
        elif name.startswith("kvfleet") and not is_kvfleet_router_available():
            skipped[target] = "kvfleet_router.cli not in this build yet"
        elif name == "kvfleet-w2" and "--workers" not in kvfleet_router_help():
            skipped[target] = "this kvfleet router has no --workers flag yet"
        elif name == "kvfleet-replicas3" and not is_exchange_available():
            skipped[target] = "the router's state exchange (exchange.py) not in this build"
        elif name.startswith("kvfleet-replicas"):
            from kvfleet_bench import balancer

            is_ok, why = balancer.is_available()
            if is_ok:
                keep.append(target)
            else:
                skipped[target] = why
        else:
            keep.append(target)
    return keep, skipped
