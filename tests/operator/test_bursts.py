"""Traffic in clumps, in the autoscaler: the burst rate a role's scrapes show
(role_signals.burst_rate), the SLO sizing that loads each request with it (slo_sizing), and
the scale-down hold that a few seconds of burst no longer sets for a whole window
(autoscaler.held)."""

import dataclasses
import math
import random
from pathlib import Path

import pytest
from kvfleet_operator.api.status import Reason
from kvfleet_operator.decide.autoscaler import (
    BURST_RATIO,
    HOLD_QUANTILE,
    AutoscalerConfig,
    History,
    RoleLimits,
    RoleTargets,
    decide,
    held,
    held_for_load,
    promises_itl,
    scale_down_step,
)
from kvfleet_operator.decide.load_forecast import ForecastState, recent_peak_rate
from kvfleet_operator.decide.role_signals import (
    ReplicaSample,
    RoleSignals,
    Scrape,
    ScrapeLog,
    Signals,
    aggregate,
    burst_rate,
)
from kvfleet_operator.decide.slo_sizing import (
    CHECK_QUANTILE,
    RoleLoad,
    SloTargets,
    predict,
    role_load,
    role_slo,
    size,
)
from kvfleet_router.perf_model import RoleCoefficients

ROOT = Path(__file__).resolve().parents[2]


def test_a_clump_is_seen_at_its_own_rate():
    # 20 requests in one second of a 20-s window: each sees the other 19 in its second,
    # 19 req/s, where the window's mean is 1 req/s.
    assert burst_rate([(20.0, 1.0)] + [(0.0, 1.0)] * 19) == pytest.approx(18.0)


def test_steady_and_independent_arrivals_show_no_burst():
    assert burst_rate([(2.0, 1.0)] * 10) == 0.0  # evenly spaced: fewer around each than the mean
    rng = random.Random(7)

    def poisson(lam: float) -> int:  # Knuth's method
        k, p, limit = 0, 1.0, math.exp(-lam)
        while True:
            p *= rng.random()
            if p <= limit:
                return k
            k += 1

    counts = [(float(poisson(3.0)), 1.0) for _ in range(20000)]
    assert burst_rate(counts) == pytest.approx(0.0, abs=0.1)


def test_burst_rate_of_nothing_and_of_uneven_intervals():
    assert burst_rate([]) == 0.0
    assert burst_rate([(0.0, 1.0), (0.0, 2.0)]) == 0.0
    # 10 requests in half a second, none in the next 4.5 s: each sees 9 others in 0.5 s.
    assert burst_rate([(10.0, 0.5), (0.0, 4.5)]) == pytest.approx(18.0 - 2.0)


def sample(requests: float) -> ReplicaSample:
    return ReplicaSample(ttft=((math.inf, requests),))


def test_aggregate_sums_the_replicas_clumps_per_scrape_interval():
    # Two replicas scraped at the same ticks, 10 first tokens each in the second ending at
    # t=2 and none after: the role's interval holds 20, so each request sees 19/s; the
    # window's mean is 20 over 3 s.
    log = ScrapeLog()
    for replica in ("a", "b"):
        for t, n in ((1.0, 0.0), (2.0, 10.0), (3.0, 10.0), (4.0, 10.0)):
            log.add(replica, Scrape(t, sample(n)))
    rs = aggregate(log, {"a": "unified", "b": "unified"}, now=4.0, window_s=3.5,
                   stale_after_s=5.0).roles["unified"]
    assert rs.request_rate == pytest.approx(20.0 / 3.0)
    assert rs.burst_rate == pytest.approx(19.0 - 20.0 / 3.0)


def test_a_restarted_replica_counts_from_zero():
    log = ScrapeLog()
    for t, n in ((1.0, 50.0), (2.0, 5.0), (3.0, 5.0)):  # restarted between 1 and 2
        log.add("a", Scrape(t, sample(n)))
    rs = aggregate(log, {"a": "unified"}, now=3.0, window_s=2.5, stale_after_s=5.0)
    assert rs.roles["unified"].burst_rate == pytest.approx(4.0 - 2.5)


