"""The `space` scorer: fewest prompt blocks recorded on an endpoint scores 1 (sglang-router's
smallest-tree rule). Weighted below one in-flight request's queue score, it decides only
what a random tie-break would: where a prompt no endpoint holds goes among equally loaded
endpoints, namely where it evicts the least.
"""

from __future__ import annotations

import random

import pytest
from kvfleet_router.config import ConfigError, PipelineConfig, RouterConfig
from kvfleet_router.policies.scorers import SCORERS
from kvfleet_router.prefix_index import ChainIndex
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore
from policy_fixtures import cfg, ctx, ep

SPACE = {"prefix": 1.0, "queue": 4.0, "space": 0.01}
LONG = "a conversation that fills this endpoint's cache with its many turns. " * 60


def test_space_scores_the_endpoint_holding_the_fewest_blocks_highest():
    eps = [ep("a"), ep("b"), ep("c")]
    index = ChainIndex(1000)
    for name, n in (("a", 100), ("b", 10), ("c", 55)):
        index.record(name, [hash((name, k)) for k in range(n)])
    c = ctx(prefix_index=index)
    assert SCORERS["space"](cfg())(eps, c) == pytest.approx([0.0, 1.0, 0.5])
    assert SCORERS["space"](cfg())(eps, ctx()) == [1.0, 1.0, 1.0]  # nothing recorded: a tie


def core(weights: dict[str, float], seed: int) -> RouterCore:
    """'a' holds a long prompt, 'b' a short one; both idle."""
    c = RouterCore(RouterConfig.from_dict({
        "endpoints": [{"name": n, "url": f"http://{n}:1"} for n in ("a", "b")],
        "policy": {"weights": weights}}), rng=random.Random(seed))
    for name, text in (("a", LONG), ("b", LONG[:700])):
        c.record(c.route(RequestInfo(prompt_text=text), "unified", 0.0,
                         allowed=frozenset({name})))
    return c


def first_choice(c: RouterCore, text: str, in_flight_on_b: int = 0) -> str:
    c.registry.by_name["b"].num_in_flight = in_flight_on_b
    e = c.route(RequestInfo(prompt_text=text), "unified", 1.0).decision.endpoint
    assert e is not None
    return e.name


def test_a_new_prompt_goes_where_the_index_holds_the_least_whatever_the_seed():
    new = "an unrelated first question from a new user " * 20
    assert {first_choice(core(SPACE, seed), new) for seed in range(12)} == {"b"}
    # without it the tie between two idle endpoints is random
    assert {first_choice(core({"prefix": 1.0, "queue": 4.0}, seed), new)
            for seed in range(12)} == {"a", "b"}


def test_at_a_hundredth_space_never_outweighs_one_request_in_flight():
    """At the default capacity (256) one request is worth 4/256 = 0.0156 of queue score,
    above space's 0.01; and a cached prefix still wins over space."""
    new = "an unrelated first question from a new user " * 20
    assert first_choice(core(SPACE, 0), new, in_flight_on_b=1) == "a"
    assert first_choice(core(SPACE, 0), LONG + " and one more turn") == "a"


def test_space_is_not_a_load_term():
    # a prompt that is cached adds no blocks, so the emptiest index would take every repeat
    with pytest.raises(ConfigError, match="no load term"):
        PipelineConfig(scorers={"space": 1.0})
    PipelineConfig(scorers={"space": 1.0}, guard=True)
