"""What a finished exchange teaches the latency, UCB and SLO scorers (pure updates).

* TTFT EWMA: the time to the first byte (for non-streaming answers the whole response).
* UCB reward r = ttft_ref / (ttft_ref + ttft / work), work = 1 + uncached ktokens +
  requests queued ahead when it was routed (`scorers.ucb_work`): per unit of work, so a
  replica that got the long prompts or the long queue is not blamed for them.
* The perf model (perf_model.py, on `EndpointState.perf`), from streams only, not from
  requests sent with a peer hint (their TTFT mixes a fetch with the prefill of fewer
  tokens): TTFT against the decision's load snapshot (`RouteContext.chosen_load`:
  uncached tokens, queued, running, KV usage); TPOT = (total - ttft) / (events - 1) when
  > 1 event, against the in-flight count then. Before learning, what was predicted for
  this exchange (the SLO scorer's prediction, else the endpoint's own model's once it has
  answers) is scored against what happened: `ttft_mape` / `tpot_mape`.
* Output lengths per model and session (`EndpointState.output_lengths`) from streams.
* The SLO EWMAs alpha (s per uncached prompt token) and beta (s per output token) that
  peer_hint.py's recompute estimate reads.
"""

from __future__ import annotations

from kvfleet_router.endpoint import EndpointState
from kvfleet_router.perf_model import FIT_MAX_AGE, tpot_features, ttft_features
from kvfleet_router.policies.context import load_snapshot
from kvfleet_router.policies.scorers import ucb_reward, ucb_work
from kvfleet_router.proxy import Outcome
from kvfleet_router.router_core import Routed

MIN_OWN_SAMPLES_FOR_MAPE = 8  # the endpoint's own fit is scored once it has this many


def learn(e: EndpointState, routed: Routed, outcome: Outcome, ttft_ref_s: float) -> None:
    ctx = routed.ctx
    snap = ctx.chosen_load
    if snap is None or routed.decision.endpoint is not e:
        snap = load_snapshot(e, ctx.uncached_tokens(e.name))
    e.ttft.add(outcome.ttft_s)
    e.num_ucb_pulls += 1
    work = ucb_work(snap.uncached_tokens, snap.num_waiting)
    e.ucb_reward_sum += ucb_reward(outcome.ttft_s / work, ttft_ref_s)
    if not outcome.is_stream:
        return
    info = ctx.request
    if outcome.num_events > 0:
        e.output_lengths.learn(info.model, info.session_key, float(outcome.num_events))
    uncached = snap.uncached_tokens
    if not routed.num_hinted_blocks:
        x = ttft_features(uncached, snap.num_waiting, snap.num_running, snap.kv_usage)
        predicted = ctx.predicted_ttft_s if routed.decision.endpoint is e else None
        if predicted is None and e.perf.ttft.num_samples >= MIN_OWN_SAMPLES_FOR_MAPE:
            predicted = e.perf.ttft.predict_recent(x, FIT_MAX_AGE)
        if predicted is not None:
            e.ttft_mape.add(max(predicted, 0.0), outcome.ttft_s)
        e.perf.learn_ttft(x, outcome.ttft_s)
        if uncached >= 1:
            e.prefill_s_per_token.add(outcome.ttft_s / uncached)
    if outcome.num_events > 1:
        tpot = (outcome.total_s - outcome.ttft_s) / (outcome.num_events - 1)
        x = tpot_features(snap.num_in_flight + 1, snap.kv_usage)
        predicted = ctx.predicted_tpot_s if routed.decision.endpoint is e else None
        if predicted is None and e.perf.tpot.num_samples >= MIN_OWN_SAMPLES_FOR_MAPE:
            predicted = e.perf.tpot.predict_recent(x, FIT_MAX_AGE)
        if predicted is not None:
            e.tpot_mape.add(max(predicted, 0.0), tpot)
        e.perf.learn_tpot(x, tpot)
        e.decode_s_per_token.add(tpot)
