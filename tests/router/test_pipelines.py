"""Policies as configuration: `policy.pipelines` composes filters, weighted scorers, a picker
and the guard; the named policies are presets of the same kind.

Break `build_policies` (ignore the config's pipelines), `Policy` (skip the pipeline's
filters, its guard or its roles' stages) or a preset (change a weight), and a case here
fails.
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


PD_ROLES = {"a": "prefill", "b": "prefill", "c": "decode", "d": "decode"}


def config(pipelines: dict, name: str = "cache-aware", pd: bool = False, **policy) -> dict:
    return {"endpoints": [{"name": n, "url": f"http://127.0.0.1:{9100 + i}", "capacity": 64,
                           "role": PD_ROLES[n] if pd else "unified"}
                          for i, n in enumerate(NAMES)],
            "policy": {"name": name, "pipelines": pipelines, **policy}}


def core_with_prefix_on_a(cfg: dict, in_flight_on_a: int, role: str = "unified") -> RouterCore:
    """'a' holds SHARED and has `in_flight_on_a` requests running; the rest are idle."""
    core = RouterCore(RouterConfig.from_dict(cfg), rng=random.Random(3))
    core.record(core.route(RequestInfo(prompt_text=SHARED), role, now=0.0,
                           allowed=frozenset({"a"})))
    core.registry.by_name["a"].num_in_flight = in_flight_on_a
    return core


def pick(core: RouterCore, policy: str | None = None, role: str = "unified") -> str:
    routed = core.route(RequestInfo(prompt_text=SHARED + " next question"), role, now=1.0,
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
@pytest.mark.parametrize("fleet", ["unified", "pd"])
def test_every_preset_is_the_pipeline_it_names(preset, fleet):
    """The same pipeline written in the config decides exactly as the preset does, on every
    leg: a P/D pool's prefill and decode legs too (cache-aware's prefill stage)."""
    spec = dataclasses.asdict(PRESETS[preset](RouterConfig()))
    pd = fleet == "pd"
    legs = ["prefill", "decode"] if pd else ["unified"]
    cores = [core_with_prefix_on_a(config({"mine": spec}, name=name, pd=pd), 3, legs[0])
             for name in (preset, "mine")]
    for i in range(40):
        info = RequestInfo(prompt_text=(SHARED if i % 3 else "") + f" q{i}",
                           session_key=f"s{i % 5}")
        for leg in legs:
            names = []
            for core in cores:
                e = core.start(core.route(info, leg, now=2.0 + i))
                names.append(e.name if e else None)
            assert names[0] == names[1], (preset, leg, i)


def test_a_roles_stage_scores_that_roles_legs():
    """`roles.prefill` decides a P/D pool's prefill legs; the pipeline's own stage decides
    the others. 'a' (prefill) holds the prompt with 4 requests running, 'b' is idle."""
    split = {"load": {**LOAD, "roles": {"prefill": AFFINITY}}}
    assert pick(core_with_prefix_on_a(config(split, name="load", pd=True), 4, "prefill"),
                role="prefill") == "a"
    assert pick(core_with_prefix_on_a(config({"load": LOAD}, name="load", pd=True), 4,
                                      "prefill"), role="prefill") == "b"
    # a decode stage leaves the prefill legs to the pipeline's own stage
    decode_only = {"load": {**LOAD, "roles": {"decode": AFFINITY}}}
    assert pick(core_with_prefix_on_a(config(decode_only, name="load", pd=True), 4,
                                      "prefill"), role="prefill") == "b"
    # a unified pool's legs run the pipeline's own stage, whatever its roles say
    assert pick(core_with_prefix_on_a(config(split, name="load"), 4)) != "a"


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
    ({"pipelines": {"p": {**LOAD, "roles": {"prefill": {"scorers": {"latency": 1.0}}}}}},
     "policy.pipelines.p.roles.prefill.filters: scorer latency has no load term"),
    ({"pipelines": {"p": {**LOAD, "roles": {"unified": LOAD}}}},
     "policy.pipelines.p.roles.unified: unknown role; known: prefill, decode"),
    ({"pipelines": {"p": {**LOAD, "roles": {"prefill": {**LOAD, "roles": {}}}}}},
     "policy.pipelines.p.roles.prefill.roles: unknown field"),
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
