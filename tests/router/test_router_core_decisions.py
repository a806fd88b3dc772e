import random

import pytest
from kvfleet_engine.contract import KVEvent
from kvfleet_router.config import RouterConfig
from kvfleet_router.policies import POLICIES, build_policy
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

PROMPT = "You are a helpful assistant. " * 20  # 580 bytes: 9 blocks of 64


def core(policy="cache-aware", n=3, **extra):
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "capacity": 10}
                      for i in range(n)],
        "policy": {"name": policy, **extra}})
    return RouterCore(cfg, rng=random.Random(0))


def route(c, text, **kw):
    routed = c.route(RequestInfo(prompt_text=text, **kw), "unified", now=1.0)
    c.record(routed)
    return routed


def test_every_named_policy_builds_and_picks():
    c = core()
    assert set(POLICIES) == {"round-robin", "random", "least-request", "least-kv",
                             "prefix-cache", "session", "latency", "ucb", "slo", "backlog",
                             "cache-aware"}
    for name in POLICIES:
        d = build_policy(name, c.cfg).choose(c.registry.endpoints, route(c, "x").ctx)
        assert d.endpoint is not None and d.reason == "picked", name
    with pytest.raises(KeyError):
        build_policy("nope", c.cfg)


def test_cache_aware_follows_the_prefix():
    c = core()
    first = route(c, PROMPT + "question one").decision.endpoint
    assert first is not None
    again = route(c, PROMPT + "question two")
    assert again.decision.endpoint is first
    assert again.matched_fraction == pytest.approx(9 / 9)
    assert c.prefix_hit_ratio > 0


SYSTEM = "s" * 64  # one 64-byte block every conversation shares


@pytest.mark.parametrize("own_blocks, min_match, follows", [
    (10, None, False),  # 1 of 11 blocks matched (0.09) is under the default 0.1: load decides
    (9, None, True),    # 1 of 10 (0.1) is at it: the match counts and wins over 3 in flight
    (10, 0.0, True),    # every match counts: the shared block outweighs 3 requests in flight
])
def test_a_match_under_min_prefix_match_does_not_pull(own_blocks, min_match, follows):
    # A new conversation that shares only the system prompt with what an endpoint served
    # would otherwise follow it there while that endpoint is busier than the idle ones.
    c = RouterCore(RouterConfig.from_dict({
        "endpoints": [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}"}
                      for i in range(4)],
        "policy": {} if min_match is None else {"min_prefix_match": min_match}}),
        rng=random.Random(0))
    first = route(c, SYSTEM + "a" * 640).decision.endpoint
    first.num_in_flight = 3  # under the guard's 8: only the scores decide
    routed = route(c, SYSTEM + "b" * 64 * own_blocks)
    assert routed.ctx.prefix_fraction[first.name] == pytest.approx(1 / (1 + own_blocks))
    assert (routed.decision.endpoint is first) is follows


def test_imbalance_guard_balances_but_still_records_the_prefix():
    c = core(imbalance={"abs_threshold": 2, "rel_threshold": 1.5})
    first = route(c, PROMPT).decision.endpoint
    first.num_in_flight = 5  # others at 0: 5 - 0 > 2 and 5 > 1.5 * 0
    routed = route(c, PROMPT)
    assert routed.decision.is_balanced_by_load and routed.decision.endpoint is not first
    other = routed.decision.endpoint
    assert c.approx.match(c.approx.hash_text(PROMPT)).get(other.name) == 9
    first.num_in_flight = 1  # balanced again: affinity resumes (both now hold the prefix)
    assert not route(c, PROMPT).decision.is_balanced_by_load


def test_round_robin_and_saturation_and_empty():
    c = core("round-robin")
    assert [route(c, "p").decision.endpoint.name for _ in range(4)] == ["e0", "e1", "e2", "e0"]
    for e in c.registry.endpoints:
        e.num_in_flight = e.capacity
    assert route(c, "p").decision.reason == "saturated"
    for e in c.registry.endpoints:
        e.is_probe_healthy = False
    assert route(c, "p").decision.reason == "no-endpoint"
    assert core(n=0).route(RequestInfo(prompt_text="p"), "unified", 1.0).decision.endpoint is None


