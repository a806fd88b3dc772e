"""The autoscaler at its edges (decide/autoscaler.py): the ranges its targets, limits and
config accept (the last value allowed, the first refused), and the thresholds its decisions
turn on (panic at exactly its threshold and at its expiry, a step or a maximum reached
exactly, prefill capacity learned from exactly one queued request per replica)."""

import pytest
from kvfleet_operator.api.status import DecisionReason, Reason
from kvfleet_operator.decide.autoscaler import (
    AutoscalerConfig,
    History,
    RoleLimits,
    RoleTargets,
    decide,
    demand,
    learn_prefill_capacity,
)
from kvfleet_operator.decide.role_signals import RoleSignals, Signals


@pytest.mark.parametrize(("field", "value", "ok"), [
    ("kv_usage", 1.0, True), ("kv_usage", 1.0001, False), ("kv_usage", 0.0, False),
    ("prefill_utilization", 1.0, True), ("prefill_utilization", 0.0, False),
    ("num_waiting", 0.001, True), ("num_waiting", 0.0, False),
    ("ttft_p90_s", 0.0, False), ("itl_p90_s", -1.0, False),
])
def test_role_targets_ranges(field, value, ok):
    if ok:
        assert getattr(RoleTargets(**{field: value}), field) == value
    else:
        with pytest.raises(ValueError, match=f"target {field} must be"):
            RoleTargets(**{field: value})


@pytest.mark.parametrize(("lo", "hi", "ok"), [
    (0, 1, True), (3, 3, True), (-1, 1, False), (0, 0, False), (4, 3, False),
])
def test_role_limits_need_0_le_min_le_max_and_max_ge_1(lo, hi, ok):
    if ok:
        assert RoleLimits(lo, hi).max_replicas == hi
    else:
        with pytest.raises(ValueError, match="need 0 <= min <= max and max >= 1"):
            RoleLimits(lo, hi)


def config(**kw):
    return AutoscalerConfig(roles={"unified": RoleLimits(1, 4)}, targets={}, **kw)


@pytest.mark.parametrize(("kw", "message"), [
    ({"panic_window_s": 60.0, "stable_window_s": 60.0}, None),  # equal windows are allowed
    ({"panic_window_s": 60.5, "stable_window_s": 60.0}, "panic_window_s <= stable_window_s"),
    ({"panic_window_s": 0.0}, "0 < panic_window_s"),
    ({"panic_threshold": 1.0}, None),
    ({"panic_threshold": 0.99}, "panic_threshold must be >= 1"),
    ({"max_step_up": 1, "max_step_down": 1}, None),
    ({"max_step_down": 0}, "max steps must be >= 1"),
    ({"prefill_capacity_alpha": 1.0}, None),
    ({"prefill_capacity_alpha": 0.0}, "alpha in \\(0, 1\\]"),
    ({"prefill_capacity_alpha": 1.01}, "alpha in \\(0, 1\\]"),
    ({"prefill_tokens_per_s_initial": 0.0}, "prefill capacity must be > 0"),
    ({"scale_down_window_s": 0.0}, None),
    ({"scale_down_cooldown_s": -0.1}, "scale_down_cooldown_s must be >= 0"),
])
def test_config_ranges(kw, message):
    if message is None:
        assert config(**kw).is_enabled
    else:
        with pytest.raises(ValueError, match=message):
            config(**kw)


def role(n, **kw):
    return RoleSignals(num_replicas=n, num_known=n, **kw)


def unified(max_=10, **kw):
    kw.setdefault("scale_down_window_s", 0.0)
    return AutoscalerConfig(roles={"unified": RoleLimits(1, max_)},
                            targets={"unified": RoleTargets(num_waiting=2)}, **kw)


def decide_once(config, stable, panic, current, history=None, now=1000.0):
    return decide(Signals(t=now, window_s=60.0, roles={"unified": stable}),
                  Signals(t=now, window_s=6.0, roles={"unified": panic}),
                  {"unified": current}, config, history or History(), now)


@pytest.mark.parametrize(("panic_waiting", "desired", "kind"), [
    # 4 replicas = exactly 2 x 2: no panic (the stable window's 1 is not taken either: a
    # scale-down stops at what the short window asks for, here all 2 running)
    (8.0, 2, ""),
    (8.2, 5, DecisionReason.PANIC_SCALE_UP),  # 4.1 > 4: panic, and its demand is taken
])
def test_panic_takes_more_than_threshold_times_current(panic_waiting, desired, kind):
    d = decide_once(unified(), role(2), role(2, num_waiting=panic_waiting), 2)
    assert d.desired["unified"] == desired, d.reasons["unified"]
    assert d.kinds["unified"] == kind


