"""The perf model's transport to the autoscaler: the router exports each role's pooled fit as
`kvfleet_router_perf_model_coefficient{role,target,feature}` (+ evidence, + the recent
prompts, `kvfleet_router_perf_model_prompt_ktokens{role,stat}`) on /metrics; the
operator reads them back equal (`role_signals.parse_router_perf_models`); several routers
combine by evidence; the simulator's router hands over the same numbers in process."""

from __future__ import annotations

import random

import pytest
from kvfleet_operator.decide.role_signals import combine_perf_models, parse_router_perf_models
from kvfleet_router.config import RouterConfig
from kvfleet_router.metrics import RouterMetrics, perf_models
from kvfleet_router.perf_model import RoleCoefficients, tpot_features, ttft_features
from kvfleet_router.router_core import RouterCore
from kvfleet_sim.ports import SimRouter, drive


def trained_core() -> RouterCore:
    names = [("u0", "unified"), ("u1", "unified"), ("p0", "prefill"), ("d0", "decode")]
    cfg = RouterConfig.from_dict({"endpoints": [
        {"name": n, "url": f"http://127.0.0.1:{9000 + i}", "role": role}
        for i, (n, role) in enumerate(names)]})
    core = RouterCore(cfg, rng=random.Random(0))
    rng = random.Random(1)
    for e in core.registry.endpoints:
        if e.role == "decode":
            continue  # no answer yet: no fit, nothing exported
        for _ in range(60):
            u, w, r, kv = rng.uniform(0, 8000), rng.randint(0, 6), rng.randint(0, 30), rng.random()
            e.perf.learn_ttft(ttft_features(u, w, r, kv), 0.01 + 3.3e-5 * u * (1 + w) + 0.002 * r)
            n = rng.randint(1, 60)
            e.perf.learn_tpot(tpot_features(n, kv), 0.0065 + 3.5e-5 * n + 0.003 * kv)
    return core


def test_exported_coefficients_are_read_back_equal():
    core = trained_core()
    fits = perf_models(core)
    assert set(fits) == {"unified", "prefill"}
    assert fits["unified"].num_ttft_samples == 120 and fits["prefill"].num_tpot_samples == 60
    text = RouterMetrics(lambda: core, lambda: 0).render().decode()
    assert 'kvfleet_router_perf_model_coefficient{feature="u",role="unified",target="ttft"}' \
        in text
    back = parse_router_perf_models(text)
    assert set(back) == set(fits)
    for role, fit in fits.items():
        assert back[role].ttft == pytest.approx(fit.ttft, rel=1e-12, abs=1e-15)
        assert back[role].tpot == pytest.approx(fit.tpot, rel=1e-12, abs=1e-15)
        assert (back[role].num_ttft_samples, back[role].num_tpot_samples) == (
            fit.num_ttft_samples, fit.num_tpot_samples)
        assert fit.prompt and back[role].prompt == pytest.approx(fit.prompt, rel=1e-12)
    # The fit is the model's: it recovers the per-ktoken slope it was taught.
    assert fits["unified"].ttft[1] == pytest.approx(0.033, rel=0.05)


def test_a_role_that_learned_ttft_alone_is_exported_with_no_tpot_evidence():
    """A prefill role's legs teach TTFT and it decodes nothing: its fit still reaches the
    autoscaler, TPOT as zeros with zero evidence (the sizing then takes the seed's)."""
    cfg = RouterConfig.from_dict({"endpoints": [
        {"name": "p0", "url": "http://127.0.0.1:9000", "role": "prefill"}]})
    core = RouterCore(cfg, rng=random.Random(0))
    [e] = core.registry.endpoints
    assert perf_models(core) == {}  # nothing learned: nothing exported
    for u in range(500, 8500, 500):
        e.perf.learn_ttft(ttft_features(u, 0, 0, 0.0), 0.01 + 3.3e-5 * u)
    fits = perf_models(core)
    assert fits["prefill"].num_ttft_samples == 16 and fits["prefill"].num_tpot_samples == 0
    assert fits["prefill"].tpot == (0.0, 0.0, 0.0)
    back = parse_router_perf_models(RouterMetrics(lambda: core, lambda: 0).render().decode())
    assert back["prefill"] == fits["prefill"]
    assert back["prefill"].ttft[1] == pytest.approx(0.033, rel=0.05)


