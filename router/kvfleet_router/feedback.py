"""What exchanges tell the router about an endpoint: the one way results flow back.

The dispatcher and the P/D prefill leg both report through a `HealthFeedback`, passed to
them explicitly; nothing reaches into another piece's internals to record a failure.

    fb = HealthFeedback(metrics, lambda: core.cfg)
    fb.attempt(e, now)                    # a decision sent a request there (breaker trial)
    fb.failure(e, "connect", now)         # before the first byte: counts, may eject
    fb.success(e)                         # a non-streamed side call went well
    fb.exchange_done(e, routed, outcome, now)   # an exchange ended: breaker + learning
    fb.prefill_leg_done(e, routed, latency_s, now)  # a P/D prefill leg: the same, TTFT only

Only the endpoint's own faults count against it (the rule is `fault.classify`): "busy"
(429/503) releases a half-open trial without counting; a client that went away, a 4xx and
a 5xx the request itself caused teach nothing. A good exchange feeds
`scorers_feedback.learn` (the latency, UCB and SLO scorers' state).
"""

from __future__ import annotations

from collections.abc import Callable

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.proxy import Outcome
from kvfleet_router.router_core import Routed
from kvfleet_router.scorers_feedback import learn


class HealthFeedback:
    def __init__(self, metrics: RouterMetrics, cfg: Callable[[], RouterConfig]) -> None:
        self._metrics = metrics
        self._cfg = cfg  # always the config in force

    @staticmethod
    def attempt(e: EndpointState, now: float) -> None:
        e.breaker.on_attempt(now)

    @staticmethod
    def success(e: EndpointState) -> None:
        e.breaker.record_success()

    def failure(self, e: EndpointState, kind: str, now: float) -> None:
        self._metrics.backend_errors.labels(e.name, kind).inc()
        if kind == "busy":  # an overloaded endpoint is not an outlier
            e.breaker.release_trial()
        elif e.breaker.record_failure(now):
            self._metrics.ejections.labels(e.name).inc()

    def prefill_leg_done(self, e: EndpointState, routed: Routed, latency_s: float,
                         now: float) -> None:
        """A P/D prefill leg answered (one token, not streamed): a success for the breaker,
        and its latency, which is the prefill, teaches the prefill endpoint's TTFT model.
        Without it the prefill role's perf model, which sizes that role, stays on its seed.
        No output is learned (num_events 0): the prefill endpoint decodes nothing."""
        self.exchange_done(e, routed, Outcome(latency_s, latency_s, 0, True), now)

    def exchange_done(self, e: EndpointState, routed: Routed, outcome: Outcome,
                      now: float) -> None:
        if outcome.is_broken:
            self.failure(e, "midstream", now)
        elif outcome.is_client_gone or outcome.is_client_fault:
            e.breaker.release_trial()  # no verdict on the endpoint (fault.py)
        else:
            e.breaker.record_success()
            learn(e, routed, outcome, self._cfg().policy.ttft_ref_s)
