"""Launch kvfleet processes (engines, routers, ...) on 127.0.0.1 for tests; generic.

    with ProcessGroup(tmp_path) as procs:
        engine = procs.start(kvfleet_argv("engine", "--model", "tiny-random", "--port", "{port}"))
        ... engine.url ...

`{port}` in argv is replaced by a free port; the process counts as up once
GET {url}{health_path} answers 200. Output goes to a log file (never a pipe that could
fill up), shown in the error when a process dies or never gets healthy. Every process
runs in its own session and is killed with its children at teardown: no orphans.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvfleet_bench.procs import free_port

HOST = "127.0.0.1"
__all__ = ["ProcessGroup", "ServerProcess", "free_port", "http_status", "kvfleet_argv",
           "wait_healthy"]


def kvfleet_argv(*args: str) -> list[str]:
    """The `kvfleet` console script, run through this interpreter."""
    return [sys.executable, "-m", "kvfleet_operator.cli.main", *args]


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """Status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    host: str = HOST

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def is_running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.is_running():
            self.proc.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the process and everything in its session."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class ProcessGroup:
    """Starts processes and guarantees they are gone when the group closes."""

    log_dir: Path
    processes: list[ServerProcess] = field(default_factory=list)

    def start(
        self,
        argv: list[str],
        *,
        health_path: str = "/health",
        timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> ServerProcess:
        # A port we picked can be taken by another process between the pick and the bind
        # (tests run beside each other): then pick again, a bounded number of times.
        attempts = 1 if port else 3
        for attempt in range(attempts):
            server = self._launch(argv, port or free_port(), env)
            try:
                wait_healthy(server, health_path, timeout_s)
                return server
            except RuntimeError:
                if attempt + 1 == attempts or not _lost_the_port(server):
                    raise
        raise AssertionError("unreachable")

    def _launch(self, argv: list[str], port: int, env: dict[str, str] | None) -> ServerProcess:
        argv = [a.replace("{port}", str(port)) for a in argv]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"proc-{len(self.processes)}-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, start_new_session=True,
            )
        server = ServerProcess(proc, port, log_path)
        self.processes.append(server)
        return server

    def close(self) -> None:
        for server in self.processes:
            server.kill()
        self.processes.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lost_the_port(server: ServerProcess) -> bool:
    return not server.is_running() and "address already in use" in server.log_text()


def wait_healthy(server: ServerProcess, health_path: str = "/health",
                 timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.is_running():
            raise RuntimeError(
                f"process exited with {server.proc.returncode} before getting healthy:\n"
                + server.log_text()[-4000:]
            )
        if http_status(server.url + health_path) == 200:
            return
        time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"process not healthy after {timeout_s}s:\n" + server.log_text()[-4000:])
