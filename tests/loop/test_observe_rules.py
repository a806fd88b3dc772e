"""The loop's pure rules: unknown in-flight, what a warm cache is worth, who is measured,
the staleness rule, and the cold-start hold (now in the router config the core builds)."""

from datetime import UTC, datetime
from pathlib import Path

from fake_ports import FakeReplica
from kvfleet_operator.api import load_pool
from kvfleet_operator.decide.reconcile import reconcile
from kvfleet_operator.decide.role_signals import ReplicaSample, Scrape, ScrapeLog
from kvfleet_operator.decide.router_config import COLD_START_HOLD_S, build_router_config
from kvfleet_operator.loop.observe import (
    UNKNOWN_IN_FLIGHT,
    current_replicas,
    decision_roles,
    num_in_flight,
    observe,
    prefix_hit_tokens_per_s,
    stale_after_s,
)
from kvfleet_operator.loop.ports import EndpointView, RouterView

POOLS = Path(__file__).resolve().parents[1] / "e2e_local" / "pools"


def test_in_flight_is_unknown_for_a_draining_replica_only_when_no_router_answers():
    view = RouterView(3, {"a": EndpointView("a", "draining", 2, True)})
    assert num_in_flight(view, "a", "draining") == 2
    assert num_in_flight(view, "b", "draining") == 0  # no router knows it: nothing in flight
    assert num_in_flight(None, "a", "draining") == UNKNOWN_IN_FLIGHT
    assert num_in_flight(None, "a", "ready") == 0


def test_a_draining_replica_is_not_stopped_while_the_router_cannot_be_read():
    pool = load_pool(POOLS / "sim-unified.yaml")
    replicas = [FakeReplica("unified-0", "unified", "ready"),
                FakeReplica("unified-1", "unified", "draining")]  # fmt: skip
    observed = observe(replicas, None, ScrapeLog(), {"unified-1": 100.0}, None)
    assert observed.replicas[1].num_in_flight == UNKNOWN_IN_FLIGHT
    assert not observed.is_router_ready
    timeout = pool.spec.autoscaling.drain_timeout_seconds
    wall = datetime.now(UTC)
    early = reconcile(pool, observed, {"unified": 1}, now=100.0 + timeout - 1, wall=wall)
    assert early.roles["unified"].to_stop == []
    late = reconcile(pool, observed, {"unified": 1}, now=100.0 + timeout, wall=wall)
    assert late.roles["unified"].to_stop == ["unified-1"]


def test_prefix_hit_tokens_per_s_over_the_scrape_log():
    log = ScrapeLog()
    assert prefix_hit_tokens_per_s(log, "a") == 0.0
    log.add("a", Scrape(10.0, ReplicaSample(num_prefix_hits=100)))
    assert prefix_hit_tokens_per_s(log, "a") == 0.0  # one point is no rate
    log.add("a", Scrape(11.0, None, "timeout"))
    log.add("a", Scrape(14.0, ReplicaSample(num_prefix_hits=500)))
    assert prefix_hit_tokens_per_s(log, "a") == 100.0
    log.add("b", Scrape(10.0, ReplicaSample(num_prefix_hits=900)))
    log.add("b", Scrape(12.0, ReplicaSample(num_prefix_hits=10)))  # restarted: counter reset
    assert prefix_hit_tokens_per_s(log, "b") == 0.0


def test_who_is_measured_and_who_counts():
    pool = load_pool(POOLS / "sim-unified.yaml")
    replicas = [FakeReplica(n, "unified", s) for n, s in
                [("a", "starting"), ("b", "ready"), ("c", "failed"), ("d", "draining"),
                 ("e", "stopping")]]  # fmt: skip
    assert decision_roles(replicas) == {"b": "unified", "c": "unified"}
    assert current_replicas(pool.spec, replicas) == {"unified": 3}


def test_staleness_rule():
    assert stale_after_s(10.0, 2.0) == 22.0


def test_scale_to_zero_pools_hold_requests_through_a_cold_start():
    zero = load_pool(POOLS / "sim-zero.yaml").spec
    assert build_router_config(zero, [], 1)["queue"]["timeout_s"] == COLD_START_HOLD_S >= 30
    steady = load_pool(POOLS / "sim-unified.yaml").spec
    assert "queue" not in build_router_config(steady, [], 1)
