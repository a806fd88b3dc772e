"""The feedback policies adapt: fed what finished exchanges taught them, `latency`, `ucb`
and `slo` move traffic off a slow endpoint. Every test here fails when
`scorers_feedback.learn` learns nothing (all three then see two identical endpoints and
split traffic about evenly).

The pure replays drive the same path the dispatcher uses: RouterCore.route/start, then
HealthFeedback.exchange_done with the exchange's Outcome, then RouterCore.end.
"""

from __future__ import annotations

import random

import pytest
from kvfleet_router.config import RouterConfig
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.proxy import Outcome
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore
from router_fixtures import endpoints_cfg, http_json, start_fake, start_router

# endpoint -> (time to first token s, s per further output token)
SPEED = {"fast": (0.05, 0.01), "slow": (0.6, 0.08)}
MAX_TOKENS = 16


def replay(policy: str, num_requests: int, is_stream: bool = True) -> list[str]:
    """Sequential requests (nothing in flight at a decision); the endpoint picked for each."""
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": name, "url": f"http://127.0.0.1:{9000 + i}"}
                      for i, name in enumerate(["slow", "fast"])],
        "policy": {"name": policy}})
    core = RouterCore(cfg, rng=random.Random(0))
    feedback = HealthFeedback(RouterMetrics(lambda: core, lambda: 0), lambda: core.cfg)
    picks = []
    for i in range(num_requests):
        # distinct from the first byte: no prefix hit steers anything
        info = RequestInfo(prompt_text=f"{i} question " * 30, max_tokens=MAX_TOKENS)
        routed = core.route(info, "unified", now=float(i))
        e = core.start(routed)
        assert e is not None
        ttft, per_token = SPEED[e.name]
        total = ttft + per_token * (MAX_TOKENS - 1) if is_stream else ttft
        feedback.exchange_done(e, routed, Outcome(ttft, total, MAX_TOKENS if is_stream else 0,
                                                  is_stream), now=float(i))
        core.end(routed)  # neither pending nor in flight
        picks.append(e.name)
    return picks


@pytest.mark.parametrize("policy, is_stream", [
    ("latency", True), ("latency", False), ("ucb", True), ("ucb", False), ("slo", True)])
def test_feedback_policies_shift_traffic_off_the_slow_endpoint(policy, is_stream):
    picks = replay(policy, 80, is_stream)
    assert "fast" in picks[:4]  # both are tried or guessed early
    late = picks[40:]
    assert late.count("slow") <= len(late) // 10, (policy, picks)


def test_slo_learns_both_rates_from_streams():
    cfg = RouterConfig()
    core = RouterCore(RouterConfig.from_dict({
        "endpoints": [{"name": "slow", "url": "http://127.0.0.1:9000"}],
        "policy": {"name": "slo"}}), rng=random.Random(0))
    feedback = HealthFeedback(RouterMetrics(lambda: core, lambda: 0), lambda: cfg)
    routed = core.route(RequestInfo(prompt_text="x" * 400, max_tokens=5), "unified", 0.0)
    e = core.start(routed)
    assert e is not None
    feedback.exchange_done(e, routed, Outcome(0.5, 0.9, 5, True), now=0.0)
    assert e.prefill_s_per_token.value == pytest.approx(0.5 / 100)  # 400 chars = 100 tokens
    assert e.decode_s_per_token.value == pytest.approx(0.4 / 4)
    assert e.ttft.value == pytest.approx(0.5) and e.num_ucb_pulls == 1
    # reward per unit of work: 0.5 s over 1 + 0.1 uncached ktokens + 0 queued ahead
    assert e.ucb_reward_sum == pytest.approx(0.5 / (0.5 + 0.5 / 1.1))
    assert e.perf.ttft.num_samples == 1 and e.perf.tpot.num_samples == 1


def test_router_process_learns_latency_from_real_exchanges(procs, tmp_path):
    """End to end: the dispatcher feeds what it measured, so the latency policy moves off
    a backend that takes 40x longer to answer."""
    backends = [start_fake(procs, "b0", "--token-delay-ms", "80"),
                start_fake(procs, "b1", "--token-delay-ms", "2")]
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends),
                                            "policy": {"name": "latency"}})
    served = []
    for i in range(16):
        status, body = http_json(router.url + "/v1/completions",
                                 {"model": "fake", "prompt": f"{i} hello", "max_tokens": 2})
        assert status == 200
        served.append(body["choices"][0]["text"].split(":")[0])
    assert served[4:].count("b0") <= 1, served
