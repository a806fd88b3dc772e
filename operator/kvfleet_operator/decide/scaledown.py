"""Scale-down victims and drain completion, pure.

Public API:

- `VictimCandidate`: one replica as the control plane sees it: readiness, in-flight
  requests (summed over every router's admin view), prefix-cache hit tokens/s (from its
  own scraped counters: what its warm cache is worth), start time.
- `choose_victims(candidates, num_to_remove) -> list[str]`: cheapest replicas to lose.
  Order: not-ready replicas first (they serve nothing), then fewest in-flight requests,
  then fewest prefix-cache hit tokens/s, then the newest (its cache is the coldest), then
  the name, so the choice is deterministic.
- `is_drain_done(num_in_flight, drain_started_at, now, drain_timeout_s) -> bool`: a
  draining replica may be stopped once it is empty or its timeout has passed.

The runtime does the rest: push a router config marking victims draining, wait for
`is_drain_done`, then SIGTERM (the engine's own drain finishes anything left).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class VictimCandidate:
    name: str
    is_ready: bool = True
    num_in_flight: int = 0
    prefix_hit_tokens_per_s: float = 0.0
    started_at: float = 0.0

    def __post_init__(self) -> None:
        if self.num_in_flight < 0 or self.prefix_hit_tokens_per_s < 0:
            raise ValueError(f"{self.name}: in-flight count and prefix hit rate must be >= 0")


def victim_order_key(c: VictimCandidate) -> tuple[bool, int, float, float, str]:
    return (
        c.is_ready,
        c.num_in_flight,
        c.prefix_hit_tokens_per_s,
        -c.started_at,
        c.name,
    )


def choose_victims(candidates: Sequence[VictimCandidate], num_to_remove: int) -> list[str]:
    """The `num_to_remove` cheapest replicas to drain (all of them if fewer exist)."""
    if num_to_remove < 0:
        raise ValueError(f"num_to_remove must be >= 0, got {num_to_remove}")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError("candidate names must be unique")
    return [c.name for c in sorted(candidates, key=victim_order_key)[:num_to_remove]]


def is_drain_done(
    num_in_flight: int, drain_started_at: float, now: float, drain_timeout_s: float
) -> bool:
    """Stop a draining replica once nothing is in flight or the drain timeout has passed."""
    return num_in_flight <= 0 or now - drain_started_at >= drain_timeout_s
