import math

import pytest
from kvfleet_router.perf_model import tpot_features, ttft_features
from kvfleet_router.policies.scorers import (
    SCORERS,
    lower_is_better,
    session_choice,
    ucb_reward,
    ucb_values,
)
from kvfleet_router.request_info import RequestInfo
from policy_fixtures import cfg, ctx, ep


def with_ttft(name, ttft=None):
    e = ep(name)
    if ttft is not None:
        e.ttft.add(ttft)
    return e


def with_slo(name, alpha=None, beta=None):
    e = ep(name)
    if alpha is not None:
        e.prefill_s_per_token.add(alpha)
    if beta is not None:
        e.decode_s_per_token.add(beta)
    return e


@pytest.mark.parametrize("scorer, endpoints, context, expected", [
    # queue: max(0, 1 - q / capacity), q = router in-flight + engine load beyond it (last
    # scrape); each endpoint on its own capacity-relative scale
    ("queue", [ep("a", in_flight=0, capacity=10), ep("b", in_flight=5, capacity=10),
               ep("c", in_flight=10, capacity=10)], {}, [1.0, 0.5, 0.0]),
    ("queue", [ep("a", in_flight=3), ep("b", in_flight=3)], {}, [1 - 3 / 256, 1 - 3 / 256]),
    # a: 1 own + (4 + 5 - 1) foreign = 9 of 10; b: 3 of 10 (stale scrape: own count only)
    ("queue", [ep("a", in_flight=1, kv=0.0, running=4, waiting=5, capacity=10),
               ep("b", in_flight=3, capacity=10)], {}, [0.1, 0.7]),
    # the same depth weighs less on a bigger endpoint; beyond capacity (foreign load) is 0
    ("queue", [ep("a", in_flight=8, capacity=16), ep("b", in_flight=8, capacity=64),
               ep("c", in_flight=2, kv=0.0, running=30, capacity=16)], {}, [0.5, 0.875, 0.0]),
    # kv: 1 - usage; unknown (no fresh scrape) scores 0, never "idle"
    ("kv", [ep("a", kv=0.25), ep("b", kv=1.0), ep("c")], {}, [0.75, 0.0, 0.0]),
    # prefix: matched / prompt blocks
    ("prefix", [ep("a"), ep("b"), ep("c")], {"prefix_fraction": {"a": 0.5, "c": 1.0}},
     [0.5, 0.0, 1.0]),
    # latency: before any streamed answer, ttft_ref / (ttft_ref + the TTFT EWMA), 0.5 s
    # reference; unknown scores 1.0
    ("latency", [with_ttft("a", 0.5), with_ttft("b", 1.5), with_ttft("c")], {},
     [0.5, 0.25, 1.0]),
])
def test_scorer_table(scorer, endpoints, context, expected):
    got = SCORERS[scorer](cfg())(endpoints, ctx(**context))
    assert got == pytest.approx(expected, abs=1e-9)
    assert all(0.0 <= s <= 1.0 for s in got)


def learned(name, ttft_s, tpot_s):
    """An endpoint whose perf model learned a flat TTFT and TPOT (40 answers each)."""
    e = ep(name)
    for i in range(40):
        e.perf.learn_ttft(ttft_features(100 * i, i % 3, i % 5, 0.01 * i), ttft_s)
        e.perf.learn_tpot(tpot_features(i % 7, 0.01 * i), tpot_s)
    return e


def test_latency_scores_the_whole_request_decode_included():
    # Same predicted TTFT, decode three times as slow on b (a half-speed replica holding as
    # many requests): b is slower for the request, not just later to its first token.
    c = cfg()
    got = SCORERS["latency"](c)([learned("a", 0.1, 0.01), learned("b", 0.1, 0.03)], ctx())
    out = c.policy.slo.output_tokens_prior  # no history yet: the prior, 256 tokens
    ref = c.policy.ttft_ref_s + out * c.policy.slo.tpot_s
    assert got == pytest.approx([ref / (ref + 0.1 + out * 0.01),
                                 ref / (ref + 0.1 + out * 0.03)], rel=1e-3)
    # a request that bounds its answer is scored on that many tokens
    short = SCORERS["latency"](c)([learned("a", 0.1, 0.01), learned("b", 0.1, 0.03)],
                                  ctx(request=RequestInfo(body={"max_tokens": 8},
                                                          max_tokens=8)))
    ref = c.policy.ttft_ref_s + 8 * c.policy.slo.tpot_s
    assert short == pytest.approx([ref / (ref + 0.18), ref / (ref + 0.34)], rel=1e-3)


