"""The failure modes users report in peers' trackers (issue 27, item 4), decided purely with
time injected: replicas that never become ready (aibrix's pending-replica guard,
dynamo#14251), traffic that drops to zero (dynamo#6985), and who is a scale-down victim."""

import pytest
from kvfleet_operator.api.status import Reason
from kvfleet_operator.decide.autoscaler import (
    AutoscalerConfig,
    History,
    RoleLimits,
    RoleTargets,
    decide,
)
from kvfleet_operator.decide.role_signals import RoleSignals, Signals
from kvfleet_operator.decide.scaledown import VictimCandidate, choose_victims

ROLE = "prefill"


def sig(rs: RoleSignals) -> Signals:
    return Signals(t=0.0, window_s=60.0, roles={ROLE: rs})


def cfg(min_: int = 1, max_: int = 10, **kw) -> AutoscalerConfig:
    targets = kw.pop("targets", RoleTargets(num_waiting=2, ttft_p90_s=1.0))
    kw.setdefault("scale_down_window_s", 0.0)
    return AutoscalerConfig(roles={ROLE: RoleLimits(min_, max_)}, targets={ROLE: targets}, **kw)


def step(rs: RoleSignals, current: int, config: AutoscalerConfig, history: History, now: float):
    return decide(sig(rs), sig(rs), {ROLE: current}, config, history, now)


# --- replicas that never become ready --------------------------------------------------------


def loaded(num_ready: int, overdue: int = 0, pending_for_s: float = 0.0) -> RoleSignals:
    """`num_ready` measured replicas, each with 5 requests waiting (at 2 waiting per replica:
    2.5 replicas each), and `overdue` replicas not ready past the allowance."""
    return RoleSignals(
        num_replicas=num_ready, num_known=num_ready, num_waiting=5.0 * num_ready,
        num_pending_overdue=overdue, pending_for_s=pending_for_s, pending_after_s=240.0,
    )  # fmt: skip


def test_overdue_replicas_hold_scale_up_at_the_count_already_asked_for():
    # 2 ready + 2 starting for 300 s (allowance 240 s): demand says 5, the guard says 4.
    d = step(loaded(2, overdue=2, pending_for_s=300.0), 4, cfg(), History(), now=1000.0)
    assert d.desired[ROLE] == 4, d.reason
    assert d.limited[ROLE] == Reason.REPLICAS_PENDING
    assert d.details[ROLE] == "2 prefill replicas not ready for 300s (start-up allowance 240s)"
    assert d.reasons[ROLE].startswith("steady 4->4: hold: 2 prefill replicas not ready")
    assert "waiting" in d.reasons[ROLE]  # what it would have scaled on
    assert ROLE not in d.history.last_scale_up  # a held step starts no cooldown


def test_the_guard_holds_even_a_panic_and_never_blocks_a_scale_down():
    burst = loaded(2, overdue=1, pending_for_s=400.0)
    burst.num_waiting = 200.0  # panic: 100 wanted, 3 running
    d = step(burst, 3, cfg(), History(), now=1000.0)
    assert d.desired[ROLE] == 3 and d.limited[ROLE] == Reason.REPLICAS_PENDING
    # Traffic gone while one replica is stuck: scale down as usual (dynamo#14251).
    idle = RoleSignals(num_replicas=2, num_known=2, num_pending_overdue=1, pending_for_s=400.0)
    d = step(idle, 3, cfg(), History(), now=1000.0)
    assert d.desired[ROLE] == 2 and d.limited[ROLE] != Reason.REPLICAS_PENDING, d.reason


def test_replicas_within_their_start_up_do_not_hold_scale_up():
    # Starting but not overdue: they count in `current`, demand above it still adds.
    d = step(loaded(2), 4, cfg(), History(), now=1000.0)
    assert d.desired[ROLE] == 5 and d.limited[ROLE] is None, d.reason


def test_scale_up_resumes_once_the_pending_replicas_are_ready():
    config, history = cfg(), History()
    d = step(loaded(2, overdue=2, pending_for_s=300.0), 4, config, history, now=1000.0)
    assert d.desired[ROLE] == 4
    # A GPU frees up: the two are ready and measured, and the queue asks for 10.
    d = step(loaded(4), 4, config, d.history, now=1010.0)
    assert d.desired[ROLE] == 8 and d.limited[ROLE] == Reason.STEP_LIMITED, d.reason


