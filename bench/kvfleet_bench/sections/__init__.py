"""One renderer per benchmark: `render_<name>(results) -> str` turns the benchmark's stored
results files (a dict of loaded JSON by file stem, the main file first, then its variants)
into the markdown of its generated block in bench/README.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvfleet_bench.sections import (
    autoscale_local,
    chaos,
    engine_server,
    engine_throughput,
    epp_overhead,
    flow_control,
    flow_control_sim,
    kv_pool,
    operator_scale,
    router_cache_hits,
    router_memory,
    router_overhead,
    router_vllm_overhead,
    sim_fidelity,
    sim_kv_pool,
    sim_policies,
    sim_router_hits,
    sim_scale,
    slo_model_calibration,
    text_precise_cost,
)


@dataclass(frozen=True)
class Section:
    name: str
    files: tuple[str, ...]  # stems of bench/results/*.json: the main file, then its variants
    render: Callable[[dict[str, Any]], str]


def _section(module: Any) -> Section:
    name = module.__name__.rsplit(".", 1)[1]
    return Section(name, tuple(module.FILES), getattr(module, f"render_{name}"))


# in README order
SECTIONS: dict[str, Section] = {
    s.name: s
    for s in map(_section, [
        autoscale_local, sim_policies, sim_scale, sim_fidelity, slo_model_calibration,
        router_overhead, epp_overhead,
        router_cache_hits, sim_router_hits, engine_throughput, engine_server, operator_scale,
        router_vllm_overhead, kv_pool, sim_kv_pool, flow_control, flow_control_sim,
        router_memory, chaos, text_precise_cost,
    ])
}  # fmt: skip