def test_queue_score_keeps_its_meaning_as_the_fleet_grows():
    a, b = ep("a", in_flight=4, capacity=8), ep("b", in_flight=5, capacity=8)
    score = SCORERS["queue"](cfg())
    two = score([a, b], ctx())
    assert two == pytest.approx([0.5, 0.375])
    assert two[0] - two[1] == pytest.approx(1 / 8)  # one request = 1/capacity, not [0, 1]
    grown = score([a, b, ep("c", capacity=8), ep("d", in_flight=8, capacity=8)], ctx())
    assert grown[:2] == pytest.approx(two)  # an idle (or a full) newcomer changes nothing
    assert grown[2:] == pytest.approx([1.0, 0.0])
    assert score([b], ctx()) == pytest.approx([0.375])  # alone, the same score


def test_lower_is_better_edges():
    assert lower_is_better([]) == []
    assert lower_is_better([2.0]) == [1.0]


def test_ucb_arithmetic():
    # t = 3 + 1 = 4; Q_a = 2.4/3 = 0.8; Q_b = 0.5
    values = ucb_values([3, 1, 0], [2.4, 0.5, 0.0], c=1.0)
    assert values[0] == pytest.approx(0.8 + math.sqrt(math.log(4) / 3))
    assert values[1] == pytest.approx(0.5 + math.sqrt(math.log(4) / 1))
    assert values[2] == math.inf
    assert ucb_values([2, 2], [1.0, 1.5], c=0.0) == pytest.approx([0.5, 0.75])
    assert ucb_reward(0.5, 0.5) == pytest.approx(0.5)
    assert ucb_reward(0.0, 0.5) == 1.0
    assert ucb_reward(1.5, 0.5) == pytest.approx(0.25)


def test_ucb_scorer_is_relative_to_the_best_arm_and_explores_unpulled_arms():
    eps = [ep("a"), ep("b"), ep("c")]
    eps[0].num_ucb_pulls, eps[0].ucb_reward_sum = 3, 2.4
    eps[1].num_ucb_pulls, eps[1].ucb_reward_sum = 1, 0.5
    c0 = cfg(ucb_c=0.0)
    # u / max u (not min-max: a near-tie stays a near-tie)
    assert SCORERS["ucb"](c0)(eps[:2], ctx()) == pytest.approx([1.0, 0.625])
    # with the bonus both values pass 1 (0.8 + sqrt(ln 4 / 3), 0.5 + sqrt(ln 4)): they
    # still differ, where a cap at 1 scored them the same
    a, b = 0.8 + math.sqrt(math.log(4) / 3), 0.5 + math.sqrt(math.log(4))
    assert SCORERS["ucb"](cfg())(eps[:2], ctx()) == pytest.approx([a / b, 1.0])
    assert SCORERS["ucb"](cfg())(eps, ctx())[2] == 1.0  # never pulled: explore


def test_session_is_sticky_and_bounded():
    eps = [ep("a"), ep("b"), ep("c")]
    first = session_choice(eps, "user-42", 1.25)
    assert all(session_choice(eps, "user-42", 1.25) == first for _ in range(5))
    # remove another endpoint: the key stays on its endpoint (consistent hashing)
    others = [e for i, e in enumerate(eps) if i != first]
    kept = [eps[first], others[0]]
    assert kept[session_choice(kept, "user-42", 1.25)] is eps[first]
    # overload the sticky one: cap = ceil(1.25 * (10 + 1) / 3) = 5 < 10 + 1
    eps[first].num_in_flight = 10
    assert session_choice(eps, "user-42", 1.25) != first
    scores = SCORERS["session"](cfg())(eps, ctx(request=RequestInfo(session_key="user-42")))
    assert sorted(scores) == [0.0, 0.0, 1.0]
    assert SCORERS["session"](cfg())(eps, ctx()) == [0.0, 0.0, 0.0]


def test_keys_spread_over_endpoints():
    eps = [ep("a"), ep("b"), ep("c")]
    picks = {session_choice(eps, f"user-{i}", 1.25) for i in range(60)}
    assert picks == {0, 1, 2}


def test_inlined_queue_and_kv_scores_follow_the_endpoint_rules():
    # queue and kv inline EndpointState.queue_depth() / kv_usage() for speed: they must
    # stay the same rules (fresh scrape adds foreign load, stale KV scores 0).
    eps = [ep("fresh", in_flight=3, kv=0.4, running=10, waiting=2, capacity=16),
           ep("stale", in_flight=5, capacity=16), ep("busy", in_flight=20, kv=1.2, capacity=16)]
    queue = SCORERS["queue"](cfg())(eps, ctx())
    assert queue == [max(0.0, 1.0 - e.queue_depth() / e.capacity) for e in eps]
    assert queue[0] == 1.0 - 12 / 16  # 3 own + 9 foreign
    kv = SCORERS["kv"](cfg())(eps, ctx())
    # KV per running sequence over the fresh candidates: (0.4 + 1.2) / 10 running; "fresh"
    # has 12 - 10 = 2 requests that hold no KV there yet (its 2 waiting).
    assert kv == pytest.approx([1.0 - 0.4 - 2 * 0.16, 0.0, 0.0])
    assert [e.kv_usage() for e in eps] == [0.4, None, 1.2]  # the stale one scores 0


