"""Summaries of a simulation run: latency percentiles, SLO attainment, replica-seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvfleet_sim.fleet import SimResult


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


@dataclass(slots=True)
class Summary:
    scaler: str
    num_requests: int
    num_failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p90_s: float
    slo_attainment: float  # fraction of requests with TTFT <= slo and mean ITL <= slo
    replica_seconds: float
    mean_replicas: float
    max_replicas: int
    num_scale_events: int
    duration_s: float

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def replica_seconds(lifetimes: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Replica-seconds inside [start, end]; a replica counts from provisioning to stop."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in lifetimes)


def summarize(
    name: str,
    result: SimResult,
    ttft_slo_s: float,
    itl_slo_s: float,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> Summary:
    """Requests that arrived in [start_s, end_s) (after warm-up) and replica time over that
    same span (default: to the last request's end), so every scaler pays for one window."""
    end_s = result.end_s if end_s is None else end_s
    measured = [f for f in result.finished if start_s <= f.arrival < end_s]
    done = [f for f in measured if not f.is_aborted]
    ttfts = [f.first_token - f.arrival for f in done]
    met = 0
    for f in done:
        n_gaps = f.num_output_tokens - 1
        tpot = (f.finished - f.first_token) / n_gaps if n_gaps > 0 else 0.0
        met += f.first_token - f.arrival <= ttft_slo_s and tpot <= itl_slo_s
    n = len(measured)
    seconds = replica_seconds(result.lifetimes, start_s, end_s)
    span = end_s - start_s
    return Summary(
        scaler=name,
        num_requests=n,
        num_failed=n - len(done),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        itl_p50_s=percentile(result.itl_gaps, 50),
        itl_p90_s=percentile(result.itl_gaps, 90),
        slo_attainment=met / n if n else math.nan,
        replica_seconds=seconds,
        mean_replicas=seconds / span if span > 0 else math.nan,
        max_replicas=max((p for t, p, _ in result.timeline if start_s <= t < end_s), default=0),
        num_scale_events=sum(1 for t, _ in result.reasons if start_s <= t < end_s),
        duration_s=span,
    )
