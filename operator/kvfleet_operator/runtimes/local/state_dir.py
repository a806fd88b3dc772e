"""The local fleet's state directory: ./.kvfleet/<pool>/ by default (git-ignored).

It holds `state.json` (what `kvfleet status` shows, including the autoscaler history so a
restarted `up` continues where it left off, and the records of the children it adopts),
`admin-token` and `engine-token` (mode 0600, never printed; a restarted `up` that adopts
running children keeps them, since those children hold them), the router config and one log
file per child.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
CHILDREN_FILE = "children.json"  # the runtime's records of what it runs, on every change
TOKEN_FILE = "admin-token"
ENGINE_TOKEN_FILE = "engine-token"
LOG_DIR = "logs"


def default_state_dir(pool_name: str, cwd: Path | None = None) -> Path:
    return (cwd or Path.cwd()) / ".kvfleet" / pool_name


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def state_file(self) -> Path:
        return self.path / STATE_FILE

    @property
    def token_file(self) -> Path:
        return self.path / TOKEN_FILE

    def log_file(self, child_name: str) -> Path:
        return self.path / LOG_DIR / f"{child_name}.log"

    def create(self) -> None:
        # 0700 only when we create it: never re-permission a directory the user pointed at.
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.path / LOG_DIR).mkdir(exist_ok=True)

    def new_admin_token(self) -> str:
        """A fresh token per fleet start, written 0600 before any byte of it lands on disk."""
        return _new_secret(self.token_file)

    def admin_token(self, is_kept: bool) -> str:
        """The admin token the running router holds when `is_kept` (an adopted fleet), else
        a fresh one."""
        return _kept_secret(self.token_file) if is_kept else _new_secret(self.token_file)

    def engine_token(self, is_kept: bool) -> str:
        """The engines' shared token (KV transfer and events), kept like `admin_token`."""
        path = self.path / ENGINE_TOKEN_FILE
        return _kept_secret(path) if is_kept else _new_secret(path)

    def read_admin_token(self) -> str:
        return self.token_file.read_text().strip()

    def write_state(self, state: dict[str, Any]) -> None:
        """Atomic: a reader never sees half a file."""
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_file)

    def write_children(self, records: list[dict[str, Any]]) -> None:
        """The runtime's child records, atomically, each time they change: a killed `up`
        leaves no process its successor cannot find (state.json is written once a tick)."""
        tmp = (self.path / CHILDREN_FILE).with_suffix(".tmp")
        tmp.write_text(json.dumps(records))
        os.replace(tmp, self.path / CHILDREN_FILE)

    def read_children(self) -> list[dict[str, Any]] | None:
        try:
            data = json.loads((self.path / CHILDREN_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else None

    def read_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None


def _new_secret(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)
    return token


def _kept_secret(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    return token or _new_secret(path)


def running_pid(state: dict[str, Any] | None) -> int | None:
    """The pid of the `kvfleet up` that wrote `state`, if it still runs and has not stopped."""
    from kvfleet_operator.runtimes.local.procs import is_pid_alive

    pid = (state or {}).get("pid")
    if not isinstance(pid, int) or (state or {}).get("is_stopped") or not is_pid_alive(pid):
        return None
    return pid