@pytest.mark.parametrize("b_in_flight, b_score", [(1, 0.9), (2, 0.8), (3, 0.7)])
def test_kv_counts_requests_the_scrape_did_not_see_running(b_in_flight, b_score):
    # Both scraped: a at KV 0.2 with its 2 requests running, b at 0.1 with 1. KV per
    # running sequence 0.3 / 3 = 0.1. Requests sent to b since (in flight beyond its 1
    # running) count 0.1 each: at 2 in flight b ties a (0.8), at 3 a is better.
    eps = [ep("a", in_flight=2, kv=0.2, running=2), ep("b", in_flight=b_in_flight, kv=0.1,
                                                       running=1)]
    assert SCORERS["kv"](cfg())(eps, ctx()) == pytest.approx([0.8, b_score])


def test_kv_per_sequence_is_counted_in_blocks_where_capacities_differ():
    # a: 1000 blocks, 2 running at 0.2 (200 blocks); b: 500 blocks, 2 running at 0.4 (the
    # same 200 blocks). One more sequence is 400 / 4 = 100 blocks: 0.1 of a, 0.2 of b. Each
    # has 2 requests the scrape did not see running. Pooled fractions (0.6 / 4 = 0.15 on
    # both) would score them 0.5 and 0.3: b looked roomier than it is.
    def sized(name, kv, blocks):
        e = ep(name, in_flight=4, kv=kv, running=2)
        e.signals.num_gpu_blocks = blocks
        return e

    eps = [sized("a", 0.2, 1000), sized("b", 0.4, 500)]
    assert SCORERS["kv"](cfg())(eps, ctx()) == pytest.approx([0.6, 0.2])
    eps[1].signals.num_gpu_blocks = 0  # one candidate does not say: pooled fractions
    assert SCORERS["kv"](cfg())(eps, ctx()) == pytest.approx([0.5, 0.3])
    eps[1].signals.num_gpu_blocks = 1000  # equal capacities: the same as pooled
    eps[1].signals.kv_usage = 0.2
    assert SCORERS["kv"](cfg())(eps, ctx()) == pytest.approx([0.6, 0.6])


def test_prefix_scores_zero_where_no_endpoint_holds_the_prompt():
    eps = [ep("a"), ep("b")]
    assert SCORERS["prefix"](cfg())(eps, ctx()) == [0.0, 0.0]
    assert SCORERS["prefix"](cfg())(eps, ctx(prefix_fraction={"b": 0.5})) == [0.0, 0.5]


@pytest.mark.parametrize("sticky_load, stays", [
    # other endpoint at 2; cap = ceil(1.25 * (total + 1) / 2):
    (4, True),   # total 6, cap ceil(4.375) = 5: with this request 5 = cap, it stays
    (5, False),  # total 7, cap ceil(5.0) = 5: already at the cap, one more is past it
])
def test_session_bounded_load_cap_at_the_threshold(sticky_load, stays):
    eps = [ep("a"), ep("b")]
    home = session_choice(eps, "user-7", 1.25)
    eps[home].num_in_flight, eps[1 - home].num_in_flight = sticky_load, 2
    assert (session_choice(eps, "user-7", 1.25) == home) is stays
    scores = SCORERS["session"](cfg())(eps, ctx(request=RequestInfo(session_key="user-7")))
    assert scores[home] == (1.0 if stays else 0.0) and sum(scores) == 1.0


def test_prefix_counts_a_match_from_min_prefix_match_on():
    eps = [ep("a"), ep("b"), ep("c")]
    fractions = {"a": 0.1, "b": 0.0999, "c": 0.05}
    assert SCORERS["prefix"](cfg())(eps, ctx(prefix_fraction=fractions)) == [0.1, 0.0, 0.0]
    # a peer fetch's credit counts toward it
    assert SCORERS["prefix"](cfg())(eps, ctx(prefix_fraction=fractions,
                                             peer_credit={"c": 0.05})) == [0.1, 0.0, 0.1]
    assert SCORERS["prefix"](cfg(min_prefix_match=0.0))(
        eps, ctx(prefix_fraction=fractions)) == [0.1, 0.0999, 0.05]


