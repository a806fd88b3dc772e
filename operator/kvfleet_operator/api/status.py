"""InferencePool status types: kstatus-style conditions, per-role replicas, scale decisions.

Status is written by the operator (or the local runtime), never by users; these types only
need to serialise to the CRD's status schema and read back what an earlier run wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ConfigDict, with_config

from .validation import camel, to_dict

# Plain dataclasses (nothing to validate: the operator builds them); pydantic serialises them
# for `to_dict` with the CRD's camelCase keys (last_transition_time -> lastTransitionTime).
_CAMEL_KEYS = ConfigDict(alias_generator=camel)


class ConditionType:
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SCALING_LIMITED = "ScalingLimited"


CONDITION_TYPES = (
    ConditionType.READY,
    ConditionType.PROGRESSING,
    ConditionType.DEGRADED,
    ConditionType.SCALING_LIMITED,
)

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


class Reason:
    """Condition reasons (CamelCase, as the Kubernetes API conventions ask)."""

    # Ready
    ALL_REPLICAS_READY = "AllReplicasReady"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    ROUTER_NOT_READY = "RouterNotReady"
    SCALED_TO_ZERO = "ScaledToZero"
    STOPPED = "Stopped"  # a local fleet whose `kvfleet up` has stopped
    # Progressing
    RECONCILING = "Reconciling"
    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"
    DRAINING = "Draining"
    RECONCILED = "Reconciled"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"  # a canary or blue-green rollout's steps
    ROLLOUT_PAUSED = "RolloutPaused"  # spec.rollout.paused: the weight holds
    # Degraded
    AS_EXPECTED = "AsExpected"
    INVALID_SPEC = "InvalidSpec"
    REPLICA_FAILED = "ReplicaFailed"
    ROUTER_UNREACHABLE = "RouterUnreachable"
    SIGNALS_STALE = "SignalsStale"
    APPLY_FAILED = "ApplyFailed"
    ROLLBACK_SLO = "RollbackSLO"  # a rollout's analysis failed: the new revision was rolled back
    # ScalingLimited
    WITHIN_LIMITS = "WithinLimits"
    AT_MAX_REPLICAS = "AtMaxReplicas"
    AT_MIN_REPLICAS = "AtMinReplicas"
    STEP_LIMITED = "StepLimited"
    COOLDOWN = "Cooldown"
    STABILIZING = "Stabilizing"
    REPLICAS_PENDING = "ReplicasPending"  # scale-up held: replicas not ready past start-up
    AUTOSCALING_DISABLED = "AutoscalingDisabled"


class DecisionReason:
    """Why a role's replica count moved (`lastScaleDecision.reason`, and scale events)."""

    SCALING_UP = "ScalingUp"
    PANIC_SCALE_UP = "PanicScaleUp"  # the short panic window asked for more
    SCALING_DOWN = "ScalingDown"
    SCALED_TO_ZERO = "ScaledToZero"
    ACTIVATED_FROM_ZERO = "ActivatedFromZero"


DECISION_REASONS = (
    DecisionReason.SCALING_UP, DecisionReason.PANIC_SCALE_UP, DecisionReason.SCALING_DOWN,
    DecisionReason.SCALED_TO_ZERO, DecisionReason.ACTIVATED_FROM_ZERO,
)


