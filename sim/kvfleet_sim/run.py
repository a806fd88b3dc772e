"""Load a trace slice and pools, run each configuration over the same requests.

A configuration (`Variant`) is a pool file, a scaler (`scalers.SCALERS`), optionally a
routing policy that replaces the pool's `routing.policy` (`policy_overrides` below: every
registered router policy, plus `sgl-cache-aware`, a model of sgl-router's rule in
`sgl_rule.py`),
and optionally a replica count that pins every role at min = max = N (scaling efficiency).

The scaler `oracle` is not a reactive scaler: its variant is the hindsight optimum
(`oracle.solve`, many replays of the slice), and the run reported is its plan's replay.
Whenever an oracle variant (or, with `optimum=True`, an unlisted one) exists for a pool,
policy and replica pin, every run with those gets `Summary.x_optimum`: its replica-seconds
over the oracle's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvfleet_operator.api import load_pool
from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import PIPELINE_POLICY, ROUTING_POLICIES, ReplicasSpec, RoutingSpec
from kvfleet_operator.decide.router_config import is_router_kv_sharing
from kvfleet_router.router_core import RouterCore

from kvfleet_sim import oracle
from kvfleet_sim.fake_backend import FakeBackendModel
from kvfleet_sim.fleet import FleetSim, SimError, SimResult, SimSettings
from kvfleet_sim.report import Summary, summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.sgl_rule import SglRule
from kvfleet_sim.trace import TraceRequest, load_trace

DEFAULT_ITL_SLO_S = 0.05
DEFAULT_TTFT_SLO_S = 1.0


def _sgl_cache_aware(routing: RoutingSpec) -> RoutingSpec:
    """sgl-router's cache-aware rule (`sgl_rule.py`): the pool routes with kvfleet's
    cache-aware preset in its config, and `build_sim` puts the sgl rule in its place."""
    return dataclasses.replace(routing, policy="cache-aware")


# Policies that model a peer router's rule: they take a kvfleet policy's place in the
# simulated router core after every config push (ports.SimRouter.after_push).
PEER_RULES: dict[str, Callable[[], Callable[[RouterCore], None]]] = {
    "sgl-cache-aware": SglRule,
}


def _named(name: str) -> Callable[[RoutingSpec], RoutingSpec]:
    def override(routing: RoutingSpec) -> RoutingSpec:
        return dataclasses.replace(routing, policy=name)

    return override


def policy_overrides() -> dict[str, Callable[[RoutingSpec], RoutingSpec]]:
    # `pipeline` names the pool's own routing.pipeline: a pool file sets it, not --policy.
    out = {name: _named(name) for name in ROUTING_POLICIES if name != PIPELINE_POLICY}
    out["sgl-cache-aware"] = _sgl_cache_aware
    return out


POLICIES = policy_overrides()


@dataclass(slots=True, frozen=True)
class Variant:
    pool_path: str
    scaler: str = "kvfleet"
    policy: str | None = None  # None: the pool's own routing
    replicas: int | None = None  # every role pinned at min = max = this; None: the pool's

    def label(self, varying: set[str]) -> str:
        """The fields that differ between the compared variants (else the scaler); a fleet
        pinned at N beside others reads "fixed at N" in place of its scaler."""
        parts = [self.pool_path] if "pool_path" in varying else []
        parts += [self.policy or "pool's policy"] if "policy" in varying else []
        if self.replicas is not None and "replicas" in varying:
            return " / ".join([*parts, f"fixed at {self.replicas}"])
        if "scaler" in varying or not parts:
            parts.append(self.scaler)
        return " / ".join(parts)

    def load(self) -> InferencePool:
        pool = load_pool(self.pool_path)  # fresh status per run
        if self.policy is not None:
            pool.spec.routing = POLICIES[self.policy](pool.spec.routing)
        if self.replicas is not None:
            for role in pool.spec.topology.roles().values():
                role.replicas = ReplicasSpec(min=self.replicas, max=self.replicas)
        return pool

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.replicas is None:
            del out["replicas"]  # as before the field existed
        return out


@dataclass(slots=True)
class SimRun:
    name: str
    variant: Variant
    result: SimResult
    summary: Summary
    start_s: float  # where measurement starts (end of warm-up), virtual seconds
    oracle: oracle.OracleResult | None = None  # the oracle variant's plan and search

    def to_dict(self) -> dict[str, Any]:
        extra = {"oracle": self.oracle.to_dict()} if self.oracle is not None else {}
        if self.result.rollout is not None:
            extra["rollout"] = self.result.rollout
        return {
            **extra,
            "variant": self.variant.to_dict(),
            "summary": self.summary.to_dict(),
            "timeline": self.result.timeline,
            "role_timeline": self.result.role_timeline,
            "num_prefill_legs": self.result.num_prefill_legs,
            "scale_reasons": self.result.reasons,
            "imbalance": self.result.imbalance,
            "num_clipped_prompts": self.result.num_clipped,
        }


MAX_PINNED = 1000  # a role's replicas.max at most (the API's bound)


def check_variants(variants: list[Variant]) -> None:
    for v in variants:
        if v.scaler not in SCALERS and v.scaler != oracle.ORACLE:
            known = ", ".join([*SCALERS, oracle.ORACLE])
            raise ValueError(f"unknown scaler {v.scaler!r}; known: {known}")
        if v.policy is not None and v.policy not in POLICIES:
            raise ValueError(f"unknown policy {v.policy!r}; known: {', '.join(POLICIES)}")
        if v.replicas is not None and not 1 <= v.replicas <= MAX_PINNED:
            raise ValueError(f"replicas must be in 1..{MAX_PINNED}, got {v.replicas}")
        if v.replicas is not None and v.scaler == oracle.ORACLE:
            raise ValueError("the oracle chooses the replica count; it cannot be pinned")


def build_sim(variant: Variant, pool: InferencePool, settings: SimSettings,
              fake: FakeBackendModel | None = None) -> FleetSim:
    """The fleet for one variant: its scaler, a peer's rule in its router if its policy
    names one (PEER_RULES; not for the oracle, whose scaler is its plan's: `oracle.solve`),
    and with `fake` replicas that model the router benchmark's
    fake backend instead of kvfleet's engine (`fake_backend.py`)."""
    if fake is not None and (
            pool.spec.topology.is_disaggregated or is_router_kv_sharing(pool.spec)):
        raise SimError("fake-backend replicas serve unified pools without kvSharing only")
    if variant.scaler not in SCALERS:
        raise SimError(f"scaler {variant.scaler!r} has no reactive form; use run_variants")
    sim = FleetSim(pool, SCALERS[variant.scaler](pool.spec), settings)
    sim.runtime.fake = fake  # replicas are created when the run starts
    if (rule := PEER_RULES.get(variant.policy or "")) is not None:
        sim.router.after_push = rule()
    return sim


def load_slice(trace_path: str, start_s: float, duration_s: float, warmup_s: float,
               compress: float, rate: float) -> list[TraceRequest]:
    if warmup_s < 0 or warmup_s > start_s:
        raise ValueError("need 0 <= warmup_s <= start_s")
    return load_trace(trace_path, start_s - warmup_s, duration_s + warmup_s, compress, rate)


def run_variants(
    trace_path: str,
    variants: list[Variant],
    start_s: float,
    duration_s: float,
    warmup_s: float,
    compress: float,
    settings: SimSettings,
    ttft_slo_s: float | None = None,
    itl_slo_s: float | None = None,
    rate: float = 1.0,
    progress: Callable[[list[TraceRequest], str], Callable[[int], None]] | None = None,
    optimum: bool = False,
    oracle_interval_s: float = oracle.DEFAULT_INTERVAL_S,
    log: Callable[[str], None] | None = None,
) -> tuple[list[SimRun], float, float]:
    """(runs, TTFT SLO, ITL SLO). SLOs default to the first pool's p90 targets.
    `progress(trace, label)` may return a callback told how many requests arrived so far.
    `optimum`: also solve the oracle (unlisted) for every pool, policy and replica pin
    that has no oracle variant, for the × optimum figures; `oracle_interval_s` is its
    plan's interval and `log` hears its progress lines."""
    check_variants(variants)
    if not variants:
        raise ValueError("nothing to run")
    if settings.rollout is not None and (optimum or any(v.scaler == oracle.ORACLE
                                                        for v in variants)):
        raise SimError("a rollout scenario needs reactive scalers: the oracle's replays "
                       "plan replica counts, not rollouts")
    pools = [v.load() for v in variants]  # every pool checked before the first run
    for pool in pools:
        FleetSim.check_pool(pool)
    trace = load_slice(trace_path, start_s, duration_s, warmup_s, compress, rate)
    targets = pools[0].spec.autoscaling.targets
    ttft = ttft_slo_s or targets.ttft_p90_seconds or DEFAULT_TTFT_SLO_S
    itl = itl_slo_s or targets.itl_p90_seconds or DEFAULT_ITL_SLO_S
    measure_from = warmup_s / compress
    measure_to = (warmup_s + duration_s) / compress
    varying = {f for f in ("pool_path", "scaler", "policy", "replicas")
               if len({getattr(v, f) for v in variants}) > 1}  # fmt: skip
    sim_settings = dataclasses.replace(settings, measure_from_s=measure_from,
                                       run_until_s=measure_to)

    def solve(v: Variant) -> oracle.OracleResult:
        return oracle.solve(v.load, trace, sim_settings, ttft, itl, measure_from, measure_to,
                            oracle_interval_s, log)  # fmt: skip

    runs = []
    for v, pool in zip(variants, pools, strict=True):
        name = v.label(varying)
        found = None
        if v.scaler == oracle.ORACLE:
            found = solve(v)
            result = found.result
        else:
            sim = build_sim(v, pool, sim_settings)
            result = sim.run(trace, progress(trace, name) if progress else None)
        summary = summarize(name, result, ttft, itl, measure_from, measure_to)
        runs.append(SimRun(name, v, result, summary, measure_from, found))
    optima = {_same_fleet(r.variant): r.summary.replica_seconds
              for r in runs if r.variant.scaler == oracle.ORACLE}  # fmt: skip
    if optimum:
        for v in variants:
            if (key := _same_fleet(v)) not in optima:
                hidden = dataclasses.replace(v, scaler=oracle.ORACLE, replicas=None)
                optima[key] = summarize("", solve(hidden).result, ttft, itl, measure_from,
                                        measure_to).replica_seconds  # fmt: skip
    for r in runs:
        if (best := optima.get(_same_fleet(r.variant))) is not None:
            r.summary.x_optimum = r.summary.replica_seconds / best if best > 0 else math.nan
    return runs, ttft, itl


def _same_fleet(v: Variant) -> tuple[str, str | None]:
    """What the oracle is solved for: the pool and its routing. A fleet pinned at N
    replicas is read against its pool's optimum, which may use any count in the pool's
    bounds (the question a pinned row answers: what would the best constant fleet cost)."""
    return v.pool_path, v.policy


__all__ = ["SimError", "SimRun", "Variant", "build_sim", "run_variants", "POLICIES"]
