"""The online performance model (perf_model.py) and the predictive `slo` policy on it.

`test_predictor_learns_each_endpoint_through_the_router` fails when the predictor stops
learning (`EndpointPerf.learn_ttft` / `learn_tpot` a no-op, or `scorers_feedback.learn`
no longer feeding them): its predictions then stay None or the role's, and the slower
replica is not predicted slower.
"""

from __future__ import annotations

import random

import pytest
from kvfleet_router.config import RouterConfig
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.perf_model import (
    PROMPT_QUANTILES,
    PROMPT_STATS,
    PROMPT_WINDOW,
    TTFT_DIM,
    EndpointPerf,
    FitErrors,
    LinearStats,
    Mape,
    OutputLengths,
    RoleCoefficients,
    RoleModel,
    dot,
    prompt_stats,
    role_coefficients,
    tpot_features,
    ttft_features,
)
from kvfleet_router.policies.pickers import pick_slo_tiered
from kvfleet_router.proxy import Outcome
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore


def true_ttft(u_tokens: float, waiting: float, speed: float) -> float:
    """Seconds: a fixed cost, prefill per ktoken, and each queued request's wait."""
    u = u_tokens / 1000
    return speed * (0.02 + 0.03 * u + 0.01 * u * waiting + 0.2 * waiting)


def test_linear_stats_recover_a_linear_law():
    rng = random.Random(1)
    stats = LinearStats(TTFT_DIM)
    for _ in range(400):
        u, w = rng.uniform(0, 8000), rng.randint(0, 6)
        stats.add(ttft_features(u, w, rng.randint(0, 20), rng.random()), true_ttft(u, w, 1.0))
    for u, w in ((500, 0), (4000, 3), (8000, 6)):
        got = stats.predict(ttft_features(u, w, 5, 0.5))
        assert got == pytest.approx(true_ttft(u, w, 1.0), rel=0.02)


def test_prompt_stats_are_the_mean_the_mean_square_and_nearest_rank_quantiles():
    assert prompt_stats([]) == ()
    ktokens = [float(k) for k in range(1, 201)]  # 1 .. 200
    stats = dict(zip(PROMPT_STATS, prompt_stats(reversed(ktokens)), strict=True))
    assert stats["mean"] == pytest.approx(100.5)
    assert stats["mean_square"] == pytest.approx(sum(k * k for k in ktokens) / 200)
    assert stats["q0.5"] == 100.0  # nearest rank: the 100th of 200
    assert stats["q0.9"] == 180.0
    assert stats["q0.995"] == 199.0
    assert list(PROMPT_STATS[2:]) == [f"q{q:g}" for q in PROMPT_QUANTILES]


def test_prompt_quantiles_interpolate_between_the_exported_ones_and_clamp_outside():
    prompt = (1.0, 2.0, *(10.0 * (i + 1) for i in range(len(PROMPT_QUANTILES))))
    c = RoleCoefficients((0.0,) * TTFT_DIM, (0.0,) * 3, 1, 1, prompt)
    i = PROMPT_QUANTILES.index(0.9)
    assert c.prompt_ktokens_at(0.9) == pytest.approx(10.0 * (i + 1))
    q0, q1 = PROMPT_QUANTILES[i], PROMPT_QUANTILES[i + 1]
    assert c.prompt_ktokens_at((q0 + q1) / 2) == pytest.approx(10.0 * (i + 1.5))
    assert c.prompt_ktokens_at(0.1) == 10.0  # below the lowest: the lowest
    assert c.prompt_ktokens_at(0.9999) == 10.0 * len(PROMPT_QUANTILES)
    assert c.mean_prompt_ktokens == 1.0
    assert RoleCoefficients((0.0,) * TTFT_DIM, (0.0,) * 3).prompt_ktokens_at(0.9) is None
    assert RoleCoefficients((0.0,) * TTFT_DIM, (0.0,) * 3).mean_prompt_ktokens is None
    with pytest.raises(ValueError, match="prompt statistics"):
        RoleCoefficients((0.0,) * TTFT_DIM, (0.0,) * 3, 1, 1, prompt[:-1])


