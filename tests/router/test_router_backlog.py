"""The `backlog` scorer: the prefill work, in tokens, a request's first token waits for on
each endpoint (the uncached prompt tokens of the router's pending requests there plus its
own uncached tokens there). The router core keeps each endpoint's pending tokens from a
request's start to its first byte, once; the scorer weighs a cached prefix and a queue of
prefills in that one unit, so the boundary is where the tokens ahead equal the tokens saved.
"""

from __future__ import annotations

import random

import pytest
from kvfleet_router.config import ConfigError, PipelineConfig, RouterConfig
from kvfleet_router.policies.policy import Policy, build_policy, pipeline_of
from kvfleet_router.policies.scorers import SCORERS
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore
from policy_fixtures import cfg, ctx, ep


def test_a_request_counts_its_uncached_tokens_pending_from_its_start_to_its_first_byte():
    core = RouterCore(RouterConfig.from_dict(
        {"endpoints": [{"name": "a", "url": "http://a:1"}]}), rng=random.Random(0))
    first = core.route(RequestInfo(prompt_token_ids=list(range(400))), "unified", 0.0)
    e = core.start(first)
    assert e is not None and e.pending_tokens == pytest.approx(400)
    # the same prompt again: its cached blocks are not prefill work, the rest is
    again = core.route(RequestInfo(prompt_token_ids=list(range(400)) + [7] * 100),
                       "unified", 1.0)
    uncached = again.ctx.uncached_tokens("a")
    assert 0 < uncached < 500
    core.start(again)
    assert e.pending_tokens == pytest.approx(400 + uncached)
    core.first_byte(first)
    core.first_byte(first)  # the exchange's end says it again: taken off once
    assert e.pending_tokens == pytest.approx(uncached)
    core.end(again)
    core.end(first)
    assert (e.num_in_flight, e.pending_tokens) == (0, 0.0)


@pytest.mark.parametrize("queued, picked", [(799.0, "cached"), (801.0, "idle")])
def test_a_cached_prefix_is_worth_the_tokens_it_saves(queued, picked):
    """A 1,000-token prompt, 80% cached on one endpoint: 200 tokens to prefill there, 1,000
    on the idle one. It goes to the cached endpoint while fewer than the 800 tokens it
    saves are queued there for prefill, and to the idle one past that."""
    cached, idle = ep("cached"), ep("idle")
    cached.pending_tokens = queued
    policy = Policy("p", cfg(), PipelineConfig(scorers={"backlog": 1.0}, guard=True))
    c = ctx(num_prompt_tokens=1000, prefix_fraction={"cached": 0.8})
    assert policy.choose([cached, idle], c).endpoint.name == picked  # type: ignore[union-attr]


def test_backlog_counts_tokens_where_pending_counts_requests():
    """One endpoint prefills one long prompt, the other three short ones: by requests the
    first is busier, by prefill work the second."""
    long_one, short_ones = ep("long"), ep("short")
    long_one.num_pending, long_one.pending_tokens = 1, 8000.0
    short_ones.num_pending, short_ones.pending_tokens = 3, 300.0
    c = ctx(num_prompt_tokens=1000)
    backlog = SCORERS["backlog"](cfg())([long_one, short_ones], c)
    pending = SCORERS["pending"](cfg())([long_one, short_ones], c)
    assert backlog == pytest.approx([1000 / (1000 + 8000 + 1000), 1000 / (1000 + 300 + 1000)])
    assert pending[0] > pending[1]


def test_the_backlog_preset_is_the_default_weights_plus_backlog_behind_the_guard():
    pipeline = pipeline_of("backlog", cfg())
    assert pipeline.scorers == {"prefix": 1.0, "queue": 4.0, "backlog": 4.0}
    assert pipeline.guard and not pipeline.filters
    with pytest.raises(ConfigError, match="no load term"):  # cached prompts add little work
        PipelineConfig(scorers={"backlog": 1.0})
    PipelineConfig(scorers={"backlog": 1.0}, guard=True)
    assert RouterConfig.from_dict(
        {"policy": {"weights": {"prefix": 1, "queue": 4, "backlog": 4}}}
    ).policy.weights["backlog"] == 4


def _prefill_boundary(cap: int) -> float:
    """The tokens queued on the cached endpoint at which the two endpoints below score
    level under the default prefill weights (prefix 1, queue 4, backlog 4):
    0.8 + 4 (1 - 1/cap) + 4 * 1000 / (1200 + q) = 4 + 4 * 0.5."""
    return 4000 / (1.2 + 4 / cap) - 1200


@pytest.mark.parametrize("role, delta, picked", [
    ("prefill", -1.0, "cached"), ("prefill", 1.0, "idle"),
    ("unified", 1.0, "cached"), ("decode", 1.0, "cached"),
    ("unified", 1e6, "cached"),
])
def test_cache_aware_weighs_the_prefill_backlog_on_prefill_legs_only(role, delta, picked):
    """A 1,000-token prompt, 80% cached on an endpoint prefilling one other prompt. A
    prefill leg leaves it for an idle endpoint once the tokens queued there outweigh the
    800 it saves at the prefill weights (the boundary, a token either side); any other leg
    keeps the default weights, whose queue term sees one request, however long."""
    c = cfg()
    cached, idle = ep("cached", in_flight=1, role=role), ep("idle", role=role)
    cached.num_pending, cached.pending_tokens = 1, _prefill_boundary(256) + delta
    policy = build_policy("cache-aware", c)
    chosen = policy.choose([cached, idle], ctx(num_prompt_tokens=1000, role=role,
                                               prefix_fraction={"cached": 0.8}))
    assert chosen.endpoint is not None and chosen.endpoint.name == picked
    assert chosen.reason == "picked"  # the scorers decided, not the imbalance guard


def test_prefill_weights_are_configurable_and_refused_all_zero():
    c = RouterConfig.from_dict({"policy": {"prefill_weights": {"prefix": 1, "queue": 4}}})
    assert build_policy("cache-aware", c).for_role["prefill"].pipeline.scorers == {
        "prefix": 1.0, "queue": 4.0}
    assert cfg().policy.prefill_weights == pipeline_of("backlog", cfg()).scorers
    with pytest.raises(ConfigError, match="prefill_weights: at least one weight"):
        RouterConfig.from_dict({"policy": {"prefill_weights": {"prefix": 0}}})
    # other policies run their own pipeline on every leg
    assert not build_policy("least-request", cfg()).for_role
