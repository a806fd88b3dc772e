"""Replicas that never become ready, through the one control loop: the start-up log that
measures start-ups and who is overdue, and the pending guard end to end over fake ports
(the real autoscaler, a runtime whose new replicas wait for a GPU)."""

from pathlib import Path

import pytest
from fake_ports import (
    Events,
    FakeClock,
    FakeMetrics,
    FakeReplica,
    FakeRouters,
    FakeRuntime,
    MemoryStore,
)
from kvfleet_operator.api import load_pool
from kvfleet_operator.api.status import ConditionType, Reason
from kvfleet_operator.decide.role_signals import ReplicaSample, RoleSignals, Signals
from kvfleet_operator.loop.control_loop import ControlLoop
from kvfleet_operator.loop.observe import (
    DEFAULT_PENDING_AFTER_S,
    MIN_PENDING_AFTER_S,
    StartupLog,
    fill_pending,
)

POOL = Path(__file__).resolve().parents[1] / "e2e_local" / "pools" / "sim-unified.yaml"


def test_start_ups_are_measured_from_the_fleet_and_set_the_allowance():
    log = StartupLog()
    assert log.pending_after_s() == DEFAULT_PENDING_AFTER_S  # nothing measured yet
    a = FakeReplica("a", "unified", "starting", started_at=100.0)
    log.update([a], now=105.0)
    a.state = "ready"
    log.update([a], now=145.0)  # 45 s from its own start
    assert list(log.startups) == [45.0]
    assert log.pending_after_s() == 90.0  # twice the slowest
    b = FakeReplica("b", "unified", "starting", started_at=200.0)
    log.update([a, b], now=200.0)
    b.state = "ready"
    log.update([a, b], now=210.0)
    assert log.pending_after_s() == 90.0  # the slowest of the recent ones
    fast = StartupLog()
    c = FakeReplica("c", "unified", "starting", started_at=0.5)
    fast.update([c], now=1.0)
    c.state = "ready"
    fast.update([c], now=2.0)
    assert fast.pending_after_s() == MIN_PENDING_AFTER_S


def test_who_is_overdue_and_since_when():
    log = StartupLog()
    served = FakeReplica("served", "unified", "ready", started_at=10.0)
    pending = FakeReplica("pod-1", "unified", "starting", started_at=500.0)  # created at 500
    placeholder = FakeReplica("dep-pending-0", "unified", "starting", started_at=600.0)
    log.update([served, pending, placeholder], now=600.0)
    # A replica that served and crashed counts from when it stopped serving, not its start.
    served.state, served.num_restarts = "failed", 1
    placeholder.started_at = 900.0  # a placeholder's start is always "now"
    log.update([served, pending, placeholder], now=900.0)
    assert log.overdue(now=900.0) == {"pod-1": 400.0}  # 300 s is not past 300 s
    assert log.overdue(now=1000.0) == {"pod-1": 500.0, "dep-pending-0": 400.0}
    assert log.overdue(now=1200.1) == pytest.approx(
        {"pod-1": 700.1, "dep-pending-0": 600.1, "served": 300.1})
    # Gone or draining replicas are forgotten; a draining one is no start-up.
    served.state = "draining"
    log.update([served, pending], now=1300.0)
    assert set(log.not_ready_since) == {"pod-1"} and not log.startups


def test_fill_pending_counts_overdue_replicas_per_role_only():
    log = StartupLog()
    replicas = [
        FakeReplica("p0", "prefill", "starting", started_at=100.0),
        FakeReplica("p1", "prefill", "failed", started_at=200.0),  # an image pull failing
        FakeReplica("d0", "decode", "starting", started_at=590.0),
    ]
    log.update(replicas, now=595.0)
    signals = Signals(0.0, 60.0, {"prefill": RoleSignals(), "decode": RoleSignals()})
    fill_pending(signals, replicas, log, now=600.0)
    p, d = signals.roles["prefill"], signals.roles["decode"]
    assert (p.num_pending_overdue, p.pending_for_s) == (2, 500.0)
    assert (d.num_pending_overdue, d.pending_after_s) == (0, DEFAULT_PENDING_AFTER_S)


