"""Process plumbing for the benchmarks: free ports, pinned launches, readiness, RSS, teardown.

Every process is started in its own session so that teardown can signal exactly the group
we started (never by name), and every one binds 127.0.0.1. `free_port` is the one `kvfleet up`
picks ports with (kvfleet_operator.runtimes.local.procs); the tests take it from here
(tests/helpers/procs.py re-exports it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kvfleet_operator.runtimes.local.procs import free_port

BENCH_DIR = Path(__file__).resolve().parents[1]  # bench/: entry scripts, results, caches
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
HOST = "127.0.0.1"
__all__ = ["cpu_seconds", "free_port", "free_port_triple", "http_get", "http_post_json",
           "listen_drops", "pin_prefix", "rss_bytes", "start", "stop", "usable_cpus", "wait_until"]


def free_port_triple(host: str = HOST) -> int:
    """A port p with p+1 and p+2 free too (vLLM: HTTP, KV-event PUB, replay)."""
    for _ in range(100):
        port = free_port(host)
        if port + 2 >= 65536:
            continue
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as sock:
                    sock.bind((host, p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port triple")


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def pin_prefix(cpus: str | None) -> list[str]:
    """`taskset -c CPUS` when pinning is asked for and possible, else nothing."""
    if not cpus or not Path("/usr/bin/taskset").exists():
        return []
    return ["taskset", "-c", cpus]


def start(
    cmd: list[str], log_path: Path, cpus: str | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
    try:
        return subprocess.Popen(
            pin_prefix(cpus) + cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            cwd=REPO_DIR,
        )
    finally:
        log.close()


def stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM the group we started, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def http_get(url: str, timeout_s: float = 2.0, headers: dict[str, str] | None = None) -> bytes:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return bytes(resp.read())


def http_post_json(url: str, body: object, timeout_s: float = 5.0) -> object:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"null")


def wait_until(
    is_ready: Callable[[], object], proc: subprocess.Popen, what: str, timeout_s: float = 30.0
) -> None:
    """Poll until `is_ready()` returns anything but False without raising an I/O error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            if is_ready() is not False:
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} was not ready after {timeout_s:.0f}s")


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += _descendants(int(child))
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants, from /proc."""
    total = 0
    for p in set(_descendants(pid)):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def cpu_seconds(pid: int, with_descendants: bool = True) -> float:
    """User+system CPU time of a process (and its descendants), from /proc/<pid>/stat."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in set(_descendants(pid)) if with_descendants else {pid}:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def listen_drops() -> int:
    """Machine-wide count of connections dropped because a listen backlog was full."""
    try:
        rows = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()
                if line.startswith("TcpExt:")]
        return int(dict(zip(rows[0][1:], rows[1][1:], strict=True)).get("ListenDrops", 0))
    except (OSError, IndexError, ValueError):
        return 0


def processes_with_env(name: str, value: str) -> list[int]:
    """Live (not zombie) processes whose environment holds `name=value`: what a run that
    marks its children's environment left behind."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if needle not in env.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # exited, only waiting to be reaped
        except OSError:
            continue
        found.append(int(entry))
    return found
