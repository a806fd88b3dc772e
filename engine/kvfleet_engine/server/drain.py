"""The drain state machine for SIGTERM: serving -> draining -> stopped (pure, time injected).

While draining the server admits nothing new (503) and /health says so; it stops once
nothing is in flight or the drain timeout has passed, whichever comes first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(slots=True)
class DrainState:
    timeout_s: float
    phase: Phase = Phase.SERVING
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.timeout_s < 0:
            raise ValueError("drain timeout must be >= 0")

    @property
    def is_admitting(self) -> bool:
        return self.phase is Phase.SERVING

    @property
    def is_draining(self) -> bool:
        return self.phase is Phase.DRAINING

    def begin(self, now: float) -> bool:
        """Start draining; False if already draining or stopped (a second SIGTERM)."""
        if self.phase is not Phase.SERVING:
            return False
        self.phase = Phase.DRAINING
        self.deadline = now + self.timeout_s
        return True

    def can_stop(self, now: float, num_in_flight: int) -> bool:
        """True once draining and either idle or out of time; moves to STOPPED."""
        if self.phase is Phase.STOPPED:
            return True
        if self.phase is not Phase.DRAINING or self.deadline is None:
            return False
        if num_in_flight == 0 or now >= self.deadline:
            self.phase = Phase.STOPPED
            return True
        return False
