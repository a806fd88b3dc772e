"""A per-user registry of local fleets, so `kvfleet status` finds one from any directory.

`kvfleet up` records each fleet's state dir under `$XDG_STATE_HOME/kvfleet/fleets/`
(default `~/.local/state/kvfleet/fleets/`), one small JSON file per state dir. Entries
whose state dir is gone are dropped when read. Nothing secret is written here.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


def registry_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kvfleet" / "fleets"


@dataclass(slots=True, frozen=True)
class Entry:
    pool: str
    state_dir: Path


def _entry_file(state_dir: Path) -> Path:
    key = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]
    return registry_dir() / f"{key}.json"


def register(pool: str, state_dir: Path) -> None:
    """Best effort: a read-only home only means `status` needs `--state-dir`."""
    path = _entry_file(state_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pool": pool, "state_dir": str(state_dir.resolve())}))
        tmp.replace(path)
    except OSError:
        pass


def entries() -> list[Entry]:
    out = []
    for path in sorted(registry_dir().glob("*.json")):
        try:
            data = json.loads(path.read_text())
            entry = Entry(str(data["pool"]), Path(data["state_dir"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (entry.state_dir / "state.json").is_file():
            out.append(entry)
        else:
            path.unlink(missing_ok=True)  # the fleet's state dir is gone
    return out
