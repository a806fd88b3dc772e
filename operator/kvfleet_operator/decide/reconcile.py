"""The reconcile core: (InferencePool, what is observed) -> what should be, pure.

Runtimes (local processes, Kubernetes) observe, call `reconcile`, and apply the plan.

Public API:

- `ObservedReplica` / `Observed`: what the runtime sees. Replica phases:
  `starting` (process up, not yet healthy), `ready` (healthy, serving), `failed`
  (crashed, being restarted with backoff), `draining` (router told to send it nothing
  new; not yet signalled), `stopping` (SIGTERM sent; gone from the router).
- `reconcile(pool, observed, desired_replicas, *, now, wall, limited, decisions,
  previous_router_config) -> Desired`:
  * per role a `RolePlan`: replica count, the engine command/args/env (args rendered
    for the default port; local runtimes re-render per replica with
    `engine_args.engine_args(spec, role, host=..., port=...)`), and actions:
    `num_to_start`, `to_undrain` (draining replicas put back to work before starting
    new ones: their cache is warm), `to_drain` (ready victims, chosen by
    `scaledown.choose_victims`), `to_stop` (drained, timed out, or never ready).
    `limited` holds each role's ScalingLimited reason, or "Reason: message"; the
    condition's reason is the first role's, its message lists every role's.
  * `router_config`: the dict for the router's admin API (ready -> active, draining and
    new victims -> draining) and whether it changed (`is_router_config_changed`).
  * `status`: a new `PoolStatus` with per-role replicas and the four conditions
    (transition times kept when a status does not flip).
- `initial_replicas(spec, status)`: where a role starts: the last desired count in status,
  else max(min, 1) (as KServe's initial scale), within min/max.
- `invalid_spec_status(status, error, wall)`: Degraded/InvalidSpec for a pool that does
  not parse; the control loop reports it and never crashes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import (
    FALSE,
    TRUE,
    ConditionType,
    PoolStatus,
    Reason,
    RoleStatus,
    RolloutPhase,
    RolloutStatus,
    ScaleDecision,
)
from kvfleet_operator.decide.engine_args import engine_args, engine_command, engine_env
from kvfleet_operator.decide.rollout import RolloutDecision
from kvfleet_operator.decide.router_config import (
    RouterEndpoint,
    build_router_config,
    next_version,
)
from kvfleet_operator.decide.scaledown import VictimCandidate, choose_victims, is_drain_done

PHASES = ("starting", "ready", "failed", "draining", "stopping")
_IN_SERVICE = ("starting", "ready", "failed")  # count toward the desired replicas


@dataclass(slots=True)
class ObservedReplica:
    name: str
    role: str
    phase: str
    url: str | None = None  # http://host:port, once known
    num_restarts: int = 0
    num_in_flight: int = 0  # from the router's admin view
    prefix_hit_tokens_per_s: float = 0.0  # what its warm prefix cache is worth
    last_error: str = ""  # why it last failed, in its own words (a failed replica's reason)
    started_at: float = 0.0
    drain_started_at: float | None = None
    is_overdue: bool = False  # not ready for longer than the pool's start-up allowance
    revision: str = ""  # the engine template it runs ("" read as the stable revision)

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"{self.name}: phase must be one of {PHASES}, got {self.phase!r}")
        if self.phase in ("ready", "draining") and not self.url:
            raise ValueError(f"{self.name}: a {self.phase} replica needs its url")


@dataclass(slots=True)
class Observed:
    replicas: list[ObservedReplica] = field(default_factory=list)
    is_router_ready: bool = True
    num_unknown_signals: int = 0  # ready replicas whose scrape failed or went stale


@dataclass(slots=True)
class RolePlan:
    role: str
    num_desired: int
    command: list[str]
    args: list[str]
    env: dict[str, str]
    num_to_start: int = 0
    to_undrain: list[str] = field(default_factory=list)
    to_drain: list[str] = field(default_factory=list)
    to_stop: list[str] = field(default_factory=list)
    revision: str = ""  # the engine template these replicas run (`rollout.revision_of`)


@dataclass(slots=True)
class Desired:
    plans: list[RolePlan]  # one per role, or per (role, revision) while revisions coexist
    router_config: dict[str, Any]
    is_router_config_changed: bool
    status: PoolStatus

    @property
    def roles(self) -> dict[str, RolePlan]:
        """Each role's plan for the newest revision (the last planned for it)."""
        return {plan.role: plan for plan in self.plans}


