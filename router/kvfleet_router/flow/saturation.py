"""When to queue: may a request be dispatched now, and if not, why.

An endpoint is saturated when the router's own in-flight count reaches its capacity, or,
per its last scrape, the engine's waiting requests reach `saturation.max_waiting` (when
> 0) or its KV usage reaches `saturation.max_kv_usage`. A scrape that went stale (one
was taken, none since within `signals.stale_after_s`) is saturated: unknown is never
idle. An endpoint never scraped yet is judged by the in-flight cap alone, so a replica
that just joined (or a backend without /metrics) still serves.

A request that outranks seats on an endpoint (`seats.py`: lower standing) ignores those
seats in the cap and the engine's waiting and KV signals too: the engine makes room for it
by preempting one of them.

`admissible` is the pool's verdict: the endpoints ready for this role (healthy,
accepting new work); of those, the names not saturated. No ready endpoint: wait in the
waiting room (`no-endpoint`); ready ones but all saturated: queue (`saturated`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kvfleet_router.config import SaturationConfig
from kvfleet_router.endpoint import EndpointState


def is_saturated(e: EndpointState, cfg: SaturationConfig, outranked: int = 0) -> bool:
    """`outranked`: seats on `e` held at a worse standing than the request's."""
    if e.in_flight_total - outranked >= e.capacity:
        return True
    if not e.is_signals_fresh:
        return e.signals.scraped_at > 0  # stale: saturated; never scraped: the cap alone
    if outranked:
        return False  # the engine preempts an outranked request for it
    if cfg.max_waiting > 0 and e.signals.num_waiting >= cfg.max_waiting:
        return True
    return e.signals.kv_usage >= cfg.max_kv_usage


def is_ready(e: EndpointState, role: str, now: float) -> bool:
    return e.role == role and e.is_accepting() and e.is_healthy(now)


def admissible(endpoints: Iterable[EndpointState], role: str, now: float,
               cfg: SaturationConfig, exclude: frozenset[str] = frozenset(),
               allowed: frozenset[str] | None = None,
               outranked: Callable[[EndpointState], int] | None = None,
               ) -> tuple[int, frozenset[str]]:
    """(ready endpoints, names of the ready ones not saturated); `outranked(e)`: the seats
    on e the request outranks (none when not given)."""
    num_ready = 0
    free = []
    for e in endpoints:
        if e.name in exclude or (allowed is not None and e.name not in allowed):
            continue
        if is_ready(e, role, now):
            num_ready += 1
            if not is_saturated(e, cfg, outranked(e) if outranked is not None else 0):
                free.append(e.name)
    return num_ready, frozenset(free)
