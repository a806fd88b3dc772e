"""Attained service per tenant: tokens served (input + output), decayed exponentially
with time constant `window_s`, so a burst an hour ago weighs nothing now (the virtual
token counter of VTC, Sheng et al. 2024, with forgetting).

    s = AttainedService(window_s=60)
    s.charge("a", 512, now)      # a request of tenant a was dispatched
    s.value("a", now)            # its decayed service
    s.lift("b", floor, now)      # b was idle: it starts at the backlogged minimum

Pure: time is passed in.
"""

from __future__ import annotations

import math

_PRUNE_AT = 4096  # tenants kept before decayed ones are dropped


class AttainedService:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._served: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def value(self, tenant: str, now: float) -> float:
        tokens, at = self._served.get(tenant, (0.0, now))
        if now <= at:
            return tokens
        return tokens * math.exp(-(now - at) / self.window_s)

    def charge(self, tenant: str, tokens: float, now: float) -> None:
        self._served[tenant] = (max(0.0, self.value(tenant, now) + tokens), now)
        if len(self._served) > _PRUNE_AT:
            self._served = {t: v for t, v in self._served.items()
                            if self.value(t, now) >= 1.0}

    def lift(self, tenant: str, floor: float, now: float) -> None:
        """Raise the tenant's service to at least `floor` (an idle tenant cannot bank
        credit and then starve the others when it returns)."""
        if self.value(tenant, now) < floor:
            self._served[tenant] = (floor, now)
