"""SLO sizing (decide/slo_sizing.py): the queueing step and the smallest count at its
boundary; the start-up forecast (decide/load_forecast.py); decide() driven by the SLO."""

import dataclasses
import math
import random
from collections.abc import Callable

import pytest
from kvfleet_operator.api.pool import parse_pool
from kvfleet_operator.decide.autoscaler import (
    QUEUEING_SHARE,
    AutoscalerConfig,
    History,
    RoleLimits,
    RoleTargets,
    decide,
    is_queueing,
    slo_demand,
)
from kvfleet_operator.decide.autoscaler_spec import config_from_pool
from kvfleet_operator.decide.load_forecast import (
    MIN_POINTS,
    ForecastState,
    linear_forecast,
    record_rate,
    track_startup,
)
from kvfleet_operator.decide.role_signals import RoleSignals, Signals
from kvfleet_operator.decide.slo_sizing import (
    CHECK_QUANTILE,
    MIN_EVIDENCE,
    RoleLoad,
    SloTargets,
    choose_coefficients,
    decode_share_s,
    meets,
    predict,
    prefill_stall_s,
    queue_quantile,
    role_load,
    role_slo,
    seed_coefficients,
    service_s,
    size,
    wait_per_running_s,
)
from kvfleet_router.perf_model import RoleCoefficients, prompt_stats

# An H100-like fit: 10 ms + 32.5 ms per uncached ktoken, the same per ktoken queued ahead;
# TPOT 6.5 ms + 35 us per sequence in flight.
FIT = RoleCoefficients((0.01, 0.0325, 0.0325, 0.0, 0.0002, 0.0), (0.0065, 3.5e-5, 0.003),
                       500, 500)
SLO = SloTargets(ttft_p90_s=2.0, itl_p90_s=0.05, headroom=0.2)
# The KV usage per sequence `loaded` signals show (0.05 over 2 running per replica).
KV_PER_SEQ = 0.025


def test_queue_quantile_is_mm1():
    # P(w_q >= k) = rho^(k+1): the 0.9 quantile is ln 0.1 / ln rho - 2.
    assert queue_quantile(0.5, 0.9) == pytest.approx(math.log(0.1) / math.log(0.5) - 2)
    assert queue_quantile(0.3, 0.9) == 0.0  # rho^2 <= 0.1: nine arrivals in ten wait for none
    assert queue_quantile(1.0, 0.9) == math.inf


def test_prediction_hand_computed_at_low_load():
    # One request per second of 4k uncached tokens and 1 output token on 1 replica:
    # S = 0.0325 * 4 = 0.13 s, rho = 0.13, no queue at p90 (mean rho^2 / (1 - rho));
    # L solves L = 1 * TTFT(w_q mean, r = L).
    load = RoleLoad(1.0, 4000, 1.0)
    p = predict(FIT, load, 1)
    assert p.utilization == pytest.approx(0.13)
    assert p.num_queued_p == 0.0
    wq_mean = 0.13**2 / 0.87
    ttft_mean = 0.01 + 0.13 + 0.13 * wq_mean
    assert p.num_in_flight == pytest.approx(ttft_mean / (1 - 0.0002), rel=1e-6)
    assert p.ttft_p90_s == pytest.approx(0.01 + 0.13 + 0.0002 * p.num_in_flight, rel=1e-6)


def with_queue_terms(per_queued_ktoken: float, per_queued: float) -> RoleCoefficients:
    return RoleCoefficients((0.002, 0.035, per_queued_ktoken, per_queued, 0.0, 0.0),
                            FIT.tpot, 500, 500)


def test_a_queued_request_waits_its_prefill_whatever_the_fits_queue_terms():
    # The queue is prefill work: each request ahead adds its prefill, w_u . U, not the fit's
    # w_u_wq . U + w_wq, however high (a P/D prefill role's: 0.78 s), close, low or negative.
    # 9 req/s of 1.63k-token prompts on one replica (rho 0.51, 2.4 queued ahead at the p95).
    load = RoleLoad(9.0, 1630, 1.0)
    prefill = 0.035 * 1.63
    predictions = [predict(with_queue_terms(*terms), load, 1) for terms in
                   ((1.32, -1.37), (0.0, prefill * 0.999), (0.0002, 0.001), (-0.01, 0.0))]
    queued = math.log(0.05) / math.log(9 * prefill) - 2
    for p in predictions:  # 2 ms + the own prefill + the prefills queued ahead
        assert p.num_queued_p == pytest.approx(queued)
        assert p.ttft_p90_s == pytest.approx(0.002 + prefill + queued * prefill)