def test_a_scale_from_zero_whose_first_replica_is_stuck_adds_no_second():
    held = RoleSignals(num_held_requests=30, num_pending_overdue=1, pending_for_s=600.0)
    d = step(held, 1, cfg(min_=0), History(), now=1000.0)
    assert d.desired[ROLE] == 1 and d.limited[ROLE] == Reason.REPLICAS_PENDING, d.reason


# --- traffic that drops to zero ----------------------------------------------------------


def quiet(num: int, **kw) -> RoleSignals:
    """Known replicas with no work and no traffic: no new TTFT samples, so p90 is None."""
    return RoleSignals(num_replicas=num, num_known=num, ttft_p90_s=None, itl_p90_s=None, **kw)


def test_traffic_that_stops_steps_down_to_min_without_latency_samples():
    config = cfg(min_=2, targets=RoleTargets(ttft_p90_s=1.0, itl_p90_s=0.05))  # latency only
    history, current, now = History(), 7, 1000.0
    for want in (5, 4, 3, 2):  # half the gap to min each look, at least one replica
        d = step(quiet(current), current, config, history, now)
        assert d.desired[ROLE] == want, d.reason
        history, current, now = d.history, d.desired[ROLE], now + 10.0
    d = step(quiet(2), 2, config, history, now)
    assert d.desired[ROLE] == 2 and d.limited[ROLE] == Reason.AT_MIN_REPLICAS


def test_traffic_that_stops_goes_to_zero_when_allowed_and_unknown_is_never_idle():
    config = cfg(min_=0, scale_to_zero_after_s=300.0)
    d = step(quiet(1), 1, config, History(), now=1000.0)
    assert d.desired[ROLE] == 1  # the idle timer starts
    unknown = quiet(1, num_unknown=1)
    unknown.num_known = 0
    blocked = step(unknown, 1, config, d.history, now=1400.0)
    assert blocked.desired[ROLE] == 1, blocked.reason  # a failed scrape resets the timer
    d = step(quiet(1), 1, config, blocked.history, now=1410.0)
    d = step(quiet(1), 1, config, d.history, now=1710.0)
    assert d.desired[ROLE] == 0 and d.reasons[ROLE].startswith("scale down 1->0: idle 300s")


@pytest.mark.parametrize("num_unknown", [1, 2])
def test_no_samples_with_an_unknown_replica_holds_instead_of_scaling_down(num_unknown):
    rs = quiet(4, num_unknown=num_unknown)
    rs.num_known = 4 - num_unknown
    d = step(rs, 4, cfg(), History(), now=1000.0)
    assert d.desired[ROLE] == 4 and "signals unknown" in d.reasons[ROLE]


# --- who is a scale-down victim ----------------------------------------------------------


def fleet() -> list[VictimCandidate]:
    """A ready replica that looks exactly like an unmeasured one (nothing in flight, no
    cache value), a starter within its allowance, one stuck in start-up, a crash-looper."""
    return [
        VictimCandidate("ready-idle", is_ready=True, started_at=50.0),
        VictimCandidate("ready-busy", is_ready=True, num_in_flight=3, started_at=10.0),
        VictimCandidate("starting", is_ready=False, started_at=900.0),
        VictimCandidate("stuck", is_ready=False, is_stuck=True, started_at=100.0),
        VictimCandidate("crashing", is_ready=False, is_stuck=True, started_at=20.0),
    ]


@pytest.mark.parametrize(
    "num,expected",
    [
        (1, ["stuck"]),  # the newest of the two that serve nothing and may never
        (2, ["stuck", "crashing"]),
        (3, ["stuck", "crashing", "starting"]),
        (4, ["stuck", "crashing", "starting", "ready-idle"]),
    ],
)
def test_victims_stuck_first_then_starters_then_ready_by_measured_cost(num, expected):
    assert choose_victims(fleet(), num) == expected


def test_a_starting_replica_is_not_ranked_by_the_zeros_it_never_reported():
    # A starter that started before the ready replica, both "0 in flight, 0 cache": the
    # starter's rank decides (serves nothing yet), and among ready ones only measurements.
    unmeasured = [
        VictimCandidate("old-starter", is_ready=False, started_at=1.0),
        VictimCandidate("new-stuck", is_ready=False, is_stuck=True, started_at=2.0),
    ]
    assert choose_victims(unmeasured, 1) == ["new-stuck"]
    measured = [VictimCandidate("a", num_in_flight=0, prefix_hit_tokens_per_s=500.0),
                VictimCandidate("b", num_in_flight=0, prefix_hit_tokens_per_s=0.0)]  # fmt: skip
    assert choose_victims(measured, 1) == ["b"]
