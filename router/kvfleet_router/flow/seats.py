"""Who holds each endpoint's in-flight seats, and at what standing. Pure (no clocks, no I/O).

Fairness at the router's queue is not enough when the flood already holds every seat of
an engine: a tenant under its share would still wait for one of the flood's requests to
finish. So a request's *standing* on an endpoint (lower first; the `priority` its engine
gets) is its band, lifted by one step when its tenant is under its share there:

    standing = 2 * base - (1 if under its share else 0)

`base` is `tenants.engine_priority` (the tenant's band, or the request's own lower
priority). A tenant is under its share on an endpoint when another tenant of its band
holds seats there that was served, per unit of weight, more than twice as many tokens
recently (the caller's measure: tokens dispatched, decayed over a few seconds). Twice, so
that tenants near their fair shares do not preempt each other; recently, so that a tenant
back from idle is lifted for seconds, not for the queue's whole service window. A tenant
alone in its band is never lifted, so one tenant's requests keep the order they came in.

The in-flight cap counts, for a request, only the seats held at its standing or better
(`worse_than` is what it may ignore): a request that outranks seats the flood holds goes
past the cap, and the engine seats it by preempting its least important running request
(kvfleet's scheduler; vLLM's priority policy). Seats taken without a standing (a P/D
prefill leg, an ext_proc fallback) are not tracked here, so they count against everyone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

_CLEARLY_UNDER = 2.0  # served less than half of what the most served holder was, per weight


def standing(base: int, is_under_share: bool) -> int:
    return 2 * base - (1 if is_under_share else 0)


@dataclass(slots=True, frozen=True)
class Seat:
    endpoint: str
    tenant: str
    band: int
    weight: float
    standing: int


class Seats:
    def __init__(self) -> None:
        self._by_standing: dict[str, Counter[int]] = {}
        # (endpoint, band) -> tenant -> (seats, weight)
        self._holders: dict[tuple[str, int], dict[str, tuple[int, float]]] = {}

    def is_under_share(self, endpoint: str, tenant: str, band: int, weight: float,
                       served: Callable[[str], float]) -> bool:
        """`served(tenant)`: the tokens it was served recently (any decayed measure)."""
        holders = self._holders.get((endpoint, band))
        if not holders:
            return False
        most = max((served(t) / w for t, (_, w) in holders.items() if t != tenant),
                   default=None)
        return most is not None and served(tenant) / weight * _CLEARLY_UNDER < most

    def worse_than(self, endpoint: str, standing_: int) -> int:
        """Seats on `endpoint` held at a standing worse (higher) than `standing_`."""
        counts = self._by_standing.get(endpoint)
        return sum(n for s, n in counts.items() if s > standing_) if counts else 0

    def take(self, endpoint: str, tenant: str, band: int, weight: float,
             standing_: int) -> Seat:
        self._by_standing.setdefault(endpoint, Counter())[standing_] += 1
        holders = self._holders.setdefault((endpoint, band), {})
        held = holders.get(tenant, (0, weight))[0]
        holders[tenant] = (held + 1, weight)
        return Seat(endpoint, tenant, band, weight, standing_)

    def give_back(self, seat: Seat) -> None:
        counts = self._by_standing.get(seat.endpoint)
        if counts is not None:
            counts[seat.standing] -= 1
            if counts[seat.standing] <= 0:
                del counts[seat.standing]
            if not counts:
                del self._by_standing[seat.endpoint]
        key = (seat.endpoint, seat.band)
        holders = self._holders.get(key)
        if holders is None or seat.tenant not in holders:
            return
        held, weight = holders[seat.tenant]
        if held <= 1:
            del holders[seat.tenant]
            if not holders:
                del self._holders[key]
        else:
            holders[seat.tenant] = (held - 1, weight)

    def num_held(self, endpoint: str) -> int:
        counts = self._by_standing.get(endpoint)
        return sum(counts.values()) if counts else 0
