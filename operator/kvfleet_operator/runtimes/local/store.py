"""The loop's `StateStore` port for a local fleet: `state.json` in the fleet's state dir.

One file holds what `kvfleet status` shows (replicas, signals, router view, conditions,
recent events) and what a restarted `up` carries on from: the pool status and the loop's
state (desired counts, autoscaler history, drain start times, the last pushed config).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvfleet_operator.api.status import PoolStatus, parse_status
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.ports import EventSink, Saved
from kvfleet_operator.loop.state import LoopState
from kvfleet_operator.runtimes.local.state_dir import StateDir


def saved_from(previous: dict[str, Any] | None, pool_name: str) -> Saved | None:
    """What an earlier run of this pool left in state.json; junk gives a fresh start."""
    if not previous or previous.get("pool") != pool_name:
        return None
    try:
        loop = LoopState.from_dict(previous.get("loop") or {})
    except ValueError:
        loop = LoopState()
    return Saved(parse_status(previous.get("status")), loop)


class StateFileStore:
    def __init__(
        self,
        state_dir: StateDir,
        pool_name: str,
        base: dict[str, Any],
        replicas: Callable[[], list[dict[str, Any]]],
        recent_events: Callable[[], list[dict[str, str]]],
        events: EventSink,
    ) -> None:
        self.state_dir = state_dir
        self.pool_name = pool_name
        self.base = base  # pool, pid, endpoint...: the caller may update it
        self._replicas = replicas
        self._recent_events = recent_events
        self._events = events
        self.last: dict[str, Any] = {}

    def load(self) -> Saved | None:
        return saved_from(self.state_dir.read_state(), self.pool_name)

    async def save(self, status: PoolStatus, loop: LoopState, view: dict[str, Any]) -> None:
        state = {
            **self.base,
            "updated_at": time.time(),
            "replicas": self._replicas(),
            **view,
            "status": status.to_dict(),
            "loop": loop.to_dict(),
            "events": self._recent_events(),
        }
        self.last = state
        try:
            self.state_dir.write_state(state)
        except OSError as exc:  # e.g. the dir was removed under us; keep serving
            self._events.emit(ev.warning(
                ev.EventReason.STATE_WRITE_FAILED,
                f"cannot write state to {self.state_dir.path}: {exc.strerror}",
            ))  # fmt: skip