# TTFT 10 ms + 32.5 ms per uncached ktoken (and per ktoken queued ahead); TPOT 6.5 ms +
# 1 ms per sequence in flight.
COEF = RoleCoefficients((0.01, 0.0325, 0.0325, 0.0, 0.0002, 0.0), (0.0065, 0.001, 0.0),
                        500, 500)


def test_a_request_is_loaded_with_the_burst_around_it():
    load = RoleLoad(4.0, 2000.0, 20.0, 0.0, burst_rate=6.0)
    as_if = RoleLoad(10.0, 2000.0, 20.0)
    for n in (1, 2, 3, 5):
        assert predict(COEF, load, n) == predict(COEF, as_if, n)
    rs = RoleSignals(num_replicas=4, num_known=2, request_rate=2.0, burst_rate=3.0,
                     uncached_prompt_tokens_per_s=4000.0, generation_tokens_per_s=40.0)
    assert role_load(rs, 10.0).burst_rate == 6.0  # extrapolated to the unknown replicas too


def test_the_burst_sizes_a_role_up_at_the_boundary():
    slo = SloTargets(ttft_p90_s=0.5)
    calm = RoleLoad(20.0, 2000.0, 1.0)
    n, _ = size(COEF, calm, slo, 16)
    bursty = RoleLoad(20.0, 2000.0, 1.0, burst_rate=10.0)
    n_bursty, why = size(COEF, bursty, slo, 16)
    assert n_bursty > n
    assert size(COEF, RoleLoad(30.0, 2000.0, 1.0), slo, 16)[0] == n_bursty
    assert why.endswith("at 20.00 req/s")  # the reason names the mean rate


def test_each_target_is_checked_at_the_quantile_that_leaves_half_the_p90s_misses():
    assert CHECK_QUANTILE == 0.95
    assert SloTargets(ttft_p90_s=2.0).quantile == CHECK_QUANTILE
    unified = role_slo("unified", 2.0, 0.05)
    assert unified is not None and unified.quantile == CHECK_QUANTILE
    load = RoleLoad(20.0, 2000.0, 1.0)
    slo = SloTargets(ttft_p90_s=0.5)
    n, _ = size(COEF, load, slo, 16)
    assert predict(COEF, load, n, 0.95).ttft_p90_s <= 0.5 * 0.8
    assert predict(COEF, load, n - 1, 0.95).ttft_p90_s > 0.5 * 0.8


@pytest.mark.parametrize(("num", "num_high", "holds"), [
    (20, 2, False), (20, 3, True),  # exactly 10% high: released; more: held
    (70, 7, False), (70, 8, True),  # 0.9 x 70 is 63.000000000000014 in floats
    (1, 1, True), (10, 1, False), (9, 1, True),
])
def test_held_is_the_nearest_rank_p90(num, num_high, holds):
    assert HOLD_QUANTILE == 0.9
    recs = [2] * (num - num_high) + [6] * num_high
    random.Random(num).shuffle(recs)
    assert held(recs) == (6 if holds else 2)
    assert held([]) == 0


def unified_config() -> AutoscalerConfig:
    return AutoscalerConfig(roles={"unified": RoleLimits(1, 10)},
                            targets={"unified": RoleTargets(num_waiting=2)},
                            scale_down_window_s=300.0, max_step_down=10,
                            halves_scale_down=False)  # what the window holds, in one step


@pytest.mark.parametrize(("num_burst", "desired"), [(30, 2), (31, 6)])
def test_a_burst_of_a_tenth_of_the_window_does_not_hold_a_scale_down(num_burst, desired):
    # 300 recommendations in the window (299 a second apart and now's), `num_burst` of
    # them 6 replicas (a burst), the rest and now 2: a tenth of the window (30) or less
    # releases the burst's replicas, more holds them.
    recs = [(700.0 + i, 6 if i < num_burst else 2) for i in range(299)]
    history = History(recommendations={"unified": recs})
    quiet = RoleSignals(num_replicas=6, num_known=6, num_waiting=4.0)
    d = decide(Signals(t=1000.0, window_s=60.0, roles={"unified": quiet}),
               Signals(t=1000.0, window_s=6.0, roles={"unified": quiet}),
               {"unified": 6}, unified_config(), history, 1000.0)
    assert d.desired["unified"] == desired


