"""The dynamo-planner and llmd-keda baselines: each rule's arithmetic at its boundary, the
forecast, and the profile measured from the pool's engine. Pure, time injected."""

from pathlib import Path

import pytest
from kvfleet_engine.core.runner_base import ScheduledSeq, StepBatch
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.cost_model import load_profile, step_time
from kvfleet_operator.api import load_pool
from kvfleet_operator.decide.autoscaler import History, RoleLimits
from kvfleet_operator.decide.role_signals import RoleSignals, Signals
from kvfleet_sim import run
from kvfleet_sim.dynamo_planner import (
    DEFAULT_ITL_SLO_S,
    DEFAULT_TTFT_SLO_S,
    DecodePoint,
    EngineProfile,
    Forecaster,
    PlannerConfig,
    PlannerState,
    PrefillPoint,
    measure_profile,
    plan,
    replicas_needed,
)
from kvfleet_sim.llmd_keda import (
    LlmdKedaConfig,
    calibrate_peak_prefill,
    hpa_replicas,
    llmd_keda_decide,
)
from kvfleet_sim.scalers import SCALERS

ROOT = Path(__file__).resolve().parents[2]
FIDELITY = ROOT / "sim" / "pools" / "fidelity-4.yaml"

# A hand-built profile: 10,000 prompt tokens/s at any ISL (TTFT 0.1 s per 1000 tokens), and
# 1,000 decode tokens/s within a 50 ms ITL (batch 40 at 40 ms; batch 80 at 80 ms misses it).
FLAT = EngineProfile(
    prefill=(PrefillPoint(1000, 1, 0.1), PrefillPoint(4000, 1, 0.4), PrefillPoint(16000, 1, 1.6)),
    decode=(DecodePoint(1000, 40, 0.04), DecodePoint(1000, 80, 0.08)),
)


def _planner(roles: dict[str, RoleLimits], interval_s: float = 10.0) -> PlannerConfig:
    return PlannerConfig(roles=roles, profile=FLAT, interval_s=interval_s, ttft_s=1.0, itl_s=0.05)


def _sig(t: float, window_s: float = 10.0, **roles: RoleSignals) -> Signals:
    return Signals(t=t, window_s=window_s, roles=dict(roles))


# ---------------------------------------------------------------- dynamo-planner


def test_prefill_replicas_are_forecast_prompt_throughput_over_the_profiled_one():
    cfg = _planner({"prefill": RoleLimits(1, 10), "decode": RoleLimits(1, 10)})
    # 10 req/s x 1000 uncached tokens = 10,000 tok/s = exactly one replica's profile
    assert replicas_needed(cfg, 10.0, 1000, 40, 0.0)["prefill"][0] == 1
    assert replicas_needed(cfg, 10.01, 1000, 40, 0.0)["prefill"][0] == 2
    # the prefix-cache hit rate discounts the ISL (current Dynamo): 2000 x (1 - 0.5)
    assert replicas_needed(cfg, 10.0, 2000, 40, 0.5)["prefill"][0] == 1


def test_decode_replicas_are_forecast_output_throughput_at_the_itl_target():
    cfg = _planner({"prefill": RoleLimits(1, 10), "decode": RoleLimits(1, 10)})
    # 25 req/s x 40 output tokens = 1000 tok/s = one replica at ITL <= 50 ms (batch 40)
    assert replicas_needed(cfg, 25.0, 1000, 40, 0.0)["decode"][0] == 1
    assert replicas_needed(cfg, 25.1, 1000, 40, 0.0)["decode"][0] == 2


def test_unified_replicas_add_the_two_phases_shares_and_the_ttft_floor():
    cfg = _planner({"unified": RoleLimits(1, 10)})
    # half a replica of prefill (5000 / 10000) + half of decode (500 / 1000) = 1.0
    assert replicas_needed(cfg, 5.0, 1000, 100, 0.0)["unified"][0] == 1
    assert replicas_needed(cfg, 5.05, 1000, 100, 0.0)["unified"][0] == 2
    # one 16,000-token prompt alone takes 1.6 s > the 1 s target: Dynamo's SLA floor of 2
    assert replicas_needed(cfg, 0.01, 16000, 1, 0.0)["unified"][0] == 2


