"""How the benchmarks quote numbers: nearest-rank percentiles, medians with their spread.

One nearest-rank percentile for every benchmark: the smallest value with at least q% of the
values at or below it, the definition `kvfleet sim` reports with (kvfleet_sim.report keeps
its own copy, since the product does not import this toolkit; a test holds the two equal).
Repetitions are quoted as a median with min and max (`spread`), NaN runs left out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(values: Iterable[float], q: float, empty: float = math.nan) -> float:
    """Nearest-rank percentile, q in [0, 100]; `empty` (NaN unless told) for no values."""
    ordered = sorted(values)
    if not ordered:
        return empty
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; 0 for no values."""
    return sum(values) / len(values) if values else 0.0


def median(values: Iterable[float]) -> float:
    """Median of the values that are not NaN; NaN when none is."""
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else math.nan


def spread(values: Iterable[float]) -> dict[str, float]:
    """{median, min, max} over repetitions, NaN left out; all NaN when nothing is left."""
    clean = [v for v in values if v == v]
    if not clean:
        return {"median": math.nan, "min": math.nan, "max": math.nan}
    return {"median": statistics.median(clean), "min": min(clean), "max": max(clean)}


@dataclass(slots=True)
class LoadStats:
    """What one measured load run did, whichever load side drove it (loadgen.py, wrk)."""
    duration_s: float
    num_ok: int
    num_errors: int
    errors: dict[str, int]  # by kind
    rps: float  # completed requests per second
    p50_ms: float
    p99_ms: float
