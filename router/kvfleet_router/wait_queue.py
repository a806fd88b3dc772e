"""The bounded wait queue for requests that cannot be dispatched yet: every endpoint
saturated, or none ready (the waiting room: none configured, all starting, scaled to zero).

The asyncio edge of `flow/fair_queue.py`, whose order it keeps: bands first, weighted
least attained service between tenants of a band, (priority, deadline, arrival) inside a
tenant. With one tenant and one band that is today's order: lower `priority` first
(vLLM's convention), FIFO within a priority. Each waiter holds a future; only the head may
retry routing, and `wake()` (on a finished request, a config push or a health change)
lets it. `leave` removes a waiter at once (dispatched, expired, or its client gone).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kvfleet_router.config import FlowControlConfig
from kvfleet_router.flow.fair_queue import FairQueue, QueueFull, Ticket
from kvfleet_router.flow.service import AttainedService

__all__ = ["QueueFull", "Ticket", "WaitQueue"]


class WaitQueue:
    def __init__(self, max_size: int, flow: FlowControlConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        flow = flow or FlowControlConfig()
        self.clock = clock
        self.service = AttainedService(flow.service_window_s, flow.max_tracked_tenants)
        self.fair = FairQueue(max_size, self.service, flow.band_bound)
        self._tickets: dict[asyncio.Future[None], Ticket] = {}
        self._futures: dict[Ticket, asyncio.Future[None]] = {}  # the reverse map

    @property
    def max_size(self) -> int:
        return self.fair.max_size

    @max_size.setter
    def max_size(self, value: int) -> None:
        self.fair.max_size = value

    def configure(self, flow: FlowControlConfig) -> None:
        """A config push: band bounds, the service window and its tenant cap follow it."""
        self.fair.band_bound = flow.band_bound
        self.service.window_s = flow.service_window_s
        self.service.max_tenants = flow.max_tracked_tenants

    def __len__(self) -> int:
        return len(self.fair)

    def band_lengths(self) -> dict[int, int]:
        return self.fair.band_lengths()

    def would_lead(self, band: int) -> bool:
        return self.fair.would_lead(band)

    def enter(self, priority: int = 0, *, tenant: str = "default", band: int = 0,
              weight: float = 1.0, deadline: float = float("inf")) -> asyncio.Future[None]:
        """Queue a waiter; raises QueueFull (the whole queue or its band is full)."""
        now = self.clock()
        t = Ticket(tenant=tenant, band=band, weight=weight, priority=priority,
                   deadline=deadline, seq=self.fair.next_seq(), enqueued_at=now)
        self.fair.push(t, now)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tickets[fut] = t
        self._futures[t] = fut
        return fut

    def ticket(self, fut: asyncio.Future[None]) -> Ticket | None:
        return self._tickets.get(fut)

    def charge(self, tenant: str, tokens: float) -> None:
        """Service a tenant received (tokens dispatched, or a refund when negative)."""
        self.service.charge(tenant, tokens, self.clock())

    def _head_future(self) -> asyncio.Future[None] | None:
        head = self.fair.head(self.clock())
        return None if head is None else self._futures.get(head)

    def is_head(self, fut: asyncio.Future[None]) -> bool:
        t = self._tickets.get(fut)
        return t is not None and t is self.fair.head(self.clock())

    def leave(self, fut: asyncio.Future[None]) -> None:
        t = self._tickets.pop(fut, None)
        if t is not None:
            self.fair.remove(t)
            del self._futures[t]
        self.wake()

    def wake(self) -> None:
        fut = self._head_future()
        if fut is not None and not fut.done():
            fut.set_result(None)

    def rearm(self, fut: asyncio.Future[None]) -> asyncio.Future[None]:
        """Replace a woken waiter's future in place (keeps its position)."""
        t = self._tickets.pop(fut, None)
        if t is None:
            raise KeyError("waiter not in queue")
        new: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tickets[new] = t
        self._futures[t] = new
        return new