# The routers' recent uncached prompts: four in five of 1k tokens, one in five of 6k (mean
# 2k, p90 6k), as `kvfleet_router_perf_model_prompt_ktokens` exports them.
TAIL_FIT = dataclasses.replace(FIT, prompt=prompt_stats([1.0] * 80 + [6.0] * 20))


def test_a_ttft_p90_is_priced_at_the_routers_p90_prompt():
    # A request's own prefill at the p90 prompt (6k: 10 ms + 195 ms), the queue ahead at the
    # mean one (S = 65 ms): 4 req/s on one replica, rho 0.26, 1.2 queued at the p95.
    # Little's law (the mean in flight) still reads the mean prompt.
    load = RoleLoad(4.0, 2000, 1.0)
    mean_only = predict(FIT, load, 1)
    p = predict(TAIL_FIT, load, 1)
    assert p.utilization == pytest.approx(4 * 0.065)
    assert p.num_in_flight == pytest.approx(mean_only.num_in_flight)
    queued = math.log(0.05) / math.log(0.26) - 2
    own = 0.01 + 0.0325 * 6.0 + 0.0002 * p.num_in_flight
    assert p.ttft_p90_s == pytest.approx(own + queued * 0.065)
    assert mean_only.ttft_p90_s == pytest.approx(own - 0.0325 * 4.0 + queued * 0.065)


@pytest.mark.parametrize("target_s", [0.3, 0.5])
def test_the_prompt_tail_sizes_a_role_up(target_s):
    # The same load sized with and without the tail: the p90 prompt's own prefill leaves
    # the queue less of the target, so the tail asks for more replicas; just below the
    # rate at which its count meets the target that count, just above one more.
    slo = SloTargets(ttft_p90_s=target_s, headroom=0.0)

    def asks(fit: RoleCoefficients, rate: float) -> int:
        return size(fit, RoleLoad(rate, 2000, 1.0), slo, 64, "prefill")[0]

    assert asks(TAIL_FIT, 40.0) > asks(FIT, 40.0)
    n = asks(TAIL_FIT, 40.0)
    rate = boundary_rate(n - 1, slo, TAIL_FIT, lambda r: RoleLoad(r, 2000, 1.0))
    assert asks(TAIL_FIT, rate * 0.999) == n - 1
    assert asks(TAIL_FIT, rate * 1.001) == n


def test_a_p90_prompt_longer_than_the_target_is_sized_for_its_queue():
    # The p90 prompt alone takes 205 ms, past a 150 ms target: no count reaches it, so the
    # queue is sized to add at most a tenth of it (as for any target an idle replica
    # misses), not the maximum; the mean prompt alone (75 ms) would not say so.
    n, why = size(TAIL_FIT, RoleLoad(40.0, 2000, 1.0), SloTargets(ttft_p90_s=0.15, headroom=0.0),
                  64, "prefill")
    assert n <= 64, why
    assert "an idle replica misses TTFT p90, TTFT p90 205 ms > 150 ms" in why


# The local example pool's fit (Azure conversation from 600 s, compressed 4x, read at 50 s
# on six lightly loaded replicas): 3.5 ms per queued 1.25k-token prompt against its 41 ms
# prefill, and TPOT's cost of a sequence on KV usage (v_n -48 us, v_kv 17 ms).
LOCAL_FIT = RoleCoefficients((0.00219, 0.03301, 0.0027, 0.00026, 0.00048, -0.00825),
                             (0.007197, -4.8e-05, 0.017102), 754, 754)


def test_a_fit_from_idle_replicas_does_not_size_a_busy_one():
    # 12 req/s of 1,248-token prompts with 261-token answers, KV 1% per sequence: the
    # decode share is TPOT's slope in n through KV usage too, 260 x 127 us = 33 ms, so one
    # replica runs at rho 0.89 (0.49 by its prompts alone) and its queue of 41 ms prefills
    # misses the 1 s TTFT target. Counting the fit's 3.5 ms per queued prompt, or v_n
    # alone (negative: no decode share), one replica looked enough up to 20 req/s, and the
    # pool flapped between one and six replicas.
    load = RoleLoad(12.0, 1248, 261.0, 0.0102)
    slope = -4.8e-05 + 0.017102 * 0.0102
    assert decode_share_s(LOCAL_FIT, load) == pytest.approx(260 * slope)
    s = service_s(LOCAL_FIT, load)
    p = predict(LOCAL_FIT, load, 1)
    assert p.utilization == pytest.approx(12 * (s + 260 * slope))
    slo = SloTargets(ttft_p90_s=1.0, itl_p90_s=0.05)
    assert not meets(p, slo)
    assert size(LOCAL_FIT, load, slo, 6, "unified")[0] == 2
    # At 10 req/s (rho 0.74) one replica meets it.
    assert size(LOCAL_FIT, RoleLoad(10.0, 1248, 261.0, 0.0102), slo, 6, "unified")[0] == 1


