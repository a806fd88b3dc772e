"""Pure arithmetic over what the fake backends and the replay recorded.

- Load imbalance, from each backend's in-flight timeline (a step function of time):
  imbalance = (max - min) / mean over backends, at sampled instants and over windows.
- Backends per prefix: how many distinct backends served requests sharing a prefix.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from kvfleet_bench.stats import mean, percentile

Timeline = Sequence[tuple[float, int]]  # (time, in-flight after the change), time-ordered


def imbalance(loads: Sequence[float]) -> float:
    """(max - min) / mean; 0 when there is no load at all."""
    mean = sum(loads) / len(loads)
    return (max(loads) - min(loads)) / mean if mean > 0 else 0.0


def value_at(timeline: Timeline, times: list[float], t: float) -> int:
    """The step function's value at t (0 before the first change)."""
    i = bisect.bisect_right(times, t) - 1
    return timeline[i][1] if i >= 0 else 0


def window_means(timeline: Timeline, t_start: float, t_end: float, width: float) -> list[float]:
    """Time-averaged in-flight over consecutive windows [t_start + k*width, ...)."""
    num_windows = max(0, math.floor((t_end - t_start) / width))
    times = [t for t, _ in timeline]
    means = []
    for k in range(num_windows):
        lo, hi = t_start + k * width, t_start + (k + 1) * width
        area, t, level = 0.0, lo, value_at(timeline, times, lo)
        for j in range(bisect.bisect_right(times, lo), len(times)):
            tj, vj = timeline[j]
            if tj >= hi:
                break
            area += level * (tj - t)
            t, level = tj, vj
        area += level * (hi - t)
        means.append(area / width)
    return means


def imbalance_summary(
    timelines: list[Timeline], t_start: float, t_end: float, window_s: float, sample_s: float
) -> dict[str, float]:
    """Imbalance at instants (every sample_s) and over windows, where there is load.

    An instant counts when any request is in flight; a window counts when the backends
    average at least one request each, since with less the ratio measures noise
    (one request on one of four backends is an "imbalance" of 4).
    """
    times = [[t for t, _ in tl] for tl in timelines]
    instants: list[float] = []
    t = t_start
    while t < t_end:
        loads = [value_at(tl, ts, t) for tl, ts in zip(timelines, times, strict=True)]
        if sum(loads) > 0:
            instants.append(imbalance(loads))
        t += sample_s
    per_backend = [window_means(tl, t_start, t_end, window_s) for tl in timelines]
    windows = []
    for window_loads in zip(*per_backend, strict=True):
        if sum(window_loads) / len(window_loads) >= 1.0:
            windows.append(imbalance(window_loads))
    return {
        "instant_mean": mean(instants),
        "instant_p95": percentile(instants, 95, empty=0.0),
        "instant_max": max(instants, default=0.0),
        "window_s": window_s,
        "window_mean": mean(windows),
        "window_max": max(windows, default=0.0),
        "num_windows": len(windows),
    }


def backends_per_prefix(routes: list[tuple[Sequence[int], str]]) -> dict[str, float]:
    """From (hash_ids, backend) per request: spread of each prefix shared by >= 2 requests."""
    backends: dict[int, set[str]] = {}
    counts: dict[int, int] = {}
    for hash_ids, backend in routes:
        key = 0
        for h in hash_ids:
            key = hash((key, h))
            backends.setdefault(key, set()).add(backend)
            counts[key] = counts.get(key, 0) + 1
    shared = [len(backends[k]) for k, n in counts.items() if n >= 2]
    return {
        "num_shared_prefixes": len(shared),
        "mean_backends_per_shared_prefix": mean(shared),
        "fraction_shared_on_one_backend": (
            sum(1 for n in shared if n == 1) / len(shared) if shared else 0.0
        ),
    }