@pytest.mark.parametrize(("short_waiting", "desired", "reason"), [
    (2.0, 1, "scale down 4->1: waiting 2.0 / 2 ["),  # it asks for 1 too: down to it
    (4.0, 2, "scale down 4->2: the last 6s ask for 2 ("),  # it asks for 2: no lower
    (4.1, 3, "scale down 4->3: the last 6s ask for 3 ("),  # a hair more: 3
    (8.0, 4, "steady 4->4: hold: the last 6s ask for 4 ("),  # all it runs: hold
    (10.0, 4, "steady 4->4: hold: the last 6s ask for 5 ("),  # more: a hold, no scale-up
])
def test_a_scale_down_never_goes_below_what_the_short_window_asks_for(
        short_waiting, desired, reason):
    # The stable window asks for 1 (2 waiting, 2 per replica); the short window, the
    # freshest evidence, may ask for more. Below the panic threshold (2 x 4 running), a
    # scale-down still stops at what it asks for: a replica shed against it comes back a
    # start-up later.
    stable = RoleSignals(num_replicas=4, num_known=4, num_waiting=2.0)
    short = RoleSignals(num_replicas=4, num_known=4, num_waiting=short_waiting)
    d = decide(Signals(t=1000.0, window_s=60.0, roles={"unified": stable}),
               Signals(t=1000.0, window_s=6.0, roles={"unified": short}),
               {"unified": 4}, unified_config(), History(), 1000.0)
    assert d.desired["unified"] == desired
    assert d.reasons["unified"].startswith(reason)
    assert d.history.panic_until == {}  # no panic: the rule is below it


def test_latency_over_target_holds_the_count_but_records_what_it_measured():
    # 12 asked for, 1 up at 19x the TTFT target: the count is held (the 11 starting are
    # not cancelled), but the recommendation the window keeps is 1 measured x 2.
    config = AutoscalerConfig(roles={"unified": RoleLimits(1, 16)},
                              targets={"unified": RoleTargets(ttft_p90_s=1.0)},
                              scale_down_window_s=300.0)
    slow = RoleSignals(num_replicas=12, num_known=1, ttft_p90_s=19.0, request_rate=0.5)
    d = decide(Signals(t=100.0, window_s=60.0, roles={"unified": slow}),
               Signals(t=100.0, window_s=6.0, roles={"unified": slow}),
               {"unified": 12}, config, History(), 100.0)
    assert d.desired["unified"] == 12
    assert d.reasons["unified"].startswith("steady 12->12: hold: ttft p90 19000ms > 1000ms")
    assert d.history.recommendations["unified"] == [(100.0, 2)]
    # with the offered rate it was set at: 0.5 req/s on the 1 known, 12 replicas' worth
    assert d.history.observed_latency["unified"] == [(100.0, 2, 6.0)]


@pytest.mark.parametrize(("made_at", "desired"), [(700.0, 6), (699.0, 2)])
def test_a_count_latency_over_target_set_holds_for_the_whole_window(made_at, desired):
    # 299 recommendations of 2 and one of 6 (a third of a percent of the window): at the
    # window's p90 alone it would be released, but the observed-latency cap set it, and
    # such a count holds until it is exactly a window old.
    # The offered rate now (4 waiting to clear in 10 s: 0.4 req/s) is the one it was set
    # at: no burst has passed, so the count holds whole.
    recs = [(700.0 + i, 2) for i in range(1, 299)] + [(made_at, 6)]
    history = History(recommendations={"unified": recs},
                      observed_latency={"unified": [(made_at, 6, 0.4)]})
    quiet = RoleSignals(num_replicas=6, num_known=6, num_waiting=4.0)
    d = decide(Signals(t=1000.0, window_s=60.0, roles={"unified": quiet}),
               Signals(t=1000.0, window_s=6.0, roles={"unified": quiet}),
               {"unified": 6}, unified_config(), history, 1000.0)
    assert d.desired["unified"] == desired
    if desired == 2:
        assert d.history.observed_latency["unified"] == []  # forgotten with the window