def test_a_role_missing_a_feature_is_left_out():
    text = "\n".join(
        f'kvfleet_router_perf_model_coefficient{{role="unified",target="ttft",feature="{f}"}} 1'
        for f in ("const", "u", "u_wq", "wq", "r"))  # no kv, no tpot
    assert parse_router_perf_models(text) == {}

    def line(target: str, feature: str) -> str:
        return (f'kvfleet_router_perf_model_coefficient{{role="unified",target="{target}",'
                f'feature="{feature}"}} 1')

    ttft = [line("ttft", f) for f in ("const", "u", "u_wq", "wq", "r", "kv")]
    tpot = [line("tpot", f) for f in ("const", "n", "kv")]
    assert set(parse_router_perf_models("\n".join(ttft + tpot))) == {"unified"}
    assert parse_router_perf_models("\n".join(ttft + tpot[:2])) == {}  # TPOT short of kv
    assert parse_router_perf_models("\n".join(ttft[1:] + tpot)) == {}  # TTFT short of const


def test_several_routers_combine_by_evidence():
    a = RoleCoefficients((1, 1, 1, 1, 1, 1), (1, 1, 1), 300, 100)
    b = RoleCoefficients((3, 3, 3, 3, 3, 3), (5, 5, 5), 100, 100)
    both = combine_perf_models([{"unified": a}, {"unified": b, "decode": b}])
    assert both["unified"].ttft == pytest.approx((1.5,) * 6)  # (300 x 1 + 100 x 3) / 400
    assert both["unified"].tpot == pytest.approx((3.0,) * 3)
    assert both["unified"].num_ttft_samples == 400
    assert both["unified"].prompt == ()  # neither exports prompts
    assert both["decode"] == b


def test_prompt_statistics_parse_whole_and_combine_by_evidence():
    from kvfleet_router.perf_model import PROMPT_STATS

    def text(role: str, stats: list[str], value: float) -> str:
        weights = [f'kvfleet_router_perf_model_coefficient{{role="{role}",target="{t}",'
                   f'feature="{f}"}} 1' for t, fs in (
                       ("ttft", ("const", "u", "u_wq", "wq", "r", "kv")),
                       ("tpot", ("const", "n", "kv"))) for f in fs]
        prompts = [f'kvfleet_router_perf_model_prompt_ktokens{{role="{role}",stat="{n}"}} '
                   f'{value}' for n in stats]
        return "\n".join(weights + prompts)

    assert parse_router_perf_models(text("u", list(PROMPT_STATS), 2.0))["u"].prompt == (
        (2.0,) * len(PROMPT_STATS))
    # one statistic missing: the prompts are unknown, the weights still read
    assert parse_router_perf_models(text("u", list(PROMPT_STATS[:-1]), 2.0))["u"].prompt == ()
    a = RoleCoefficients((1,) * 6, (1, 1, 1), 300, 100, (1.0,) * len(PROMPT_STATS))
    b = RoleCoefficients((1,) * 6, (1, 1, 1), 100, 100, (5.0,) * len(PROMPT_STATS))
    c = RoleCoefficients((1,) * 6, (1, 1, 1), 400, 100)  # exports no prompts
    both = combine_perf_models([{"u": a}, {"u": b}, {"u": c}])
    assert both["u"].prompt == pytest.approx((2.0,) * len(PROMPT_STATS))  # (300 + 500) / 400


def test_the_simulated_router_hands_over_what_a_live_one_exports():
    router = SimRouter(seed=0)
    router.core = trained_core()
    assert drive(router.perf_models()) == perf_models(router.core)
