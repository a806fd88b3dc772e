"""The control plane's metrics: counted from the loop's events, gauges from its status."""

import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kvfleet_operator.api import load_pool
from kvfleet_operator.api.status import PoolStatus, RoleStatus
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.metrics import LoopMetrics

POOLS = Path(__file__).resolve().parents[1] / "e2e_local" / "pools"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _series(metrics: LoopMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_events_are_counted_by_reason():
    m = LoopMetrics("p", load_pool(POOLS / "sim-unified.yaml").spec)
    for event in [ev.normal("ScalingUp", "scale unified: up"), ev.normal("ScalingUp", "again"),
                  ev.normal("ScaledToZero", "zero"),
                  ev.warning(ev.EventReason.DRAIN_TIMED_OUT, "stop x: drain timeout"),
                  ev.warning(ev.EventReason.ROUTER_PUSH_FAILED, "router: down"),
                  ev.warning(ev.EventReason.REPLICA_CRASHED, "x exited"),
                  ev.normal(ev.EventReason.REPLICA_READY, "x ready")]:  # fmt: skip
        m.emit(event)
    s = _series(m)
    assert s['kvfleet_scale_decisions_total{pool="p",reason="ScalingUp"}'] == 2
    assert s['kvfleet_scale_decisions_total{pool="p",reason="ScaledToZero"}'] == 1
    assert s['kvfleet_drain_timeouts_total{pool="p"}'] == 1
    assert s['kvfleet_router_push_failures_total{pool="p"}'] == 1
    assert s['kvfleet_replica_crashes_total{pool="p"}'] == 1
    assert s['kvfleet_loop_errors_total{pool="p"}'] == 0  # present from the start
    assert s['kvfleet_scale_decisions_total{pool="p",reason="PanicScaleUp"}'] == 0


def test_status_gauges_follow_the_latest_status_without_stale_series():
    m = LoopMetrics("p", load_pool(POOLS / "sim-unified.yaml").spec)
    status = PoolStatus(roles={"unified": RoleStatus(desired_replicas=3, ready_replicas=2,
                                                     draining_replicas=1)})  # fmt: skip
    status.set_condition("ScalingLimited", "True", "AtMaxReplicas", "", NOW)
    m.observe_status(status, num_held=4)
    s = _series(m)
    assert s['kvfleet_pool_replicas{pool="p",role="unified",state="desired"}'] == 3
    assert s['kvfleet_pool_replicas{pool="p",role="unified",state="ready"}'] == 2
    assert s['kvfleet_pool_replicas{pool="p",role="unified",state="draining"}'] == 1
    assert s['kvfleet_pool_condition{pool="p",reason="AtMaxReplicas",status="True",'
             'type="ScalingLimited"}'] == 1
    assert s['kvfleet_pool_held_requests{pool="p"}'] == 4
    status.set_condition("ScalingLimited", "False", "WithinLimits", "", NOW)
    m.observe_status(status, num_held=0)
    s = _series(m)
    assert not any("AtMaxReplicas" in key for key in s)  # the old reason is gone


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's promtool not installed")
def test_promtool_finds_nothing_to_lint():
    m = LoopMetrics("p", load_pool(POOLS / "sim-unified.yaml").spec)
    m.emit(ev.normal("ScalingUp", "up"))
    m.observe_status(PoolStatus(roles={"unified": RoleStatus(desired_replicas=1)}), 0)
    out = subprocess.run(["promtool", "check", "metrics"], input=m.render(),
                         capture_output=True, timeout=30)  # fmt: skip
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_the_ttft_target_is_exported_when_the_pool_has_one():
    with_target = LoopMetrics("p", load_pool(POOLS.parents[2] / "examples" / "local-sim.yaml").spec)
    assert _series(with_target)['kvfleet_pool_ttft_p90_target_seconds{pool="p"}'] == 1.0
    without = LoopMetrics("p", load_pool(POOLS / "sim-unified.yaml").spec)
    assert not any(k.startswith("kvfleet_pool_ttft") for k in _series(without))


def test_the_rollout_is_a_series_and_rollbacks_are_counted():
    from kvfleet_operator.api.status import RolloutStatus
    from kvfleet_operator.decide.rollout import RolloutReason

    m = LoopMetrics("p", load_pool(POOLS / "sim-unified.yaml").spec)
    assert 'kvfleet_pool_rollout_weight{pool="p"}' not in _series(m)  # no rollout status yet
    m.observe_status(PoolStatus(rollout=RolloutStatus(
        strategy="canary", phase="Progressing", stable_revision="aaa", canary_revision="bbb",
        weight=25)), num_held=0)  # fmt: skip
    m.emit(ev.warning(RolloutReason.ROLLBACK_SLO, "revision bbb rolled back: ..."))
    m.emit(ev.normal(RolloutReason.STEP_PASSED, "revision bbb at 5%"))
    s = _series(m)
    assert s['kvfleet_pool_rollout_weight{pool="p"}'] == 25
    assert s['kvfleet_pool_rollout{canary_revision="bbb",phase="Progressing",pool="p",'
             'stable_revision="aaa",strategy="canary"}'] == 1
    assert s['kvfleet_rollbacks_total{pool="p"}'] == 1
