"""`kvfleet status [POOL] [--state-dir DIR] [--json]`: a local fleet, seen from another terminal.

It reads the state file that `kvfleet up` keeps in the state dir (default
./.kvfleet/<pool-name>/). With no POOL and one fleet under ./.kvfleet, that one is shown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvfleet_operator.runtimes.procs import is_pid_alive
from kvfleet_operator.runtimes.progress import render_status
from kvfleet_operator.runtimes.state_dir import STATE_FILE, StateDir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvfleet status", description=__doc__.splitlines()[0])
    parser.add_argument("pool", nargs="?", help="pool name (default: the only fleet in ./.kvfleet)")
    parser.add_argument("--state-dir", type=Path, help="the state dir that `kvfleet up` used")
    parser.add_argument("--json", action="store_true", help="print the raw state as JSON")
    return parser


def find_state_dir(pool: str | None, state_dir: Path | None) -> Path:
    """The state dir to read, or ValueError with a one-line reason."""
    if state_dir is not None:
        return state_dir
    root = Path.cwd() / ".kvfleet"
    if pool is not None:
        return root / pool
    found = sorted(p.parent for p in root.glob(f"*/{STATE_FILE}"))
    if not found:
        raise ValueError("no local fleet found under ./.kvfleet; start one with `kvfleet up`")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ValueError(f"several fleets under ./.kvfleet ({names}); name one")
    return found[0]


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        path = find_state_dir(args.pool, args.state_dir)
    except ValueError as exc:
        print(f"kvfleet status: {exc}", file=sys.stderr)
        return 1
    state = StateDir(path).read_state()
    if state is None:
        print(f"kvfleet status: no fleet state in {path}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(state, indent=1, sort_keys=True))
        return 0
    pid = state.get("pid")
    is_running = isinstance(pid, int) and is_pid_alive(pid)
    print("\n".join(render_status(state, is_running)))
    return 0
