"""Exponential restart backoff for crashed replicas (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Delay before restart number `num_restarts + 1`: base * 2**n, capped.

    A replica that stayed up for `reset_after_s` is considered healthy again, so its next
    crash starts from `base_s` instead of the cap.
    """

    base_s: float = 0.5
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_s < self.base_s:
            raise ValueError("backoff needs 0 < base_s <= max_s")
        if self.reset_after_s <= 0:
            raise ValueError("backoff reset_after_s must be > 0")

    def delay(self, num_recent_crashes: int) -> float:
        return min(self.max_s, self.base_s * 2 ** max(0, num_recent_crashes - 1))

    def recent_crashes(self, num_recent_crashes: int, uptime_s: float) -> int:
        """The crash count to carry forward after a crash that followed `uptime_s` of life."""
        return 1 if uptime_s >= self.reset_after_s else num_recent_crashes + 1
