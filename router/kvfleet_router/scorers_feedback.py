"""What a finished exchange teaches the latency, UCB and SLO scorers (pure updates).

* TTFT EWMA and UCB reward r = ttft_ref / (ttft_ref + ttft) use the time to the first
  byte; for non-streaming answers that is the whole response time.
* SLO alpha (s per uncached prompt token) = ttft / uncached tokens on that endpoint, for
  streams only, and not from requests sent with a peer hint (their TTFT mixes a fetch
  with the prefill of fewer tokens); beta (s per output token) = (total - ttft) /
  (events - 1) when > 1 event.
"""

from __future__ import annotations

from kvfleet_router.endpoint import EndpointState
from kvfleet_router.policies.scorers import ucb_reward
from kvfleet_router.proxy import Outcome
from kvfleet_router.router_core import Routed


def learn(e: EndpointState, routed: Routed, outcome: Outcome, ttft_ref_s: float) -> None:
    e.ttft.add(outcome.ttft_s)
    e.num_ucb_pulls += 1
    e.ucb_reward_sum += ucb_reward(outcome.ttft_s, ttft_ref_s)
    if not outcome.is_stream:
        return
    uncached = routed.ctx.uncached_tokens(e.name)
    if uncached >= 1 and not routed.num_hinted_blocks:
        e.prefill_s_per_token.add(outcome.ttft_s / uncached)
    if outcome.num_events > 1:
        e.decode_s_per_token.add((outcome.total_s - outcome.ttft_s) / (outcome.num_events - 1))