@pytest.mark.parametrize(("now", "desired"), [(99.9, 2), (100.0, 1)])
def test_a_panic_holds_scale_down_until_it_expires(now, desired):
    history = History(panic_until={"unified": 100.0})
    d = decide_once(unified(), role(2), role(2), 2, history, now)
    assert d.desired["unified"] == desired, d.reasons["unified"]
    if desired == 2:
        assert "hold: panic" in d.reasons["unified"]


def test_a_step_or_the_maximum_reached_exactly_limits_nothing():
    # Waiting 8 over 2 per replica: 4 wanted, 2 more than the 2 running.
    d = decide_once(unified(max_step_up=2), role(2, num_waiting=8.0), role(2), 2)
    assert d.desired["unified"] == 4 and d.limited["unified"] is None
    d = decide_once(unified(max_=4), role(2, num_waiting=8.0), role(2), 2)
    assert d.desired["unified"] == 4 and d.limited["unified"] is None
    d = decide_once(unified(max_=4), role(2, num_waiting=8.2), role(2), 2)  # 5 wanted
    assert d.desired["unified"] == 4 and d.limited["unified"] == Reason.AT_MAX_REPLICAS


def test_held_requests_count_toward_the_running_target():
    rs = role(2, num_running=6.0, num_waiting=2.0, num_held_requests=4)
    want, why = demand(rs, RoleTargets(num_running=4), 2, prefill_capacity=5000,
                       backlog_clear_s=10)
    assert want == pytest.approx((6 + 2 + 4) / 4) and why.startswith("running 12.0 / 4")


def prefill_config():
    return AutoscalerConfig(roles={"prefill": RoleLimits(1, 8)},
                            targets={"prefill": RoleTargets(prefill_utilization=0.8)},
                            prefill_tokens_per_s_initial=10_000, prefill_capacity_alpha=0.5)


@pytest.mark.parametrize(("signals", "learned"), [
    # one queued request per replica is saturation: 4,000 tok/s each is learned (EWMA 0.5)
    (role(2, uncached_prompt_tokens_per_s=8000, num_waiting=2.0), 7000.0),
    (role(2, uncached_prompt_tokens_per_s=8000, num_waiting=1.98), 10_000.0),  # not quite
    # saturated but nothing prefilled (no rate yet): nothing to learn from
    (role(2, uncached_prompt_tokens_per_s=0.0, num_waiting=10.0), 10_000.0),
    # no replica known: nothing to divide by
    (RoleSignals(num_replicas=2, num_known=0, uncached_prompt_tokens_per_s=8000,
                 num_waiting=10.0), 10_000.0),
])
def test_prefill_capacity_learned_from_one_queued_request_per_replica(signals, learned):
    assert learn_prefill_capacity(signals, None, prefill_config()) == pytest.approx(learned)


def test_a_steady_role_is_not_reported_as_held_back():
    # Neither the pending-replica guard nor a scale-up cooldown holds back a decision that
    # does not scale up: a steady role reports no ScalingLimited reason.
    pending = role(2, num_waiting=4.0, num_pending_overdue=1, pending_for_s=400.0)
    d = decide_once(unified(), pending, role(2), 2)
    assert d.desired["unified"] == 2 and d.limited["unified"] is None
    cooling = History(last_scale_up={"unified": 999.0})
    d = decide_once(unified(scale_up_cooldown_s=30.0), role(2, num_waiting=4.0), role(2), 2,
                    cooling)
    assert d.desired["unified"] == 2 and d.limited["unified"] is None


@pytest.mark.parametrize(("cooldown", "since", "current", "waiting", "desired"), [
    ({"scale_up_cooldown_s": 30.0}, 29.9, 2, 8.0, 2),  # 4 wanted, 0.1 s too soon
    ({"scale_up_cooldown_s": 30.0}, 30.0, 2, 8.0, 4),
    ({"scale_down_cooldown_s": 10.0}, 9.9, 3, 4.0, 3),  # 2 wanted
    ({"scale_down_cooldown_s": 10.0}, 10.0, 3, 4.0, 2),
])
def test_a_scale_waits_exactly_its_cooldown(cooldown, since, current, waiting, desired):
    history = History(last_scale_up={"unified": 1000.0 - since})
    d = decide_once(unified(**cooldown), role(current, num_waiting=waiting), role(current),
                    current, history)
    assert d.desired["unified"] == desired, d.reasons["unified"]


