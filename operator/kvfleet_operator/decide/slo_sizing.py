"""How many replicas of a role meet the SLO: pure, from the router's own performance model.

The router learns, per role, TTFT = w . [1, u, u*w_q, w_q, r, kv] and TPOT = v . [1, n, kv]
(`kvfleet_router.perf_model`: u uncached prompt ktokens, w_q requests queued ahead, r
running, n in flight, kv KV usage) from the fleet's finished requests. The autoscaler asks
the same model, for N = 1, 2, ... replicas, what a request would see if the role's load
were spread over N, and takes the smallest N whose predicted TTFT p90 and ITL meet the
pool's targets with headroom (predicted <= target x (1 - headroom)).

The queueing step, from the role's load (request rate lam, mean uncached prompt tokens U,
mean output tokens O) to the model's features on one of N replicas (a = (lam + B) / N
each, B the burst rate below):

* Arrivals in clumps. The formulas below hold for requests that arrive independently,
  where the rate around a request is the mean rate. Traffic that comes in clumps (Azure
  code) meets its clump-mates: on 3 unified replicas 19 of the 146 requests of one 10-s
  window missed the ITL SLO and 1 of the 123 of another (docs/operator.md gives the
  replay), which a mean rate cannot tell apart. So a request's load is the rate of the
  others around it, the mean plus
  B = `RoleSignals.burst_rate` (from the scrape intervals: sum(c (c - 1) / dt) / sum(c)
  less the mean, about 0 for independent arrivals), spread over the N replicas as the
  router spreads a clump.

* Queued ahead, w_q. Prefill is one server per replica (the engine's token budget works
  the queue down in arrival order). Its service time is the mean prompt's prefill,
  S = w_u . U by the model's per-ktoken slope (the best identified weight: prompts vary
  in every window), and a request ahead delays the ones behind by that service time
  (`_ttft`): the queue is prefill work, which batching does not shrink. Not by
  the fit's own queue terms (w_u_wq . U + w_wq), which are seen only where the fleet
  queued, so they say anything: 0.78 s per queued 1.6k-token prompt against its 57 ms
  prefill on a P/D prefill role, and 3.5 ms per queued 1.2k-token prompt against its
  41 ms on the local example pool (`examples/local-sim.yaml`, Azure conversation from
  600 s), fitted on six lightly loaded replicas (the fit the sizing read at 50 s, printed
  from a debug run; the simulator's reports do not carry it, so it is pinned as
  `LOCAL_FIT` in tests/operator/test_slo_sizing.py). Read from there, and with no decode share
  (below: that fit's v_n was negative), the sizing put 17 req/s on one replica, the next
  burst found it alone, and the pool moved 24 times in 150 s (`bench/autoscale_local.py
  --held-out` at 2b075f2).
  Utilization rho = a . (S + D), D the GPU time a request's decode takes from the prompts
  on a replica that both prefills and decodes (`decode_share_s`: its O - 1 steps at the
  model's marginal step time per sequence in flight, v_n + v_kv . kv_per_seq, as KV usage
  grows with the sequences held; 0 on a prefill or decode role). A prompt
  waits for every step ahead of it, decode steps too: counting prefill alone (before
  92977eb; `bench/autoscale_local.py` at that commit's parent), the local example pool
  (`examples/local-sim.yaml`, Azure conversation, 220-token answers) sized 21 req/s to one
  replica at rho 0.69, and TTFT p90 there rose to 2.3 s while the one
  replica asked for next was still starting. With rho >= 1 the queue grows without bound
  and N is infeasible. Otherwise the queue an arrival sees is M/M/1's (PASTA):
  P(w_q >= k) = rho^(k+1), so its mean is rho^2 / (1 - rho) and its q-quantile
  (q = `CHECK_QUANTILE`, 0.95, for the p90 targets; see below) is
  max(0, ln(1 - q) / ln(rho) - 2), continuous in rho.
  M/M/1 over-states a queue of similar prompts (M/D/1 halves the wait), which leaves
  room for long-prompt outliers.
* In flight, n. Little's law: a request is in flight for its TTFT and O - 1 decode steps,
  so L = a . (TTFT(w_q mean, r = L, kv(L)) + (O - 1) . TPOT(L + 1, kv(L))), a fixed point
  in L solved by bisection (none below `MAX_IN_FLIGHT`: infeasible). The in-flight count of
  an infinite-server queue is Poisson(L) (M/G/inf), so its q-quantile is
  L + z_q . sqrt(L) (normal approximation; z_0.95 = 1.64).
* KV usage grows with the sequences a replica holds: kv(n) = min(1, n . kv_per_seq), with
  kv_per_seq the role's observed KV usage per running sequence (0 before any is seen).
* Predicted TTFT p90 = w . [1, U_90, 0, 0, 0, kv(L)] + L . (wait per running) + w_q(q) . S,
  U_90 the routers' recent p90 uncached prompt (`tail_prompt_tokens`; U where they export
  none): a TTFT p90 is set by the long prompts, whose own prefill the mean prompt does not
  show. Priced at U, the sizing asked 9 to 11 replicas of Mooncake's unified pool (the p90
  of its asks per pinned count from 8 up) where 16 met its bar, 12 to 16 at U_90
  (`bench/slo_model_calibration.py` at fc8b29f and bcb3796); the observed-latency cap
  makes up the rest. At the target's own quantile, not the check's 0.95: Mooncake's p95
  prompt alone takes longer than the 2 s target, so the queue was sized to add at most a
  tenth of it and the unified pool of 32 spent 16,784 replica-s at start-up 10 s (1.27x
  the optimum) for 94.5% of requests, against 13,190 for 94.2% at the p90 prompt
  (docs/operator.md gives the command). The
  queue ahead and Little's law keep U: they count work, not one request's own wait.
  The wait per running request is the model's w_r kept within [0, S] (a running request
  shares the step's token budget; `wait_per_running_s`: a P/D prefill role's fit said
  0.30 s per running prompt, and Little's law then had no fixed point at a quarter of one
  replica's load);
  predicted ITL = TPOT at the in-flight quantile, v . [1, n_q + 1, kv(n_q)] (a request's
  mean inter-token time, what the simulator's attainment and the router's TPOT are
  measured on), plus, on a role that prefills what it decodes (unified), the prefill
  that stalls the request's decode steps at the quantile (`prefill_stall_s`): without it
  a unified pool of short answers behind long prompts (Azure code) sat at 2 replicas
  while bursts of prompts held every decode step to an 8k-token chunk, and 10% of
  requests missed the ITL SLO. The stall is the prompt work a request's decode steps
  carry, so it reads the prompts' utilization, a . S: TPOT(n) already prices the decode
  steps themselves. Both clamped to at least `FLOOR_S`.

A target that an idle replica already misses (the idle prediction: nothing queued or
running, `idle_prediction`) is out of scaling's reach; it is checked as the idle
prediction plus `QUEUEING_SHARE` of the target (`reachable`), so the count asked for is
the one whose queue adds at most that share, not the maximum.

Each target is checked at q = 0.95, not 0.9: a request meets the SLO only when it meets
both, so each check leaves half of the p90's 10% and, by the union bound, at least 90% of
requests meet both (checked at 0.9 each, up to 20% could miss one or the other).

Which checks apply: a unified role both targets, prefill TTFT, decode ITL (a decode
replica's first token is the hand-off, not a prompt). A pool that sets one target gets
the router's default SLO (`kvfleet_router.config.SloConfig`) for the other, so the
autoscaler and the router's `slo` policy read the same SLO.

Where the weights come from: the routers' fit for the role once it has seen
`MIN_EVIDENCE` finished requests, else a seed (`seed_coefficients`: the prefill and decode
seconds per token of the pool's `prefillTokensPerSecondPerReplica` when set, else the
router's SLO priors), and the reason says which.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from kvfleet_router.config import SloConfig
from kvfleet_router.perf_model import RoleCoefficients, dot, tpot_features, ttft_features

from kvfleet_operator.decide.role_signals import RoleSignals

FLOOR_S = 1e-4  # predictions are at least this (as the router clamps them)
MIN_SERVICE_S = 1e-3  # a queued request costs at least this much prefill time
MAX_IN_FLIGHT = 1e5  # per replica; a fixed point beyond this is overload
MIN_EVIDENCE = 32  # finished requests before the fleet's fit replaces the seed
_ROUTER_SLO = SloConfig()
HEADROOM = _ROUTER_SLO.headroom  # the router's slo policy leaves the same margin
# A request meets the SLO only when it meets both targets, so each is checked at the
# quantile that leaves half the p90's 10%: by the union bound, at least 90% meet both.
CHECK_QUANTILE = 0.95
# A TTFT p90 is set by the long prompts: a request's own prefill is priced at the routers'
# recent p90 uncached prompt, the target's own quantile (the module docstring says why).
PROMPT_QUANTILE = 0.9


@dataclass(frozen=True, slots=True)
class SloTargets:
    """A role's SLO: TTFT p90 and ITL targets (None: not checked for this role)."""

    ttft_p90_s: float | None = None
    itl_p90_s: float | None = None
    headroom: float = HEADROOM
    quantile: float = CHECK_QUANTILE

    def __post_init__(self) -> None:
        for name in ("ttft_p90_s", "itl_p90_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SLO {name} must be > 0, got {v}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"SLO headroom must be in [0, 1), got {self.headroom}")
        if not 0.5 <= self.quantile < 1:
            raise ValueError(f"SLO quantile must be in [0.5, 1), got {self.quantile}")


def role_slo(role: str, ttft_p90_s: float | None, itl_p90_s: float | None) -> SloTargets | None:
    """The SLO a role is sized for, or None when the pool sets no target (then the
    per-replica targets drive, as before)."""
    if ttft_p90_s is None and itl_p90_s is None:
        return None
    ttft = ttft_p90_s if ttft_p90_s is not None else _ROUTER_SLO.ttft_s
    itl = itl_p90_s if itl_p90_s is not None else _ROUTER_SLO.tpot_s
    return SloTargets(ttft_p90_s=None if role == "decode" else ttft,
                      itl_p90_s=None if role == "prefill" else itl)


def seed_coefficients(prefill_tokens_per_s: float | None = None,
                      decode_s_per_token: float | None = None) -> RoleCoefficients:
    """Weights before the fleet has evidence: TTFT = prefill seconds per ktoken x u, TPOT
    = decode seconds per token; no queue, running or KV terms (the queueing step still
    queues prompts at the prefill rate)."""
    s_per_token = (1.0 / prefill_tokens_per_s if prefill_tokens_per_s
                   else _ROUTER_SLO.prefill_s_per_token)
    decode = decode_s_per_token or _ROUTER_SLO.decode_s_per_token
    return RoleCoefficients((0.0, 1000.0 * s_per_token, 0.0, 0.0, 0.0, 0.0),
                            (decode, 0.0, 0.0))


def choose_coefficients(fleet: RoleCoefficients | None, seed: RoleCoefficients
                        ) -> tuple[RoleCoefficients, str]:
    """(weights, where they came from), per target: the fleet's TTFT fit once it has
    MIN_EVIDENCE requests, else the seed's, and the same for TPOT. Per target because a
    role may learn one and never the other: a prefill role's legs teach TTFT, and it
    decodes nothing."""
    n_ttft = 0 if fleet is None else fleet.num_ttft_samples
    n_tpot = 0 if fleet is None else fleet.num_tpot_samples
    use_ttft, use_tpot = n_ttft >= MIN_EVIDENCE, n_tpot >= MIN_EVIDENCE
    if fleet is not None and use_ttft and use_tpot:
        return fleet, f"fleet model, {n_ttft} requests"
    if fleet is None or not (use_ttft or use_tpot):
        return seed, f"seed model, fleet has {min(n_ttft, n_tpot)}/{MIN_EVIDENCE} requests"
    # the fleet's fit with one target swapped for the seed's: what else the fleet's fit
    # carries (the routers' prompts) stays
    if use_ttft:
        return (dataclasses.replace(fleet, tpot=seed.tpot,
                                    num_tpot_samples=seed.num_tpot_samples),
                f"fleet TTFT model, {n_ttft} requests; seed TPOT, fleet has "
                f"{n_tpot}/{MIN_EVIDENCE}")
    return (dataclasses.replace(fleet, ttft=seed.ttft, num_ttft_samples=seed.num_ttft_samples),
            f"seed TTFT, fleet has {n_ttft}/{MIN_EVIDENCE}; fleet TPOT model, {n_tpot} "
            "requests")


def is_learned(fleet: RoleCoefficients | None, slo: SloTargets) -> bool:
    """Whether every target `slo` checks is predicted from the fleet's own fit."""
    if fleet is None:
        return False
    return ((slo.ttft_p90_s is None or fleet.num_ttft_samples >= MIN_EVIDENCE)
            and (slo.itl_p90_s is None or fleet.num_tpot_samples >= MIN_EVIDENCE))


@dataclass(frozen=True, slots=True)
class RoleLoad:
    """A role's offered load: requests/s, and per request its mean uncached prompt tokens,
    mean output tokens, and KV usage per running sequence on a replica."""

    request_rate: float
    uncached_prompt_tokens: float = 0.0
    output_tokens: float = 1.0
    kv_per_seq: float = 0.0
    burst_rate: float = 0.0  # the others' rate around a typical request, above the mean


def role_load(rs: RoleSignals, backlog_clear_s: float, role: str = "") -> RoleLoad:
    """The load a role's signals show: the known replicas' rates extrapolated to all, plus
    the queue (engines' waiting requests and the router's held ones) to be cleared within
    `backlog_clear_s`; token means per request over the window. A decode role computes no
    prompt (it arrives as KV from the prefill leg), so it has no uncached prompt tokens
    to queue behind, whatever its engines count as prompt tokens."""
    scale = rs.num_replicas / rs.num_known if rs.num_known else 0.0
    served = rs.request_rate
    backlog = rs.num_waiting * scale + rs.num_held_requests
    rate = served * scale + backlog / backlog_clear_s
    uncached = rs.uncached_prompt_tokens_per_s / served if served > 0 and role != "decode" \
        else 0.0
    output = rs.generation_tokens_per_s / served if served > 0 else 1.0
    per_replica_running = rs.num_running / rs.num_known if rs.num_known else 0.0
    kv_per_seq = rs.kv_usage_mean / per_replica_running if per_replica_running > 0 else 0.0
    return RoleLoad(rate, uncached, max(1.0, output), min(1.0, kv_per_seq),
                    rs.burst_rate * scale)


@dataclass(frozen=True, slots=True)
class Prediction:
    """What one replica of N would see; inf latencies when N cannot keep up."""

    num_replicas: int
    ttft_p90_s: float
    itl_p90_s: float
    utilization: float  # of the prefill server, decode's share included (rho)
    num_in_flight: float  # mean (L)
    num_queued_p: float  # queued ahead at the quantile

    @property
    def is_feasible(self) -> bool:
        return math.isfinite(self.ttft_p90_s) and math.isfinite(self.itl_p90_s)


def queue_quantile(rho: float, q: float) -> float:
    """M/M/1 requests queued ahead of an arrival at quantile q (continuous in rho)."""
    if rho <= 0:
        return 0.0
    if rho >= 1:
        return math.inf
    return max(0.0, math.log(1.0 - q) / math.log(rho) - 2.0)


def service_s(c: RoleCoefficients, load: RoleLoad) -> float:
    """What one queued request costs the prefill server: the mean uncached prompt's
    prefill by the model's per-ktoken slope."""
    return max(c.ttft[1] * load.uncached_prompt_tokens / 1000.0, MIN_SERVICE_S)


def decode_share_s(c: RoleCoefficients, load: RoleLoad) -> float:
    """GPU time a request's decode takes from the prompts of a replica that prefills what
    it decodes (unified): its O - 1 decode steps, each longer by the model's marginal step
    time per sequence in flight, kept >= 0. That is the slope of TPOT = v . [1, n, kv] in
    n with kv = n . kv_per_seq, v_n + v_kv . kv_per_seq: n and KV usage rise together, so
    a fit may put the cost on either (the local example pool's: v_n -48 us, v_kv 17 ms,
    a slope of +127 us per sequence where v_n alone said none). 0 on a role that prefills
    nothing (decode) and for a prefill leg's single token."""
    if load.uncached_prompt_tokens <= 0:
        return 0.0
    per_sequence = c.tpot[1] + c.tpot[2] * load.kv_per_seq
    return max(0.0, load.output_tokens - 1.0) * max(0.0, per_sequence)


def wait_per_running_s(c: RoleCoefficients, load: RoleLoad) -> float:
    """The model's marginal TTFT per request running beside a new one (w_r), within
    [0, service_s]: a running request shares the step's token budget and delays a new
    prompt by at most its own prefill. A prefill role's fit, where the requests running
    are the prompts being prefilled, said 0.30 s per running 1.8k-token prompt against
    its 65 ms prefill, so Little's law found no fixed point at 3.3 legs/s per replica
    (utilization 0.25) and one replica looked infeasible."""
    return min(max(0.0, c.ttft[4]), service_s(c, load))


def tail_prompt_tokens(c: RoleCoefficients, load: RoleLoad) -> float:
    """The uncached prompt a TTFT p90 is priced at: the routers' recent PROMPT_QUANTILE
    prompt (`RoleCoefficients.prompt`), the load's mean prompt where they export none."""
    ktokens = c.prompt_ktokens_at(PROMPT_QUANTILE)
    return 1000.0 * ktokens if ktokens is not None else load.uncached_prompt_tokens


def _ttft(c: RoleCoefficients, load: RoleLoad, num_queued: float, num_running: float,
          kv: float, prompt_tokens: float) -> float:
    """The model's TTFT of a request of `prompt_tokens` uncached tokens with nothing queued
    ahead beside `num_running` requests, plus the prefill of each of the `num_queued`
    ahead (the service time, at the mean prompt; not the fit's queue terms, see the
    module docstring)."""
    alone = max(FLOOR_S, dot(c.ttft, ttft_features(prompt_tokens, 0.0, 0.0, kv))
                + num_running * wait_per_running_s(c, load))
    return alone + num_queued * service_s(c, load)


def _in_flight(c: RoleCoefficients, load: RoleLoad, a: float, wq_mean: float) -> float:
    """Little's law fixed point L = a . (TTFT + (O - 1) . TPOT) at load L; inf if none."""
    decode_steps = max(0.0, load.output_tokens - 1.0)

    def excess(n: float) -> float:
        kv = min(1.0, n * load.kv_per_seq)
        ttft = _ttft(c, load, wq_mean, n, kv, load.uncached_prompt_tokens)
        tpot = max(FLOOR_S, dot(c.tpot, tpot_features(n + 1.0, kv)))
        return a * (ttft + decode_steps * tpot) - n

    if excess(MAX_IN_FLIGHT) > 0:
        return math.inf
    lo, hi = 0.0, MAX_IN_FLIGHT
    for _ in range(80):  # excess(lo) > 0 >= excess(hi)
        mid = (lo + hi) / 2
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


def predict(c: RoleCoefficients, load: RoleLoad, num_replicas: int,
            quantile: float = CHECK_QUANTILE
            ) -> Prediction:
    """The module docstring's queueing step for `load` over `num_replicas` replicas."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    a = (load.request_rate + load.burst_rate) / num_replicas
    service = service_s(c, load)
    rho = a * (service + decode_share_s(c, load))
    wq_p = queue_quantile(rho, quantile)
    if not math.isfinite(wq_p):
        return Prediction(num_replicas, math.inf, math.inf, rho, math.inf, math.inf)
    n = _in_flight(c, load, a, rho * rho / (1.0 - rho))
    if not math.isfinite(n):
        return Prediction(num_replicas, math.inf, math.inf, rho, math.inf, wq_p)
    kv = min(1.0, n * load.kv_per_seq)
    n_p = n + NormalDist().inv_cdf(quantile) * math.sqrt(n)
    kv_p = min(1.0, n_p * load.kv_per_seq)
    ttft = _ttft(c, load, wq_p, n, kv, tail_prompt_tokens(c, load))
    itl = max(FLOOR_S, dot(c.tpot, tpot_features(n_p + 1.0, kv_p)))
    if load.uncached_prompt_tokens > 0 and c.num_ttft_samples >= MIN_EVIDENCE:
        itl += prefill_stall_s(a * service, service, load.output_tokens, quantile)
    return Prediction(num_replicas, ttft, itl, rho, n, wq_p)


def prefill_stall_s(rho: float, service: float, output_tokens: float, q: float) -> float:
    """What prefill adds to a request's mean inter-token time at quantile q, on a replica
    that both prefills and decodes. A decode step that shares the engine's token budget
    with a prompt takes that prompt's prefill, so a request's decode is stalled by the
    prefill work queued while it decodes: M/M/1's work in queue, P(V > s) =
    rho . exp(-(1 - rho) s / S), spread over its d decode steps, d exponential with the
    mean (O - 1) (short answers take the whole stall over few tokens). Then
    P(V / d > x) = rho / (1 + (1 - rho) . d_mean . x / S), whose q-quantile is
    x = (rho / (1 - q) - 1) . S / ((1 - rho) . d_mean), 0 while rho <= 1 - q."""
    if rho <= 1.0 - q:
        return 0.0
    if rho >= 1.0:
        return math.inf
    steps = max(1.0, output_tokens - 1.0)
    return (rho / (1.0 - q) - 1.0) * service / ((1.0 - rho) * steps)


def meets(p: Prediction, slo: SloTargets) -> bool:
    keep = 1.0 - slo.headroom
    return p.is_feasible and all(
        target is None or value <= target * keep
        for value, target in ((p.ttft_p90_s, slo.ttft_p90_s), (p.itl_p90_s, slo.itl_p90_s)))


def _ms(s: float) -> str:
    return "inf" if not math.isfinite(s) else f"{s * 1000:.0f} ms"


def describe(p: Prediction, slo: SloTargets) -> str:
    parts = []
    keep = 1.0 - slo.headroom
    for name, value, target in (("TTFT p90", p.ttft_p90_s, slo.ttft_p90_s),
                                ("ITL", p.itl_p90_s, slo.itl_p90_s)):
        if target is not None:
            op = "<=" if value <= target * keep else ">"
            parts.append(f"{name} {_ms(value)} {op} {_ms(target * keep)}")
    return ", ".join(parts)


# A target that an idle replica already misses (a prompt whose prefill alone takes longer
# than the TTFT target) is out of scaling's reach: more replicas shorten the wait for a
# slot, not the prefill. Such a target is sized for the wait alone: the queue may add at
# most this share of the target (the share above which the observed-latency cap calls
# TTFT "queueing", `autoscaler.is_queueing`).
QUEUEING_SHARE = 0.1


def idle_prediction(c: RoleCoefficients, load: RoleLoad) -> Prediction:
    """What a request would see on a replica with nothing else queued or running: the
    least any replica count can reach."""
    ttft = _ttft(c, load, 0.0, 0.0, 0.0, tail_prompt_tokens(c, load))
    itl = max(FLOOR_S, dot(c.tpot, tpot_features(1.0, 0.0)))
    return Prediction(0, ttft, itl, 0.0, 0.0, 0.0)


def reachable(slo: SloTargets, idle: Prediction) -> tuple[SloTargets, list[str]]:
    """(`slo` with each target an idle replica misses relaxed to the idle prediction plus
    QUEUEING_SHARE of the target, before headroom; the names of the relaxed ones)."""
    keep = 1.0 - slo.headroom
    relaxed: dict[str, float] = {}
    for name, idle_value in (("ttft_p90_s", idle.ttft_p90_s), ("itl_p90_s", idle.itl_p90_s)):
        target = getattr(slo, name)
        if target is not None and idle_value > target * keep:
            relaxed[name] = (idle_value + QUEUEING_SHARE * target) / keep
    names = {"ttft_p90_s": "TTFT p90", "itl_p90_s": "ITL"}
    return dataclasses.replace(slo, **relaxed), [names[n] for n in relaxed]


def size(c: RoleCoefficients, load: RoleLoad, slo: SloTargets, max_replicas: int,
         role: str = "") -> tuple[int, str]:
    """(smallest replica count in 1..max_replicas whose prediction meets `slo`, reason).
    None meets: max_replicas + 1 (the clamp then says AtMaxReplicas), and the reason shows
    the prediction at max_replicas. No load: 0. A target an idle replica misses is sized
    for its queueing alone (`reachable`), and the reason says so."""
    if max_replicas < 1:
        raise ValueError(f"max_replicas must be >= 1, got {max_replicas}")
    what = f"{role} replicas" if role else "replicas"
    rate = f"{load.request_rate:.2f} req/s"
    if load.request_rate <= 0:
        return 0, f"0 {what}: no load"
    idle = idle_prediction(c, load)
    wanted, relaxed = reachable(slo, idle)
    bound = "" if not relaxed else (
        f" (an idle replica misses {' and '.join(relaxed)}, {describe(idle, slo)}: sized for "
        f"the queue, at most {QUEUEING_SHARE:.0%} of the target)")
    slo = wanted
    p = None
    for n in range(1, max_replicas + 1):
        p = predict(c, load, n, slo.quantile)
        if meets(p, slo):
            return n, f"{n} {what}: predicted {describe(p, slo)} at {rate}{bound}"
    assert p is not None
    return max_replicas + 1, (f"over {max_replicas} {what}: predicted {describe(p, slo)} "
                              f"at {rate} even at {max_replicas}{bound}")


def predicted_curve(c: RoleCoefficients, load: RoleLoad, counts: Sequence[int],
                    quantile: float = CHECK_QUANTILE) -> list[Prediction]:
    """Predictions at several counts (for docs, plots and tests)."""
    return [predict(c, load, n, quantile) for n in counts]