def test_unidentified_queue_terms_do_not_size_a_role_to_its_max():
    # 12 prefill legs/s of 1.6k uncached tokens (rho 0.68 on one replica, 4 queued ahead
    # at p90): one replica, as with queue terms equal to the prefill; with the raw fit
    # (0.78 s per queued) two, and with its 0.78 s as the service time none up to 6.
    load, slo = RoleLoad(12.0, 1630, 1.0), SloTargets(ttft_p90_s=2.0)
    spurious, _ = size(with_queue_terms(1.32, -1.37), load, slo, 6, "prefill")
    physical, _ = size(with_queue_terms(0.035, 0.0), load, slo, 6, "prefill")
    assert spurious == physical == 1


def with_running_term(per_running: float) -> RoleCoefficients:
    return RoleCoefficients((-0.0015, 0.0361, 0.0142, 0.0559, per_running, 0.11),
                            (0.0, 0.0, 0.0), 1685, 0)


def test_a_running_request_delays_a_new_one_at_most_its_prefill():
    # A P/D prefill role's fit (Azure conversation): 0.30 s per running 1.8k-token prompt.
    load = RoleLoad(3.8, 1790, 1.0)
    prefill = 0.0361 * 1.79
    assert wait_per_running_s(with_running_term(0.3015), load) == pytest.approx(prefill)
    inside = prefill * 0.999
    assert wait_per_running_s(with_running_term(inside), load) == pytest.approx(inside)
    assert wait_per_running_s(with_running_term(-0.01), load) == 0.0
    # As fitted, L = a . TTFT had no fixed point at 3.8 legs/s on one replica (rho 0.25):
    # one replica would have been infeasible. Bounded, one meets the SLO.
    n, why = size(with_running_term(0.3015), load, SloTargets(ttft_p90_s=2.0), 6, "prefill")
    assert n == 1, why
    assert predict(with_running_term(0.3015), load, 1).num_in_flight < 1.0


def boundary_rate(n: int, slo: SloTargets = SLO, fit: RoleCoefficients = FIT,
                  load: Callable[[float], RoleLoad] = lambda rate: RoleLoad(
                      rate, 12000, 300, KV_PER_SEQ)) -> float:
    """The request rate at which n replicas just meet `slo` (bisection on the predictor)."""
    lo, hi = 0.01, 1000.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if meets(predict(fit, load(mid), n), slo):
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("n", [1, 3, 8])
def test_size_at_its_boundary(n):
    # Just below the rate at which n replicas meet the target: n; just above: n + 1.
    rate = boundary_rate(n)
    below, why = size(FIT, RoleLoad(rate * 0.999, 12000, 300, KV_PER_SEQ), SLO, 16, "unified")
    above, _ = size(FIT, RoleLoad(rate * 1.001, 12000, 300, KV_PER_SEQ), SLO, 16, "unified")
    assert below == n, why
    assert above == n + 1
    assert why.startswith(f"{n} unified replicas: predicted TTFT p90 ")
    assert "req/s" in why


def test_itl_target_decides_for_decode():
    slo = SloTargets(itl_p90_s=0.01, headroom=0.0)
    load = RoleLoad(50.0, 0, 400)
    n, why = size(FIT, load, slo, 64, "decode")
    assert predict(FIT, load, n).itl_p90_s <= 0.01 < predict(FIT, load, n - 1).itl_p90_s
    assert why.startswith(f"{n} decode replicas: predicted ITL ")
    assert "TTFT" not in why


def test_prefill_stall_quantile_is_the_models_own():
    # Closed form, checked against sampling its own assumptions: work in queue V is 0
    # with probability 1 - rho, else exponential with mean S / (1 - rho); decode steps d
    # exponential with mean O - 1; the q-quantile x of V / d has P(V / d > x) = 1 - q.
    rho, service, output, q = 0.7, 0.06, 25.0, 0.9
    x = prefill_stall_s(rho, service, output, q)
    assert x == pytest.approx((0.7 / 0.1 - 1) * 0.06 / (0.3 * 24))
    rng = random.Random(7)
    n, over = 200_000, 0
    for _ in range(n):
        v = rng.expovariate((1 - rho) / service) if rng.random() < rho else 0.0
        over += v > x * rng.expovariate(1 / (output - 1))
    assert over / n == pytest.approx(1 - q, abs=0.004)
    # At its edge: a replica busy no more than 1 - q of the time stalls no quantile.
    assert prefill_stall_s(0.5, service, output, 0.5) == 0.0
    assert 0.0 < prefill_stall_s(0.5001, service, output, 0.5) < 1e-5
    assert prefill_stall_s(1.0, service, output, q) == math.inf