def test_kalman_forecast_follows_a_trend_and_skips_leading_idle_zeros():
    f = Forecaster("kalman")
    for v in (0.0, 0.0):
        f = f.observe(v)
    assert not f.is_started
    for v in range(10, 110, 10):
        f = f.observe(float(v))
    assert 105 < f.forecast() < 115  # 10, 20, ..., 100 -> about 110
    const = Forecaster("constant")
    for v in (10.0, 20.0, 30.0):
        const = const.observe(v)
    assert const.forecast() == 30.0
    with pytest.raises(ValueError, match="unknown load predictor"):
        Forecaster("arima")


def test_planner_decides_once_per_interval_on_the_forecast_and_holds_between():
    cfg = _planner({"unified": RoleLimits(1, 8)})
    busy = RoleSignals(num_replicas=1, num_known=1, request_rate=10.0,
                       prompt_tokens_per_s=10_000.0, uncached_prompt_tokens_per_s=10_000.0,
                       generation_tokens_per_s=1000.0)  # fmt: skip
    state = plan(_sig(0), _sig(0), {"unified": 1}, cfg, PlannerState(), now=0.0)
    assert state.desired == {"unified": 1} and state.next_at == 10.0
    state = plan(_sig(5, unified=busy), _sig(5), {"unified": 1}, cfg, state, now=5.0)
    assert state.desired == {"unified": 1}  # mid-interval: held
    state = plan(_sig(10, unified=busy), _sig(10), {"unified": 1}, cfg, state, now=10.0)
    # 10 req/s x 1000 -> 1.0 prefill replica + 10 x 100 / 1000 -> 1.0 decode = 2
    assert state.desired == {"unified": 2}
    assert "forecast (kalman)" in state.reasons["unified"]


def test_planner_counts_queue_growth_as_arrivals():
    cfg = _planner({"unified": RoleLimits(1, 8)})
    served = RoleSignals(num_replicas=1, num_known=1, request_rate=5.0,
                         prompt_tokens_per_s=5000.0, uncached_prompt_tokens_per_s=5000.0,
                         generation_tokens_per_s=500.0)  # fmt: skip
    state = plan(_sig(0), _sig(0), {"unified": 1}, cfg, PlannerState(), now=0.0)
    # served 5 req/s (1.0 replica), but 51 more requests queued over the 10 s interval:
    # 10.1 req/s arrive -> 1.01 + 1.01 replicas -> 3
    queue = RoleSignals(num_replicas=1, num_known=1, num_waiting=51.0)
    state = plan(_sig(10, unified=served), _sig(10, unified=queue), {"unified": 1}, cfg, state,
                 now=10.0)  # fmt: skip
    assert state.desired == {"unified": 3}


def test_profile_is_measured_from_the_pools_engine_on_its_cost_model():
    spec = load_pool(FIDELITY).spec
    prof = measure_profile(spec)
    cost = load_profile(spec.engine.profile)
    # one 8192-token prompt is one chunk (maxNumBatchedTokens 8192): one step of the model
    seq = ScheduledSeq("r", list(range(8192)), 0, [], True, SamplingParams(max_tokens=1))
    one = StepBatch([seq])
    assert prof.prefill_ttft_s(8192) == pytest.approx(step_time(cost, one), rel=1e-6)
    # decode slows down as the batch grows; the best batch within the ITL target is used
    at_1k = sorted((p for p in prof.decode if p.context == 1024), key=lambda p: p.batch)
    assert [p.batch for p in at_1k][-1] == spec.engine.max_num_seqs
    assert all(a.itl_s < b.itl_s for a, b in zip(at_1k, at_1k[1:], strict=False))
    assert prof.decode_tokens_per_s(1024, 0.05) == pytest.approx(at_1k[-1].tokens_per_s)
    assert prof.decode_tokens_per_s(1024, at_1k[0].itl_s) == pytest.approx(
        at_1k[0].tokens_per_s)