def test_an_endpoint_keeps_its_last_prompts_and_the_role_pools_them():
    a, b = EndpointPerf(), EndpointPerf()
    for k in range(PROMPT_WINDOW + 10):
        a.learn_ttft(ttft_features(1000.0 * k, 0, 0, 0.0), 0.1)
    b.learn_ttft(ttft_features(500.0, 0, 0, 0.0), 0.05)
    assert len(a.prompt_ktokens) == PROMPT_WINDOW and a.prompt_ktokens[0] == 10.0
    fit = role_coefficients([a, b])
    assert fit is not None
    kept = [float(k) for k in range(10, PROMPT_WINDOW + 10)] + [0.5]
    assert fit.prompt == prompt_stats(kept)


def test_forgetting_follows_a_change():
    stats = LinearStats(TTFT_DIM, forget=0.95)
    x = ttft_features(1000, 0, 0, 0)
    for _ in range(200):
        stats.add(x, 0.1)
    for _ in range(100):
        stats.add(x, 0.3)  # the replica slowed down
    assert stats.predict(x) == pytest.approx(0.3, rel=0.02)


def test_role_model_blends_own_and_pooled_evidence():
    fast, slow = EndpointPerf(), EndpointPerf()
    x = ttft_features(2000, 1, 2, 0.1)
    for _ in range(200):
        fast.learn_ttft(x, 0.1)
    for _ in range(4):
        slow.learn_ttft(x, 0.4)
    model = RoleModel(min_samples=32)
    model.refresh([fast, slow])
    pooled = (200 * 0.1 + 4 * 0.4) / 204
    k = 32 / 4
    assert model.predict_ttft(slow, x) == pytest.approx((4 * 0.4 + k * pooled) / (4 + k),
                                                        rel=0.05)
    assert model.predict_ttft(fast, x) == pytest.approx(0.1, rel=0.01)  # its own fit


def test_role_model_keeps_an_own_fit_only_where_it_predicts_better_than_the_pooled():
    """Three alike replicas and one at half speed, answers with +-30% noise, learned as the
    router learns them (the pooled fit refitted every 16 answers and handed to each
    endpoint, which scores both fits on its next answers). The slow replica's own fit wins
    and is used; an alike replica whose own fit did not predict better is predicted by the
    pooled fit, so noise in its own fit makes it neither faster nor slower."""
    rng = random.Random(7)
    perfs = [EndpointPerf() for _ in range(4)]
    speeds = [1.0, 1.0, 1.0, 2.0]
    model = RoleModel(min_samples=32)
    for _ in range(150):
        for perf, speed in zip(perfs, speeds, strict=True):
            model.refresh(perfs)
            u, w = rng.uniform(0, 8000), rng.randint(0, 3)
            y = true_ttft(u, w, speed) * rng.uniform(0.7, 1.3)
            perf.learn_ttft(ttft_features(u, w, 2, 0.2), y)
    # a fresh refit over everything learned (the fit errors live on the endpoints)
    model = RoleModel(min_samples=32)
    model.refresh(perfs)
    x = ttft_features(4000, 1, 2, 0.2)
    coefficients = role_coefficients(perfs)  # the role's pooled fit, as RoleModel pools it
    assert coefficients is not None
    pooled = dot(coefficients.ttft, x)
    slow = perfs[3]
    assert slow.ttft_errors.is_own_better
    assert model.predict_ttft(slow, x) == pytest.approx(slow.ttft.predict(x))
    assert model.predict_ttft(slow, x) == pytest.approx(true_ttft(4000, 1, 2.0), rel=0.15)
    alike = [p for p in perfs[:3] if not p.ttft_errors.is_own_better]
    assert len(alike) >= 2  # the pooled fit predicted them better
    for perf in alike:
        assert perf.ttft.predict(x) != pytest.approx(pooled, rel=1e-3)  # own fits differ
        assert model.predict_ttft(perf, x) == pytest.approx(pooled)


