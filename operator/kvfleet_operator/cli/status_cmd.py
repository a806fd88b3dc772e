"""`kvfleet status [POOL] [--state-dir DIR] [--json]`: a local fleet, seen from another terminal.

It reads the state file that `kvfleet up` keeps in the state dir (default
./.kvfleet/<pool-name>/). Fleets are found under ./.kvfleet and, from any directory, in the
per-user registry `kvfleet up` writes (`runtimes/local/fleet_registry.py`). With no POOL: the only
fleet found, else the only running one. A fleet whose `up` is gone shows as stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvfleet_operator.runtimes.local import fleet_registry
from kvfleet_operator.runtimes.local.progress import render_status
from kvfleet_operator.runtimes.local.replicas import leftover_records, running_records
from kvfleet_operator.runtimes.local.state_dir import STATE_FILE, StateDir, running_pid


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvfleet status", description=__doc__.splitlines()[0])
    parser.add_argument("pool", nargs="?", help="pool name (default: the only fleet in ./.kvfleet)")
    parser.add_argument("--state-dir", type=Path, help="the state dir that `kvfleet up` used")
    parser.add_argument("--json", action="store_true", help="print the raw state as JSON")
    return parser


def _is_running(state_dir: Path) -> bool:
    return running_pid(StateDir(state_dir).read_state()) is not None


def known_fleets() -> list[fleet_registry.Entry]:
    """Fleets under ./.kvfleet, then those in the registry, each state dir once."""
    local = [fleet_registry.Entry(p.parent.name, p.parent)
             for p in sorted((Path.cwd() / ".kvfleet").glob(f"*/{STATE_FILE}"))]  # fmt: skip
    seen: set[Path] = set()
    out = []
    for entry in local + fleet_registry.entries():
        key = entry.state_dir.resolve()
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def find_state_dir(pool: str | None, state_dir: Path | None) -> Path:
    """The state dir to read, or ValueError with a one-line reason."""
    if state_dir is not None:
        return state_dir
    found = [e for e in known_fleets() if pool is None or e.pool == pool]
    if not found:
        what = f"no local fleet named {pool!r}" if pool else "no local fleet found"
        raise ValueError(f"{what} (under ./.kvfleet or in the registry); start one with "
                         "`kvfleet up`, or pass --state-dir")  # fmt: skip
    if len(found) > 1:
        running = [e for e in found if _is_running(e.state_dir)]
        if len(running) == 1:
            return running[0].state_dir
        names = ", ".join(f"{e.pool} ({e.state_dir})" for e in found)
        raise ValueError(f"several fleets: {names}; name one or pass --state-dir")
    return found[0].state_dir


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
    is_running = _is_running(path)
    left = [] if is_running else [str(r.get("name")) for r in running_records(
        leftover_records(state, str(state.get("pool")), StateDir(path).read_children()))]
    print("\n".join(render_status(state, is_running, left_running=left)))
    return 0