@pytest.mark.parametrize(("rate_now", "desired"), [
    (1.0, 6),  # the load it was set at: held whole
    (9.0, 6),  # more load: never more than it asked for
    (0.5, 6),  # half the load: within BURST_RATIO of it, ordinary ebb, held whole
    (1 / 3, 4),  # a third: past the ratio, 6 x 2/3
    (1 / 6, 2),  # a sixth: 2 exactly
    (0.17, 3),  # a hair above a sixth: 2.04 rounds up
])
def test_a_count_latency_over_target_set_holds_in_proportion_to_a_burst(rate_now, desired):
    # One count of 6 set by latency over target at 1 req/s (6 replicas' worth: 6 known),
    # the window's other recommendations 2 (its p90 alone releases the 6). The offered
    # rate now decides how much of the 6 still holds: a burst's backlog that asked for
    # replicas at one load no longer holds them at a fraction of it.
    assert BURST_RATIO == 2.0
    recs = [(700.0 + i, 2) for i in range(1, 299)] + [(900.0, 6)]
    history = History(recommendations={"unified": recs},
                      observed_latency={"unified": [(900.0, 6, 6.0)]})
    quiet = RoleSignals(num_replicas=6, num_known=6, request_rate=rate_now * 6)
    d = decide(Signals(t=1000.0, window_s=60.0, roles={"unified": quiet}),
               Signals(t=1000.0, window_s=6.0, roles={"unified": quiet}),
               {"unified": 6}, unified_config(), history, 1000.0)
    assert d.desired["unified"] == desired


def latency_role_config(role: str, itl_p90_s: float | None) -> AutoscalerConfig:
    return AutoscalerConfig(roles={role: RoleLimits(1, 16)},
                            targets={role: RoleTargets(ttft_p90_s=1.0, itl_p90_s=itl_p90_s)},
                            scale_down_window_s=300.0, max_step_down=10,
                            halves_scale_down=False)  # what the window holds, in one step


@pytest.mark.parametrize(("role", "itl_p90_s", "rate_now", "desired"), [
    ("prefill", None, 1.0, 2),  # the queue absorbs: each 6 stands in the p90 as 6 x 2/6
    ("prefill", None, 1.01, 3),  # a hair more load: 2.02 rounds up, in the p90 too
    ("unified", 0.05, 1.0, 6),  # ITL promised: the 6s hold whole in the p90
    ("unified", 0.05, 1.01, 6),
])
def test_a_latency_count_stands_in_the_window_at_what_it_holds_where_the_queue_absorbs(
        role, itl_p90_s, rate_now, desired):
    # 40 of the window's 300 recommendations are 6, each set by latency over target at
    # 6 req/s (past its tenth: whole, the p90 holds 6); the rest and now ask for 2 or less.
    # Where the role promises no ITL they stand in the p90 at what each holds for the
    # offered rate now (`held_for_load`), so a burst's lagging latency does not hold the
    # window; where ITL is promised they hold whole, as before.
    recs = [(700.0 + i, 2) for i in range(1, 260)] + [(960.0 + i, 6) for i in range(40)]
    history = History(recommendations={role: recs},
                      observed_latency={role: [(960.0 + i, 6, 6.0) for i in range(40)]})
    quiet = RoleSignals(num_replicas=6, num_known=6, request_rate=rate_now)
    d = decide(Signals(t=1000.0, window_s=60.0, roles={role: quiet}),
               Signals(t=1000.0, window_s=6.0, roles={role: quiet}),
               {role: 6}, latency_role_config(role, itl_p90_s), history, 1000.0)
    assert promises_itl(latency_role_config(role, itl_p90_s).targets[role]) == (
        itl_p90_s is not None)
    assert d.desired[role] == desired


