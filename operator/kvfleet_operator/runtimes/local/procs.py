"""Child processes of a local fleet.

Every child gets its own session (so a terminal's Ctrl-C reaches only `kvfleet up`, which then
stops the children in order). By default a child also gets PR_SET_PDEATHSIG=SIGKILL, so it
dies with its parent; the fleet's router and engines are spawned with `outlive_parent=True`
instead, so a SIGKILLed `up` leaves them serving and a restarted `up` adopts them
(`adopt`: a pid is taken back only if it still runs and started when it was recorded to,
`start_ticks`, so a reused pid is never mistaken for our child).
Ports are picked at random below the kernel's ephemeral range and checked free by binding
them (`free_port`): a port bound as port 0 lies inside that range, where the local end of any
outgoing connection may take it before the child listens on it.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


# Resolved before any fork: after fork only async-signal-safe work may run in the child.
_PRCTL = _load_prctl()


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets SIGKILL when `parent_pid` (the caller) dies."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl: then nobody would signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


PORT_FLOOR = 10000  # below: well-known services (Prometheus' 9090, ...)
_pick = random.SystemRandom()  # two processes seeded alike never pick the same sequence


def ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux; IANA's elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range so that no outgoing
    connection's local end takes it before our child binds it (seen in CI: an operator's
    liveness port taken while kopf opened its first connections)."""
    ceiling = ephemeral_floor()
    for _ in range(100 if ceiling - PORT_FLOOR >= 1000 else 0):
        port = _pick.randrange(PORT_FLOOR, ceiling)
        # no SO_REUSEADDR: a port still in TIME_WAIT is not offered either
        if listen_error(port, host, reuse_address=False) is None:
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded machine
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listen_error(port: int, host: str = "127.0.0.1", reuse_address: bool = True) -> str | None:
    """Why a server could not listen on host:port now (the OS's words), or None if it could.
    `reuse_address` as servers bind (aiohttp, uvicorn): a port in TIME_WAIT is free."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def can_bind(port: int, host: str = "127.0.0.1") -> bool:
    return listen_error(port, host) is None


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None,
          outlive_parent: bool = False) -> subprocess.Popen:  # fmt: skip
    """Start `argv` in its own session, output appended to `log_path`, dying with us unless
    `outlive_parent`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    preexec = None if outlive_parent else die_with_parent(os.getpid())
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - called from main thread
            close_fds=True,
        )


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/<pid>/stat field 22), or None if it
    does not run (gone, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> list[str] | None:
    """The command line `pid` runs, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


EXIT_UNKNOWN = 255  # an adopted process's exit status: not our child, so nobody told us


class Adopted:
    """A running process an earlier `kvfleet up` started, taken back by pid: the part of
    Popen the runtime uses (pid, poll, wait, returncode). Its parent is init, which reaps it,
    so its exit status is unknown (`EXIT_UNKNOWN`)."""

    def __init__(self, pid: int, ticks: int) -> None:
        self.pid = pid
        self.ticks = ticks
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and start_ticks(self.pid) != self.ticks:
            self.returncode = EXIT_UNKNOWN
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode


def adopt(pid: object, ticks: object) -> Adopted | None:
    """The recorded process, if that very process still runs; else None."""
    if not isinstance(pid, int) or not isinstance(ticks, int) or pid <= 0:
        return None
    return Adopted(pid, ticks) if start_ticks(pid) == ticks else None


Proc = subprocess.Popen | Adopted


def signal_group(proc: Proc, sig: int) -> None:
    """Signal the child's whole process group (it leads its own session)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(procs: list[Proc], grace_s: float) -> None:
    """SIGTERM every child, wait up to `grace_s`, then SIGKILL what is left; reap them all."""
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        if proc.poll() is None:
            signal_group(proc, signal.SIGKILL)
            proc.wait()


def is_pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start_ticks(pid) is not None or not os.path.exists("/proc/self/stat")


def last_line(path: Path, max_bytes: int = 4096) -> str:
    """The last non-empty line of a log file (a process's one-line reason), or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