def test_short_answers_behind_prefill_size_a_unified_role_up():
    # Azure code's shape: 1.8k-token prompts, 25-token answers. Each replica's decode
    # steps ride with the prompts it prefills, so the ITL of short answers is the TPOT
    # plus the queued prefill spread over their few steps.
    load, slo = RoleLoad(24.0, 1800, 25.0), SloTargets(ttft_p90_s=2.0, itl_p90_s=0.05)
    n, why = size(FIT, load, slo, 16, "unified")
    p = predict(FIT, load, n)
    stall = prefill_stall_s(24.0 / n * service_s(FIT, load), service_s(FIT, load), 25.0,
                            CHECK_QUANTILE)
    assert stall > 0 and "ITL" in why
    assert p.itl_p90_s <= 0.04 < predict(FIT, load, n - 1).itl_p90_s
    # Without the stall, TTFT and TPOT alone would take fewer replicas.
    no_stall_itl = p.itl_p90_s - stall
    assert no_stall_itl <= 0.04 and predict(FIT, load, n - 1).ttft_p90_s <= 1.6
    # A decode role computes no prompt: nothing stalls it.
    decode = RoleLoad(20.0, 0.0, 25.0)
    assert size(FIT, decode, SloTargets(itl_p90_s=0.05), 16, "decode")[0] == 1
    # The seed's prefill speed is a deliberately slow prior, not a measurement: no stall
    # from it (its TPOT stands alone).
    seeded = RoleCoefficients(FIT.ttft, FIT.tpot, MIN_EVIDENCE - 1, 500)
    assert predict(seeded, load, n - 1).itl_p90_s == pytest.approx(
        predict(FIT, load, n - 1).itl_p90_s - prefill_stall_s(
            24.0 / (n - 1) * service_s(FIT, load), service_s(FIT, load), 25.0, CHECK_QUANTILE))


def test_a_unified_replicas_decode_steps_count_in_its_utilization():
    # 1k-token prompts (S = 32.5 ms) with 201-token answers: each request's 200 decode
    # steps take 200 x 35 us = 7 ms of the GPU from the prompts, so one replica is full at
    # 1 / 39.5 ms = 25.3 req/s, not at the 30.8 req/s its prompts alone would fill.
    s, d = 0.0325, 200 * 3.5e-5
    full = 1.0 / (s + d)
    below, at = RoleLoad(full * 0.999, 1000, 201.0), RoleLoad(full, 1000, 201.0)
    assert predict(FIT, below, 1).utilization == pytest.approx(0.999)
    assert predict(FIT, below, 1).is_feasible
    assert not predict(FIT, at, 1).is_feasible
    assert size(FIT, at, SLO, 4, "unified")[0] == 2
    # A prefill leg decodes one token, and a decode role prefills nothing: neither counts.
    assert predict(FIT, RoleLoad(full, 1000, 1.0), 1).utilization == pytest.approx(full * s)
    decode = predict(FIT, RoleLoad(full, 0.0, 201.0), 1)
    assert decode.utilization == pytest.approx(full * service_s(FIT, RoleLoad(full, 0.0, 201.0)))


def test_nothing_meets_and_no_load():
    n, why = size(FIT, RoleLoad(1000.0, 12000, 300, KV_PER_SEQ), SLO, 4)
    assert n == 5 and "even at 4" in why
    assert size(FIT, RoleLoad(0.0), SLO, 4)[0] == 0


def test_role_load_from_signals():
    rs = RoleSignals(num_replicas=4, num_known=2, request_rate=2.0,
                     uncached_prompt_tokens_per_s=6000.0, generation_tokens_per_s=400.0,
                     num_waiting=5.0, num_held_requests=3, num_running=10.0,
                     kv_usage_mean=0.25)
    load = role_load(rs, backlog_clear_s=10.0)
    # 2 known of 4: rate doubled; 5 x 2 waiting + 3 held cleared in 10 s.
    assert load.request_rate == pytest.approx(4.0 + 1.3)
    assert load.uncached_prompt_tokens == pytest.approx(3000.0)
    assert load.output_tokens == pytest.approx(200.0)
    assert load.kv_per_seq == pytest.approx(0.25 / 5.0)