@pytest.mark.parametrize(("role", "itl_p90_s", "oldest_t", "rate_then"), [
    ("prefill", None, 10.5, 100.0),  # the window's peak, its oldest decision included
    ("prefill", None, 10.0, 39.0),  # a point 1.5 windows old is out: the next peak
    ("unified", 0.05, 10.5, 6.0),  # ITL promised: the rate of now, as before
])
def test_a_latency_count_is_recorded_at_the_peak_of_the_window_it_was_measured_over(
        role, itl_p90_s, oldest_t, rate_then):
    # As test_latency_over_target_holds_the_count_but_records_what_it_measured (12 asked
    # for, 1 of them up, TTFT p90 at 19x target: 6 req/s on 12 replicas' worth), with the
    # stable window's rates `record_rate` kept for the last window's decisions (a point
    # sits half a window before its decision: kept while newer than now - 1.5 windows).
    config = latency_role_config(role, itl_p90_s)
    assert config.stable_window_s == 60.0
    forecast = ForecastState(rates={role: [(oldest_t, 100.0), (40.0, 39.0), (70.0, 3.0)]})
    assert recent_peak_rate(forecast, role, 100.0, 60.0) == max(
        39.0, 100.0 if oldest_t > 10.0 else 0.0)
    slow = RoleSignals(num_replicas=12, num_known=1, ttft_p90_s=19.0, request_rate=0.5)
    d = decide(Signals(t=100.0, window_s=60.0, roles={role: slow}),
               Signals(t=100.0, window_s=6.0, roles={role: slow}),
               {role: 12}, config, History(forecast=forecast), 100.0)
    assert d.reasons[role].startswith("steady 12->12: hold: ttft p90 19000ms > 1000ms")
    assert d.history.observed_latency[role] == [(100.0, 2, rate_then)]


@pytest.mark.parametrize(("count", "then", "now", "holds"), [
    (6, 30.0, 5.0, 2), (6, 30.0, 15.0, 6), (6, 30.0, 60.0, 6), (6, 30.0, 0.0, 0),
    (6, 0.0, 5.0, 6),  # the rate it was set at unknown: held whole
    (4, 10.0, 2.5, 2), (4, 10.0, 2.55, 3),
])
def test_held_for_load(count, then, now, holds):
    assert held_for_load(count, then, now) == holds


def test_observed_latency_survives_a_restart_and_old_state_reads():
    h = History(observed_latency={"prefill": [(5.0, 3, 2.5)]})
    assert History.from_dict(h.to_dict()).observed_latency == {"prefill": [(5.0, 3, 2.5)]}
    assert History.from_dict({}).observed_latency == {}
    # written before the rate was kept: the count holds whole (rate 0)
    old = {"observed_latency": {"prefill": [[5.0, 3]]}}
    assert History.from_dict(old).observed_latency == {"prefill": [(5.0, 3, 0.0)]}
    for bad in ([["x", 3]], [[5.0]], [[5.0, 3, 1.0, 2.0]]):
        with pytest.raises(ValueError, match="malformed autoscaler history"):
            History.from_dict({"observed_latency": {"prefill": bad}})