def test_default_slos_match_the_simulators():
    assert (DEFAULT_TTFT_SLO_S, DEFAULT_ITL_SLO_S) == (run.DEFAULT_TTFT_SLO_S,
                                                       run.DEFAULT_ITL_SLO_S)


# ---------------------------------------------------------------- llmd-keda


def _keda(**kw: object) -> LlmdKedaConfig:
    base: dict[str, object] = dict(roles={"unified": RoleLimits(1, 10)},
                                   peak_prefill_tokens_per_s=10_000.0, backlog_threshold_s=1.0,
                                   scale_down_window_s=0.0)  # fmt: skip
    return LlmdKedaConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_hpa_rule_is_ceil_of_value_over_threshold_outside_the_tolerance():
    assert hpa_replicas(2.2, 1.0, current=2, tolerance=0.1) == 2  # ratio 1.10: within
    assert hpa_replicas(2.2001, 1.0, current=2, tolerance=0.1) == 3
    assert hpa_replicas(1.8, 1.0, current=2, tolerance=0.1) == 2
    assert hpa_replicas(1.79, 1.0, current=2, tolerance=0.1) == 2  # ceil(1.79)
    assert hpa_replicas(0.99, 1.0, current=2, tolerance=0.1) == 1


def test_backlog_seconds_at_the_threshold_hold_and_just_above_scale_up():
    cfg = _keda()

    def desired(backlog: float) -> int:
        rs = RoleSignals(num_replicas=2, num_known=2, num_waiting_prompt_tokens=backlog)
        return llmd_keda_decide(_sig(0, unified=rs), _sig(0), {"unified": 2}, cfg, History(),
                                now=0.0).desired["unified"]  # fmt: skip

    # 2 replicas x 1.0 s x 10,000 tok/s = 20,000 tokens; the HPA tolerates 10 % more
    assert desired(22_000) == 2
    assert desired(22_010) == 3
    assert desired(40_000) == 4


def test_kv_trigger_and_the_larger_trigger_wins():
    cfg = _keda()
    rs = RoleSignals(num_replicas=2, num_known=2, kv_usage_mean=0.9,
                     num_waiting_prompt_tokens=0.0)  # fmt: skip
    d = llmd_keda_decide(_sig(0, unified=rs), _sig(0), {"unified": 2}, cfg, History(), now=0.0)
    assert d.desired == {"unified": 3}  # sum 1.8 / 0.8 = 2.25 -> 3; backlog 0 -> 0
    assert "kv pods 1.80" in d.reasons["unified"]


def test_unknown_backlog_cannot_scale_down_and_steps_are_the_pools():
    cfg = _keda(max_step_up=1)
    unknown = RoleSignals(num_replicas=4, num_known=4, num_waiting_prompt_tokens=None)
    d = llmd_keda_decide(_sig(0, unified=unknown), _sig(0), {"unified": 4}, cfg, History(), 0.0)
    assert d.desired == {"unified": 4} and "unknown" in d.reasons["unified"]
    big = RoleSignals(num_replicas=1, num_known=1, num_waiting_prompt_tokens=90_000.0)
    d = llmd_keda_decide(_sig(0, unified=big), _sig(0), {"unified": 1}, cfg, History(), 0.0)
    assert d.desired == {"unified": 2}  # wants 9, one step at a time


def test_v_p_is_calibrated_as_llmd_calibrate_sh_and_threshold_is_a_share_of_the_slo():
    spec = load_pool(FIDELITY).spec
    v_p = calibrate_peak_prefill(spec)
    chunk = spec.engine.max_num_batched_tokens
    assert v_p == pytest.approx(chunk / measure_profile(spec).prefill_ttft_s(chunk), rel=1e-6)
    cfg = LlmdKedaConfig.from_pool(spec)
    ttft = spec.autoscaling.targets.ttft_p90_seconds
    assert ttft is not None
    assert cfg.backlog_threshold_s == pytest.approx(0.65 * (ttft - chunk / v_p))


def test_both_baselines_are_registered_and_build_for_a_pool():
    spec = load_pool(FIDELITY).spec
    for name in ("dynamo-planner", "llmd-keda"):
        assert name in SCALERS
        SCALERS[name](spec)