def test_role_slo_and_seed():
    assert role_slo("unified", None, None) is None
    assert role_slo("prefill", 1.0, 0.03) == SloTargets(ttft_p90_s=1.0)
    assert role_slo("decode", 1.0, 0.03) == SloTargets(itl_p90_s=0.03)
    unified = role_slo("unified", 1.0, None)
    assert unified is not None and unified.itl_p90_s == 0.05  # the router's default SLO
    seed = seed_coefficients(2000.0)
    assert seed.ttft[1] == pytest.approx(0.5)  # 0.5 s per ktoken at 2,000 tokens/s
    assert choose_coefficients(FIT, seed)[0] is FIT
    assert choose_coefficients(None, seed)[0] is seed
    neither = RoleCoefficients(FIT.ttft, FIT.tpot, MIN_EVIDENCE - 1, MIN_EVIDENCE - 1)
    assert choose_coefficients(neither, seed)[0] is seed
    # each target on its own evidence, at the boundary: a prefill role learns TTFT only
    prefill = RoleCoefficients(FIT.ttft, (0.0, 0.0, 0.0), MIN_EVIDENCE, 0)
    chosen, why = choose_coefficients(prefill, seed)
    assert chosen.ttft == FIT.ttft and chosen.tpot == seed.tpot
    assert why.startswith("fleet TTFT model") and "seed TPOT" in why
    few_ttft = RoleCoefficients(FIT.ttft, FIT.tpot, MIN_EVIDENCE - 1, MIN_EVIDENCE)
    chosen, why = choose_coefficients(few_ttft, seed)
    assert chosen.ttft == seed.ttft and chosen.tpot == FIT.tpot
    assert why.startswith("seed TTFT")
    # a mixed fit keeps what else the fleet's carries: the routers' recent prompts
    from kvfleet_router.perf_model import PROMPT_STATS

    prompts = (1.0,) * len(PROMPT_STATS)
    for mixed in (RoleCoefficients(FIT.ttft, (0.0, 0.0, 0.0), MIN_EVIDENCE, 0, prompts),
                  RoleCoefficients(FIT.ttft, FIT.tpot, 0, MIN_EVIDENCE, prompts)):
        chosen, _ = choose_coefficients(mixed, seed)
        assert chosen.prompt == prompts
    with pytest.raises(ValueError, match="SLO ttft_p90_s must be > 0"):
        SloTargets(ttft_p90_s=0)


# --- the forecast -------------------------------------------------------------------------


def test_a_ramp_is_extrapolated_by_startup_seconds():
    ramp = [(float(t), 10.0 + 0.5 * t) for t in range(0, 21)]  # +0.5 req/s per second
    observed = 20.0  # the rate at t = 20
    assert linear_forecast(ramp, observed, at=20.0 + 10.0) == pytest.approx(25.0)
    assert linear_forecast(ramp, observed, at=20.0 + 0.0) == pytest.approx(20.0)
    # Growth is capped at 2x what is observed.
    assert linear_forecast(ramp, observed, at=20.0 + 1000.0) == pytest.approx(40.0)


def test_flat_stays_flat_and_a_fall_does_not_scale_down_ahead():
    flat = [(float(t), 8.0) for t in range(10)]
    assert linear_forecast(flat, 8.0, at=100.0) == pytest.approx(8.0)
    falling = [(float(t), 20.0 - t) for t in range(10)]
    assert linear_forecast(falling, 11.0, at=100.0) == 11.0
    assert linear_forecast(flat[:2], 8.0, at=100.0) == 8.0  # too few points: no trend


def test_a_trend_takes_min_points_in_time():
    ramp = [(0.0, 10.0), (1.0, 11.0), (2.0, 12.0)]
    assert len(ramp) == MIN_POINTS
    assert linear_forecast(ramp, 12.0, at=4.0) == pytest.approx(14.0)
    assert linear_forecast(ramp[:MIN_POINTS - 1], 11.0, at=4.0) == 11.0
    # Points that span no time have no slope (and divide by nothing).
    assert linear_forecast([(5.0, 1.0), (5.0, 9.0), (5.0, 20.0)], 7.0, at=10.0) == 7.0


def test_record_rate_keeps_one_window():
    state = ForecastState()
    for t in range(100):
        record_rate(state, "unified", float(t), 1.0, window_s=20.0)
    ts = [t for t, _ in state.rates["unified"]]
    assert min(ts) > 99 - 30 and max(ts) == 99 - 10  # placed at the window's middle