# --- through the control loop, with the pool's own autoscaler ------------------------------


class NoGpuRuntime(FakeRuntime):
    """New replicas stay starting (Pending: no GPU free) until `is_gpu_free`."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.is_gpu_free = True
        self.num_created = 0

    async def supervise(self) -> None:
        if self.is_gpu_free:
            await super().supervise()

    async def create(self, spec, plan) -> None:
        self.num_created += 1
        await super().create(spec, plan)


async def test_the_loop_holds_scale_up_behind_stuck_replicas_says_why_and_recovers():
    clock = FakeClock()
    runtime = NoGpuRuntime(clock)
    metrics = FakeMetrics()
    loop = ControlLoop(load_pool(POOL), runtime=runtime, router=FakeRouters(),
                       metrics=metrics, store=MemoryStore(), events=Events(),
                       clock=clock)  # fmt: skip

    async def run(seconds: float) -> None:
        for _ in range(int(seconds)):
            clock.t += 1.0
            await loop.tick()

    await run(5)  # the first replica starts with a GPU free: one start-up measured
    assert runtime.states() == {"unified-0": "ready"}
    runtime.is_gpu_free = False
    metrics.replica_sample = ReplicaSample(num_running=4.0, num_waiting=6.0)  # wants 3
    await run(MIN_PENDING_AFTER_S + 20)
    assert runtime.states() == {"unified-0": "ready", "unified-1": "starting",
                                "unified-2": "starting"}  # fmt: skip
    # Load grows while nothing schedules: the two are overdue, so no more replicas.
    metrics.replica_sample = ReplicaSample(num_running=4.0, num_waiting=10.0)  # wants 5
    await run(30)
    held_at = runtime.num_created
    assert held_at == 3, "scale-up went on behind replicas that never start"
    limited = loop.pool.status.condition(ConditionType.SCALING_LIMITED)
    assert limited is not None and limited.is_true
    assert limited.reason == Reason.REPLICAS_PENDING
    assert limited.message.startswith("unified: 2 unified replicas not ready for ")
    assert "not ready for" in limited.message and "start-up allowance 60s" in limited.message
    # A GPU frees up: they become ready, the guard lifts, scale-up resumes up to max (6).
    runtime.is_gpu_free = True
    await run(10)
    assert runtime.num_created > held_at
    assert len(runtime.states()) == 6 and set(runtime.states().values()) == {"ready"}
    limited = loop.pool.status.condition(ConditionType.SCALING_LIMITED)
    assert limited is not None and limited.reason == Reason.AT_MAX_REPLICAS


def test_a_scale_down_stops_the_stuck_replica_before_the_one_still_starting():
    from datetime import UTC, datetime

    from kvfleet_operator.decide.reconcile import Observed, ObservedReplica, reconcile

    def replica(name: str, phase: str, **kw) -> ObservedReplica:
        return ObservedReplica(name, "unified", phase, url=f"http://{name}:8000", **kw)

    observed = Observed([
        replica("ready", "ready", started_at=10.0),
        replica("fresh", "starting", started_at=990.0),
        replica("stuck", "starting", started_at=100.0, is_overdue=True),
    ])  # fmt: skip
    desired = reconcile(load_pool(POOL), observed, {"unified": 2}, now=1000.0,
                        wall=datetime.now(UTC))  # fmt: skip
    plan = desired.roles["unified"]
    assert (plan.to_stop, plan.to_drain) == (["stuck"], [])
    desired = reconcile(load_pool(POOL), observed, {"unified": 1}, now=1000.0,
                        wall=datetime.now(UTC))  # fmt: skip
    plan = desired.roles["unified"]
    assert (sorted(plan.to_stop), plan.to_drain) == (["fresh", "stuck"], [])
