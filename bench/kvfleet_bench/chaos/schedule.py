"""The chaos soak's fault schedule, pure: a seed gives the same faults at the same times.

Fault kinds (what the soak injects, and on what):

- `engine_kill`: SIGKILL one engine replica (the local runtime restarts it on its port).
- `engine_hang`: SIGSTOP one engine for longer than the router's idle timeout, then SIGCONT.
- `router_kill`: SIGKILL the router replica that `kvfleet up` supervises (it restarts it and
  the control loop re-pushes its config); the other replica carries on.
- `loop_kill`: SIGKILL the control loop (`kvfleet up`) and start it again on its state dir.
- `net_latency`, `net_drop`, `net_truncate`: the loopback proxy between the second router
  replica and one engine adds latency, resets connections, or cuts responses short.
- `scrape_garbage`: that proxy answers the engine's `/metrics` with garbage.

`make_schedule` draws kinds with fixed weights (every kind at least once when there are
enough faults), targets and times from one `random.Random(seed)`; times are spread over the
run between a warm-up and a tail. The driver injects a fault at its time or once the fleet
has recovered from the previous one, whichever is later, so faults never overlap and each
failure has one fault to answer for.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

ENGINE_KILL, ENGINE_HANG = "engine_kill", "engine_hang"
ROUTER_KILL, LOOP_KILL = "router_kill", "loop_kill"
NET_LATENCY, NET_DROP, NET_TRUNCATE = "net_latency", "net_drop", "net_truncate"
SCRAPE_GARBAGE = "scrape_garbage"
NET_KINDS = (NET_LATENCY, NET_DROP, NET_TRUNCATE, SCRAPE_GARBAGE)  # through the proxy

# Relative frequency of each kind. Hangs are rare: each lasts longer than the router's idle
# timeout (a minute by default), so a few fill a good part of a ten-minute run.
WEIGHTS: dict[str, float] = {
    ENGINE_KILL: 6.0, ENGINE_HANG: 1.0, ROUTER_KILL: 3.0, LOOP_KILL: 2.0,
    NET_LATENCY: 1.5, NET_DROP: 1.5, NET_TRUNCATE: 1.5, SCRAPE_GARBAGE: 1.5,
}  # fmt: skip
KINDS = tuple(WEIGHTS)


class ScheduleError(ValueError):
    """A schedule that cannot be drawn from these arguments (one line)."""


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float  # seconds after the load starts
    kind: str
    target: int  # engine index for engine faults; 0 otherwise
    duration_s: float  # how long a timed fault lasts (hang, proxy faults, a dead loop)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_schedule(
    seed: int,
    duration_s: float,
    num_faults: int,
    *,
    num_engines: int,
    hang_s: float,
    net_s: float = 6.0,
    loop_down_s: float = 2.0,
    warmup_s: float = 5.0,
    tail_s: float = 10.0,
    kinds: tuple[str, ...] = KINDS,
) -> list[Fault]:
    """`num_faults` faults over `duration_s`, sorted by time; the same for the same seed."""
    if num_faults < 1:
        raise ScheduleError(f"--faults must be at least 1 (got {num_faults})")
    if duration_s <= warmup_s + tail_s:
        raise ScheduleError(f"--duration must exceed {warmup_s + tail_s:g} s (the warm-up "
                            f"and the tail); got {duration_s:g}")
    if num_engines < 2:
        raise ScheduleError(f"a chaos schedule needs at least 2 engines (got {num_engines})")
    unknown = [k for k in kinds if k not in WEIGHTS]
    if unknown or not kinds:
        raise ScheduleError(f"unknown fault kind(s) {unknown}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    drawn = list(kinds) if num_faults >= len(kinds) else []
    weights = [WEIGHTS[k] for k in kinds]
    drawn += rng.choices(kinds, weights=weights, k=num_faults - len(drawn))
    rng.shuffle(drawn)
    times = sorted(rng.uniform(warmup_s, duration_s - tail_s) for _ in drawn)
    durations = {ENGINE_HANG: hang_s, LOOP_KILL: loop_down_s, **dict.fromkeys(NET_KINDS, net_s)}
    return [
        Fault(at_s=round(t, 3), kind=kind,
              target=rng.randrange(num_engines) if kind in (ENGINE_KILL, ENGINE_HANG) else 0,
              duration_s=durations.get(kind, 0.0))
        for t, kind in zip(times, drawn, strict=True)
    ]