def test_startup_is_measured_from_ask_to_ready_and_survives_a_restart():
    state = ForecastState()
    track_startup(state, "prefill", now=100.0, current=2, target=4, num_ready=2)
    track_startup(state, "prefill", now=130.0, current=4, target=4, num_ready=3)
    assert "prefill" not in state.startup_s
    track_startup(state, "prefill", now=160.0, current=4, target=4, num_ready=4)
    assert state.startup_s["prefill"] == pytest.approx(60.0)
    # A second scale-up that took 20 s: EWMA at 0.5.
    track_startup(state, "prefill", now=200.0, current=4, target=5, num_ready=4)
    track_startup(state, "prefill", now=220.0, current=5, target=5, num_ready=5)
    assert state.startup_s["prefill"] == pytest.approx(40.0)
    # A scale-down below what was asked for cancels the ask.
    track_startup(state, "prefill", now=300.0, current=5, target=8, num_ready=5)
    track_startup(state, "prefill", now=310.0, current=8, target=6, num_ready=5)
    assert "prefill" not in state.pending_up
    record_rate(state, "prefill", now=310.0, rate=12.5, window_s=20.0)
    track_startup(state, "decode", now=310.0, current=2, target=3, num_ready=2)
    history = History(forecast=state)
    restored = History.from_dict(history.to_dict()).forecast
    assert restored == state
    assert restored.rates == {"prefill": [(300.0, 12.5)]}  # the trend survives too
    assert restored.pending_up == {"decode": [(310.0, 3)]}


# --- decide() with an SLO --------------------------------------------------------------------


def sig(**kw):
    return Signals(t=0.0, window_s=20.0, roles={"unified": RoleSignals(**kw)})


def slo_config(slo=SLO, **kw):
    targets = RoleTargets(num_waiting=2, kv_usage=0.8, slo=slo)
    kw = {"scale_down_window_s": 0.0, **kw}
    return AutoscalerConfig(roles={"unified": RoleLimits(1, 16)},
                            targets={"unified": targets}, stable_window_s=20.0,
                            panic_window_s=5.0, max_step_up=16, max_step_down=16, **kw)


def loaded(rate, n=2, perf=FIT, **kw):
    return dict(num_replicas=n, num_known=n, request_rate=rate,
                uncached_prompt_tokens_per_s=rate * 12000, generation_tokens_per_s=rate * 300,
                num_running=2.0 * n, kv_usage_mean=0.05, perf=perf, **kw)


def test_decide_is_driven_by_the_slo_when_the_pool_has_targets():
    rate = boundary_rate(5) * 0.99  # 5 replicas just meet the SLO
    s = sig(**loaded(rate))
    d = decide(s, s, {"unified": 2}, slo_config(), History(), now=100.0)
    assert d.desired["unified"] == 5, d.reasons
    assert "slo: 5 unified replicas: predicted TTFT p90" in d.reasons["unified"]
    assert "fleet model, 500 requests" in d.reasons["unified"]
    # Waiting 30 (15 per replica against 2) would ask for 15 without the SLO; with it,
    # the waiting target does not drive (the queue is in the model).
    busy = sig(**loaded(boundary_rate(5) * 0.99 - 3.0, num_waiting=30.0))
    d = decide(busy, busy, {"unified": 2}, slo_config(), History(), now=100.0)
    assert d.desired["unified"] == 5, d.reasons
    plain = decide(busy, busy, {"unified": 2}, slo_config(slo=None), History(), now=100.0)
    assert plain.desired["unified"] == 15  # without an SLO, today's rule


def test_recommendations_made_on_the_seed_do_not_hold_a_scale_down():
    # Cold start: the seed (fleet has 4/32 requests) asks for many replicas; once the
    # fleet's own fit drives, the scale-down window no longer holds the seed's count.
    config = slo_config(scale_down_window_s=300.0, scale_down_cooldown_s=0.0)
    seed_fit = RoleCoefficients(FIT.ttft, FIT.tpot, 4, 4)
    rate = boundary_rate(5) * 0.99
    early = sig(**loaded(rate, perf=seed_fit))
    d = decide(early, early, {"unified": 2}, config, History(), now=10.0)
    assert d.desired["unified"] > 2 and "seed model" in d.reasons["unified"]
    seeded = d.desired["unified"]
    quiet = sig(**loaded(0.5, n=seeded))
    d2 = decide(quiet, quiet, {"unified": seeded}, config, d.history, now=40.0)  # no panic
    assert d2.desired["unified"] < seeded, d2.reasons
    assert d2.history.learned_since == {"unified": 40.0}
    assert History.from_dict(d2.history.to_dict()).learned_since == {"unified": 40.0}
    # A recommendation made on the fleet's fit still holds for the whole window.
    fleet_early = sig(**loaded(rate))
    d4 = decide(fleet_early, fleet_early, {"unified": 2}, config, History(), now=10.0)
    d5 = decide(quiet, quiet, {"unified": d4.desired["unified"]}, config, d4.history, now=40.0)
    assert d5.desired["unified"] == d4.desired["unified"] == 5