def test_one_step_down_exactly_and_a_step_short_of_the_maximum_say_so():
    d = decide_once(unified(), role(3, num_waiting=4.0), role(3), 3)  # 2 wanted: one step
    assert d.desired["unified"] == 2 and d.limited["unified"] is None
    # 8 wanted, at most 5, one step up allowed: the step is what limits it, not the max
    d = decide_once(unified(max_=5, max_step_up=1), role(2, num_waiting=16.0), role(2), 2)
    assert d.desired["unified"] == 3 and d.limited["unified"] == Reason.STEP_LIMITED
    # Exactly the minimum wanted: the minimum does not hold anything back.
    at_min = AutoscalerConfig(roles={"unified": RoleLimits(2, 10)},
                              targets={"unified": RoleTargets(num_waiting=2)},
                              scale_down_window_s=0.0)
    d = decide_once(at_min, role(2, num_waiting=4.0), role(2), 2)
    assert d.desired["unified"] == 2 and d.limited["unified"] is None


def test_requests_held_in_either_window_activate_a_role_at_zero():
    config = AutoscalerConfig(roles={"unified": RoleLimits(0, 4)},
                              targets={"unified": RoleTargets(num_waiting=2)})
    d = decide_once(config, RoleSignals(), RoleSignals(num_held_requests=3), 0)
    assert d.desired["unified"] >= 1 and d.reasons["unified"].startswith(
        "scale up 0->"), d.reasons["unified"]
    assert "3 held request(s)" in d.reasons["unified"]


@pytest.mark.parametrize(("made_at", "desired"), [(940.0, 5), (939.9, 4)])
def test_a_recommendation_exactly_a_scale_down_window_old_still_holds(made_at, desired):
    history = History(recommendations={"unified": [(made_at, 5)]})
    d = decide_once(unified(scale_down_window_s=60.0), role(5, num_waiting=4.0), role(5), 5,
                    history)
    assert d.desired["unified"] == desired, d.reasons["unified"]


@pytest.mark.parametrize(("made_at", "desired"), [(970.0, 3), (969.9, 6)])
def test_a_recommendation_exactly_a_scale_up_window_old_still_counts(made_at, desired):
    history = History(recommendations={"unified": [(made_at, 3)]})
    d = decide_once(unified(scale_up_window_s=30.0), role(2, num_waiting=12.0), role(2), 2,
                    history)
    assert d.desired["unified"] == desired, d.reasons["unified"]


def test_a_whole_panic_demand_is_not_rounded_up():
    # The panic window asks for exactly 5 replicas (10 waiting over 2 each): 5, not 6.
    d = decide_once(unified(), role(2), role(2, num_waiting=10.0), 2)
    assert d.desired["unified"] == 5 and d.kinds["unified"] == DecisionReason.PANIC_SCALE_UP


def test_a_role_at_zero_wakes_for_a_demand_of_one_replica():
    config = AutoscalerConfig(roles={"unified": RoleLimits(0, 4)},
                              targets={"unified": RoleTargets(num_waiting=2)})
    d = decide_once(config, role(1, num_waiting=2.0), RoleSignals(), 0)
    assert d.desired["unified"] == 1, d.reasons["unified"]
    # A role the caller has no count for is at zero: with no demand it stays there.
    d = decide(Signals(t=0.0, window_s=60.0, roles={}), Signals(t=0.0, window_s=6.0, roles={}),
               {}, config, History(), 1000.0)
    assert d.desired["unified"] == 0 and d.reasons["unified"] == "idle at zero"


@pytest.mark.parametrize(("role_name", "utilization", "learns"), [
    ("unified", 0.8, True), ("unified", None, False), ("decode", None, False)])
def test_prefill_capacity_is_learned_by_a_role_sized_on_it(role_name, utilization, learns):
    # a prefill role always; a unified one only when a prefill target sizes it
    targets = RoleTargets(num_waiting=2, prefill_utilization=utilization)
    config = AutoscalerConfig(roles={role_name: RoleLimits(1, 8)}, targets={role_name: targets},
                              prefill_tokens_per_s_initial=10_000, prefill_capacity_alpha=0.5)
    busy = role(2, uncached_prompt_tokens_per_s=8000, num_waiting=4.0)
    d = decide(Signals(t=0.0, window_s=60.0, roles={role_name: busy}),
               Signals(t=0.0, window_s=6.0, roles={role_name: busy}),
               {role_name: 2}, config, History(), 1000.0)
    assert (d.history.prefill_tokens_per_s == pytest.approx(7000.0)) is learns
    if not learns:
        assert d.history.prefill_tokens_per_s is None
