"""What one finished exchange does to the endpoint's breaker and learners, at the edges of
the fault rule (fault.py, feedback.py) and of the SLO learner (scorers_feedback.py).

* A 4xx (or a 5xx the request caused) is the client's doing: no failure counted against
  the endpoint, and no success either (the consecutive-failure count stays, the latency,
  UCB and SLO learners learn nothing).
* A 5xx of the endpoint's own counts; a 2xx resets the count and teaches the learners.
* A request sent with a peer hint teaches the TTFT and decode learners but not the SLO
  prefill rate (its TTFT mixes a fetch with the prefill of fewer tokens).
"""

from __future__ import annotations

import random

import pytest
from kvfleet_router.breaker import CLOSED, OPEN
from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.proxy import Outcome
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import Routed, RouterCore


def one_exchange() -> tuple[HealthFeedback, EndpointState, Routed]:
    """A one-endpoint router (eject after 3 failures) and one routed, started request of
    100 uncached prompt tokens."""
    core = RouterCore(RouterConfig.from_dict({
        "endpoints": [{"name": "e", "url": "http://127.0.0.1:9000"}],
        "policy": {"name": "slo"}}), rng=random.Random(0))
    assert core.cfg.health.eject_after_errors == 3
    feedback = HealthFeedback(RouterMetrics(lambda: core, lambda: 0), lambda: core.cfg)
    routed = core.route(RequestInfo(prompt_text="x" * 400, max_tokens=5), "unified", 0.0)
    e = core.start(routed)
    assert e is not None and routed.ctx.uncached_tokens("e") == 100
    return feedback, e, routed


def learned_nothing(e: EndpointState) -> bool:
    return (e.ttft.value is None and e.num_ucb_pulls == 0 and e.ucb_reward_sum == 0.0
            and e.prefill_s_per_token.value is None and e.decode_s_per_token.value is None)


CLIENT_4XX = Outcome(0.01, 0.01, 0, False, is_client_fault=True)  # as Forwarder.forward
OK_STREAM = Outcome(0.5, 0.9, 5, True)


@pytest.mark.parametrize("answer, count_after, learns", [
    ("4xx", 2, False),  # neither the endpoint's failure nor a success
    ("2xx", 0, True),   # a success resets the count and teaches the learners
    ("5xx", 3, False),  # the endpoint's own fault: the third consecutive one ejects it
])
def test_a_client_4xx_neither_resets_the_failure_count_nor_teaches(answer, count_after,
                                                                   learns):
    feedback, e, routed = one_exchange()
    for _ in range(2):  # one short of the ejection threshold
        feedback.failure(e, "status", now=1.0)
    assert e.breaker.num_consecutive_failures == 2 and e.breaker.state == CLOSED
    if answer == "4xx":
        feedback.exchange_done(e, routed, CLIENT_4XX, now=2.0)
    elif answer == "2xx":
        feedback.exchange_done(e, routed, OK_STREAM, now=2.0)
    else:  # the proxy raises BackendFailure("status"); the dispatcher reports it
        feedback.failure(e, "status", now=2.0)
    assert e.breaker.num_consecutive_failures == count_after
    assert learned_nothing(e) is not learns
    # the next endpoint fault: ejects after a 4xx (the count was kept), not after a 2xx
    if answer != "5xx":
        feedback.failure(e, "status", now=3.0)
        assert e.breaker.state == (OPEN if answer == "4xx" else CLOSED)


def test_a_client_4xx_frees_a_half_open_trial_without_closing_the_breaker():
    feedback, e, routed = one_exchange()
    for _ in range(3):
        feedback.failure(e, "connect", now=0.0)
    assert e.breaker.state == OPEN
    later = e.breaker.open_until
    feedback.attempt(e, later)  # the half-open trial
    assert not e.breaker.can_attempt(later)
    feedback.exchange_done(e, routed, CLIENT_4XX, now=later)
    assert e.breaker.can_attempt(later)  # another trial may go
    assert e.breaker.num_consecutive_failures == 3 and e.breaker.state != CLOSED
    assert learned_nothing(e)


@pytest.mark.parametrize("num_hinted_blocks", [0, 1])
def test_a_peer_hinted_stream_does_not_teach_the_slo_prefill_rate(num_hinted_blocks):
    feedback, e, routed = one_exchange()
    routed.num_hinted_blocks = num_hinted_blocks  # 1: the smallest hint there is
    feedback.exchange_done(e, routed, OK_STREAM, now=1.0)
    if num_hinted_blocks:
        assert e.prefill_s_per_token.value is None
    else:
        assert e.prefill_s_per_token.value == pytest.approx(0.5 / 100)
    # the rest is learned either way: TTFT, UCB, the decode rate
    assert e.ttft.value == pytest.approx(0.5) and e.num_ucb_pulls == 1
    assert e.decode_s_per_token.value == pytest.approx(0.4 / 4)
