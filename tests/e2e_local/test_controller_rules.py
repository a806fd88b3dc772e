"""The control loop's own rules, without processes: drain safety when the router cannot be
read, the cold-start hold for scale-to-zero pools, and what a replica's cache is worth."""

from datetime import UTC, datetime

from e2e_fleet import POOLS
from kvfleet_operator.api import load_pool
from kvfleet_operator.controller import UNKNOWN_IN_FLIGHT, Controller, prefix_hit_rate
from kvfleet_operator.reconcile import reconcile
from kvfleet_operator.runtimes.local import Child, LocalRuntime
from kvfleet_operator.runtimes.router_admin import EndpointView, RouterView
from kvfleet_operator.runtimes.state_dir import StateDir
from kvfleet_operator.signals import ReplicaSample, Scrape, ScrapeLog


def _controller(tmp_path, pool_file="sim-unified.yaml"):
    pool = load_pool(POOLS / pool_file)
    runtime = LocalRuntime(StateDir(tmp_path))
    return Controller(pool, runtime, "http://127.0.0.1:1", "token"), runtime


def _add(runtime, name, state, port):
    runtime.children[name] = Child(name, "unified", port, lambda p: [], state=state)


def test_draining_replica_is_not_stopped_while_the_router_cannot_be_read(tmp_path):
    ctl, runtime = _controller(tmp_path)
    _add(runtime, "unified-0", "ready", 9001)
    _add(runtime, "unified-1", "draining", 9002)
    ctl.drain_started["unified-1"] = 100.0
    wall = datetime.now(UTC)

    ctl.router_view = None
    observed = ctl._observe()
    assert observed.replicas[1].num_in_flight == UNKNOWN_IN_FLIGHT
    assert not observed.is_router_ready
    timeout = ctl.pool.spec.autoscaling.drain_timeout_seconds
    early = reconcile(ctl.pool, observed, {"unified": 1}, now=100.0 + timeout - 1, wall=wall)
    assert early.roles["unified"].to_stop == []
    late = reconcile(ctl.pool, observed, {"unified": 1}, now=100.0 + timeout, wall=wall)
    assert late.roles["unified"].to_stop == ["unified-1"]

    # With the router's word that nothing is in flight, the drain ends at once.
    ctl.router_view = RouterView(3, {"unified-1": EndpointView("unified-1", "draining", 0, True)})
    now = reconcile(ctl.pool, ctl._observe(), {"unified": 1}, now=100.5, wall=wall)
    assert now.roles["unified"].to_stop == ["unified-1"]
    ctl.router_view = RouterView(3, {"unified-1": EndpointView("unified-1", "draining", 2, True)})
    busy = reconcile(ctl.pool, ctl._observe(), {"unified": 1}, now=100.5, wall=wall)
    assert busy.roles["unified"].to_stop == []


def test_scale_to_zero_pools_hold_requests_through_a_cold_start(tmp_path):
    zero, _ = _controller(tmp_path, "sim-zero.yaml")
    held = zero._with_cold_start_hold({"version": 1, "endpoints": []})
    assert held["queue"]["timeout_s"] >= 30
    assert zero._with_cold_start_hold({"queue": {"timeout_s": 7.0}}) == {
        "queue": {"timeout_s": 7.0}}  # the reconcile core's own choice wins
    steady, _ = _controller(tmp_path, "sim-unified.yaml")
    assert "queue" not in steady._with_cold_start_hold({"version": 1})


def test_prefix_hit_rate_over_the_scrape_log():
    log = ScrapeLog()
    assert prefix_hit_rate(log, "a") == 0.0
    log.add("a", Scrape(10.0, ReplicaSample(num_prefix_hits=100)))
    assert prefix_hit_rate(log, "a") == 0.0  # one point is no rate
    log.add("a", Scrape(11.0, None, "timeout"))
    log.add("a", Scrape(14.0, ReplicaSample(num_prefix_hits=500)))
    assert prefix_hit_rate(log, "a") == 100.0
    log.add("b", Scrape(10.0, ReplicaSample(num_prefix_hits=900)))
    log.add("b", Scrape(12.0, ReplicaSample(num_prefix_hits=10)))  # restarted: counter reset
    assert prefix_hit_rate(log, "b") == 0.0