def initial_replicas(spec: PoolSpec, status: PoolStatus | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, role in spec.topology.roles().items():
        last = status.roles.get(name) if status else None
        n = last.desired_replicas if last is not None else max(role.replicas.min, 1)
        out[name] = min(max(n, role.replicas.min), role.replicas.max)
    return out


def pool_sizes(
    spec: PoolSpec, desired_replicas: dict[str, int] | None, status: PoolStatus | None
) -> dict[str, int]:
    """Each role's replica count for the pool as a whole: the autoscaler's, or where a role
    starts; clamped to the role's min/max."""
    start = initial_replicas(spec, status)
    return {
        name: min(max((desired_replicas or {}).get(name, start[name]), role.replicas.min),
                  role.replicas.max)
        for name, role in spec.topology.roles().items()
    }


def _plan_role(
    spec: PoolSpec, role: str, num_desired: int, replicas: list[ObservedReplica], now: float,
    revision: str = "",
) -> RolePlan:
    plan = RolePlan(
        role=role,
        num_desired=num_desired,
        command=engine_command(spec),
        args=engine_args(spec, role),
        env=engine_env(spec, role),
        revision=revision,
    )
    in_service = [r for r in replicas if r.phase in _IN_SERVICE]
    draining = [r for r in replicas if r.phase == "draining"]
    missing = num_desired - len(in_service)
    if missing > 0:
        # Warm replicas that are still only draining go back to work first.
        back = sorted(draining, key=lambda r: (r.drain_started_at or 0.0, r.name), reverse=True)
        plan.to_undrain = [r.name for r in back[:missing]]
        plan.num_to_start = missing - len(plan.to_undrain)
    elif missing < 0:
        candidates = [
            VictimCandidate(
                name=r.name,
                is_ready=r.phase == "ready",
                is_stuck=r.phase == "failed" or (r.phase == "starting" and r.is_overdue),
                num_in_flight=r.num_in_flight,
                prefix_hit_tokens_per_s=r.prefix_hit_tokens_per_s,
                started_at=r.started_at,
            )
            for r in in_service
        ]
        by_name = {r.name: r for r in in_service}
        for name in choose_victims(candidates, -missing):
            # Only a ready replica holds requests; anything else can stop at once.
            (plan.to_drain if by_name[name].phase == "ready" else plan.to_stop).append(name)
    timeout = spec.autoscaling.drain_timeout_seconds
    for r in draining:
        started = r.drain_started_at if r.drain_started_at is not None else now
        if r.name not in plan.to_undrain and is_drain_done(r.num_in_flight, started, now, timeout):
            plan.to_stop.append(r.name)
    return plan


def _router_endpoints(
    replicas: list[ObservedReplica], plans: list[RolePlan]
) -> list[RouterEndpoint]:
    draining = {n for p in plans for n in p.to_drain}
    undrain = {n for p in plans for n in p.to_undrain}
    stopping = {n for p in plans for n in p.to_stop}
    out = []
    for r in replicas:
        if r.name in stopping or r.phase not in ("ready", "draining") or r.url is None:
            continue
        is_draining = (r.phase == "draining" and r.name not in undrain) or r.name in draining
        out.append(RouterEndpoint(r.name, r.url, r.role, is_draining, r.revision))
    return out


def _role_status(
    plans: list[RolePlan], replicas: list[ObservedReplica], old: RoleStatus | None,
    pool_size: int,
) -> RoleStatus:
    """`pool_size` is the role's desired count: with two revisions side by side (a canary's
    surge, a blue-green's second fleet) the role is ready once that many replicas of any
    revision are, as the pool then serves at its size."""
    to_drain = {n for p in plans for n in p.to_drain}
    to_undrain = {n for p in plans for n in p.to_undrain}
    ready = [r for r in replicas if r.phase == "ready" and r.name not in to_drain]
    draining = [r for r in replicas if r.phase == "draining" and r.name not in to_undrain] + [
        r for r in replicas if r.name in to_drain
    ]
    return RoleStatus(
        desired_replicas=pool_size,
        replicas=sum(r.phase != "stopping" for r in replicas),
        ready_replicas=len(ready) + len(to_undrain),
        draining_replicas=len(draining),
        last_scale_decision=old.last_scale_decision if old else None,
    )


def _set_conditions(
    status: PoolStatus,
    spec: PoolSpec,
    observed: Observed,
    plans: list[RolePlan],
    limited: dict[str, str | None],
    wall: datetime,
    rollout: RolloutStatus | None = None,
) -> None:
    roles = status.roles
    desired_total = sum(r.desired_replicas for r in roles.values())
    short = [n for n, r in roles.items() if r.ready_replicas < r.desired_replicas]
    if not observed.is_router_ready:
        ready = (FALSE, Reason.ROUTER_NOT_READY, "the router is not serving yet")
    elif short:
        detail = ", ".join(f"{n} {roles[n].ready_of_desired}" for n in short)
        ready = (FALSE, Reason.REPLICAS_NOT_READY, f"ready/desired: {detail}")
    elif desired_total == 0:
        ready = (TRUE, Reason.SCALED_TO_ZERO, "no replicas; the router holds requests")
    else:
        ready = (TRUE, Reason.ALL_REPLICAS_READY, "all replicas ready")
    status.set_condition(ConditionType.READY, *ready, now=wall)

    ups = list(dict.fromkeys(p.role for p in plans if p.num_to_start or p.to_undrain))
    downs = list(dict.fromkeys(p.role for p in plans if p.to_drain or p.to_stop))
    if rollout is not None and rollout.phase == RolloutPhase.PAUSED:
        progressing = (TRUE, Reason.ROLLOUT_PAUSED, rollout.message)
    elif rollout is not None and rollout.phase == RolloutPhase.PROGRESSING:
        what = f"{rollout.strategy} to revision {rollout.canary_revision}"
        if rollout.step:
            what += f", step {rollout.step}/{rollout.num_steps} at {rollout.weight}%"
        progressing = (TRUE, Reason.ROLLOUT_IN_PROGRESS, f"{what}: {rollout.message}")
    elif ups:
        progressing = (TRUE, Reason.SCALING_UP, f"starting replicas: {', '.join(ups)}")
    elif downs:
        progressing = (TRUE, Reason.SCALING_DOWN, f"removing replicas: {', '.join(downs)}")
    elif any(r.draining_replicas for r in roles.values()):
        progressing = (TRUE, Reason.DRAINING, "waiting for draining replicas to finish")
    elif short:
        progressing = (TRUE, Reason.RECONCILING, "waiting for replicas to become ready")
    else:
        progressing = (FALSE, Reason.RECONCILED, "desired state reached")
    status.set_condition(ConditionType.PROGRESSING, *progressing, now=wall)

    failed = sorted((r for r in observed.replicas if r.phase == "failed"), key=lambda r: r.name)
    if failed:
        detail = "; ".join(f"{r.name}: {r.last_error}" if r.last_error else r.name
                           for r in failed)  # fmt: skip
        degraded = (TRUE, Reason.REPLICA_FAILED, f"restarting {detail}")
    elif rollout is not None and rollout.phase == RolloutPhase.ROLLED_BACK:
        degraded = (TRUE, Reason.ROLLBACK_SLO, rollout.message)
    elif observed.num_unknown_signals:
        num = observed.num_unknown_signals
        degraded = (TRUE, Reason.SIGNALS_STALE, f"{num} replica(s) with stale or failed metrics")
    else:
        degraded = (FALSE, Reason.AS_EXPECTED, "")
    status.set_condition(ConditionType.DEGRADED, *degraded, now=wall)

    if not spec.autoscaling.enabled:
        scaling = (FALSE, Reason.AUTOSCALING_DISABLED, "autoscaling is off")
    else:
        # A limit is its Reason, or "Reason: message" where the scaler has more to say.
        bites = {n: why.partition(": ") for n, why in limited.items() if why}
        if bites:
            text = ", ".join(f"{n}: {msg or why}" for n, (why, _, msg) in bites.items())
            scaling = (TRUE, next(iter(bites.values()))[0], text)
        else:
            scaling = (FALSE, Reason.WITHIN_LIMITS, "")
    status.set_condition(ConditionType.SCALING_LIMITED, *scaling, now=wall)


def reconcile(
    pool: InferencePool,
    observed: Observed,
    desired_replicas: dict[str, int] | None = None,
    *,
    now: float,
    wall: datetime,
    limited: dict[str, str | None] | None = None,
    decisions: dict[str, ScaleDecision] | None = None,
    previous_router_config: dict[str, Any] | None = None,
    rollout: RolloutDecision | None = None,
    router_peers_dns: str = "",
) -> Desired:
    """The desired state. `now` is the runtime's monotonic clock (drains); `wall` is for
    condition times. `desired_replicas` comes from the autoscaler; missing roles start at
    `initial_replicas`. Counts are clamped to each role's min/max. With a `rollout` whose
    split names revisions, each (role, revision) gets its own plan and count, from that
    revision's spec; replicas of a revision the split does not name are drained away.
    `router_peers_dns`: where the runtime's router pods find each other (the router
    config's `exchange`, `router_config.router_exchange`); "" for none."""
    spec = pool.spec
    roles = spec.topology.roles()
    split = rollout.split if rollout is not None else None
    unknown = {r.name for r in observed.replicas if r.role not in roles
               or (split is not None and r.revision not in split)}  # fmt: skip
    sizes = pool_sizes(spec, desired_replicas, pool.status)
    plans: list[RolePlan] = []
    for name in roles:
        mine = [r for r in observed.replicas if r.role == name]
        if split is None or rollout is None:
            plans.append(_plan_role(spec, name, sizes[name], mine, now))
            continue
        for revision, counts in split.items():
            plans.append(_plan_role(rollout.specs.get(revision, spec), name,
                                    counts.get(name, 0),
                                    [r for r in mine if r.revision == revision], now,
                                    revision))  # fmt: skip
    # Replicas of a role the pool no longer has (topology changed), or of a revision no
    # longer wanted: drain them away.
    for r in observed.replicas:
        if r.name in unknown:
            plan = plans[-1]
            if r.phase == "ready":
                plan.to_drain.append(r.name)
            elif r.phase != "draining" or is_drain_done(
                r.num_in_flight, r.drain_started_at or now, now,
                spec.autoscaling.drain_timeout_seconds,
            ):  # fmt: skip
                plan.to_stop.append(r.name)

    endpoints = _router_endpoints(observed.replicas, plans)
    weights = rollout.weights if rollout is not None else None
    candidate = build_router_config(spec, endpoints, version=0, weights=weights,
                                    peers_dns=router_peers_dns)
    version = next_version(previous_router_config, candidate)
    candidate["version"] = version

    status = copy.deepcopy(pool.status)
    status.observed_generation = pool.generation
    status.mode = spec.topology.mode
    status.router_config_version = version
    old_roles = status.roles
    status.roles = {
        name: _role_status([p for p in plans if p.role == name],
                           [r for r in observed.replicas if r.role == name],
                           old_roles.get(name), sizes[name])  # fmt: skip
        for name in roles
    }
    status.rollout = rollout.status if rollout is not None else None
    for name, decision in (decisions or {}).items():
        if name in status.roles:
            status.roles[name].last_scale_decision = decision
    _set_conditions(status, spec, observed, plans, limited or {}, wall, status.rollout)
    return Desired(
        plans=plans,
        router_config=candidate,
        is_router_config_changed=previous_router_config is None
        or version != int(previous_router_config.get("version", -1)),
        status=status,
    )


def invalid_spec_status(status: PoolStatus, error: SpecError, wall: datetime) -> PoolStatus:
    """Ready=False and Degraded=True with reason InvalidSpec, naming the field."""
    out = copy.deepcopy(status)
    out.set_condition(ConditionType.READY, FALSE, Reason.INVALID_SPEC, str(error), wall)
    out.set_condition(ConditionType.DEGRADED, TRUE, Reason.INVALID_SPEC, str(error), wall)
    return out
