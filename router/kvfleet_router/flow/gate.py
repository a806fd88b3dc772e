"""Flow control's admission at dispatch, pure (time passed in): the dispatcher (its asyncio
edge) and the simulator apply the same rules through it.

    gate = FlowGate(queue_service)                   # the fair queue's attained service
    got = gate.candidates(flow, endpoints, role, now, saturation_cfg)
    # a reason (no-endpoint, saturated), or (free endpoint names, outranked seats)
    seat = gate.take(flow, chosen_endpoint, now)     # after the routing policy chose
    gate.charge(flow.tenant, tokens, now)            # what it was served (or a refund),
                                                     # in the queue's service and here
    gate.give_back(seat)                             # the exchange ended

A request's standing on an endpoint and the seats it outranks there are `seats.py`'s;
whether an endpoint is saturated for it is `saturation.py`'s. "Served recently" (who is
under its share) is the tokens dispatched per tenant, decayed over `recent_window_s`.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvfleet_router.config import SaturationConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.flow.saturation import admissible
from kvfleet_router.flow.seats import Seat, Seats, standing
from kvfleet_router.flow.service import AttainedService
from kvfleet_router.flow.tenants import Flow

RECENT_WINDOW_S = 5.0


class FlowGate:
    def __init__(self, queue_service: AttainedService | None = None,
                 recent_window_s: float = RECENT_WINDOW_S) -> None:
        self.seats = Seats()
        self.queue_service = queue_service  # the fair queue's order (flow/service.py)
        # never lifted, unlike the queue's; as many tenants kept as the queue's keeps
        self.recent = AttainedService(recent_window_s) if queue_service is None else (
            AttainedService(recent_window_s, queue_service.max_tenants))

    def standing(self, flow: Flow, e: EndpointState, now: float) -> int:
        """The request's standing on `e`: its base, lifted when its tenant is under its
        share there."""
        return standing(flow.engine_priority, self.seats.is_under_share(
            e.name, flow.tenant, flow.band, flow.weight,
            lambda tenant: self.recent.value(tenant, now)))

    def outranked(self, flow: Flow, endpoints: Iterable[EndpointState],
                  now: float) -> dict[str, int]:
        """endpoint -> seats held there at a worse standing than the request's."""
        out: dict[str, int] = {}
        seats = self.seats
        for e in endpoints:
            if seats.num_held(e.name):
                n = seats.worse_than(e.name, self.standing(flow, e, now))
                if n:
                    out[e.name] = n
        return out

    def candidates(self, flow: Flow, endpoints: list[EndpointState], role: str, now: float,
                   cfg: SaturationConfig, exclude: frozenset[str] = frozenset(),
                   allowed: frozenset[str] | None = None, outranking_only: bool = False,
                   ) -> str | tuple[frozenset[str], dict[str, int]]:
        """Where the request may go now: (names of the endpoints not saturated for it, the
        seats it outranks per endpoint), or why nowhere: no-endpoint (none ready) or
        saturated. `outranking_only`: only endpoints where it outranks seats (a request
        that may pass the queue only on seats it outranks)."""
        outranked = self.outranked(flow, endpoints, now)
        if outranking_only:
            if not outranked:
                return "saturated"
            allowed = frozenset(outranked) if allowed is None else allowed & frozenset(outranked)
        num_ready, free = admissible(endpoints, role, now, cfg, exclude, allowed,
                                     lambda e: outranked.get(e.name, 0))
        if not num_ready:
            return "no-endpoint"
        if not free:
            return "saturated"
        return free, outranked

    def take(self, flow: Flow, e: EndpointState, now: float) -> Seat:
        return self.seats.take(e.name, flow.tenant, flow.band, flow.weight,
                               self.standing(flow, e, now))

    def give_back(self, seat: Seat) -> None:
        self.seats.give_back(seat)

    def charge(self, tenant: str, tokens: float, now: float) -> None:
        """Tokens a tenant was served (dispatched, or a refund when negative), in both
        meters: the queue's attained service (its order) and the recent one (its share)."""
        if self.queue_service is not None:
            self.queue_service.charge(tenant, tokens, now)
            self.recent.max_tenants = self.queue_service.max_tenants  # follows config pushes
        self.recent.charge(tenant, tokens, now)