def test_prefix_plus_peer_credit_is_capped_at_one():
    # a: 0.75 + 0.3 = 1.05 -> 1; b: 0.5 + 0.25 stays 0.75; c: 1 + 0.01 -> 1; d: credit only
    eps = [ep("a"), ep("b"), ep("c"), ep("d")]
    got = SCORERS["prefix"](cfg())(eps, ctx(
        prefix_fraction={"a": 0.75, "b": 0.5, "c": 1.0},
        peer_credit={"a": 0.3, "b": 0.25, "c": 0.01, "d": 0.4}))
    assert got == pytest.approx([1.0, 0.75, 1.0, 0.4])
    assert all(0.0 <= s <= 1.0 for s in got)


def test_ucb_work_counts_uncached_ktokens_and_requests_ahead():
    from kvfleet_router.policies.scorers import ucb_work

    assert ucb_work(2500, 3) == pytest.approx(1.0 + 2.5 + 3)
    assert ucb_work(-10, -2) == 1.0  # nothing negative counts


def slo_request(max_tokens=50):
    return RequestInfo(max_tokens=max_tokens, body={"max_tokens": max_tokens})


def test_slo_scores_by_the_formula_on_the_priors():
    """Nothing learned: TTFT = 0.5 ms x 2,000 uncached tokens x (1 + queued ahead), TPOT
    = 20 ms, against 2 s / 50 ms and a 0.2 headroom (lateness <= 0.8 meets). Idle: TTFT
    1 s, lateness 0.5, decode share f = 50 x 0.02 / (1 + 1) = 0.5, h = 0.5 x 0.5 + 0.5 x
    0.6 = 0.55, score 0.5 + 0.275. One queued: 2 s, lateness 1.0: 0.49 x 0.8 / 1.0. Three
    queued: 4 s, lateness 2: half that."""
    eps = [ep("idle"), ep("one", in_flight=1), ep("three", in_flight=3)]
    c = ctx(request=slo_request(), num_prompt_tokens=2000)
    scores = SCORERS["slo"](cfg())(eps, c)
    assert scores == pytest.approx([0.775, 0.392, 0.196])
    assert c.predictions["idle"] == pytest.approx((1.0, 0.02))
    assert c.predictions["three"] == pytest.approx((4.0, 0.02))
    # The request's own TTFT target (5 s): one queued now meets, lateness 0.4, f = 1 / 3,
    # h = 2/3 x 0.6 + 1/3 x 0.6 = 0.6.
    c = ctx(request=slo_request(), num_prompt_tokens=2000, slo_ttft_s=5.0)
    assert SCORERS["slo"](cfg())(eps, c)[1] == pytest.approx(0.8)


def test_slo_meets_at_exactly_the_margin():
    # 3,200 tokens idle: TTFT 1.6 s, lateness exactly 0.8: it meets, by its headroom
    # (f = 0.02 / 1.62, h = (1 - f) x 0.2 + f x 0.6); one token more and it is late.
    f = 0.02 / 1.62
    at, = SCORERS["slo"](cfg())([ep("a")], ctx(request=slo_request(1), num_prompt_tokens=3200))
    assert at == pytest.approx(0.5 + 0.5 * ((1 - f) * 0.2 + f * 0.6))
    late, = SCORERS["slo"](cfg())([ep("a")], ctx(request=slo_request(1), num_prompt_tokens=3201))
    assert late == pytest.approx(0.49 * 0.8 / (0.0005 * 3201 / 2.0))


def test_slo_lateness_is_the_later_of_ttft_and_tpot():
    # A 10 ms TPOT target: the prior 20 ms TPOT is 2x late while the TTFT (1 s of 2 s) is
    # not; the TPOT decides: 0.49 x 0.8 / 2.
    c = ctx(request=slo_request(), num_prompt_tokens=2000, slo_tpot_s=0.01)
    assert SCORERS["slo"](cfg())([ep("a")], c) == pytest.approx([0.49 * 0.8 / 2.0])


def test_output_tokens_come_from_the_session_else_the_models_mean_else_the_prior():
    from kvfleet_router.policies.scorers import request_output_tokens

    a, b = ep("a"), ep("b")
    a.output_lengths.by_model["m"] = 100.0
    b.output_lengths.by_model["m"] = 300.0
    b.output_lengths.by_session["s"] = 40.0
    unbounded = {"model": "m"}  # no max_tokens in the body: the prediction stands
    assert request_output_tokens([a, b], ctx(request=RequestInfo(
        model="m", session_key="s", body=unbounded)), 256.0) == 40.0
    assert request_output_tokens([a, b], ctx(request=RequestInfo(
        model="m", body=unbounded)), 256.0) == pytest.approx(200.0)  # both endpoints' mean
    assert request_output_tokens([a, b], ctx(request=RequestInfo(
        model="other", body=unbounded)), 256.0) == 256.0
    bounded = RequestInfo(model="m", max_tokens=150, body={"max_tokens": 150})
    assert request_output_tokens([a, b], ctx(request=bounded), 256.0) == 150.0
