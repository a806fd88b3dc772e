"""Drive a real `kvfleet up` process from a test and prove it leaves nothing behind.

Every process the fleet starts inherits a unique marker in its environment, so after `up`
exits a scan of /proc finds any survivor, however it was started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvfleet_bench.procs import processes_with_env

MARKER_ENV = "KVFLEET_E2E_MARKER"
POOLS = Path(__file__).parent / "pools"


def processes_with_marker(marker: str) -> list[int]:
    """Live processes this run marked (MARKER_ENV=marker)."""
    return processes_with_env(MARKER_ENV, marker)


class Fleet:
    def __init__(self, pool: str, tmp_path: Path, num_start: int = 0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.pool = pool
        self.tmp_path = tmp_path
        self.num_start = num_start
        self.extra_args = extra_args
        self.marker = uuid.uuid4().hex
        self.successor: Fleet | None = None  # cleaned up with this one
        self.state_dir = tmp_path / "state"
        self.out_path = tmp_path / f"up{num_start}.out"
        env = {**os.environ, MARKER_ENV: self.marker}
        tmp_path.mkdir(parents=True, exist_ok=True)
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kvfleet_operator.cli.main", "up", str(POOLS / pool),
                 "--state-dir", str(self.state_dir), *extra_args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )

    def restart(self) -> Fleet:
        """Another `kvfleet up` of the same pool on the same state dir."""
        self.cleanup()
        self.successor = Fleet(self.pool, self.tmp_path, self.num_start + 1, self.extra_args)
        return self.successor

    # --- reading ----------------------------------------------------------------------------

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_for(self, what: str, predicate: Callable[[dict[str, Any]], bool],
                 timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state()
            if state and predicate(state):
                return state
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = "\n".join(self.output().splitlines()[-30:])
        raise AssertionError(f"timed out waiting for {what}; `kvfleet up` said:\n{tail}")

    @property
    def endpoint(self) -> str:
        return self.state()["endpoint"]

    def replicas(self, state: dict[str, Any], role: str) -> list[dict[str, Any]]:
        return [r for r in state.get("replicas", []) if r["role"] == role]

    def num_ready(self, state: dict[str, Any], role: str) -> int:
        return sum(r["state"] == "ready" for r in self.replicas(state, role))

    def wait_ready(self, role: str, num: int, timeout_s: float = 60.0) -> dict[str, Any]:
        return self.wait_for(f"{num} ready {role} replica(s)",
                             lambda s: self.num_ready(s, role) == num
                             and len(self.replicas(s, role)) == num, timeout_s)

    def router_view(self) -> dict[str, Any]:
        token = (self.state_dir / "admin-token").read_text().strip()
        base = self.endpoint.removesuffix("/v1")
        req = urllib.request.Request(f"{base}/admin/config",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def events(self) -> list[str]:
        """Every progress line `up` printed, without its timestamp."""
        return [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in self.output().splitlines()]

    # --- stopping ---------------------------------------------------------------------------

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    def leftovers(self, wait_s: float = 5.0) -> list[int]:
        """Marked processes still alive after up to `wait_s` (they may be mid-exit)."""
        deadline = time.monotonic() + wait_s
        while True:
            alive = processes_with_marker(self.marker)
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)

    def cleanup(self) -> None:
        """Teardown: whatever happened in the test, nothing it started survives it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in processes_with_marker(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.successor is not None:
            self.successor.cleanup()
