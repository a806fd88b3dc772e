"""A Knative-KPA-style autoscaler, the simulator's `kpa` baseline. Pure, time injected.

Knative's Pod Autoscaler (knative.dev/serving pkg/autoscaler/scaling/autoscaler.go) scales
on *concurrency*, requests in flight per replica, averaged over two windows:

* desired = ceil(concurrency / target) over the stable window, and over the panic window;
* panic starts when the panic window's (unrounded) desired >= 2 x the ready replicas
  (`panic-threshold-percentage` 200); while in panic the count never goes down (Knative
  keeps the episode's highest panic desired; here: max(current, panic desired), the same
  once the loop has applied it), and panic ends after a stable window without the condition;
* rate limits: at most 1000 x ready up, at most ready / 2 down per decision (Knative's
  `max-scale-up-rate` 1000 and `max-scale-down-rate` 2), then the pool's min/max clamps.

The windows are the pool's (`autoscaling.windowSeconds` and `autoscaling.panic.windowSeconds`,
the Signals the control loop hands every scaler), not Knative's 60 s / 6 s: the kvfleet and
waiting-5 rows read the same windows, so a comparison measures the rule, not the smoothing.

Concurrency is a role's running + waiting requests (window means, extrapolated from known
to all replicas, as kvfleet's own `demand` does) plus the requests the router holds for it
(Knative's activator counts the requests it buffers). Each role of a P/D pool is scaled on
its own concurrency. With min 0 a role goes to zero when both windows are idle (Knative's
scale-to-zero without its grace period) and comes back on the first held request.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.autoscaler import (
    LIMIT_MAX,
    LIMIT_MIN,
    Decision,
    History,
    RoleLimits,
    decision_reason,
)
from kvfleet_operator.decide.role_signals import RoleSignals, Signals

# Knative's container-concurrency-target-percentage: replicas run at 70% of their limit.
TARGET_UTILIZATION = 0.7
PANIC_THRESHOLD = 2.0  # panic-threshold-percentage 200
MAX_SCALE_UP_RATE = 1000.0
MAX_SCALE_DOWN_RATE = 2.0


@dataclass(slots=True, frozen=True)
class KPAConfig:
    roles: dict[str, RoleLimits]
    target: float  # concurrency per replica
    stable_window_s: float  # panic ends after this long without the panic condition

    def __post_init__(self) -> None:
        if not self.target > 0 or not self.stable_window_s > 0:
            raise ValueError("need target > 0 and stable_window_s > 0")

    @classmethod
    def from_pool(cls, spec: PoolSpec) -> KPAConfig:
        # A Knative user sets containerConcurrency to what one replica runs at once: an
        # engine batches at most maxNumSeqs sequences (more queue inside it), so that is
        # the limit, and the target is 70% of it (128 -> 89.6 for the sim pools).
        return cls(
            roles={n: RoleLimits(r.replicas.min, r.replicas.max)
                   for n, r in spec.topology.roles().items()},
            target=spec.engine.max_num_seqs * TARGET_UTILIZATION,
            stable_window_s=float(spec.autoscaling.window_seconds),
        )  # fmt: skip


def concurrency(rs: RoleSignals) -> float:
    """Requests in flight for a role: running + waiting (known replicas extrapolated to all
    of them) + the router's held requests."""
    scale = rs.num_replicas / rs.num_known if rs.num_known else 0.0
    return (rs.num_running + rs.num_waiting) * scale + rs.num_held_requests


def _role(
    role: str, stable: RoleSignals, panic: RoleSignals, current: int, config: KPAConfig,
    panic_until: dict[str, float], now: float,
) -> tuple[int, str, str | None, str]:  # fmt: skip
    """(target, message, ScalingLimited reason or None, decision reason)."""
    limits = config.roles[role]
    ready = max(1, panic.num_replicas)  # Knative: max(1, ready pods)
    c_stable, c_panic = concurrency(stable), concurrency(panic)
    want_stable, want_panic = c_stable / config.target, c_panic / config.target
    if want_panic / ready >= PANIC_THRESHOLD:
        panic_until[role] = now + config.stable_window_s
    is_panic = panic_until.get(role, -math.inf) > now
    if not is_panic:
        panic_until.pop(role, None)
    raw = math.ceil(want_stable - 1e-9)
    why = f"concurrency {c_stable:.1f} / {config.target:g}"
    if is_panic:
        raw = max(current, math.ceil(want_panic - 1e-9))
        why = f"panic: concurrency {c_panic:.1f} / {config.target:g}, {ready} ready"
    idle = stable.is_idle and panic.is_idle
    if raw == 0 and not idle:
        raw = 1  # work or unknown replicas: never to zero on a rounding
    target = raw
    if current > 0:
        target = min(target, math.ceil(MAX_SCALE_UP_RATE * ready))
        target = max(target, math.floor(ready / MAX_SCALE_DOWN_RATE), 0 if idle else 1)
    limited: str | None = None
    if target > limits.max_replicas:
        target, limited = limits.max_replicas, LIMIT_MAX
    elif target < limits.min_replicas:
        target, limited = limits.min_replicas, LIMIT_MIN
    verb = "scale up" if target > current else "scale down" if target < current else "steady"
    message = f"{verb} {current}->{target}: {why} [on: vllm:num_requests_running + waiting]"
    return target, message, limited, decision_reason(current, target, is_panic)


def kpa_decide(
    stable: Signals, panic: Signals, current: dict[str, int], config: KPAConfig,
    history: History, now: float,
) -> Decision:  # fmt: skip
    """One KPA decision for every role. Pure: the panic timers go into a new History."""
    panic_until = dict(history.panic_until)
    desired: dict[str, int] = {}
    reasons: dict[str, str] = {}
    limited: dict[str, str | None] = {}
    kinds: dict[str, str] = {}
    for role in config.roles:
        desired[role], reasons[role], limited[role], kinds[role] = _role(
            role, stable.roles.get(role, RoleSignals()), panic.roles.get(role, RoleSignals()),
            current.get(role, 0), config, panic_until, now,
        )  # fmt: skip
    return Decision(desired, reasons, limited,
                    dataclasses.replace(history, panic_until=panic_until), kinds)  # fmt: skip
