"""Policies as configuration: `policy.pipelines` composes filters, weighted scorers, a picker
and the guard; the named policies are presets of the same kind.

Break `build_policies` (ignore the config's pipelines), `Policy` (skip the pipeline's
filters, or its guard) or a preset (change a weight), and a case here fails.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from kvfleet_router.admission import admit
from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.errors import RequestError
from kvfleet_router.policies.policy import PRESETS
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

NAMES = ["a", "b", "c", "d"]
SHARED = "system: you are a careful assistant. " * 40  # only "a" holds it


def config(pipelines: dict, name: str = "cache-aware", **policy) -> dict:
    return {"endpoints": [{"name": n, "url": f"http://127.0.0.1:{9100 + i}", "capacity": 64}
                          for i, n in enumerate(NAMES)],
            "policy": {"name": name, "pipelines": pipelines, **policy}}


def core_with_prefix_on_a(cfg: dict, in_flight_on_a: int) -> RouterCore:
    """'a' holds SHARED and has `in_flight_on_a` requests running; the rest are idle."""
    core = RouterCore(RouterConfig.from_dict(cfg), rng=random.Random(3))
    core.record(core.route(RequestInfo(prompt_text=SHARED), "unified", now=0.0,
                           allowed=frozenset({"a"})))
    core.registry.by_name["a"].num_in_flight = in_flight_on_a
    return core


def pick(core: RouterCore, policy: str | None = None) -> str:
    routed = core.route(RequestInfo(prompt_text=SHARED + " next question"), "unified", now=1.0,
                        policy_name=policy)
    assert routed.decision.endpoint is not None
    return routed.decision.endpoint.name


AFFINITY = {"scorers": {"prefix": 1.0, "queue": 0.01}, "guard": True}
LOAD = {"scorers": {"queue": 1.0}}


def test_the_policy_name_runs_the_configs_pipeline():
    # 'a' holds the prompt but carries 4 requests: affinity goes there, load elsewhere.
    both = {"affinity": AFFINITY, "load": LOAD}
    assert pick(core_with_prefix_on_a(config(both, name="affinity"), 4)) == "a"
    assert pick(core_with_prefix_on_a(config(both, name="load"), 4)) != "a"


def test_a_pipeline_can_be_named_per_request():
    core = core_with_prefix_on_a(config({"affinity": AFFINITY, "load": LOAD}), 4)
    assert pick(core, "affinity") == "a"
    assert pick(core, "load") != "a"


def test_the_pipelines_guard_balances_at_its_threshold():
    # The guard trips when max - min > abs_threshold (8) and max > rel x min.
    cfg = config({"affinity": AFFINITY}, name="affinity")
    assert pick(core_with_prefix_on_a(cfg, 8)) == "a"
    core = core_with_prefix_on_a(cfg, 9)
    routed = core.route(RequestInfo(prompt_text=SHARED + " q"), "unified", now=1.0)
    assert routed.decision.is_balanced_by_load and routed.decision.endpoint.name != "a"
    unguarded = config({"affinity": {**AFFINITY, "guard": False,
                                     "filters": ["bounded-load"]}}, name="affinity")
    assert not core_with_prefix_on_a(unguarded, 0).route(
        RequestInfo(prompt_text=SHARED), "unified", now=1.0).decision.is_balanced_by_load


def test_the_pipelines_bounded_load_filter_caps_the_affinity():
    # Bounded load keeps 'a' while q_a + 1 <= ceil(1.25 * (Q + 1) * 64 / 256): with the
    # others idle, q_a = 1 -> cap ceil(0.625) = 1: out; q_a = 0 -> in.
    cfg = config({"bounded": {"scorers": {"prefix": 1.0}, "filters": ["bounded-load"]}},
                 name="bounded")
    assert pick(core_with_prefix_on_a(cfg, 0)) == "a"
    assert pick(core_with_prefix_on_a(cfg, 1)) != "a"


def test_the_pipelines_picker_is_used():
    cfg = config({"rr": {"picker": "round-robin"}}, name="rr")
    core = RouterCore(RouterConfig.from_dict(cfg), rng=random.Random(0))
    seen = [pick(core) for _ in range(8)]
    assert seen == NAMES * 2


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_is_the_pipeline_it_names(preset):
    """The same pipeline written in the config decides exactly as the preset does."""
    spec = dataclasses.asdict(PRESETS[preset](RouterConfig()))
    cores = [core_with_prefix_on_a(config({"mine": spec}, name=name), 3)
             for name in (preset, "mine")]
    for i in range(40):
        info = RequestInfo(prompt_text=(SHARED if i % 3 else "") + f" q{i}",
                           session_key=f"s{i % 5}")
        names = []
        for core in cores:
            e = core.start(core.route(info, "unified", now=2.0 + i))
            names.append(e.name if e else None)
        assert names[0] == names[1], (preset, i)


@pytest.mark.parametrize(("policy", "message"), [
    ({"pipelines": {"least-request": LOAD}},
     "policy.pipelines.least-request: is a preset's name"),
    ({"name": "nope"}, "policy.name: must be one of round-robin, "),
    ({"pipelines": {"Bad_Name": LOAD}},
     "policy.pipelines.Bad_Name: the name must match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
    ({"pipelines": {"p": {**LOAD, "filters": ["bounded-load"] * 2}}},
     "policy.pipelines.p.filters: each filter at most once"),
    ({"pipelines": {"p": {"scorers": {"slo": 1.0, "queue": 1.0}, "picker": "slo-tiered",
                          "filters": ["bounded-load"]}}},
     "policy.pipelines.p.picker: slo-tiered reads the slo scorer's 0.5 line"),
    ({"pipelines": {"p": {"scorers": {"queue": 0.0}}}},
     "policy.pipelines.p.scorers: picker max needs a scorer with a weight > 0"),
    ({"pipelines": {"p": {"scorers": {"latency": 1.0, "queue": 1.0}}}},
     "policy.pipelines.p.filters: scorer latency has no load term"),
    ({"pipelines": {"p": {"scorers": {"queue": 1.0}, "filters": ["healthy"]}}},
     "policy.pipelines.p.filters[0]: must be one of bounded-load; got 'healthy'"),
    ({"pipelines": {"p": {"scorers": {"queue": 1.0}, "picker": "best"}}},
     "policy.pipelines.p.picker: must be one of max, power-of-two, weighted-random, "
     "round-robin, slo-tiered; got 'best'"),
    ({"pipelines": {"p": {"scorers": {"fast": 1.0}}}},
     "policy.pipelines.p.scorers.fast: unknown scorer; known: prefix"),
])
def test_bad_pipelines_are_refused_with_the_field(policy, message):
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict({"policy": policy})
    assert str(err.value).startswith(message), str(err.value)


def test_the_pipeline_rules_hold_at_their_edges():
    ok = [{"scorers": {"latency": 1.0}, "filters": ["bounded-load"]},  # bounded
          {"scorers": {"prefix": 1.0}, "guard": True},                 # guarded
          {"scorers": {"session": 1.0}},                               # bounds itself
          {"picker": "weighted-random"},                               # uniform random
          {"scorers": {"slo": 2.0}, "picker": "slo-tiered", "filters": ["bounded-load"]}]
    for i, spec in enumerate(ok):
        RouterConfig.from_dict({"policy": {"pipelines": {f"p{i}": spec}}})


def test_the_override_header_names_presets_and_pipelines():
    cfg = config({"load": LOAD}, allow_override=True)
    core = RouterCore(RouterConfig.from_dict(cfg))
    raw = b'{"model": "m", "prompt": "hi"}'
    assert admit(core, raw, "/v1/completions", {"x-kvfleet-policy": "load"})[1] == "load"
    assert admit(core, raw, "/v1/completions", {"x-kvfleet-policy": "ucb"})[1] == "ucb"
    with pytest.raises(RequestError, match="unknown policy 'other'; known: round-robin, .*load"):
        admit(core, raw, "/v1/completions", {"x-kvfleet-policy": "other"})


def test_a_config_round_trips_with_its_pipelines():
    cfg = RouterConfig.from_dict(config({"load": LOAD, "affinity": AFFINITY}, name="load"))
    again = RouterConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.policy.pipelines["affinity"].guard is True
