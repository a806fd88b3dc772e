"""The queued requests, in the order flow control serves them. Pure (time passed in).

1. Bands: the lowest band integer (critical -1, standard 0, sheddable 1) with a queued
   request goes first; a lower band is served only when the bands above it are empty,
   i.e. when they leave capacity.
2. Tenants inside a band: weighted least attained service. The next ticket is the head
   of the tenant with the least `service / weight` (`service.py`: input + output
   tokens, decayed), so backlogged tenants converge to served tokens in proportion to
   their weights. A tenant that becomes backlogged starts just below the band's least
   normalised service among the backlogged ones (VTC's lift, ties to the newcomer), so
   idling banks nothing and a tenant that rarely queues is next, not behind the flood.
3. Inside a tenant: (priority, deadline, arrival). The deadline is arrival + the
   request's TTFT SLO where it gives one, else arrival + the queue TTL, so requests
   without SLOs are served first come, first served and SLOs give earliest deadline.

The whole queue holds at most `max_size`; a band at most `band_bound(band)` (None: no
bound of its own). `push` raises QueueFull with the reason (`queue-full`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kvfleet_router.flow.service import AttainedService

# A lifted newcomer sits this far below the floor, so that it is ahead of the tenant at
# the floor whatever the rounding of the two decayed values (equal up to ~1e-15).
_JUST_BELOW = 1.0 - 1e-9


class QueueFull(Exception):
    pass


@dataclass(slots=True, eq=False)
class Ticket:
    tenant: str = "default"
    band: int = 0
    weight: float = 1.0
    priority: int = 0
    deadline: float = float("inf")
    seq: int = 0
    enqueued_at: float = 0.0

    def key(self) -> tuple[int, float, int]:
        return (self.priority, self.deadline, self.seq)


@dataclass(slots=True)
class _Band:
    tenants: dict[str, list[tuple[tuple[int, float, int], Ticket]]] = field(
        default_factory=dict)
    num_tickets: int = 0


class FairQueue:
    def __init__(self, max_size: int, service: AttainedService,
                 band_bound: Callable[[int], int | None] = lambda band: None) -> None:
        self.max_size = max_size
        self.service = service
        self.band_bound = band_bound
        self._bands: dict[int, _Band] = {}
        self._num = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._num

    def band_lengths(self) -> dict[int, int]:
        return {b: q.num_tickets for b, q in self._bands.items()}

    def backlogged(self) -> dict[int, dict[str, float]]:
        """band -> {tenant with a queued request: its weight} (the fairness metric's set)."""
        return {b: {name: heap[0][1].weight for name, heap in q.tenants.items() if heap}
                for b, q in self._bands.items()}

    def next_seq(self) -> int:
        return next(self._seq)

    def push(self, t: Ticket, now: float) -> None:
        if self._num >= self.max_size:
            raise QueueFull("queue-full")
        q = self._bands.setdefault(t.band, _Band())
        bound = self.band_bound(t.band)
        if bound is not None and q.num_tickets >= bound:
            raise QueueFull("queue-full")
        heap = q.tenants.get(t.tenant)
        if heap is None:  # newly backlogged: start at the band's least normalised service
            if q.tenants:
                floor = min(self.service.value(name, now) / h[0][1].weight
                            for name, h in q.tenants.items())
                self.service.lift(t.tenant, floor * t.weight * _JUST_BELOW, now)
            heap = q.tenants[t.tenant] = []
        heapq.heappush(heap, (t.key(), t))
        q.num_tickets += 1
        self._num += 1

    def remove(self, t: Ticket) -> bool:
        q = self._bands.get(t.band)
        heap = q.tenants.get(t.tenant) if q is not None else None
        if q is None or heap is None:
            return False
        for i, (_, item) in enumerate(heap):
            if item is t:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                break
        else:
            return False
        if not heap:
            del q.tenants[t.tenant]
        q.num_tickets -= 1
        self._num -= 1
        if not q.num_tickets:
            del self._bands[t.band]
        return True

    def head(self, now: float) -> Ticket | None:
        """The ticket to dispatch next."""
        if not self._bands:
            return None
        q = self._bands[min(self._bands)]
        best: Ticket | None = None
        best_key: tuple[float, int] = (0.0, 0)
        for name, heap in q.tenants.items():
            first = heap[0][1]
            key = (self.service.value(name, now) / first.weight, first.seq)
            if best is None or key < best_key:
                best, best_key = first, key
        return best

    def would_lead(self, band: int) -> bool:
        """A new request of `band` would be served before every queued one."""
        return not self._bands or band < min(self._bands)
