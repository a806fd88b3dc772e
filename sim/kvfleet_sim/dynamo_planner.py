"""A Dynamo-style throughput planner, the simulator's `dynamo-planner` baseline. Pure, time
injected; the profile is measured once per pool, offline, from the pool's own engine.

What NVIDIA Dynamo's SLA planner does (ai-dynamo/dynamo, components/src/dynamo/planner:
`core/throughput_scaling.py`, `core/load/predictors.py`, `defaults.py`; docs "SLA-based
Planner"), and what this module does in its place:

* Pre-deployment profiling (`profile_sla`) sweeps the engine: prefill TTFT against input
  length, decode ITL against batch size and context length. Here `measure_profile(spec)`
  runs the pool's engine (`engine_sweep.py`: the real scheduler on the pool's cost profile,
  virtual clock) over the same two sweeps: prefill, k prompts of ISL tokens started
  together (k up to maxNumBatchedTokens / ISL); decode, b sequences at context C decoding
  together (b up to maxNumSeqs and the KV capacity).
* Every adjustment interval the planner observes the interval's request count, mean input
  (ISL) and output (OSL) lengths and the KV hit rate, and forecasts the next interval's with
  its load predictor. Dynamo's default predictor is auto-ARIMA (pmdarima), which needs an
  order search this repository does not carry; this module implements Dynamo's `kalman`
  predictor (a local-linear-trend Kalman filter, Dynamo's defaults q_level 1, q_trend 0.1,
  r 10, leading idle zeros skipped) and its `constant` one (next = last). The registered
  `dynamo-planner` uses `kalman`.
* Prefill replicas = max(ceil(demand rps / engine prefill rps), SLA floor, 1), where the
  engine prefill rps is the profile's best prompt throughput at the forecast *uncached* ISL
  (ISL x (1 - hit rate), as current Dynamo discounts) whose TTFT meets the target, divided
  by that ISL, and the SLA floor is ceil(idle TTFT at that ISL / target) when one prompt
  alone misses it.
* Decode replicas = max(ceil(demand rps / engine decode rps), 1), the engine decode rps
  being the profile's best decode tokens/s at context ISL + OSL / 2 whose ITL meets the
  target, divided by OSL.
* Unified pool (Dynamo's "agg" mode fits a joint model): a unified replica time-shares the
  two phases, so its rps is 1 / (1 / prefill rps + 1 / decode rps), i.e. replicas =
  ceil(prefill demand / prefill capacity + decode demand / decode capacity).
* The decision is applied directly, clamped to the pool's min (at least 1, Dynamo's
  min_endpoint) and max (Dynamo's GPU budget): no stabilization, no step limits, as Dynamo.

The adjustment interval is the pool's `autoscaling.windowSeconds` (Dynamo's default is
180 s): the stable Signals the loop hands every scaler cover exactly that window, and the
kvfleet, waiting-5 and kpa rows read the same window, so a comparison measures the rule.
TTFT and ITL targets are the pool's p90 targets, else the simulator's default SLOs. Dynamo
no longer applies its old correction factors (observed / expected mean TTFT and ITL); they
would need mean latencies, which `Signals` does not carry (it has p90s).

Signals used: request_rate, prompt_tokens_per_s, uncached_prompt_tokens_per_s,
generation_tokens_per_s (ISL = prompt / requests, OSL = generated / requests, counted at
the first token, so both are steady-state means over the window), and num_waiting plus
num_held_requests of the panic window: `Signals` has no arrival counter (Dynamo reads its
frontend's), and the first-token rate of a saturated fleet is its capacity, so arrivals are
taken as first tokens + the queue's growth over the interval (see `observe`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

from kvfleet_engine.runners.cost_model import load_profile
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.autoscaler import (
    LIMIT_MAX,
    LIMIT_MIN,
    Decision,
    History,
    RoleLimits,
    decision_reason,
)
from kvfleet_operator.decide.role_signals import Signals

from kvfleet_sim.engine_sweep import engine_config_for, profile_name, run_batch

# The simulator's SLOs when the pool sets no target (run.DEFAULT_TTFT_SLO_S / _ITL_SLO_S;
# a test keeps them equal; run.py imports this package, so it cannot be imported here).
DEFAULT_TTFT_SLO_S = 1.0
DEFAULT_ITL_SLO_S = 0.05
PREFILL_ISLS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DECODE_CONTEXTS = (256, 1024, 4096, 16384)
NUM_DECODE_STEPS = 8  # pure-decode steps timed per point
# Dynamo's Kalman predictor defaults (SLAPlannerDefaults).
KALMAN_Q_LEVEL, KALMAN_Q_TREND, KALMAN_R, KALMAN_P0 = 1.0, 0.1, 10.0, 1000.0
PREDICTORS = ("kalman", "constant")


# ---------------------------------------------------------------- the profile


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    isl: int
    batch: int  # prompts started together
    ttft_s: float  # until the last of them has its first token

    @property
    def tokens_per_s(self) -> float:
        return self.isl * self.batch / self.ttft_s


@dataclass(frozen=True, slots=True)
class DecodePoint:
    context: int
    batch: int  # sequences decoding together
    itl_s: float  # mean gap between tokens while all of them decode

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.itl_s


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear over sorted xs, held flat outside them."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True),
                                  strict=False):  # fmt: skip
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a profile needs prefill and decode points")

    def prefill_ttft_s(self, isl: float) -> float:
        """Idle TTFT of one prompt of `isl` uncached tokens."""
        ones = sorted((p.isl, p.ttft_s) for p in self.prefill if p.batch == 1)
        return _interpolate([float(i) for i, _ in ones], [t for _, t in ones], isl)

    def prefill_tokens_per_s(self, isl: float, ttft_target_s: float) -> float:
        """Best prompt tokens/s of one replica at `isl` whose TTFT meets the target (the
        one-prompt figure where none does)."""
        return _best_meeting([(p.isl, p.ttft_s, p.batch, p.tokens_per_s) for p in self.prefill],
                             isl, ttft_target_s)

    def decode_tokens_per_s(self, context: float, itl_target_s: float) -> float:
        """Best decode tokens/s of one replica at `context` whose ITL meets the target (the
        one-sequence figure where none does)."""
        return _best_meeting([(p.context, p.itl_s, p.batch, p.tokens_per_s)
                              for p in self.decode], context, itl_target_s)


def _best_meeting(points: list[tuple[float, float, int, float]], at: float,
                  target_s: float) -> float:
    """points: (level, latency, batch, tokens/s). Per level, the best tokens/s whose
    latency meets `target_s` (the smallest batch's where none does), interpolated at `at`."""
    levels = sorted({level for level, _, _, _ in points})
    best = []
    for level in levels:
        here = [p for p in points if p[0] == level]
        meeting = [tps for _, latency, _, tps in here if latency <= target_s]
        best.append(max(meeting) if meeting else min(here, key=lambda p: p[2])[3])
    return _interpolate([float(v) for v in levels], best, at)


def _powers_of_two_to(n: int) -> list[int]:
    out = [1]
    while out[-1] * 2 <= n:
        out.append(out[-1] * 2)
    return out if out[-1] == n else [*out, n]


@lru_cache(maxsize=8)
def _measure(profile: str, max_num_seqs: int, max_batched: int, max_model_len: int,
             num_blocks: int, block_size: int, kv_margin: float) -> EngineProfile:  # fmt: skip
    from kvfleet_engine.core.config import EngineConfig

    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_batched, max_model_len=max_model_len,
                          enable_prefix_caching=False)  # fmt: skip
    kv_tokens = int((num_blocks - 1) * block_size * (1 - kv_margin))
    prefill: list[PrefillPoint] = []
    for isl in PREFILL_ISLS:
        if isl + 1 > max_model_len:
            break
        for k in _powers_of_two_to(max(1, min(max_num_seqs, max_batched // isl))):
            if k * (isl + 1) > kv_tokens:
                break
            times = run_batch(config, profile, isl, k, 1)
            prefill.append(PrefillPoint(isl, k, max(t[0] for t in times)))
    decode: list[DecodePoint] = []
    for ctx in DECODE_CONTEXTS:
        if ctx + 1 > max_model_len:
            break
        for b in _powers_of_two_to(max_num_seqs):
            # long enough that every sequence is still decoding once the last prefill ends
            num_output = -(-b * ctx // max_batched) + NUM_DECODE_STEPS + 1
            if ctx + num_output > max_model_len or b * (ctx + num_output) > kv_tokens:
                break
            times = run_batch(config, profile, ctx, b, num_output)
            start = max(t[0] for t in times)
            end = min(t[-1] for t in times)
            steps = [t for t in times[0] if start < t <= end]
            if len(steps) < 2:
                continue
            decode.append(DecodePoint(ctx, b, (steps[-1] - steps[0]) / (len(steps) - 1)))
    return EngineProfile(tuple(prefill), tuple(decode))


def measure_profile(spec: PoolSpec) -> EngineProfile:
    """The pool's engine, swept offline (cached per engine configuration)."""
    name = profile_name(spec)
    config = engine_config_for(spec, load_profile(name).num_gpu_blocks)
    return _measure(name, config.max_num_seqs, config.max_num_batched_tokens,
                    config.max_model_len, config.num_blocks, config.block_size,
                    config.kv_safety_margin)  # fmt: skip


# ---------------------------------------------------------------- the load predictor


@dataclass(frozen=True, slots=True)
class Forecaster:
    """One series' predictor state (Dynamo's BasePredictor + Kalman/constant)."""

    kind: str = "kalman"
    is_started: bool = False  # a nonzero value was seen (leading idle zeros are skipped)
    last: float = 0.0
    level: float = 0.0
    trend: float = 0.0
    p: tuple[float, float, float, float] = (KALMAN_P0, 0.0, 0.0, KALMAN_P0)  # row-major 2x2

    def __post_init__(self) -> None:
        if self.kind not in PREDICTORS:
            raise ValueError(f"unknown load predictor {self.kind!r}; known: {PREDICTORS}")

    def observe(self, value: float) -> Forecaster:
        value = value if math.isfinite(value) else 0.0
        if value == 0 and not self.is_started:
            return self
        if self.kind == "constant" or not self.is_started:
            return dataclasses.replace(self, is_started=True, last=value, level=value, trend=0.0)
        # predict: x = F x, P = F P F' + Q, with F = [[1, 1], [0, 1]]
        lvl, trd = self.level + self.trend, self.trend
        a, b, c, d = self.p
        a, b, c, d = a + b + c + d + KALMAN_Q_LEVEL, b + d, c + d, d + KALMAN_Q_TREND
        # update with H = [1, 0]
        s = a + KALMAN_R
        k0, k1 = a / s, c / s
        resid = value - lvl
        p = (a - k0 * a, b - k0 * b, c - k1 * a, d - k1 * b)
        return dataclasses.replace(self, last=value, level=lvl + k0 * resid,
                                   trend=trd + k1 * resid, p=p)  # fmt: skip

    def forecast(self) -> float:
        """The next interval's value (never negative)."""
        if self.kind == "constant":
            return max(0.0, self.last)
        return max(0.0, self.level + self.trend) if self.is_started else 0.0


# ---------------------------------------------------------------- the planner


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    roles: dict[str, RoleLimits]
    profile: EngineProfile
    interval_s: float
    ttft_s: float
    itl_s: float
    predictor: str = "kalman"

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or not self.ttft_s > 0 or not self.itl_s > 0:
            raise ValueError("need interval_s, ttft_s and itl_s > 0")
        if self.predictor not in PREDICTORS:
            raise ValueError(f"unknown load predictor {self.predictor!r}; known: {PREDICTORS}")

    @classmethod
    def from_pool(cls, spec: PoolSpec, predictor: str = "kalman") -> PlannerConfig:
        t = spec.autoscaling.targets
        return cls(
            roles={n: RoleLimits(r.replicas.min, r.replicas.max)
                   for n, r in spec.topology.roles().items()},
            profile=measure_profile(spec),
            interval_s=float(spec.autoscaling.window_seconds),
            ttft_s=t.ttft_p90_seconds or DEFAULT_TTFT_SLO_S,
            itl_s=t.itl_p90_seconds or DEFAULT_ITL_SLO_S,
            predictor=predictor,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class PlannerState:
    next_at: float | None = None  # the next adjustment; None before the first call
    num_req: Forecaster = field(default_factory=Forecaster)  # requests per interval
    isl: Forecaster = field(default_factory=Forecaster)
    osl: Forecaster = field(default_factory=Forecaster)
    hit: Forecaster = field(default_factory=Forecaster)  # prefix-cache hit fraction
    num_queued: float = 0.0  # `queued` at the last adjustment
    desired: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    limited: dict[str, str | None] = field(default_factory=dict)  # the clamp that bit


@dataclass(frozen=True, slots=True)
class Observed:
    """One interval's traffic, as Dynamo's frontend metrics give it."""

    num_req: float
    isl: float | None  # None: no request finished its prefill in the interval
    osl: float | None
    hit: float | None


def queued(panic: Signals) -> float:
    """Requests waiting now (the short window): in the engines' queues (known replicas
    extrapolated to all) and held by the router."""
    total = 0.0
    held = 0
    for rs in panic.roles.values():
        scale = rs.num_replicas / rs.num_known if rs.num_known else 0.0
        total += rs.num_waiting * scale
        held = max(held, rs.num_held_requests)
    return total + held


def observe(stable: Signals, queue_growth: float = 0.0) -> Observed:
    """The interval's traffic from the stable window. Dynamo's frontend counts requests as
    they arrive; `Signals` counts them at their first token, which under saturation is what
    the fleet serves, not what arrives. So arrivals = first tokens + the queue's growth over
    the interval (`queue_growth`, from `queued`). Every request of a P/D pool has a decode
    leg, so the role with the most requests is the frontend's view; prefix hits are read
    where prompts are computed (the prefill role when it computed any)."""
    roles = stable.roles
    if not roles:
        return Observed(max(0.0, queue_growth), None, None, None)
    front = max(roles.values(), key=lambda rs: rs.request_rate)
    rate = front.request_rate
    num_req = max(0.0, rate * stable.window_s + queue_growth)
    if rate <= 0:
        return Observed(num_req, None, None, None)
    prefill = roles.get("prefill")
    computing = prefill if prefill is not None and prefill.prompt_tokens_per_s > 0 else front
    hit = None
    if computing.prompt_tokens_per_s > 0:
        hit = 1.0 - computing.uncached_prompt_tokens_per_s / computing.prompt_tokens_per_s
    return Observed(num_req, front.prompt_tokens_per_s / rate,
                    front.generation_tokens_per_s / rate, hit)  # fmt: skip


def replicas_needed(config: PlannerConfig, rps: float, isl: float, osl: float,
                    hit: float) -> dict[str, tuple[int, str]]:  # fmt: skip
    """Dynamo's throughput rule per role: (replicas before the clamps, why)."""
    prof = config.profile
    uncached = max(1.0, isl * (1.0 - min(1.0, max(0.0, hit))))
    p_tps = prof.prefill_tokens_per_s(uncached, config.ttft_s)
    idle_ttft = prof.prefill_ttft_s(uncached)
    sla_floor = math.ceil(idle_ttft / config.ttft_s - 1e-9) if idle_ttft > config.ttft_s else 1
    d_tps = prof.decode_tokens_per_s(isl + osl / 2, config.itl_s)
    p_load, d_load = rps * uncached / p_tps, rps * osl / d_tps  # replicas' worth of each phase
    load = (f"{rps:.2f} req/s, isl {isl:.0f} (uncached {uncached:.0f}), osl {osl:.0f}: "
            f"prefill {rps * uncached:.0f} / {p_tps:.0f} tok/s")  # fmt: skip
    out: dict[str, tuple[int, str]] = {}
    for role in config.roles:
        if role == "prefill":
            n, why = max(math.ceil(p_load - 1e-9), sla_floor), f"{load} = {p_load:.2f}"
        elif role == "decode":
            n = math.ceil(d_load - 1e-9)
            why = f"decode {rps * osl:.0f} / {d_tps:.0f} tok/s = {d_load:.2f}"
        else:
            n = max(math.ceil(p_load + d_load - 1e-9), sla_floor)
            why = f"{load} + decode {rps * osl:.0f} / {d_tps:.0f} tok/s = {p_load + d_load:.2f}"
        if sla_floor > 1 and role != "decode":
            why += f"; idle TTFT {idle_ttft:.2f}s > {config.ttft_s:g}s: floor {sla_floor}"
        out[role] = (max(n, 1), why)
    return out


def plan(stable: Signals, panic: Signals, current: dict[str, int], config: PlannerConfig,
         state: PlannerState, now: float) -> PlannerState:  # fmt: skip
    """One call of the planner. Between adjustments it holds its last decision."""
    if state.next_at is None:  # first call: the first interval starts now
        return dataclasses.replace(state, next_at=now + config.interval_s, desired=dict(current),
                                   num_queued=queued(panic),
                                   reasons={r: "waiting for the first interval"
                                            for r in config.roles})  # fmt: skip
    if now < state.next_at:
        return state
    num_queued = queued(panic)
    seen = observe(stable, num_queued - state.num_queued)
    num_req = state.num_req.observe(seen.num_req)
    isl = state.isl.observe(seen.isl) if seen.isl is not None else state.isl
    osl = state.osl.observe(seen.osl) if seen.osl is not None else state.osl
    hit = state.hit.observe(seen.hit) if seen.hit is not None else state.hit
    nxt = dataclasses.replace(state, next_at=now + config.interval_s, num_req=num_req, isl=isl,
                              osl=osl, hit=hit, num_queued=num_queued)  # fmt: skip
    rps = num_req.forecast() / config.interval_s
    if not isl.is_started or not osl.is_started:
        return dataclasses.replace(nxt, reasons={r: "no traffic seen yet" for r in config.roles})
    need = replicas_needed(config, rps, isl.forecast(), max(1.0, osl.forecast()),
                           hit.forecast())  # fmt: skip
    desired: dict[str, int] = {}
    reasons: dict[str, str] = {}
    limited: dict[str, str | None] = {}
    for role, (n, why) in need.items():
        lim = config.roles[role]
        desired[role] = min(max(n, lim.min_replicas, 1), lim.max_replicas)
        limited[role] = LIMIT_MAX if n > lim.max_replicas else \
            LIMIT_MIN if n < lim.min_replicas else None  # fmt: skip
        reasons[role] = f"forecast ({config.predictor}) {why}"
    return dataclasses.replace(nxt, desired=desired, reasons=reasons, limited=limited)


def as_decision(state: PlannerState, current: dict[str, int], config: PlannerConfig,
                history: History) -> Decision:  # fmt: skip
    """The planner's held decision as the control loop's Decision (History passes through:
    the planner's memory is its PlannerState)."""
    desired: dict[str, int] = {}
    reasons: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for role in config.roles:
        n = current.get(role, 0)
        target = state.desired.get(role, n)
        desired[role] = target
        verb = "scale up" if target > n else "scale down" if target < n else "steady"
        reasons[role] = f"{verb} {n}->{target}: {state.reasons.get(role, '')}"
        kinds[role] = decision_reason(n, target, is_panic=False)
    limited = {role: state.limited.get(role) for role in config.roles}
    return Decision(desired, reasons, limited, history, kinds)
