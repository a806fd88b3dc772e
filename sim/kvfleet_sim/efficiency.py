"""Horizontal scaling efficiency: how much of N replicas' nominal capacity the fleet uses.

    points = measure(trace, pool, [1, 2, 4, 8], start_s=..., ..., slo_attainment=0.99)

For each N the pool is pinned at N replicas (`Variant(replicas=N)`, every role min = max =
N, the fixed-max scaler) and replayed over the same trace slice at several `rate`
multipliers (`trace.multiply_rate`): rate(N) is the highest multiplier at which SLO
attainment (`report.Summary.slo_attainment`, the pool's TTFT and ITL targets) is still
>= the threshold. Then

    efficiency(N) = rate(N) / (N x rate(1))

The search (`max_rate`, pure over a probe function) first brackets, then bisects:

* Bracket: the first probe is at `guess` (N x rate(1) for N > 1: perfect scaling; the
  caller's rate, default 1, for N = 1). From there it steps by x2 up while probes pass, or
  by /2 down while they fail, until one passes and the next one up fails. Efficiencies
  between 50% and 100% are bracketed by the guess and one probe below it.
* Bisection in log space (the geometric mean of the bracket) until hi / lo <= 1 + tol
  (default tol 0.05: the figure is within 5% of the boundary, about 4 probes).
* Limits: rates are kept in [MIN_RATE, trace.MAX_RATE]; a pool that still meets the SLO at
  MAX_RATE reports MAX_RATE with no upper bound (capped; for N = 1 that is an error, there
  is nothing to scale against), one that misses it at MIN_RATE is an error (`NoRateError`).

SLO attainment need not be monotone in the rate (thinning and copies change which requests
run together), so the result is a boundary between a passing and a failing probe, not
necessarily the only one. Every run is deterministic for a seed, so the whole curve is too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvfleet_sim.fleet import SimSettings
from kvfleet_sim.report import Summary
from kvfleet_sim.run import MAX_PINNED, Variant, run_variants
from kvfleet_sim.trace import MAX_RATE, TraceRequest

MIN_RATE = 1e-3
DEFAULT_TOLERANCE = 0.05
# The seed research's horizontal-scaling figures, for reference: (N from, N to, low, high).
REFERENCE_BANDS = ((2, 4, 0.85, 0.95), (8, 16, 0.70, 0.85), (32, None, 0.50, 0.70))

Probe = Callable[[float], float]  # rate multiplier -> SLO attainment


class NoRateError(ValueError):
    """The pool misses the SLO even at the lowest rate tried."""


@dataclass(slots=True)
class Search:
    rate: float  # the highest passing rate found
    upper: float | None  # the lowest failing rate above it; None: capped at MAX_RATE
    probes: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment)


def max_rate(probe: Probe, guess: float, threshold: float, tol: float = DEFAULT_TOLERANCE,
             lo_limit: float = MIN_RATE, hi_limit: float = MAX_RATE) -> Search:  # fmt: skip
    """The highest rate at which `probe(rate) >= threshold`, to a relative `tol` (module
    docstring). A NaN attainment counts as a miss."""
    if not (tol > 0 and 0 < lo_limit <= guess <= hi_limit):
        raise ValueError(f"need tol > 0 and {lo_limit:g} <= guess <= {hi_limit:g}")
    probes: list[tuple[float, float]] = []

    def passes(rate: float) -> bool:
        attainment = probe(rate)
        probes.append((rate, attainment))
        return attainment >= threshold

    lo: float | None = None
    hi: float | None = None
    rate = guess
    if passes(rate):
        lo = rate
        while hi is None and lo < hi_limit:
            rate = min(lo * 2, hi_limit)
            if passes(rate):
                lo = rate
            else:
                hi = rate
        if hi is None:
            return Search(lo, None, probes)
    else:
        hi = rate
        while lo is None:
            if hi <= lo_limit:
                raise NoRateError(f"SLO attainment < {threshold:g} even at rate {hi:g}")
            rate = max(hi / 2, lo_limit)
            if passes(rate):
                lo = rate
            else:
                hi = rate
    while hi / lo > 1 + tol:
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return Search(lo, hi, probes)


@dataclass(slots=True)
class Point:
    replicas: int
    max_rate: float  # the highest rate multiplier that met the SLO
    upper_rate: float | None  # the lowest that did not (None: capped at MAX_RATE)
    req_per_s: float  # measured requests per virtual second at max_rate
    slo_attainment: float  # at max_rate
    efficiency: float  # max_rate / (replicas x the one-replica max_rate)
    probes: list[tuple[float, float]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_replicas(replicas: Sequence[int]) -> list[int]:
    """Sorted counts with 1 first (efficiency is relative to it); ValueError when bad."""
    if not replicas or len(set(replicas)) != len(replicas):
        raise ValueError("--replicas needs distinct counts, e.g. 1,2,4,8")
    if any(not 1 <= n <= MAX_PINNED for n in replicas):
        raise ValueError(f"--replicas counts must be in 1..{MAX_PINNED} (a role's replicas.max)")
    return sorted({1, *replicas})


Progress = Callable[[list[TraceRequest], str], Callable[[int], None]]


def measure(
    trace_path: str,
    pool_path: str,
    replicas: Sequence[int],
    start_s: float,
    duration_s: float,
    warmup_s: float,
    compress: float,
    settings: SimSettings,
    slo_attainment: float = 0.99,
    tol: float = DEFAULT_TOLERANCE,
    first_guess: float = 1.0,
    ttft_slo_s: float | None = None,
    itl_slo_s: float | None = None,
    progress: Progress | None = None,
    on_probe: Callable[[int, float, Summary], None] | None = None,
) -> tuple[list[Point], float, float]:
    """(one Point per replica count, TTFT SLO, ITL SLO); see the module docstring.
    `on_probe(N, rate, summary)` is told about every replay."""
    if not 0 < slo_attainment <= 1:
        raise ValueError(f"--slo-attainment must be in (0, 1], got {slo_attainment:g}")
    if not tol > 0:
        raise ValueError(f"--tolerance must be > 0, got {tol:g}")
    if not MIN_RATE <= first_guess <= MAX_RATE:
        raise ValueError(f"rate must be in [{MIN_RATE:g}, {MAX_RATE:g}], got {first_guess:g}")
    counts = check_replicas(replicas)
    slos: list[float] = []
    points: list[Point] = []
    for n in counts:
        summaries: dict[float, Summary] = {}

        def probe(rate: float, n: int = n, summaries: dict[float, Summary] = summaries) -> float:
            bar = None if progress is None else (
                lambda trace, _label: progress(trace, f"N={n} rate x{rate:.3g}"))  # fmt: skip
            runs, ttft, itl = run_variants(
                trace_path, [Variant(pool_path, "fixed-max", replicas=n)], start_s,
                duration_s, warmup_s, compress, settings, ttft_slo_s, itl_slo_s, rate, bar,
            )  # fmt: skip
            slos[:] = [ttft, itl]
            summary = runs[0].summary
            summaries[rate] = summary
            if on_probe is not None:
                on_probe(n, rate, summary)
            if math.isnan(summary.slo_attainment):
                raise ValueError(f"no requests in the measured slice at rate {rate:g}")
            return summary.slo_attainment

        one = points[0].max_rate if points else None
        guess = first_guess if one is None else min(n * one, MAX_RATE)
        found = max_rate(probe, guess, slo_attainment, tol)
        if one is None and found.upper is None:
            raise ValueError(f"one replica meets the SLO even at rate {found.rate:g}: "
                             "nothing to scale against (a busier or longer slice?)")  # fmt: skip
        best = summaries[found.rate]
        points.append(Point(
            replicas=n, max_rate=found.rate, upper_rate=found.upper,
            req_per_s=best.num_requests / best.duration_s if best.duration_s > 0 else 0.0,
            slo_attainment=best.slo_attainment,
            efficiency=found.rate / (n * (one if one is not None else found.rate)),
            probes=found.probes,
        ))  # fmt: skip
    return points, slos[0], slos[1]


def format_table(points: Sequence[Point]) -> str:
    rows = ["| replicas | max rate multiplier | req/s | SLO met | efficiency | probes |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for p in points:
        capped = " (capped)" if p.upper_rate is None else f" (< {p.upper_rate:.3g})"
        rows.append(
            f"| {p.replicas} | {p.max_rate:.3g}{capped} | {p.req_per_s:.2f} "
            f"| {p.slo_attainment:.1%} | {p.efficiency:.1%} | {len(p.probes)} |"
        )
    return "\n".join(rows)
