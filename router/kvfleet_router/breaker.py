"""Passive outlier ejection as a circuit breaker, with time injected (pure, no I/O).

closed --(eject_after_errors consecutive failures)--> open for eject_s
open --(eject_s elapsed)--> half-open: exactly one trial request may pass
half-open --success--> closed (eject_s back to base)
half-open --failure--> open again for min(2 * eject_s, eject_max_s)
"""

from __future__ import annotations

from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


@dataclass(slots=True)
class CircuitBreaker:
    eject_after_errors: int = 3
    eject_base_s: float = 2.0
    eject_max_s: float = 30.0
    num_consecutive_failures: int = 0
    state: str = CLOSED
    open_until: float = 0.0
    eject_s: float = 0.0
    is_trial_in_flight: bool = False
    num_ejections: int = 0

    def __post_init__(self) -> None:
        if self.eject_after_errors < 1:
            raise ValueError("eject_after_errors must be >= 1")
        self.eject_s = self.eject_s or self.eject_base_s

    def current_state(self, now: float) -> str:
        if self.state == OPEN and now >= self.open_until:
            return HALF_OPEN
        return self.state

    def can_attempt(self, now: float) -> bool:
        state = self.current_state(now)
        if state == CLOSED:
            return True
        return state == HALF_OPEN and not self.is_trial_in_flight

    def on_attempt(self, now: float) -> None:
        """Call when a request is actually sent; claims the half-open trial slot."""
        if self.current_state(now) == HALF_OPEN:
            self.state = HALF_OPEN
            self.is_trial_in_flight = True

    def record_success(self) -> None:
        self.num_consecutive_failures = 0
        self.state = CLOSED
        self.is_trial_in_flight = False
        self.eject_s = self.eject_base_s

    def record_failure(self, now: float) -> bool:
        """Count one failure; True when this failure ejected the endpoint."""
        self.num_consecutive_failures += 1
        was_trial = self.state == HALF_OPEN
        self.is_trial_in_flight = False
        if was_trial:
            self.eject_s = min(self.eject_s * 2, self.eject_max_s)
        elif self.state == CLOSED and self.num_consecutive_failures >= self.eject_after_errors:
            self.eject_s = self.eject_base_s
        else:
            return False
        self.state = OPEN
        self.open_until = now + self.eject_s
        self.num_ejections += 1
        return True

    def release_trial(self) -> None:
        """A trial ended with no verdict (the client left): let another one through."""
        self.is_trial_in_flight = False
