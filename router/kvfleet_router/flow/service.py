"""Attained service per tenant: tokens served (input + output), decayed exponentially
with time constant `window_s`, so a burst an hour ago weighs nothing now (the virtual
token counter of VTC, Sheng et al. 2024, with forgetting).

    s = AttainedService(window_s=60, max_tenants=10_000)
    s.charge("a", 512, now)      # a request of tenant a was dispatched
    s.value("a", now)            # its decayed service
    s.lift("b", floor, now)      # b was idle: it starts at the backlogged minimum

Bounded: tenant ids come from a request header, so a client can name a new one per
request. When the table passes `max_tenants` (`flow_control.max_tracked_tenants`), it
drops every tenant decayed below one token and, if more than three quarters of the cap
are left, keeps only the three quarters with the most service: a forgotten tenant counts
as served nothing, so forgetting the least served changes the order least. Pruning to
three quarters makes its cost amortised O(log n) per charge, not O(n).

Pure: time is passed in.
"""

from __future__ import annotations

import heapq
import math

DEFAULT_MAX_TENANTS = 10_000  # flow_control.max_tracked_tenants' default


class AttainedService:
    def __init__(self, window_s: float, max_tenants: int = DEFAULT_MAX_TENANTS) -> None:
        if max_tenants < 1:
            raise ValueError(f"max_tenants must be >= 1, got {max_tenants}")
        self.window_s = window_s
        self.max_tenants = max_tenants
        self._served: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def __len__(self) -> int:
        return len(self._served)

    def value(self, tenant: str, now: float) -> float:
        tokens, at = self._served.get(tenant, (0.0, now))
        if now <= at:
            return tokens
        return tokens * math.exp(-(now - at) / self.window_s)

    def charge(self, tenant: str, tokens: float, now: float) -> None:
        self._served[tenant] = (max(0.0, self.value(tenant, now) + tokens), now)
        if len(self._served) > self.max_tenants:
            self._prune(tenant, now)

    def lift(self, tenant: str, floor: float, now: float) -> None:
        """Raise the tenant's service to at least `floor` (an idle tenant cannot bank
        credit and then starve the others when it returns)."""
        if self.value(tenant, now) < floor:
            self._served[tenant] = (floor, now)
            if len(self._served) > self.max_tenants:
                self._prune(tenant, now)

    def _prune(self, keep: str, now: float) -> None:
        """Drop the decayed, then all but the 3/4 cap most served; `keep` (the tenant
        just charged or lifted) stays."""
        values = {t: v for t in self._served if (v := self.value(t, now)) >= 1.0}
        low_water = max(1, self.max_tenants * 3 // 4)
        kept = set(values) if len(values) <= low_water else set(
            heapq.nlargest(low_water, values, key=values.__getitem__))
        kept.add(keep)
        self._served = {t: v for t, v in self._served.items() if t in kept}