def test_fit_errors_compare_on_the_same_answers():
    errors = FitErrors(alpha=0.5)
    assert errors.is_own_better  # nothing compared yet: the own fit, as before
    errors.add(own=2.4, pooled=2.2, actual=2.0)  # relative errors: 0.2 and 0.1
    assert errors.own == pytest.approx(0.2) and errors.pooled == pytest.approx(0.1)
    assert not errors.is_own_better
    errors.add(own=2.0, pooled=2.6, actual=2.0)  # 0.1 vs 0.2 after the EWMA
    assert errors.is_own_better
    errors.add(own=None, pooled=2.0, actual=1.0)  # one side missing: not scored
    errors.add(own=5.0, pooled=1.0, actual=0.0)  # nothing to be relative to: not scored
    assert errors.own == pytest.approx(0.1) and errors.pooled == pytest.approx(0.2)
    tie = FitErrors(alpha=0.5)
    tie.add(own=2.5, pooled=1.5, actual=2.0)  # equally wrong: the pooled fit, not its own
    assert not tie.is_own_better


def test_output_lengths_and_mape():
    lengths = OutputLengths(prior=100)
    assert lengths.predict("m", "s") == 100
    lengths.learn("m", None, 50)
    assert lengths.predict("m", "s") == 50
    lengths.learn("m", "s", 400)
    assert lengths.predict("m", "s") == 400 and lengths.predict("m", "t") == pytest.approx(120)
    mape = Mape()
    assert mape.value == 0.0
    mape.add(2.2, 2.0)  # 10% over
    mape.add(1.0, 2.0)  # 50% under
    mape.add(1.0, 0.0)  # no actual to be relative to: not counted
    assert mape.value == pytest.approx(0.3) and mape.num_samples == 2


def test_output_lengths_keep_at_most_max_keys_dropping_the_oldest():
    lengths = OutputLengths(prior=100, max_keys=2)
    lengths.learn(None, "s1", 10)
    lengths.learn(None, "s2", 20)
    lengths.learn(None, "s1", 30)  # a key it holds: learned, nothing dropped
    assert lengths.by_session == {"s1": pytest.approx(14.0), "s2": 20}
    lengths.learn(None, "s3", 5)  # a new key at the cap: the oldest (s1) goes
    assert lengths.by_session == {"s2": 20, "s3": 5}


def test_features_clamp_what_cannot_be_negative_and_kv_to_one():
    assert ttft_features(-100, -1, -2, 1.7) == (1.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    assert ttft_features(3000, 2, 5, -0.3) == (1.0, 3.0, 6.0, 2.0, 5.0, 0.0)
    assert tpot_features(-4, 1.2) == (1.0, 0.0, 1.0)
    assert tpot_features(7, 0.4) == (1.0, 7.0, 0.4)


@pytest.mark.parametrize(("ttft", "tpot"), [(6, 2), (5, 3), (7, 3)])
def test_role_coefficients_need_every_coefficient(ttft, tpot):
    with pytest.raises(ValueError, match=f"need 6 TTFT and 3 TPOT coefficients, got {ttft} "):
        RoleCoefficients((0.0,) * ttft, (0.0,) * tpot)


def test_the_pooled_fit_is_refitted_every_refit_every_answers_and_shared_by_two():
    a, b = EndpointPerf(), EndpointPerf()
    x = ttft_features(2000, 0, 1, 0.1)
    for _ in range(8):
        a.learn_ttft(x, 0.1)
    model = RoleModel(min_samples=32, refit_every=16)
    model.refresh([a, b])
    assert a.pooled_ttft is None  # one endpoint with answers: nothing to score a pool on
    b.learn_ttft(x, 0.4)
    model.refresh([a, b])  # 1 answer since the last fit: not refitted
    assert a.pooled_ttft is None
    for _ in range(15):
        b.learn_ttft(x, 0.4)
    model.refresh([a, b])  # 16 since: refitted, and now two endpoints share it
    assert a.pooled_ttft is not None and a.pooled_ttft is b.pooled_ttft


@pytest.mark.parametrize(("n", "blended"), [(31, True), (32, False)])
def test_an_own_fit_replaces_the_blend_at_min_samples(n, blended):
    mine, other = EndpointPerf(), EndpointPerf()
    x = ttft_features(2000, 0, 1, 0.1)
    for _ in range(n):
        mine.learn_ttft(x, 0.1)
    for _ in range(64):
        other.learn_ttft(x, 0.4)
    model = RoleModel(min_samples=32)
    model.refresh([mine, other])
    own = mine.ttft.predict(x)
    got = model.predict_ttft(mine, x)
    assert own == pytest.approx(0.1, rel=0.01)
    assert (got != pytest.approx(own, rel=0.01)) is blended  # the pooled fit pulls it up


def two_speed_core(ttft_s: float = 2.0, policy: str = "slo"
                   ) -> tuple[RouterCore, HealthFeedback]:
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "capacity": 64}
                      for i, n in enumerate(["fast", "slow"])],
        "policy": {"name": policy, "slo": {"min_samples": 16, "ttft_s": ttft_s},
                   "pipelines": {"tiered": {"scorers": {"slo": 1.0}, "picker": "slo-tiered",
                                            "filters": ["bounded-load"]}}}})
    core = RouterCore(cfg, rng=random.Random(3))
    return core, HealthFeedback(RouterMetrics(lambda: core, lambda: 0), lambda: core.cfg)