def test_the_hold_quantile_is_configurable_and_the_keda_baseline_keeps_the_hpas_highest():
    from kvfleet_operator.api import load_pool  # noqa: PLC0415
    from kvfleet_sim.scalers import SCALERS  # noqa: PLC0415 (the simulator's registry)

    assert unified_config().hold_quantile == HOLD_QUANTILE
    for ok in (1.0, 0.01):
        AutoscalerConfig(roles={"unified": RoleLimits(1, 4)}, targets={}, hold_quantile=ok)
    for bad in (0.0, 1.0001):
        with pytest.raises(ValueError, match="hold_quantile"):
            AutoscalerConfig(roles={"unified": RoleLimits(1, 4)}, targets={},
                             hold_quantile=bad)
    assert held([2] * 29 + [6], 1.0) == 6  # the highest, however rare
    recs = [(700.0 + i, 6 if i < 2 else 2) for i in range(299)]
    quiet = RoleSignals(num_replicas=6, num_known=6, num_waiting=4.0)
    hpa = dataclasses.replace(unified_config(), hold_quantile=1.0)
    history = History(recommendations={"unified": recs})
    args = (Signals(t=1000.0, window_s=60.0, roles={"unified": quiet}),
            Signals(t=1000.0, window_s=6.0, roles={"unified": quiet}), {"unified": 6})
    assert decide(*args, hpa, history, 1000.0).desired["unified"] == 6
    assert decide(*args, unified_config(), history, 1000.0).desired["unified"] == 2
    # The simulator's KEDA rule (waiting > 5 per replica) holds as the HPA does.
    keda = SCALERS["waiting-5"](load_pool(ROOT / "sim/pools/h100-llama3-8b-16.yaml").spec)
    assert keda.scaler(*args, history, 1000.0).desired["unified"] == 6
    # ... and has no short window under a scale-down: 30 waiting over the last seconds
    # (6 replicas' worth at 5 each, all it runs), 4 over the stable window, a quiet
    # history: down by the pool's step (its default, 4) at once, where kvfleet's autoscaler
    # holds.
    def busy_now(waiting):
        return (Signals(t=1000.0, window_s=60.0, roles={"unified": quiet}),
                Signals(t=1000.0, window_s=6.0, roles={"unified": dataclasses.replace(
                    quiet, num_waiting=waiting)}), {"unified": 6})
    assert keda.scaler(*busy_now(30.0), History(), 1000.0).desired["unified"] == 2
    assert decide(*busy_now(12.0), dataclasses.replace(unified_config(), max_step_down=1),
                  History(), 1000.0).desired["unified"] == 6  # 6 at 2 each: held


@pytest.mark.parametrize(("current", "target", "step"), [
    (13, 4, 4),  # half the gap, 4.5, down to 4: also the max step
    (12, 4, 4),  # half of 8: the max step
    (11, 4, 3),  # half of 7
    (7, 4, 1),  # half of 3: one
    (6, 4, 1),  # a gap of two: one replica, as the window's noise is that wide
    (5, 4, 1),
])
def test_a_scale_down_removes_half_the_gap_to_its_target(current, target, step):
    config = unified_config()
    halving = dataclasses.replace(config, halves_scale_down=True, max_step_down=4)
    assert scale_down_step(current, target, halving) == step
    # the switch off (the HPA's rule, the simulator's KEDA baseline): the whole max step
    assert scale_down_step(current, target, dataclasses.replace(
        halving, halves_scale_down=False)) == 4
    # a pool's maxStep bounds it either way
    assert scale_down_step(current, target, dataclasses.replace(
        halving, max_step_down=1)) == 1


def test_a_pool_far_above_its_target_comes_down_in_a_few_decisions():
    # 13 replicas after a burst, the window asking for 4 and nothing holding it: 13 -> 9
    # -> 7 -> 6 -> 5 -> 4, one decision each, each reported as step-limited but the last.
    config = dataclasses.replace(unified_config(), halves_scale_down=True, max_step_down=4,
                                 scale_down_window_s=0.0)
    assert AutoscalerConfig(roles={}, targets={}).halves_scale_down  # on by default
    current, history, seen = 13, History(), []
    for now in range(1000, 1006):
        quiet = RoleSignals(num_replicas=current, num_known=current, num_waiting=8.0)
        d = decide(Signals(t=now, window_s=60.0, roles={"unified": quiet}),
                   Signals(t=now, window_s=6.0, roles={"unified": quiet}),
                   {"unified": current}, config, history, float(now))
        current, history = d.desired["unified"], d.history
        seen.append((current, d.limited["unified"]))
    assert [n for n, _ in seen] == [9, 7, 6, 5, 4, 4]
    assert [why for _, why in seen[:4]] == [Reason.STEP_LIMITED] * 4