REASONS_BY_TYPE: dict[str, tuple[str, ...]] = {
    ConditionType.READY: (
        Reason.ALL_REPLICAS_READY, Reason.REPLICAS_NOT_READY, Reason.ROUTER_NOT_READY,
        Reason.SCALED_TO_ZERO, Reason.INVALID_SPEC, Reason.STOPPED,
    ),
    ConditionType.PROGRESSING: (
        Reason.RECONCILING, Reason.SCALING_UP, Reason.SCALING_DOWN, Reason.DRAINING,
        Reason.RECONCILED, Reason.ROLLOUT_IN_PROGRESS, Reason.ROLLOUT_PAUSED,
    ),
    ConditionType.DEGRADED: (
        Reason.AS_EXPECTED, Reason.INVALID_SPEC, Reason.REPLICA_FAILED,
        Reason.ROUTER_UNREACHABLE, Reason.SIGNALS_STALE, Reason.APPLY_FAILED,
        Reason.ROLLBACK_SLO,
    ),
    ConditionType.SCALING_LIMITED: (
        Reason.WITHIN_LIMITS, Reason.AT_MAX_REPLICAS, Reason.AT_MIN_REPLICAS,
        Reason.STEP_LIMITED, Reason.COOLDOWN, Reason.STABILIZING, Reason.REPLICAS_PENDING,
        Reason.AUTOSCALING_DISABLED,
    ),
}


