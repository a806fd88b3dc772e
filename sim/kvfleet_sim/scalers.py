"""Scaling policies the simulator compares, registered by name in `SCALERS`.

Each factory takes the pool spec and returns an object with
`decide(stable, panic, current, now) -> (desired per role, reason)`.

* kvfleet:   kvfleet's autoscaler (`autoscaler.decide`) with the pool's own settings.
* fixed-max: every role at its max, always (provisioned for the peak).
* waiting-5: production-stack's KEDA example, "scale when vllm:num_requests_waiting > 5 per
             replica": one target, desired = ceil(total waiting / 5), run through the same
             decide() machinery with the pool's windows, steps and clamps but no panic
             mode and no other signal, so only the rule differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.autoscaler import AutoscalerConfig, History, RoleTargets, decide
from kvfleet_operator.autoscaler_spec import config_from_pool
from kvfleet_operator.signals import Signals

NO_PANIC = 1e12  # a panic threshold no demand reaches


class Scaler(Protocol):
    def decide(
        self, stable: Signals, panic: Signals, current: dict[str, int], now: float
    ) -> tuple[dict[str, int], str]: ...


class DecideScaler:
    """Any AutoscalerConfig through kvfleet's decide(), keeping the History between calls."""

    def __init__(self, config: AutoscalerConfig) -> None:
        self.config = config
        self.history = History()

    def decide(
        self, stable: Signals, panic: Signals, current: dict[str, int], now: float
    ) -> tuple[dict[str, int], str]:
        d = decide(stable, panic, current, self.config, self.history, now)
        self.history = d.history
        return d.desired, d.reason


class FixedScaler:
    def __init__(self, replicas: dict[str, int]) -> None:
        self.replicas = replicas
        self.initial = dict(replicas)  # the fleet starts fully provisioned

    def decide(
        self, stable: Signals, panic: Signals, current: dict[str, int], now: float
    ) -> tuple[dict[str, int], str]:
        return dict(self.replicas), "fixed"


def _waiting_rule(spec: PoolSpec, per_replica: float = 5.0) -> DecideScaler:
    base = config_from_pool(spec)
    only_waiting = {role: RoleTargets(num_waiting=per_replica) for role in base.roles}
    return DecideScaler(dataclasses.replace(base, targets=only_waiting, panic_threshold=NO_PANIC))


SCALERS: dict[str, Callable[[PoolSpec], Scaler]] = {
    "kvfleet": lambda spec: DecideScaler(config_from_pool(spec)),
    "fixed-max": lambda spec: FixedScaler(
        {name: r.replicas.max for name, r in spec.topology.roles().items()}
    ),
    "waiting-5": _waiting_rule,
}
