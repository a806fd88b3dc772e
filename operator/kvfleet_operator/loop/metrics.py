"""The control plane's own Prometheus metrics, for alerts and dashboards.

`LoopMetrics` is an `EventSink` (it counts the loop's events) and reads the pool status the
loop saves (`observe_status`), so the loop itself knows nothing about it. Series:

kvfleet_pool_replicas{pool,role,state}       desired | ready | draining replicas per role
kvfleet_pool_condition{pool,type,status,reason}  1 for each condition as it is now
kvfleet_pool_ttft_p90_target_seconds{pool}   the pool's TTFT p90 target, when it has one
kvfleet_pool_held_requests{pool}             requests the routers hold for capacity
kvfleet_pool_rollout{pool,strategy,phase,stable_revision,canary_revision}  1: the rollout now
kvfleet_pool_rollout_weight{pool}            the new revision's percent of new requests
kvfleet_rollbacks_total{pool}                rollouts rolled back by their analysis
kvfleet_scale_decisions_total{pool,reason}   replica counts moved (ScalingUp, ...)
kvfleet_drain_timeouts_total{pool}           replicas stopped at their drain timeout with
                                             requests still in flight
kvfleet_router_push_failures_total{pool}     config pushes some router did not accept
kvfleet_loop_errors_total{pool}              control-loop ticks that failed
kvfleet_replica_crashes_total{pool}          replica processes that exited on their own
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import DECISION_REASONS, PoolStatus
from kvfleet_operator.decide.rollout import RolloutReason
from kvfleet_operator.loop.events import Event, EventReason


class _StatusCollector(Collector):
    """Gauges from the last saved status: no stale series when a reason changes."""

    def __init__(self, pool: str, spec: PoolSpec) -> None:
        self.pool = pool
        self.spec = spec
        self.status = PoolStatus()
        self.num_held = 0

    def collect(self):  # type: ignore[no-untyped-def]
        replicas = GaugeMetricFamily("kvfleet_pool_replicas", "replicas per role and state",
                                     labels=["pool", "role", "state"])  # fmt: skip
        for role, rs in self.status.roles.items():
            for state, num in (("desired", rs.desired_replicas), ("ready", rs.ready_replicas),
                               ("draining", rs.draining_replicas)):  # fmt: skip
                replicas.add_metric([self.pool, role, state], num)
        yield replicas
        conditions = GaugeMetricFamily("kvfleet_pool_condition", "the pool's conditions now",
                                       labels=["pool", "type", "status", "reason"])
        for c in self.status.conditions:
            conditions.add_metric([self.pool, c.type, c.status, c.reason], 1)
        yield conditions
        target = self.spec.autoscaling.targets.ttft_p90_seconds
        if target is not None:
            yield _one("kvfleet_pool_ttft_p90_target_seconds", "the pool's TTFT p90 target",
                       self.pool, target)  # fmt: skip
        yield _one("kvfleet_pool_held_requests", "requests the routers hold", self.pool,
                   self.num_held)  # fmt: skip
        r = self.status.rollout
        if r is not None:
            rollout = GaugeMetricFamily(
                "kvfleet_pool_rollout", "the pool's rollout now (1 per pool)",
                labels=["pool", "strategy", "phase", "stable_revision", "canary_revision"])
            rollout.add_metric([self.pool, r.strategy, r.phase, r.stable_revision,
                                r.canary_revision], 1)  # fmt: skip
            yield rollout
            yield _one("kvfleet_pool_rollout_weight", "the new revision's percent of new "
                       "requests", self.pool, r.weight)  # fmt: skip


def _one(name: str, doc: str, pool: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["pool"])
    family.add_metric([pool], value)
    return family


class LoopMetrics:
    def __init__(self, pool: str, spec: PoolSpec) -> None:
        self.pool = pool
        self.registry = CollectorRegistry()
        r = self.registry
        self._status = _StatusCollector(pool, spec)
        r.register(self._status)
        self.scale_decisions = Counter("kvfleet_scale_decisions", "replica counts moved",
                                       ["pool", "reason"], registry=r)  # fmt: skip
        self.drain_timeouts = Counter("kvfleet_drain_timeouts",
                                      "replicas stopped at their drain timeout, still busy",
                                      ["pool"], registry=r)  # fmt: skip
        self.push_failures = Counter("kvfleet_router_push_failures",
                                     "router config pushes not accepted by every router",
                                     ["pool"], registry=r)  # fmt: skip
        self.loop_errors = Counter("kvfleet_loop_errors", "failed control-loop ticks", ["pool"],
                                   registry=r)  # fmt: skip
        self.crashes = Counter("kvfleet_replica_crashes", "replicas that exited on their own",
                               ["pool"], registry=r)  # fmt: skip
        self.rollbacks = Counter("kvfleet_rollbacks", "rollouts rolled back by their analysis",
                                 ["pool"], registry=r)  # fmt: skip
        for reason in DECISION_REASONS:
            self.scale_decisions.labels(pool, reason)
        for counter in (self.drain_timeouts, self.push_failures, self.loop_errors, self.crashes,
                        self.rollbacks):
            counter.labels(pool)  # present at 0 from the start, so rate() and alerts see it

    def emit(self, event: Event) -> None:
        if event.reason in DECISION_REASONS:
            self.scale_decisions.labels(self.pool, event.reason).inc()
        elif event.reason == EventReason.DRAIN_TIMED_OUT:
            self.drain_timeouts.labels(self.pool).inc()
        elif event.reason == EventReason.ROUTER_PUSH_FAILED:
            self.push_failures.labels(self.pool).inc()
        elif event.reason == EventReason.LOOP_ERROR:
            self.loop_errors.labels(self.pool).inc()
        elif event.reason == EventReason.REPLICA_CRASHED:
            self.crashes.labels(self.pool).inc()
        elif event.reason == RolloutReason.ROLLBACK_SLO:
            self.rollbacks.labels(self.pool).inc()

    def observe_status(self, status: PoolStatus, num_held: int) -> None:
        self._status.status = status
        self._status.num_held = num_held

    def render(self) -> bytes:
        return generate_latest(self.registry)
