"""Scorers: each returns one value in [0, 1] per endpoint (higher is better).

Registered by type name in SCORERS; each factory takes the RouterConfig.
min-max(x) below means (max - x) / (max - min) over the candidates, 1.0 for all when equal.

* queue:   max(0, 1 - q_i / capacity_i), q_i = router in-flight + the engine's running +
           waiting beyond it (last fresh scrape), capacity_i = the endpoint's configured
           in-flight capacity. Capacity-relative, not min-max: an endpoint's score depends
           on its own load only, so one request more is worth 1/capacity (not the whole
           [0, 1] range) and adding an idle endpoint changes no other endpoint's score.
* kv:      1 - kv_usage_i; 0 when the scrape is stale or missing (unknown is not idle).
* prefix:  matched leading blocks / prompt blocks on endpoint i (ctx.prefix_fraction),
           plus, with kv_sharing, the blocks a peer fetch is worth there (ctx.peer_credit);
           at most 1.
* session: bounded-load rendezvous hashing: endpoints ordered by H(key, name); the first
           whose in-flight with this request, in-flight + 1, stays <=
           ceil(load_factor * (total in-flight + 1) / n) scores 1 (one already at the cap
           is skipped), the rest 0; all at the cap: the first. No session key: 0 for all
           (neutral).
* latency: min-max of the TTFT EWMA; endpoints without samples score 1 (explore them).
* ucb:     UCB1 over TTFT: u_i = Q_i + c * sqrt(ln t / n_i), Q_i = mean reward with
           reward = ttft_ref / (ttft_ref + ttft), t = sum of n_i; n_i = 0 -> 1.0; finite
           u_i are min-max normalised (higher u -> 1).
* slo:     estimated completion T_i = alpha_i * uncached_prompt_i + beta_i * expected_output,
           alpha_i / beta_i = EWMAs of seconds per prefill / decode token (priors from
           config until measured), expected_output = max_tokens; score = min-max of T_i.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.policies.context import RouteContext

Scorer = Callable[[list[EndpointState], RouteContext], list[float]]


def lower_is_better(values: Sequence[float]) -> list[float]:
    """(max - x) / (max - min); all 1.0 when the values are equal."""
    if not values:
        return []
    hi, lo = max(values), min(values)
    if hi - lo <= 1e-12:
        return [1.0] * len(values)
    return [(hi - v) / (hi - lo) for v in values]


# The queue, kv and prefix scorers run over every endpoint for every request; they inline
# EndpointState.queue_depth() and kv_usage() (same rules) to spare a call per endpoint.


def queue(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        return [max(0.0, 1.0 - (e.num_in_flight + e.foreign_load if e.is_signals_fresh
                                else e.num_in_flight) / e.capacity) for e in eps]  # fmt: skip

    return score


def kv(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        return [min(1.0, max(0.0, 1.0 - e.signals.kv_usage)) if e.is_signals_fresh else 0.0
                for e in eps]  # fmt: skip

    return score


def prefix(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        fractions, credit = ctx.prefix_fraction, ctx.peer_credit
        if credit:
            return [min(1.0, fractions.get(e.name, 0.0) + credit.get(e.name, 0.0))
                    for e in eps]
        if not fractions:  # no endpoint holds any of the prompt
            return [0.0] * len(eps)
        return [min(1.0, fractions.get(e.name, 0.0)) for e in eps]

    return score


def _rendezvous(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest(),
                          "big")


def session_choice(eps: list[EndpointState], key: str, load_factor: float) -> int:
    """Index of the endpoint a session sticks to, under the bounded-load cap."""
    total = sum(e.num_in_flight for e in eps)
    cap = math.ceil(load_factor * (total + 1) / len(eps))
    order = sorted(range(len(eps)), key=lambda i: _rendezvous(key, eps[i].name), reverse=True)
    for i in order:
        if eps[i].num_in_flight + 1 <= cap:
            return i
    return order[0]


def session(cfg: RouterConfig) -> Scorer:
    factor = cfg.session.load_factor

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        key = ctx.request.session_key
        out = [0.0] * len(eps)
        if key and eps:
            out[session_choice(eps, key, factor)] = 1.0
        return out

    return score


def latency(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        known = [e.ttft.value for e in eps if e.ttft.value is not None]
        if not known:
            return [1.0] * len(eps)
        ranked = lower_is_better(known)
        it = iter(ranked)
        return [1.0 if e.ttft.value is None else next(it) for e in eps]

    return score


def ucb_reward(ttft_s: float, ttft_ref_s: float) -> float:
    return ttft_ref_s / (ttft_ref_s + max(0.0, ttft_s))


def ucb_values(pulls: Sequence[int], reward_sums: Sequence[float], c: float) -> list[float]:
    """UCB1: Q_i + c * sqrt(ln t / n_i); inf for arms never pulled."""
    t = sum(pulls)
    out = []
    for n, total in zip(pulls, reward_sums, strict=True):
        if n == 0:
            out.append(math.inf)
        else:
            out.append(total / n + c * math.sqrt(math.log(t) / n))
    return out


def ucb(cfg: RouterConfig) -> Scorer:
    c = cfg.policy.ucb_c

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        values = ucb_values([e.num_ucb_pulls for e in eps], [e.ucb_reward_sum for e in eps], c)
        finite = [v for v in values if v != math.inf]
        if not finite:
            return [1.0] * len(eps)
        hi, lo = max(finite), min(finite)
        span = hi - lo
        return [1.0 if v == math.inf else (1.0 if span <= 1e-12 else (v - lo) / span)
                for v in values]

    return score


def slo_estimate(e: EndpointState, ctx: RouteContext, prior_prefill: float,
                 prior_decode: float) -> float:
    alpha = e.prefill_s_per_token.value if e.prefill_s_per_token.value is not None \
        else prior_prefill
    beta = e.decode_s_per_token.value if e.decode_s_per_token.value is not None \
        else prior_decode
    return alpha * ctx.uncached_tokens(e.name) + beta * ctx.request.max_tokens


def slo(cfg: RouterConfig) -> Scorer:
    p, d = cfg.policy.slo.prefill_s_per_token, cfg.policy.slo.decode_s_per_token
    return lambda eps, ctx: lower_is_better([slo_estimate(e, ctx, p, d) for e in eps])


SCORERS: dict[str, Callable[[RouterConfig], Scorer]] = {
    "queue": queue,
    "kv": kv,
    "prefix": prefix,
    "session": session,
    "latency": latency,
    "ucb": ucb,
    "slo": slo,
}
