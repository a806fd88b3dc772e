"""Scale-down victims and drain completion, pure.

Public API:

- `VictimCandidate`: one replica as the control plane sees it: readiness, whether it is
  stuck (failed, or starting past the pool's start-up allowance), in-flight requests
  (summed over every router's admin view), prefix-cache hit tokens/s (from its own scraped
  counters: what its warm cache is worth), start time.
- `choose_victims(candidates, num_to_remove) -> list[str]`: cheapest replicas to lose.
  Order: stuck replicas first (they serve nothing and may never: no GPU free, an image
  pull failing, a crash loop), then replicas still starting within their allowance (they
  serve nothing yet; removing one loses no request and no cache, where draining a ready
  one would cut serving capacity below the decision until the starter is ready), then
  ready ones by fewest in-flight requests, fewest prefix-cache hit tokens/s, newest (its
  cache is the coldest); the name last, so the choice is deterministic. In-flight and
  cache value rank ready replicas only: a replica that is not ready has no measurements,
  and zeros it never reported make no replica cheaper.
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
    is_stuck: bool = False  # not ready and not about to be (failed, or overdue in start-up)

    def __post_init__(self) -> None:
        if self.num_in_flight < 0 or self.prefix_hit_tokens_per_s < 0:
            raise ValueError(f"{self.name}: in-flight count and prefix hit rate must be >= 0")


def victim_order_key(c: VictimCandidate) -> tuple[int, int, float, float, str]:
    if not c.is_ready:  # unmeasured: its rank and age decide, never zeros it did not report
        return (0 if c.is_stuck else 1, 0, 0.0, -c.started_at, c.name)
    return (2, c.num_in_flight, c.prefix_hit_tokens_per_s, -c.started_at, c.name)


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
