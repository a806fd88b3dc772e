"""Scorers: each returns one value in [0, 1] per endpoint (higher is better).

Registered by type name in SCORERS; each factory takes the RouterConfig.
min-max(x) below means (max - x) / (max - min) over the candidates, 1.0 for all when equal.

* queue:   max(0, 1 - q_i / capacity_i), q_i = router in-flight + the engine's running +
           waiting beyond it (last fresh scrape), capacity_i = the endpoint's configured
           in-flight capacity. Capacity-relative, not min-max: an endpoint's score depends
           on its own load only, so one request more is worth 1/capacity (not the whole
           [0, 1] range) and adding an idle endpoint changes no other endpoint's score.
* pending: max(0, 1 - p_i / capacity_i), p_i = this router's requests on endpoint i that
           have not answered a first byte yet (queued in the engine or prefilling:
           EndpointState.num_pending). A new prompt's TTFT waits behind those prefills, not
           behind answers already streaming, which the queue scorer counts alike; weighted
           beside it, a prompt goes where fewer prefills are ahead of it. Other router
           replicas' and clients' requests are not in p_i (the queue scorer's are).
* backlog: ref / (ref + b_i + u_i), b_i = the uncached prompt tokens of this router's
           pending requests on endpoint i (EndpointState.pending_tokens, each as estimated
           when it was sent), u_i = this request's uncached tokens there, ref = its prompt
           tokens: the prefill work in tokens that its first token waits for there (Dynamo's
           KV router weighs the same two, in blocks). A cached prefix and a short queue of
           prefills count in the same unit, so a match is worth what it saves, and a long
           prompt avoids an endpoint already prefilling one where the pending scorer sees one
           request like any other. Full match on an idle endpoint: 1; no match, idle: 0.5.
           It does not know an endpoint's speed, only the work queued there.
* kv:      1 - kv_usage_i - k_seq_i * pending_i, pending_i = q_i (as the queue scorer's) -
           the engine's running at the last scrape (requests that hold no KV there yet),
           k_seq_i = the candidates' KV blocks per running sequence over endpoint i's
           blocks (`num_gpu_blocks`; where a candidate does not export it, their KV
           fraction per running sequence); clamped to [0, 1]; 0 when the scrape is stale
           or missing (unknown is not idle).
* prefix:  matched leading blocks / prompt blocks on endpoint i (ctx.prefix_fraction),
           plus, with kv_sharing, the blocks a peer fetch is worth there (ctx.peer_credit);
           at most 1; 0 below policy.min_prefix_match (a match that small, typically a
           shared system prompt, would pull every new conversation to one endpoint).
* session: bounded-load rendezvous hashing: endpoints ordered by H(key, name); the first
           whose in-flight with this request, in-flight + 1, stays <=
           ceil(load_factor * (total in-flight + 1) / n) scores 1 (one already at the cap
           is skipped), the rest 0; all at the cap: the first. No session key: 0 for all
           (neutral).
* latency: ref / (ref + predicted latency of this request on endpoint i), the latency its
           predicted TTFT + its output tokens x predicted TPOT, ref = ttft_ref + output
           tokens x slo.tpot_s, from the perf model (perf_model.py: TTFT as a linear
           function of uncached prompt ktokens u, u x queued-ahead w, w, running r and KV
           usage, TPOT of in-flight and KV usage, per endpoint once it has
           `slo.min_samples` answers, the role's pooled fit otherwise; output tokens as
           the slo scorer predicts them). Only streams teach it, so before any the
           time-to-first-byte EWMA stands in for the TTFT; an endpoint without a TPOT
           prediction (its own or the pooled fit's, which refits every 16 answers) is
           scored on the TTFT alone; 1.0 while nothing is known. The `latency` preset
           adds the queue and pending scorers (1 and 4, as `slo`) and the bounded-load
           filter.
* ucb:     UCB1 over TTFT per unit of work: u_i = Q_i + c * sqrt(ln t / n_i), Q_i = mean
           reward, reward = ttft_ref / (ttft_ref + ttft / work), work = 1 + uncached
           ktokens + requests queued ahead at the decision; n_i = 0 -> 1.0; else
           u_i / max u over the answered candidates (not capped at 1, which tied every arm;
           not min-max). The preset explores only inside the bounded-load set and adds the
           queue scorer.
* slo:     predicted TTFT and TPOT (the perf model; priors alpha x uncached x (1 + w) and
           beta until anything is learned) against the request's SLO targets
           (ctx.slo_ttft_s / slo_tpot_s, else policy.slo.ttft_s / tpot_s): endpoints that
           meet both with `headroom` to spare score 0.5 + 0.5 x their headroom (the TTFT
           and TPOT headrooms weighted by the request's predicted prefill / decode share,
           output tokens from the session's or model's history), the others
           0.49 x (1 - headroom) / lateness, so any endpoint that meets outranks every
           one that does not. The `slo` preset adds the queue scorer (1:1) inside
           bounded-load; the `slo-tiered` picker instead draws at random among those above
           0.5, weighted by the excess, else takes the least late.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState, Signals
from kvfleet_router.perf_model import RoleModel, tpot_features, ttft_features
from kvfleet_router.policies.context import LoadSnapshot, RouteContext, load_snapshot

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
        return [max(0.0, 1.0 - (e.in_flight_total + e.foreign_load if e.is_signals_fresh
                                else e.in_flight_total) / e.capacity) for e in eps]  # fmt: skip

    return score


def pending(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        return [max(0.0, 1.0 - e.num_pending / e.capacity) for e in eps]

    return score


def backlog(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        ref = max(1.0, float(ctx.num_prompt_tokens))
        return [ref / (ref + e.pending_tokens + ctx.uncached_tokens(e.name)) for e in eps]

    return score


def space(cfg: RouterConfig) -> Scorer:
    """Most cache space: min-max of the prompt blocks the router's prefix index holds for each
    endpoint, fewest 1 (sglang-router's smallest-tree rule). A prompt no endpoint holds
    then goes where it evicts the least, instead of wherever a random tie-break lands it."""

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        blocks = ctx.prefix_index.num_blocks
        return lower_is_better([float(blocks(e.name)) for e in eps])

    return score


def kv_per_sequence(fresh: list[Signals]) -> Callable[[Signals], float]:
    """The KV fraction one more running sequence takes on an endpoint, from the candidates'
    usage per running sequence. In blocks where every candidate exports its capacity
    (`num_gpu_blocks`): a sequence holds as many blocks on a small replica as on a big one,
    so it takes twice the fraction of one with half the blocks (pooling the fractions would
    count it at their mean on both; on equal capacities the two agree). Pooled fractions
    otherwise."""
    running = sum(s.num_running for s in fresh)
    if running <= 0:
        return lambda s: 0.0
    if all(s.num_gpu_blocks > 0 for s in fresh):
        blocks = sum(s.kv_usage * s.num_gpu_blocks for s in fresh) / running
        return lambda s: blocks / s.num_gpu_blocks
    fraction = sum(s.kv_usage for s in fresh) / running
    return lambda s: fraction


def kv(cfg: RouterConfig) -> Scorer:
    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        # A request takes KV only once its engine runs it: those sent there that the last
        # scrape did not count as running (queued in the engine, or sent since) count at
        # the candidates' mean KV per running sequence, so the endpoint that looked
        # emptiest at the scrape is not taken for empty until the next one (without it
        # least-kv lost to least-request on a held-out Mooncake slice: commit f4d2aed).
        fresh = [e.signals for e in eps if e.is_signals_fresh]
        per_seq = kv_per_sequence(fresh)
        return [min(1.0, max(0.0, 1.0 - e.signals.kv_usage - per_seq(e.signals) * max(
            0.0, e.in_flight_total + e.foreign_load - e.signals.num_running)))
                if e.is_signals_fresh else 0.0 for e in eps]  # fmt: skip

    return score


def prefix(cfg: RouterConfig) -> Scorer:
    least = cfg.policy.min_prefix_match

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        fractions, credit = ctx.prefix_fraction, ctx.peer_credit
        if credit:  # merged once over the few endpoints either names, not per endpoint
            fractions = {n: fractions.get(n, 0.0) + credit.get(n, 0.0)
                         for n in fractions.keys() | credit.keys()}
        if not fractions:  # no endpoint holds any of the prompt
            return [0.0] * len(eps)
        return [s if (s := min(1.0, fractions.get(e.name, 0.0))) >= least else 0.0
                for e in eps]  # fmt: skip

    return score


def _rendezvous(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest(),
                          "big")


def session_choice(eps: list[EndpointState], key: str, load_factor: float) -> int:
    """Index of the endpoint a session sticks to, under the bounded-load cap."""
    total = sum(e.in_flight_total for e in eps)
    cap = math.ceil(load_factor * (total + 1) / len(eps))
    order = sorted(range(len(eps)), key=lambda i: _rendezvous(key, eps[i].name), reverse=True)
    for i in order:
        if eps[i].in_flight_total + 1 <= cap:
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


def role_model(cfg: RouterConfig) -> RoleModel:
    slo_cfg = cfg.policy.slo
    return RoleModel(min_samples=slo_cfg.min_samples, forget=slo_cfg.forget)


def predict_request(model: RoleModel, e: EndpointState, ctx: RouteContext
                    ) -> tuple[LoadSnapshot, float | None, float | None]:
    """This request's load snapshot on `e` and the perf model's TTFT and TPOT for it there
    (None where the model has learned nothing yet)."""
    snap = load_snapshot(e, ctx.uncached_tokens(e.name))
    ttft = model.predict_ttft(e.perf, ttft_features(
        snap.uncached_tokens, snap.num_waiting, snap.num_running, snap.kv_usage))
    tpot = model.predict_tpot(e.perf, tpot_features(snap.num_in_flight + 1, snap.kv_usage))
    return snap, ttft, tpot


def latency(cfg: RouterConfig) -> Scorer:
    """ref / (ref + predicted latency of this request there): its TTFT plus its output
    tokens at the predicted TPOT, ref the same request at `ttft_ref_s` and the SLO's TPOT;
    1.0 while nothing is known."""
    model, s = role_model(cfg), cfg.policy.slo
    ttft_ref = cfg.policy.ttft_ref_s

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        model.refresh([e.perf for e in eps])
        out_tokens = request_output_tokens(eps, ctx, s.output_tokens_prior)
        out = []
        for e in eps:
            _, ttft, tpot = predict_request(model, e, ctx)
            if ttft is None:  # no streamed answer anywhere: the first-byte EWMA
                ttft = e.ttft.value
            if ttft is None:
                out.append(1.0)
            elif tpot is None:  # nothing decoded here or in the pooled fit yet
                out.append(ttft_ref / (ttft_ref + ttft))
            else:
                ref = ttft_ref + out_tokens * s.tpot_s
                out.append(ref / (ref + ttft + out_tokens * tpot))
        return out

    return score


def ucb_reward(ttft_s: float, ttft_ref_s: float) -> float:
    return ttft_ref_s / (ttft_ref_s + max(0.0, ttft_s))


def ucb_work(uncached_tokens: float, num_waiting: float) -> float:
    """Units of work a TTFT paid for: 1 + uncached ktokens + requests queued ahead."""
    return 1.0 + max(0.0, uncached_tokens) / 1000.0 + max(0.0, num_waiting)


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


def ucb_scores(values: Sequence[float]) -> list[float]:
    """UCB values as scores: relative to the best pulled arm (it scores 1), unpulled arms
    1. Not capped at 1: UCB1 values of rewards in (0, 1] are mostly above 1 once the
    exploration bonus is added, so a cap scored every arm the same."""
    top = max((v for v in values if v != math.inf), default=0.0)
    return [1.0 if v == math.inf or top <= 0 else v / top for v in values]


def ucb(cfg: RouterConfig) -> Scorer:
    c = cfg.policy.ucb_c

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        values = ucb_values([e.num_ucb_pulls for e in eps], [e.ucb_reward_sum for e in eps], c)
        return ucb_scores(values)

    return score


def request_output_tokens(eps: list[EndpointState], ctx: RouteContext, prior: float) -> float:
    """Output tokens expected: the session's history, else the model's (mean over the
    candidates that saw it), else `prior`; at most the request's max_tokens when the
    body bounds it."""
    info = ctx.request
    predicted: float | None = None
    if info.session_key:
        for e in eps:
            got = e.output_lengths.by_session.get(info.session_key)
            if got is not None:
                predicted = got
                break
    if predicted is None:
        key = info.model or ""
        seen = [v for e in eps if (v := e.output_lengths.by_model.get(key)) is not None]
        predicted = sum(seen) / len(seen) if seen else prior
    body = info.body
    if "max_tokens" in body or "max_completion_tokens" in body:
        return min(float(info.max_tokens), predicted)
    return predicted


def slo(cfg: RouterConfig) -> Scorer:
    """Predicted TTFT and TPOT of this request on each endpoint against the SLO targets.

    Meets (both predictions <= (1 - headroom) x target): 0.5 + 0.5 * h, with
    h = (1 - f) * (1 - ttft / T_ttft) + f * (1 - tpot / T_tpot) and f the request's
    predicted decode share out * tpot / (ttft + out * tpot). Misses: 0.49 * (1 - headroom)
    / lateness, lateness = max(ttft / T_ttft, tpot / T_tpot). The `slo` preset adds the
    queue scorer; the `slo-tiered` picker instead draws among the endpoints above 0.5,
    weighted by the score above it, else takes the least late."""
    model = role_model(cfg)
    s = cfg.policy.slo
    prior_a, prior_b, margin = s.prefill_s_per_token, s.decode_s_per_token, 1.0 - s.headroom

    def score(eps: list[EndpointState], ctx: RouteContext) -> list[float]:
        model.refresh([e.perf for e in eps])
        t_ttft = ctx.slo_ttft_s or s.ttft_s
        t_tpot = ctx.slo_tpot_s or s.tpot_s
        out_tokens = request_output_tokens(eps, ctx, s.output_tokens_prior)
        scores = []
        for e in eps:
            snap, ttft, tpot = predict_request(model, e, ctx)
            if ttft is None:  # nothing learned anywhere yet: the priors, queue included
                ttft = prior_a * snap.uncached_tokens * (1.0 + snap.num_waiting)
            if tpot is None:
                tpot = prior_b
            ctx.predictions[e.name] = (ttft, tpot)
            lateness = max(ttft / t_ttft, tpot / t_tpot)
            if lateness <= margin:
                f = out_tokens * tpot / (ttft + out_tokens * tpot)
                h = (1 - f) * (1 - ttft / t_ttft) + f * (1 - tpot / t_tpot)
                scores.append(0.5 + 0.5 * min(1.0, max(1e-6, h)))
            else:
                scores.append(0.49 * margin / lateness if margin > 0 else 0.49 / lateness)
        return scores

    return score


SCORERS: dict[str, Callable[[RouterConfig], Scorer]] = {
    "queue": queue,
    "pending": pending,
    "kv": kv,
    "prefix": prefix,
    "session": session,
    "latency": latency,
    "backlog": backlog,
    "ucb": ucb,
    "slo": slo,
    "space": space,
}
