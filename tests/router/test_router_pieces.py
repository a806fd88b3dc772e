"""The router's pieces on their own, built from what each uses (no aiohttp app)."""

from __future__ import annotations

import random

import pytest
from kvfleet_router import config as config_mod
from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.config_store import ConfigStore, StaleVersion
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd_deciders import DECIDERS, UncachedTokens, build_decider
from kvfleet_router.policies.policy import POLICIES
from kvfleet_router.proxy import Outcome
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

PD = {"endpoints": [{"name": "pre", "url": "http://127.0.0.1:1", "role": "prefill"},
                    {"name": "dec", "url": "http://127.0.0.1:2", "role": "decode"}]}


def pd_core(**pd: object) -> RouterCore:
    return RouterCore(RouterConfig.from_dict({**PD, "pd": pd}), rng=random.Random(0))


def test_registries_match_the_config_schema():
    assert set(DECIDERS) == set(config_mod.PD_DECIDER_NAMES)
    assert set(POLICIES) == set(config_mod.POLICY_NAMES)
    assert RouterConfig().pd.decider == "uncached-tokens"
    with pytest.raises(ConfigError, match=r"^pd\.decider: must be one of"):
        RouterConfig.from_dict({"pd": {"decider": "coin-flip"}})


@pytest.mark.parametrize("prompt_chars, threshold, cached, expected", [
    (600, 128, False, True),   # 150 tokens uncached > 128
    (400, 128, False, False),  # 100 tokens: decode computes it alone
    (512, 128, False, False),  # exactly 128: not above the threshold
    (600, 128, True, False),   # the decode endpoint already holds the prompt
    (8, 0, False, True),       # threshold 0: any uncached token earns a prefill
])
def test_uncached_tokens_decider(prompt_chars, threshold, cached, expected):
    core = pd_core(prefill_threshold_tokens=threshold)
    info = RequestInfo(prompt_text="y" * prompt_chars)
    if cached:
        core.record(core.route(info, "decode", 1.0))
    decode = core.route(info, "decode", 1.0)
    assert decode.decision.endpoint.name == "dec"
    decider = build_decider(core.cfg)
    assert isinstance(decider, UncachedTokens)
    assert decider.wants_prefill(decode) is expected


def test_a_custom_decider_plugs_in_by_name(monkeypatch):
    class Always:
        def wants_prefill(self, decode):
            return decode.decision.endpoint is not None

    monkeypatch.setitem(DECIDERS, "always", lambda cfg: Always())
    monkeypatch.setattr(config_mod, "PD_DECIDER_NAMES", (*config_mod.PD_DECIDER_NAMES, "always"))
    core = pd_core(decider="always")
    assert build_decider(core.cfg).wants_prefill(core.route(RequestInfo(prompt_text="a"),
                                                            "decode", 1.0))


def test_router_core_has_role():
    core = pd_core()
    assert core.has_role("prefill") and core.has_role("decode") and not core.has_role("unified")


async def test_config_store_versions_and_listeners():
    core = RouterCore(RouterConfig.from_dict({"version": 1, **PD}))
    store = ConfigStore(core)
    seen: list[int] = []
    store.on_apply(lambda cfg: seen.append(cfg.version))
    same = RouterConfig.from_dict({"version": 1, **PD})
    assert await store.push(same) is False and seen == []  # identical re-push: a no-op
    with pytest.raises(StaleVersion, match="stale config version 1; current is 1"):
        await store.push(RouterConfig.from_dict({"version": 1}))
    assert await store.push(RouterConfig.from_dict({"version": 2})) is True
    assert seen == [2] and store.current.version == 2 and core.cfg is store.current
    with pytest.raises(StaleVersion):
        await store.push(RouterConfig.from_dict({"version": 1, **PD}))
    assert [e.name for e in store.endpoints()] == [] and seen == [2]


def feedback_for(core: RouterCore) -> tuple[HealthFeedback, RouterMetrics]:
    metrics = RouterMetrics(lambda: core, lambda: 0)
    return HealthFeedback(metrics, lambda: core.cfg), metrics


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_health_feedback_counts_only_the_endpoints_own_faults():
    core = RouterCore(RouterConfig.from_dict({**PD, "health": {"eject_after_errors": 2}}))
    fb, metrics = feedback_for(core)
    e = core.registry.by_name["dec"]
    for _ in range(5):  # overloaded is not broken
        fb.failure(e, "busy", 1.0)
    assert e.is_healthy(1.0)
    assert sample(metrics, "kvfleet_router_backend_errors_total", endpoint="dec",
                  kind="busy") == 5
    fb.failure(e, "connect", 1.0)
    fb.exchange_done(e, core.route(RequestInfo(), "decode", 1.0),
                     Outcome(0.1, 0.2, 3, True, is_client_gone=True), 1.0)  # teaches nothing
    assert e.ttft.value is None and e.is_healthy(1.0)
    fb.exchange_done(e, core.route(RequestInfo(), "decode", 1.0),
                     Outcome(0.1, 0.2, 3, True, is_broken=True), 1.0)  # 2nd own fault
    assert not e.is_healthy(1.0)
    assert sample(metrics, "kvfleet_router_ejections_total", endpoint="dec") == 1
    assert sample(metrics, "kvfleet_router_backend_errors_total", endpoint="dec",
                  kind="midstream") == 1


def test_health_feedback_success_resets_and_learns():
    core = RouterCore(RouterConfig.from_dict({**PD, "health": {"eject_after_errors": 2}}))
    fb, _ = feedback_for(core)
    e = core.registry.by_name["dec"]
    fb.failure(e, "timeout", 1.0)
    fb.exchange_done(e, core.route(RequestInfo(), "decode", 1.0),
                     Outcome(0.25, 0.25, 0, False), 1.0)
    fb.failure(e, "timeout", 1.0)  # the success in between reset the streak
    assert e.is_healthy(1.0)
    assert e.ttft.value == pytest.approx(0.25) and e.num_ucb_pulls == 1
