"""Scaling policies the simulator compares, registered by name in `SCALERS`.

Each factory takes the pool spec and returns a `SimScaler`: the control loop's `Scaler`
(stable, panic, current, history, now) -> Decision, and where the fleet starts.

* kvfleet:   kvfleet's autoscaler (`autoscaler.decide`) with the pool's own settings.
* fixed-max: every role at its max, always (provisioned for the peak).
* waiting-5: production-stack's KEDA example, "scale when vllm:num_requests_waiting > 5 per
             replica": one target, desired = ceil(total waiting / 5), run through the same
             decide() machinery with the pool's windows, steps and clamps but no panic
             mode (nor its short window's floor under a scale-down), no other signal and
             the HPA's scale-down hold (the window's highest), so only the rule differs.
* kpa:       Knative's KPA (`kpa.kpa_decide`): stable and panic windows over concurrency
             (running + waiting per replica), target 0.7 x maxNumSeqs per replica.
* dynamo-planner: NVIDIA Dynamo's SLA throughput planner (`dynamo_planner.py`): every
             windowSeconds, forecast request rate, ISL and OSL (Dynamo's Kalman predictor),
             replicas = forecast prefill / decode throughput over the per-replica throughput
             at the TTFT / ITL target, profiled offline from the pool's own engine.
* llmd-keda: llm-d's token-aware KEDA rule (`llmd_keda.py`): ceil(queued uncached prompt
             tokens / V_P / threshold s) and ceil(sum KV usage / 0.8), the larger wins; V_P
             calibrated as llm-d's calibrate.sh, threshold 0.65 x (TTFT SLO - idle floor),
             the HPA's tolerance, with the pool's windows, steps and cooldowns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.autoscaler import (
    AutoscalerConfig,
    Decision,
    History,
    RoleTargets,
    decide,
)
from kvfleet_operator.decide.autoscaler_spec import config_from_pool
from kvfleet_operator.decide.role_signals import Signals
from kvfleet_operator.loop.control_loop import Scaler

from kvfleet_sim.dynamo_planner import PlannerConfig, PlannerState, as_decision, plan
from kvfleet_sim.kpa import KPAConfig, kpa_decide
from kvfleet_sim.llmd_keda import LlmdKedaConfig, llmd_keda_decide

NO_PANIC = 1e12  # a panic threshold no demand reaches


@dataclass(slots=True)
class SimScaler:
    scaler: Scaler
    initial: dict[str, int] | None = None  # None: the pool's own initial replicas


def _with_config(config: AutoscalerConfig) -> SimScaler:
    def scaler(stable: Signals, panic: Signals, current: dict[str, int], history: History,
               now: float) -> Decision:  # fmt: skip
        return decide(stable, panic, current, config, history, now)

    return SimScaler(scaler)


def _fixed(replicas: dict[str, int]) -> SimScaler:
    def scaler(stable: Signals, panic: Signals, current: dict[str, int], history: History,
               now: float) -> Decision:  # fmt: skip
        return Decision(dict(replicas), {r: "fixed" for r in replicas}, {}, history)

    return SimScaler(scaler, initial=dict(replicas))  # the fleet starts fully provisioned


def _waiting_rule(spec: PoolSpec, per_replica: float = 5.0) -> SimScaler:
    base = config_from_pool(spec)
    only_waiting = {role: RoleTargets(num_waiting=per_replica) for role in base.roles}
    # KEDA's HPA: no short window, it holds the highest, and a scale-down takes the whole
    # gap its policy allows
    return _with_config(dataclasses.replace(
        base, targets=only_waiting, panic_threshold=NO_PANIC, holds_short_window=False,
        hold_quantile=1.0, halves_scale_down=False))


def _kpa(spec: PoolSpec) -> SimScaler:
    config = KPAConfig.from_pool(spec)

    def scaler(stable: Signals, panic: Signals, current: dict[str, int], history: History,
               now: float) -> Decision:  # fmt: skip
        return kpa_decide(stable, panic, current, config, history, now)

    return SimScaler(scaler)


def _dynamo_planner(spec: PoolSpec) -> SimScaler:
    config = PlannerConfig.from_pool(spec)
    state = PlannerState()  # the planner's memory for this run (plan() itself is pure)

    def scaler(stable: Signals, panic: Signals, current: dict[str, int], history: History,
               now: float) -> Decision:  # fmt: skip
        nonlocal state
        state = plan(stable, panic, current, config, state, now)
        return as_decision(state, current, config, history)

    return SimScaler(scaler)


def _llmd_keda(spec: PoolSpec) -> SimScaler:
    config = LlmdKedaConfig.from_pool(spec)

    def scaler(stable: Signals, panic: Signals, current: dict[str, int], history: History,
               now: float) -> Decision:  # fmt: skip
        return llmd_keda_decide(stable, panic, current, config, history, now)

    return SimScaler(scaler)


SCALERS: dict[str, Callable[[PoolSpec], SimScaler]] = {
    "kvfleet": lambda spec: _with_config(config_from_pool(spec)),
    "fixed-max": lambda spec: _fixed(
        {name: r.replicas.max for name, r in spec.topology.roles().items()}
    ),
    "waiting-5": _waiting_rule,
    "kpa": _kpa,
    "dynamo-planner": _dynamo_planner,
    "llmd-keda": _llmd_keda,
}
