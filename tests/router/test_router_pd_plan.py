"""pd_plan: one request's legs, decided without I/O (tests/sim/test_sim_pd_plan.py checks
that the router's aiohttp side and the simulator both follow it)."""

from __future__ import annotations

import random

import pytest
from kvfleet_engine import contract
from kvfleet_router.config import RouterConfig
from kvfleet_router.pd_plan import (
    PREFILL_FAILED,
    PREFILL_OK,
    PDPlan,
    Planner,
    RoutePrefill,
    RunPrefill,
    Serve,
    entry_role,
    peer_hint,
    prefill_body,
    with_kv_transfer_params,
)
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

PRE = {"name": "pre", "url": "http://127.0.0.1:1", "role": "prefill"}
DEC = {"name": "dec", "url": "http://127.0.0.1:2", "role": "decode"}
UNI = {"name": "uni", "url": "http://127.0.0.1:3"}


def core_of(*endpoints: dict[str, object], **cfg: object) -> RouterCore:
    return RouterCore(RouterConfig.from_dict({"endpoints": list(endpoints), **cfg}),
                      rng=random.Random(0))


def tokens(n: int) -> RequestInfo:
    return RequestInfo(prompt_token_ids=list(range(1, n + 1)), body={"prompt": "p"})


def first_leg(core: RouterCore, info: RequestInfo) -> tuple[PDPlan[dict], object]:
    plan: PDPlan[dict] = PDPlan(Planner(core), info)
    return plan, plan.chosen(core.route(info, plan.role, 1.0))


@pytest.mark.parametrize(("num_tokens", "wants"), [(99, False), (100, False), (101, True)])
def test_a_prefill_leg_runs_only_above_the_threshold_of_uncached_tokens(num_tokens, wants):
    core = core_of(PRE, DEC, pd={"prefill_threshold_tokens": 100})
    plan, step = first_leg(core, tokens(num_tokens))
    assert plan.role == "decode"
    if wants:
        assert step == RoutePrefill()
    else:
        assert step == Serve(core.registry.by_name["dec"]) and plan.prefill_outcome is None


def test_cached_tokens_on_the_decode_endpoint_do_not_count():
    core = core_of(PRE, DEC, pd={"prefill_threshold_tokens": 100})
    info = tokens(2000)
    core.record(core.route(info, "decode", 1.0))  # the decode endpoint holds the prompt
    assert isinstance(first_leg(core, info)[1], Serve)


def test_without_a_prefill_endpoint_or_in_a_unified_pool_the_chosen_endpoint_serves():
    for endpoints, role, name in (((DEC,), "decode", "dec"), ((UNI,), "unified", "uni")):
        core = core_of(*endpoints, pd={"prefill_threshold_tokens": 0})
        assert entry_role(core) == role
        plan, step = first_leg(core, tokens(500))
        assert plan.role == role
        assert step == Serve(core.registry.by_name[name]) and plan.prefill_outcome is None


def test_no_eligible_prefill_endpoint_means_decode_computes_the_prompt_at_once():
    core = core_of(PRE, DEC, pd={"prefill_threshold_tokens": 0})
    info = tokens(500)
    plan, step = first_leg(core, info)
    assert step == RoutePrefill()
    none = core.route(info, "prefill", 1.0, exclude=frozenset({"pre"}))
    assert none.decision.endpoint is None
    assert plan.prefill_routed(none) == Serve(core.registry.by_name["dec"])
    assert plan.prefill_outcome == PREFILL_FAILED


def test_the_prefill_leg_and_its_outcome_shape_the_decode_leg():
    core = core_of(PRE, DEC, pd={"prefill_threshold_tokens": 0})
    dec = core.registry.by_name["dec"]
    params = {contract.DO_REMOTE_PREFILL: True, "remote_handle": "h1"}
    for kv, outcome in ((params, PREFILL_OK), (None, PREFILL_FAILED)):
        info = tokens(500)
        plan, _ = first_leg(core, info)
        routed = core.route(info, "prefill", 1.0)
        step = plan.prefill_routed(routed)
        assert isinstance(step, RunPrefill) and step.endpoint.name == "pre"
        assert step.routed is routed and step.body == prefill_body(info.body)
        assert plan.prefill_done(kv) == Serve(dec, kv) and plan.prefill_outcome == outcome


def test_prefill_body_asks_one_token_unstreamed_and_keeps_the_kv():
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 50,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5}
    out = prefill_body(chat)
    assert out["max_tokens"] == 1 and out["max_completion_tokens"] == 1
    assert out["stream"] is False and "stream_options" not in out
    assert out["temperature"] == 0.5 and out["messages"] == chat["messages"]
    params = out[contract.KV_TRANSFER_PARAMS]
    assert params[contract.DO_REMOTE_DECODE] is True
    assert params[contract.DO_REMOTE_PREFILL] is False
    assert chat["stream"] is True and contract.KV_TRANSFER_PARAMS not in chat  # a copy
    assert "max_completion_tokens" not in prefill_body({"prompt": "p", "max_tokens": 9})
    decode = with_kv_transfer_params(chat, {"remote_handle": "h"})
    assert decode == {**chat, contract.KV_TRANSFER_PARAMS: {"remote_handle": "h"}}
    assert contract.KV_TRANSFER_PARAMS not in chat


def test_the_planner_follows_a_config_reload():
    core = core_of(PRE, DEC, pd={"prefill_threshold_tokens": 1000})
    planner = Planner(core)
    info = tokens(500)
    assert planner.decider() is planner.decider()  # kept while the config stands
    plan: PDPlan[dict] = PDPlan(planner, info)
    assert isinstance(plan.chosen(core.route(info, "decode", 1.0)), Serve)
    core.apply(RouterConfig.from_dict({"endpoints": [PRE, DEC],
                                       "pd": {"prefill_threshold_tokens": 100}}))
    plan = PDPlan(planner, info)
    assert plan.chosen(core.route(info, "decode", 1.0)) == RoutePrefill()


@pytest.mark.parametrize(("enabled", "role", "client_params", "asked"), [
    (True, "unified", False, True),
    (False, "unified", False, False),  # sharing off
    (True, "decode", False, False),  # a P/D leg's KV comes from its prefill replica
    (True, "unified", True, False),  # the client's own kv_transfer_params stay
])
def test_a_peer_hint_is_asked_for_after_a_unified_choice_only(monkeypatch, enabled, role,
                                                              client_params, asked):
    core = core_of({**UNI, "role": role}, kv_sharing={"enabled": enabled})
    seen = []
    monkeypatch.setattr(core, "peer_hint", lambda routed: seen.append(routed) or ("d", None))
    body = {"prompt": "p", **({contract.KV_TRANSFER_PARAMS: {}} if client_params else {})}
    routed = core.route(RequestInfo(prompt_token_ids=[1, 2, 3], body=body), role, 1.0)
    assert peer_hint(core, routed, role) == (("d", None) if asked else None)
    assert seen == ([routed] if asked else [])