def teach(core: RouterCore, feedback: HealthFeedback, n: int) -> None:
    """n requests per endpoint, with queues of 0-3 ahead, answered per `true_ttft`."""
    rng = random.Random(5)
    for i in range(n):
        for name, speed in (("fast", 1.0), ("slow", 2.0)):
            e = next(x for x in core.registry.endpoints if x.name == name)
            waiting = rng.randint(0, 3)
            e.num_in_flight += waiting  # requests ahead of this one
            chars = rng.randint(400, 16000)
            info = RequestInfo(prompt_text=f"{i}{name}" + "x" * chars, max_tokens=32)
            routed = core.route(info, "unified", now=float(i), allowed=frozenset({name}))
            core.start(routed)
            ttft = true_ttft(chars / 4, waiting, speed)
            tpot = speed * (0.006 + 0.0004 * (waiting + 1))
            feedback.exchange_done(e, routed, Outcome(ttft, ttft + 31 * tpot, 32, True),
                                   now=float(i))
            core.end(routed)  # neither pending nor in flight
            e.num_in_flight -= waiting


def test_predictor_learns_each_endpoint_through_the_router():
    core, feedback = two_speed_core()
    teach(core, feedback, 60)
    eps = {e.name: e for e in core.registry.endpoints}
    assert eps["fast"].perf.ttft.num_samples == 60
    eps["fast"].num_in_flight = eps["slow"].num_in_flight = 2
    routed = core.route(RequestInfo(prompt_text="q" * 8000, max_tokens=32), "unified", 100.0)
    fast_ttft, fast_tpot = routed.ctx.predictions["fast"]
    slow_ttft, slow_tpot = routed.ctx.predictions["slow"]
    assert fast_ttft == pytest.approx(true_ttft(2000, 2, 1.0), rel=0.1)
    assert slow_ttft == pytest.approx(true_ttft(2000, 2, 2.0), rel=0.1)
    assert slow_tpot == pytest.approx(2 * fast_tpot, rel=0.15)
    # what was predicted is scored: later predictions are close, so the MAPE is small
    assert eps["fast"].ttft_mape.num_samples > 0 and eps["fast"].ttft_mape.value < 0.2
    text = RouterMetrics(lambda: core, lambda: 0).render().decode()
    assert 'kvfleet_router_perf_model_mape{role="unified",target="ttft"}' in text