def test_latency_above_target_never_sheds_replicas_still_starting():
    # 12 asked for, 1 up and measured at 19x the TTFT target, the fit asking for 1: the
    # observed-latency cap holds the 12 (measured x 2 = 2 would cancel the 11 starting).
    slo_ttft = SLO.ttft_p90_s
    config = slo_config()
    config.targets["unified"].ttft_p90_s = slo_ttft  # as config_from_pool sets it
    s = sig(**{**loaded(0.1, n=12), "num_known": 1, "ttft_p90_s": 19 * slo_ttft})
    d = decide(s, s, {"unified": 12}, config, History(), now=100.0)
    assert d.desired["unified"] == 12, d.reasons
    assert d.reasons["unified"].startswith("steady 12->12: hold: ttft p90 38000ms > 2000ms ["), \
        d.reasons
    # The same fleet with its latency at the target scales down on the fit.
    ok = sig(**{**loaded(0.1, n=12), "num_known": 1, "ttft_p90_s": slo_ttft})
    assert decide(ok, ok, {"unified": 12}, config, History(), now=100.0
                  ).desired["unified"] < 12


def test_latency_cap_acts_only_while_the_short_window_is_above_target_too():
    # The long window's TTFT p90 is 1.5x the target; 4 replicas measured, the fit asks
    # for fewer. The cap pushes to 4 x 1.5 = 6 only while the short window is over too.
    slo_ttft = SLO.ttft_p90_s
    config = slo_config()
    config.targets["unified"].ttft_p90_s = slo_ttft
    stable = sig(**{**loaded(0.1, n=4), "ttft_p90_s": 1.5 * slo_ttft})

    def with_short_window(ttft_p90_s):
        panic = sig(**{**loaded(0.1, n=4), "ttft_p90_s": ttft_p90_s})
        return decide(stable, panic, {"unified": 4}, config, History(), now=100.0)

    over = with_short_window(slo_ttft * 1.01)  # the short window is over: 4 x 1.01 -> 5
    assert over.desired["unified"] == 5, over.reasons
    assert "ttft p90" in over.reasons["unified"]
    served = with_short_window(slo_ttft)  # at the target: the burst is served
    assert served.desired["unified"] < 4, served.reasons
    assert "ttft p90" not in served.reasons["unified"]
    unknown = with_short_window(None)  # no samples in the short window: the long one's
    assert unknown.desired["unified"] == 6, unknown.reasons


def test_ttft_above_target_holds_replicas_only_while_requests_queue():
    # 12 replicas, TTFT p90 1.5x the target, the fit asking for fewer. With requests
    # scheduled at once the latency is the prompts' own prefill: more replicas cannot help,
    # so the cap does not hold the 12. From a queue time p90 of a tenth of the target on
    # (and with none exported, the rule before the signal) it pushes up (12 x 1.5).
    slo_ttft = SLO.ttft_p90_s
    config = slo_config()
    config.targets["unified"].ttft_p90_s = slo_ttft

    def with_queue_time(queue_p90_s, short_window_queue_p90_s="same"):
        s = sig(**{**loaded(0.1, n=12), "ttft_p90_s": 1.5 * slo_ttft,
                   "queue_time_p90_s": queue_p90_s})
        if short_window_queue_p90_s == "same":
            return decide(s, s, {"unified": 12}, config, History(), now=100.0)
        short = sig(**{**loaded(0.1, n=12), "ttft_p90_s": 1.5 * slo_ttft,
                       "queue_time_p90_s": short_window_queue_p90_s})
        return decide(s, short, {"unified": 12}, config, History(), now=100.0)

    scheduled_at_once = with_queue_time(QUEUEING_SHARE * slo_ttft * 0.99)
    assert scheduled_at_once.desired["unified"] < 12, scheduled_at_once.reasons
    assert "ttft p90" not in scheduled_at_once.reasons["unified"]
    for queue_p90_s in (QUEUEING_SHARE * slo_ttft, None):
        held = with_queue_time(queue_p90_s)
        assert held.desired["unified"] > 12, (queue_p90_s, held.reasons)
        assert "ttft p90 3000ms > 2000ms" in held.reasons["unified"]
    # A queue in the short window alone counts (the long window's p90 dilutes it).
    short_queue = with_queue_time(0.0, QUEUEING_SHARE * slo_ttft)
    assert short_queue.desired["unified"] > 12, short_queue.reasons
    quiet = with_queue_time(0.0, QUEUEING_SHARE * slo_ttft * 0.99)
    assert quiet.desired["unified"] < 12, quiet.reasons
    assert is_queueing(RoleSignals(queue_time_p90_s=0.2), 2.0)
    assert not is_queueing(RoleSignals(queue_time_p90_s=0.19), 2.0)