def rfc3339(moment: datetime) -> str:
    """Kubernetes time format: UTC, second precision, trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0

    @property
    def is_true(self) -> bool:
        return self.status == TRUE


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class ScaleDecision:
    """One autoscaler decision for one role, and the signal values it was based on."""

    time: str
    from_replicas: int
    to_replicas: int
    reason: str
    message: str = ""
    signals: dict[str, float] = field(default_factory=dict)


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class RoleStatus:
    desired_replicas: int = 0
    replicas: int = 0
    ready_replicas: int = 0
    draining_replicas: int = 0
    last_scale_decision: ScaleDecision | None = None

    @property
    def ready_of_desired(self) -> str:
        return f"{self.ready_replicas}/{self.desired_replicas}"


class RolloutPhase:
    """`status.rollout.phase`."""

    STABLE = "Stable"  # one revision serves; nothing to roll out
    PROGRESSING = "Progressing"  # a canary step or a blue-green switch is under way
    PAUSED = "Paused"  # spec.rollout.paused holds the current weight
    ROLLED_BACK = "RolledBack"  # the analysis failed; the stable revision serves everything


ROLLOUT_PHASES = (RolloutPhase.STABLE, RolloutPhase.PROGRESSING, RolloutPhase.PAUSED,
                  RolloutPhase.ROLLED_BACK)


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class MetricCheck:
    """One analysis check: the new revision's figure, the stable one's, the limit it had."""

    name: str  # errorRate | ttftP90Seconds | itlP90Seconds | query
    canary: float | None
    stable: float | None
    limit: float
    passed: bool


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class Analysis:
    time: str
    passed: bool
    message: str
    canary_requests: int = 0
    stable_requests: int = 0
    checks: list[MetricCheck] = field(default_factory=list)


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class RolloutStatus:
    strategy: str = "rolling"
    phase: str = RolloutPhase.STABLE
    stable_revision: str = ""
    canary_revision: str = ""  # the revision being rolled out ("" when none)
    step: int = 0  # 1-based canary step (blue-green: 1 before the switch, 2 after); 0: none
    num_steps: int = 0
    weight: int = 0  # the new revision's share of new requests, in percent
    step_started_at: str = ""
    message: str = ""
    last_analysis: Analysis | None = None


@with_config(_CAMEL_KEYS)
@dataclass(slots=True)
class PoolStatus:
    observed_generation: int = 0
    mode: str = ""
    conditions: list[Condition] = field(default_factory=list)
    roles: dict[str, RoleStatus] = field(default_factory=dict)
    router_config_version: int = 0
    endpoint: str | None = None
    rollout: RolloutStatus | None = None

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def set_condition(
        self, type_: str, status: str, reason: str, message: str, now: datetime
    ) -> Condition:
        """Set one condition; lastTransitionTime moves only when the status flips."""
        old = self.condition(type_)
        moved = old is None or old.status != status
        new = Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=rfc3339(now) if moved or old is None else old.last_transition_time,
            observed_generation=self.observed_generation,
        )
        self.conditions = [c for c in self.conditions if c.type != type_] + [new]
        self.conditions.sort(key=lambda c: _type_order(c.type))
        return new

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_dict(self)
        for name, role in self.roles.items():
            out["roles"][name]["readyOfDesired"] = role.ready_of_desired
        return out


def _type_order(type_: str) -> int:
    return CONDITION_TYPES.index(type_) if type_ in CONDITION_TYPES else len(CONDITION_TYPES)


def parse_status(data: Any) -> PoolStatus:
    """Read back a status an earlier run wrote; junk fields are skipped, never fatal."""
    if not isinstance(data, dict):
        return PoolStatus()
    status = PoolStatus(
        observed_generation=_int(data.get("observedGeneration")),
        mode=_str(data.get("mode")),
        router_config_version=_int(data.get("routerConfigVersion")),
        endpoint=data.get("endpoint") if isinstance(data.get("endpoint"), str) else None,
    )
    for item in data.get("conditions") or []:
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            status.conditions.append(
                Condition(
                    type=item["type"],
                    status=_str(item.get("status")) or UNKNOWN,
                    reason=_str(item.get("reason")),
                    message=_str(item.get("message")),
                    last_transition_time=_str(item.get("lastTransitionTime")),
                    observed_generation=_int(item.get("observedGeneration")),
                )
            )
    roles = data.get("roles")
    for name, item in (roles.items() if isinstance(roles, dict) else []):
        if isinstance(item, dict):
            status.roles[str(name)] = _role_status(item)
    if isinstance(data.get("rollout"), dict):
        status.rollout = _rollout_status(data["rollout"])
    return status


def _rollout_status(item: dict[str, Any]) -> RolloutStatus:
    out = RolloutStatus(
        strategy=_str(item.get("strategy")) or "rolling",
        phase=_str(item.get("phase")) or RolloutPhase.STABLE,
        stable_revision=_str(item.get("stableRevision")),
        canary_revision=_str(item.get("canaryRevision")),
        step=_int(item.get("step")),
        num_steps=_int(item.get("numSteps")),
        weight=_int(item.get("weight")),
        step_started_at=_str(item.get("stepStartedAt")),
        message=_str(item.get("message")),
    )
    out.last_analysis = parse_analysis(item.get("lastAnalysis"))
    return out


def parse_analysis(last: Any) -> Analysis | None:
    """Read back `status.rollout.lastAnalysis` (as `to_dict` wrote it); None if absent."""
    if not isinstance(last, dict) or not last:
        return None
    return Analysis(
        time=_str(last.get("time")), passed=last.get("passed") is True,
        message=_str(last.get("message")),
        canary_requests=_int(last.get("canaryRequests")),
        stable_requests=_int(last.get("stableRequests")),
        checks=[MetricCheck(_str(c.get("name")), _num(c.get("canary")),
                            _num(c.get("stable")), _num(c.get("limit")) or 0.0,
                            c.get("passed") is True)
                for c in last.get("checks") or [] if isinstance(c, dict)],
    )


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _role_status(item: dict[str, Any]) -> RoleStatus:
    role = RoleStatus(
        desired_replicas=_int(item.get("desiredReplicas")),
        replicas=_int(item.get("replicas")),
        ready_replicas=_int(item.get("readyReplicas")),
        draining_replicas=_int(item.get("drainingReplicas")),
    )
    decision = item.get("lastScaleDecision")
    if isinstance(decision, dict):
        signals = decision.get("signals")
        role.last_scale_decision = ScaleDecision(
            time=_str(decision.get("time")),
            from_replicas=_int(decision.get("fromReplicas")),
            to_replicas=_int(decision.get("toReplicas")),
            reason=_str(decision.get("reason")),
            message=_str(decision.get("message")),
            signals={
                str(k): float(v)
                for k, v in (signals.items() if isinstance(signals, dict) else [])
                if isinstance(v, int | float) and not isinstance(v, bool)
            },
        )
    return role


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