def test_slo_policy_ranks_by_headroom_and_queue_and_else_takes_the_least_late():
    core, feedback = two_speed_core()
    teach(core, feedback, 60)
    fast = next(e for e in core.registry.endpoints if e.name == "fast")

    def pick(i: int) -> str:
        info = RequestInfo(prompt_text=f"{i}" + "q" * 4000, max_tokens=32)
        return core.route(info, "unified", 200.0).decision.endpoint.name

    # idle, both meet a 2 s TTFT: the faster (more headroom) wins every time
    assert {pick(i) for i in range(20)} == {"fast"}
    # the queue term: with requests in flight on fast only, slow takes the next ones
    fast.num_in_flight += 8
    assert {pick(i) for i in range(20)} == {"slow"}
    fast.num_in_flight -= 8
    # held requests spread them: the bounded load and the queue term share the work out
    held = [core.start(core.route(RequestInfo(prompt_text=f"h{i}" + "q" * 4000, max_tokens=32),
                                  "unified", 200.0)) for i in range(40)]
    counts = {n: sum(1 for e in held if e is not None and e.name == n) for n in ("fast", "slow")}
    assert counts["slow"] > 0 and counts["fast"] > counts["slow"], counts
    for e in held:
        core.finish(e)
    # a 0.5 s target: 25k tokens meet it nowhere (0.77 s / 1.54 s); the least late wins
    core, feedback = two_speed_core(ttft_s=0.5)
    teach(core, feedback, 60)
    strict_picks = {core.route(RequestInfo(prompt_text=f"{i}" + "z" * 100000, max_tokens=32),
                               "unified", 300.0).decision.endpoint.name for i in range(20)}
    assert strict_picks == {"fast"}


def test_slo_tiered_pipeline_spreads_among_endpoints_that_meet():
    core, feedback = two_speed_core(policy="tiered")
    teach(core, feedback, 60)
    picks = [core.route(RequestInfo(prompt_text=f"{i}" + "q" * 4000, max_tokens=32),
                        "unified", 200.0).decision.endpoint.name for i in range(200)]
    # both meet a 2 s TTFT with headroom: weighted random by headroom, not argmax
    assert 0 < picks.count("slow") < picks.count("fast"), picks.count("slow")


def test_slo_tiered_picker():
    rng = random.Random(0)
    assert pick_slo_tiered([0.3, 0.45, 0.1], rng) == 1  # none meets: the least late
    got = [pick_slo_tiered([0.9, 0.6, 0.2], rng) for _ in range(2000)]
    assert got.count(2) == 0
    assert got.count(0) / got.count(1) == pytest.approx(4.0, rel=0.2)  # by excess over 0.5


def test_the_configs_learning_rates_reach_every_endpoint_also_after_a_push():
    """policy.slo.forget and ewma_alpha apply to new endpoints and, on a push, to known
    ones (their statistics stay)."""
    from kvfleet_router.config import RouterConfig
    from kvfleet_router.router_core import RouterCore

    def cfg(forget: float, alpha: float, version: int) -> RouterConfig:
        return RouterConfig.from_dict({
            "version": version, "endpoints": [{"name": "a", "url": "http://127.0.0.1:9"}],
            "policy": {"slo": {"forget": forget, "ewma_alpha": alpha}}})

    core = RouterCore(cfg(0.9, 0.5, 1))
    e = core.registry.by_name["a"]
    assert (e.perf.ttft.forget, e.perf.tpot.forget, e.ttft.alpha) == (0.9, 0.9, 0.5)
    e.perf.learn_ttft([1.0] * len(e.perf.ttft.xty), 0.2)
    learned = e.perf.ttft.num_samples
    core.apply(cfg(0.999, 0.1, 2))
    assert core.registry.by_name["a"] is e and e.perf.ttft.num_samples == learned
    assert (e.perf.ttft.forget, e.perf.tpot.forget) == (0.999, 0.999)
    assert (e.ttft.alpha, e.prefill_s_per_token.alpha, e.decode_s_per_token.alpha) == (
        0.1, 0.1, 0.1)


def test_the_mape_scores_a_fit_at_most_max_age_samples_old():
    from kvfleet_router.perf_model import LinearStats

    stats = LinearStats(2, forget=1.0)
    for x in range(1, 5):
        stats.add((1.0, float(x)), 2.0 * x)
    solved = stats.predict((1.0, 10.0))  # a solve: y = 2x
    assert solved is not None and abs(solved - 20.0) < 0.1
    for _ in range(3):  # the truth moves: y = 2x + 100 at x = 1
        stats.add((1.0, 1.0), 102.0)
    assert stats.predict_recent((1.0, 10.0), max_age=3) == solved  # 3 old: kept
    stats.add((1.0, 1.0), 102.0)
    refit = stats.predict_recent((1.0, 10.0), max_age=3)  # 4 old: solved again
    assert refit is not None and refit != solved
    assert refit == stats.predict((1.0, 10.0))