def test_an_slo_without_targets_sizes_nothing():
    s = sig(**loaded(5.0))
    n, why = slo_demand("unified", s.roles["unified"], SloTargets(), 16, slo_config(), None,
                        now=0.0)
    assert (n, why.startswith("slo: no target")) == (0.0, True)


def test_kv_usage_still_caps_an_slo_driven_role():
    s = sig(**{**loaded(0.1, n=4), "kv_usage_mean": 0.95})  # little traffic, full KV
    d = decide(s, s, {"unified": 4}, slo_config(), History(), now=100.0)
    assert d.desired["unified"] == 5 and "kv 0.95" in d.reasons["unified"]


def ramp_decision(slo):
    """decide() after a ramp (the window rate grows 2% of the base per second for 20 s,
    the base half the rate 4 replicas meet `slo` at), with a 60 s start-up; returns
    (decision, the rate of now)."""
    config = slo_config(slo=slo, startup_s_initial=60.0)
    base, hist = boundary_rate(4, slo) * 0.5, History()
    for t in range(21):
        s = sig(**loaded(base * (1 + 0.02 * t), n=4))
        d = decide(s, s, {"unified": 4}, config, hist, now=float(t))
        hist = d.history
    return d, base * 1.4


def test_forecast_asks_ahead_of_a_ramp():
    d, now_rate = ramp_decision(SLO)
    now_only, _ = size(FIT, RoleLoad(now_rate, 12000, 300, KV_PER_SEQ), SLO, 16)
    assert d.desired["unified"] > now_only, d.reasons
    assert "forecast 60s ahead" in d.reasons["unified"]


def test_only_the_itl_target_is_sized_on_the_forecast():
    # TTFT: a burst that outruns the start-up waits in the queue the TTFT budget absorbs,
    # so the TTFT check is sized on the load of now; the forecast (2x now, the growth cap)
    # would ask for more.
    ttft_only = SloTargets(ttft_p90_s=2.0, headroom=0.2)
    d, now_rate = ramp_decision(ttft_only)
    now_only, _ = size(FIT, RoleLoad(now_rate, 12000, 300, KV_PER_SEQ), ttft_only, 16)
    ahead, _ = size(FIT, RoleLoad(2 * now_rate, 12000, 300, KV_PER_SEQ), ttft_only, 16)
    assert d.desired["unified"] == now_only < ahead, d.reasons
    assert "forecast" not in d.reasons["unified"]
    # ITL: a prompt on a decode step stalls every stream at once; sized ahead.
    itl_only = SloTargets(itl_p90_s=0.05, headroom=0.2)
    d, now_rate = ramp_decision(itl_only)
    now_only, _ = size(FIT, RoleLoad(now_rate, 12000, 300, KV_PER_SEQ), itl_only, 16)
    ahead, _ = size(FIT, RoleLoad(2 * now_rate, 12000, 300, KV_PER_SEQ), itl_only, 16)
    assert d.desired["unified"] == ahead > now_only, d.reasons
    assert "forecast 60s ahead" in d.reasons["unified"]


def test_config_from_pool_sets_the_slo_only_with_targets():
    def pool(targets):
        return parse_pool({
            "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "p"},
            "spec": {
                "model": {"name": "m", "source": "builtin://llama3-8b-sim"},
                "engine": {"kind": "builtin", "runner": "simulated",
                           "profile": "h100-llama3-8b"},
                "topology": {"prefill": {"replicas": {"min": 1, "max": 4}},
                             "decode": {"replicas": {"min": 1, "max": 4}}},
                "autoscaling": {"targets": targets}}}).spec

    c = config_from_pool(pool({"ttftP90Seconds": 1.5, "prefillTokensPerSecondPerReplica": 4000}))
    assert c.targets["prefill"].slo == SloTargets(ttft_p90_s=1.5)
    assert c.targets["decode"].slo == SloTargets(itl_p90_s=0.05)
    assert c.perf_seed["prefill"].ttft[1] == pytest.approx(0.25)
    c = config_from_pool(pool({}))
    assert all(t.slo is None for t in c.targets.values())
