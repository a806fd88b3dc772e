"""Load a trace slice and a pool, run each named scaler over the same requests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvfleet_operator.api import load_pool

from kvfleet_sim.fleet import FleetSim, SimResult, SimSettings
from kvfleet_sim.report import Summary, summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import load_azure_csv

DEFAULT_ITL_SLO_S = 0.05
DEFAULT_TTFT_SLO_S = 1.0


@dataclass(slots=True)
class SimRun:
    name: str
    result: SimResult
    summary: Summary
    start_s: float  # where measurement starts (end of warm-up), virtual seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary.to_dict(),
            "timeline": self.result.timeline,
            "scale_reasons": self.result.reasons,
            "num_clipped_prompts": self.result.num_clipped,
        }


def run_scalers(
    trace_path: str,
    pool_path: str,
    scalers: list[str],
    start_s: float,
    duration_s: float,
    warmup_s: float,
    compress: float,
    settings: SimSettings,
    ttft_slo_s: float | None = None,
    itl_slo_s: float | None = None,
) -> tuple[list[SimRun], float, float]:
    """(runs, TTFT SLO, ITL SLO). SLOs default to the pool's p90 targets."""
    unknown = [s for s in scalers if s not in SCALERS]
    if unknown:
        raise ValueError(f"unknown scaler(s) {unknown}; known: {', '.join(SCALERS)}")
    if warmup_s < 0 or warmup_s > start_s:
        raise ValueError("need 0 <= warmup_s <= start_s")
    targets = load_pool(pool_path).spec.autoscaling.targets
    trace = load_azure_csv(trace_path, start_s - warmup_s, duration_s + warmup_s, compress)
    ttft = ttft_slo_s or targets.ttft_p90_seconds or DEFAULT_TTFT_SLO_S
    itl = itl_slo_s or targets.itl_p90_seconds or DEFAULT_ITL_SLO_S
    measure_from = warmup_s / compress
    measure_to = (warmup_s + duration_s) / compress
    runs = []
    for name in scalers:
        pool = load_pool(pool_path)  # fresh status per run
        sim_settings = dataclasses.replace(settings, measure_from_s=measure_from)
        result = FleetSim(pool, SCALERS[name](pool.spec), sim_settings).run(trace)
        summary = summarize(name, result, ttft, itl, measure_from, measure_to)
        runs.append(SimRun(name, result, summary, measure_from))
    return runs, ttft, itl