def test_exclude_and_override():
    c = core()
    routed = c.route(RequestInfo(prompt_text="p"), "unified", 1.0, policy_name="round-robin",
                     exclude=frozenset({"e0", "e1"}))
    assert routed.decision.endpoint.name == "e2" and routed.policy_name == "round-robin"


def test_precise_mode_uses_token_ids_from_kv_events():
    cfg = RouterConfig.from_dict({"endpoints": [
        {"name": "a", "url": "http://127.0.0.1:1", "prefix_mode": "precise"},
        {"name": "b", "url": "http://127.0.0.1:2", "prefix_mode": "precise"}],
        "policy": {"name": "prefix-cache"}})
    c = RouterCore(cfg, rng=random.Random(0))
    c.precise.apply("b", KVEvent(seq=0, type="BlockStored", block_hashes=[7, 8],
                                 token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4))
    for _ in range(5):
        routed = c.route(RequestInfo(prompt_token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9]), "unified", 1.0)
        assert routed.decision.endpoint.name == "b"
        assert routed.matched_fraction == pytest.approx(1.0)


def test_reload_keeps_in_flight_and_retires_removed():
    c = core()
    e1 = c.registry.by_name["e1"]
    e1.num_in_flight = 2
    cfg = c.cfg.to_dict()
    cfg["version"] = 1
    cfg["endpoints"][1]["state"] = "draining"
    c.apply(RouterConfig.from_dict(cfg))
    assert c.registry.by_name["e1"] is e1 and e1.is_draining and e1.num_in_flight == 2
    assert all(route(c, f"p{i}").decision.endpoint is not e1 for i in range(10))
    cfg["version"] = 2
    del cfg["endpoints"][1]
    c.apply(RouterConfig.from_dict(cfg))
    assert [e.name for e in c.registry.all_endpoints()] == ["e0", "e2", "e1"]
    assert e1.state_name() == "removed"
    e1.num_in_flight = 0
    assert [e.name for e in c.registry.all_endpoints()] == ["e0", "e2"]


def test_start_and_finish_drive_least_request():
    c = core("least-request")
    picks = []
    for i in range(6):
        routed = c.route(RequestInfo(prompt_text=f"p{i}"), "unified", 1.0)
        picks.append(c.start(routed).name)
    assert sorted(picks) == ["e0", "e0", "e1", "e1", "e2", "e2"]
    assert [e.num_in_flight for e in c.registry.endpoints] == [2, 2, 2]
    c.finish(c.registry.by_name["e1"])
    routed = c.route(RequestInfo(prompt_text="next"), "unified", 1.0)
    assert routed.decision.endpoint.name == "e1"


def test_default_weights_keep_affinity_under_small_load_and_balance_fresh_prompts():
    c = core()  # capacity 10 each, default weights, guard abs 8 / rel 1.5
    first = route(c, PROMPT).decision.endpoint
    first.num_in_flight = 2  # queue 4 x (0.8 vs 1.0): less than the prefix hit it holds
    assert route(c, PROMPT + "x").decision.endpoint is first
    first.num_in_flight = 4  # 4 x 0.4 = 1.6 > a full prefix hit: load decides
    assert route(c, PROMPT + "y").decision.endpoint is not first
    first.num_in_flight = 2
    fresh = route(c, "unrelated text " * 10)  # no prefix anywhere: the least loaded wins
    assert fresh.decision.endpoint is not first and fresh.decision.reason == "picked"


@pytest.mark.parametrize("policy", ["slo", "latency"])
def test_the_learned_presets_prefer_the_endpoint_with_fewer_requests_before_their_first_byte(
        policy):
    c = core(policy, n=2)
    e0, e1 = c.registry.endpoints
    e0.num_in_flight = e1.num_in_flight = 1
    e0.num_pending = 1  # same load and the same prior prediction: only pending tells them apart
    # without pending the two tie and the picker draws: ten fresh prompts would split
    assert {route(c, f"fresh prompt {i}").decision.endpoint.name for i in range(10)} == {"e1"}
