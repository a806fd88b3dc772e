"""The autoscaler: pure, time injected. Signals in, desired replicas per role out.

Public API:

- `AutoscalerConfig` / `RoleTargets` / `RoleLimits`: what the pool asks for (targets per
  signal, windows, steps, min/max). `config_from_pool(pool)` builds it from the
  InferencePool spec (see autoscaler_spec.py).
- `History`: what must survive a restart (recent recommendations per role, panic and idle
  timers, the learned prefill capacity, the last decisions). `to_dict`/`from_dict`.
- `decide(stable, panic, current, config, history, now) -> Decision`: `stable` and `panic`
  are `signals.Signals` over the long and the short window. Returns desired replicas per
  role, one reason string per role, the ScalingLimited reason per role (or None), and the
  *new* History (the input is not mutated).

How a role's count is chosen (each step is one small function below):
1. Demand. With an SLO (the pool sets `ttftP90Seconds` and/or `itlP90Seconds`:
   `RoleTargets.slo`), the SLO drives (`slo_demand`): the smallest count whose predicted
   TTFT p90 (at the load of now, queue included) and ITL (at the load forecast one
   start-up time ahead), from the routers' perf model, meet the targets with headroom
   (`slo_sizing.py`, `load_forecast.py`); the KV
   usage and running-per-replica targets and observed latency above target stay as caps
   (whichever asks for more wins), the waiting and prefill-capacity targets do not drive.
   Without an SLO, demand per configured target: ceil(total signal / per-replica
   target); the largest wins and names the reason. Prefill uses uncached prompt tokens/s
   (plus the queued backlog) over a per-replica capacity learned online (EWMA); decode
   uses KV occupancy and running sequences. Latency targets only push up (ratio
   observed/target, at most 2x, times the replicas the latency was measured on, never
   below the replicas asked for: latency above target never scales a role down), only
   while the short window's p90 is above target too (`latency_now`), and TTFT only while
   requests queue for a slot (`is_queueing`).
2. Panic: when the short-window demand is more than `panic_threshold` x the current
   replicas, scale up on it at once (no scale-up stabilization) and forbid scale-down
   until the panic has been quiet for the stable window. Below that, a scale-down never
   goes under what the short window asks for (its freshest evidence).
3. Stabilization: going up uses the lowest recommendation of the scale-up window (as the
   Kubernetes HPA); going down holds the p90 of the scale-down window's recommendations
   (`HOLD_QUANTILE`; the HPA holds the highest), so a count asked for over more than a
   tenth of the window holds and a burst of a few seconds does not hold its replicas for
   the whole window (on Azure code the highest held a forecast-doubled burst of 7
   unified replicas for 300 s where 4 served it), and the highest count that observed
   latency over target asked for (`History.observed_latency`): that is the model
   under-predicting this traffic, not a burst it sized for. Unless it was a burst: once
   the role's offered rate is below 1 / `BURST_RATIO` of the rate the count was set at,
   it holds in proportion, n x min(1, BURST_RATIO x rate now / rate then)
   (`held_for_load`); a count a burst's backlog set at 30 req/s no longer holds its
   replicas at 5 req/s. On a role that promises no ITL (`promises_itl`: a P/D prefill
   role, whose queue absorbs a recurrence within the TTFT budget) such counts stand in
   the window's p90 at what they hold, and rate then is the peak of the stable windows
   their latency was measured over (`load_forecast.recent_peak_rate`). With an SLO,
   the windows forget what was recommended before the role's sizing first read the
   fleet's own fit (`History.learned_since`): a cold start sized on the seed's prior
   does not hold its replicas for a whole scale-down window after the evidence is in.
4. Step limits per decision, then min/max clamps, then cooldowns; whichever bites (or a
   stabilization window holding a change back) is the ScalingLimited reason. A scale-down
   removes half the gap to its target, at least one replica and at most `max_step_down`
   (`scale_down_step`): far above its target after a burst a pool comes down in a few
   decisions, near it one replica at a time.
5. Unknown replicas (failed or stale scrapes) block scale-down; they are never idle.
   Traffic that stops is idle, not unknown: latency series with no new samples push
   nothing, so the role steps down to min (dynamo#6985 kept replicas for want of samples).
5a. Pending guard (aibrix's pending-replica guard, dynamo#14251): while replicas of a role
   have not been ready for longer than the pool's start-up time (`RoleSignals.
   num_pending_overdue`: no GPU free, an image pull stuck), scale-up holds at the count
   already asked for (they are part of `current`) with ScalingLimited `ReplicasPending`
   and a message naming them; scale-down still runs (victims: the stuck ones first). It
   lifts as soon as they are ready or gone.
6. Scale to zero (min 0) after `scale_to_zero_after_s` of idleness; 0 -> 1 as soon as the
   router holds a request or any demand appears.
7. Every decision that moves a role ends with `[on: ...]`: the series it was scaled on
   (`scaled_on`), vLLM's own names, and where the prefill backlog came from (kvfleet's
   gauge, derived from vLLM's series, or unknown: then the backlog term is left out and the
   reason says so, it is never read as 0).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvfleet_router.perf_model import RoleCoefficients

from kvfleet_operator.api.status import DecisionReason, Reason
from kvfleet_operator.decide.load_forecast import (
    ForecastState,
    forecast_rate,
    recent_peak_rate,
    record_rate,
    startup_of,
    track_startup,
)
from kvfleet_operator.decide.role_signals import (
    BACKLOG_EXPORTED,
    BACKLOG_UNKNOWN,
    RoleSignals,
    Signals,
)
from kvfleet_operator.decide.slo_sizing import (
    QUEUEING_SHARE,
    SloTargets,
    choose_coefficients,
    is_learned,
    role_load,
    seed_coefficients,
    size,
)

# ScalingLimited reasons: the API's condition reasons.
LIMIT_MAX = Reason.AT_MAX_REPLICAS
LIMIT_MIN = Reason.AT_MIN_REPLICAS
LIMIT_STEP_UP = Reason.STEP_LIMITED
LIMIT_STEP_DOWN = Reason.STEP_LIMITED


# The share of a scale-down window's recommendations at or below what it holds. The
# recommendations the observed-latency cap made hold at their highest instead: latency
# above target is the model under-predicting this traffic, not a burst it priced in (on
# Mooncake, 12k-token prompts, the model asked for 3-4 unified replicas where TTFT p90 was
# over target at 10-14; held at their p90 in an experiment, the cap's counts let the pool
# drain between firings: 62 scale events, the SLO met for 92.2% of requests, not 94.2%).
HOLD_QUANTILE = 0.9
# Unless the load they were set at was a burst: a count set at more than BURST_RATIO x the
# role's offered rate now holds in proportion (`held_for_load`). Held whole, 6 prefill
# replicas that a burst's backlog asked for at 30 req/s stayed up for the window at 5 req/s
# where 2 served it (bench/sim_policies.md, Azure code, P/D, start-up 10 s, before and
# after faefcf4). Shed in proportion at any ratio (commit 189b8c5), the cap's counts on
# Mooncake, set at the rate's peaks, fell with its ordinary ebb and fewer requests met the
# SLO (its autoscaler rows, router seeds 0-2). 2 is the panic threshold's default: the
# same "twice the load" that marks a burst there.
BURST_RATIO = 2.0
LATENCY_CAPS = ("ttft p90", "itl p90")  # the names `demand` gives the observed-latency cap


@dataclass(slots=True)
class RoleTargets:
    """Per-replica targets; None switches a signal off. Each is 'what one replica holds'."""

    num_waiting: float | None = None  # queued requests per replica
    num_running: float | None = None  # running + waiting sequences per replica (concurrency)
    kv_usage: float | None = None  # mean KV occupancy fraction
    prefill_utilization: float | None = None  # fraction of learned prefill capacity to use
    ttft_p90_s: float | None = None
    itl_p90_s: float | None = None
    slo: SloTargets | None = None  # set: the SLO drives (slo_sizing.py), the rest are caps

    def __post_init__(self) -> None:
        for name in ("num_waiting", "num_running", "ttft_p90_s", "itl_p90_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"target {name} must be > 0, got {v}")
        for name in ("kv_usage", "prefill_utilization"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= 1:
                raise ValueError(f"target {name} must be in (0, 1], got {v}")


@dataclass(slots=True)
class RoleLimits:
    min_replicas: int
    max_replicas: int

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < 1 or self.min_replicas > self.max_replicas:
            raise ValueError(
                f"need 0 <= min <= max and max >= 1, got {self.min_replicas}..{self.max_replicas}"
            )


@dataclass(slots=True)
class AutoscalerConfig:
    roles: dict[str, RoleLimits]
    targets: dict[str, RoleTargets]
    is_enabled: bool = True
    stable_window_s: float = 60.0  # signals window for the normal decision
    panic_window_s: float = 6.0  # signals window for the panic check
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    # the share of the scale-down window's recommendations at or below what it holds
    # (`held`); 1.0 is the HPA's highest (the KEDA baseline in the simulator)
    hold_quantile: float = HOLD_QUANTILE
    scale_up_cooldown_s: float = 0.0  # min time between two scale-ups of a role
    scale_down_cooldown_s: float = 0.0  # min time after any scale event before a scale-down
    panic_threshold: float = 2.0
    # a scale-down stops at what the short (panic) window asks for; off is the HPA's
    # behaviour (the KEDA baseline in the simulator)
    holds_short_window: bool = True
    max_step_up: int = 4
    max_step_down: int = 4
    # a scale-down removes half the gap to its target (`scale_down_step`); off, the whole
    # gap up to max_step_down, as the HPA does (the KEDA baseline in the simulator)
    halves_scale_down: bool = True
    scale_to_zero_after_s: float = 300.0
    prefill_tokens_per_s_initial: float = 20000.0  # per replica, before anything is learned
    prefill_capacity_alpha: float = 0.2  # EWMA weight of a new observation
    backlog_clear_s: float = 10.0  # queued prompt tokens should clear within this
    num_history_decisions: int = 20
    # SLO sizing: perf-model weights per role before the fleet's own have evidence, and
    # the start-up time assumed (forecast horizon) before one is measured.
    perf_seed: dict[str, RoleCoefficients] = field(default_factory=dict)
    startup_s_initial: float = 30.0

    def __post_init__(self) -> None:
        if set(self.targets) - set(self.roles):
            raise ValueError(
                f"targets for unknown roles: {sorted(set(self.targets) - set(self.roles))}"
            )
        for name in (
            "scale_up_window_s",
            "scale_down_window_s",
            "scale_up_cooldown_s",
            "scale_down_cooldown_s",
            "scale_to_zero_after_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError("need 0 < panic_window_s <= stable_window_s")
        if not 0 < self.hold_quantile <= 1:
            raise ValueError("hold_quantile must be in (0, 1]")
        if self.panic_threshold < 1:
            raise ValueError("panic_threshold must be >= 1")
        if self.max_step_up < 1 or self.max_step_down < 1:
            raise ValueError("max steps must be >= 1")
        if self.prefill_tokens_per_s_initial <= 0 or not 0 < self.prefill_capacity_alpha <= 1:
            raise ValueError("prefill capacity must be > 0 and alpha in (0, 1]")


@dataclass(slots=True)
class History:
    """Autoscaler memory; plain JSON via to_dict/from_dict so it survives restarts."""

    recommendations: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    panic_until: dict[str, float] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    prefill_tokens_per_s: float | None = None  # learned per-replica prefill capacity
    last_scale_up: dict[str, float] = field(default_factory=dict)
    last_scale_down: dict[str, float] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    forecast: ForecastState = field(default_factory=ForecastState)  # rates, start-up times
    # role -> when its SLO sizing first read the fleet's own fit for every target it
    # checks; recommendations made before, on the seed, no longer hold a scale-down.
    learned_since: dict[str, float] = field(default_factory=dict)
    # role -> (t, count, offered req/s then) of the recommendations that observed latency
    # above target set; a scale-down holds their highest, scaled by the load, for the whole
    # window. A rate of 0 (state written before the rate was kept) holds the count whole.
    observed_latency: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["recommendations"] = {r: [list(p) for p in v] for r, v in self.recommendations.items()}
        d["observed_latency"] = {r: [list(p) for p in v]
                                 for r, v in self.observed_latency.items()}
        d["forecast"] = self.forecast.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: Any) -> History:
        """Rebuild from `to_dict` output; raises ValueError naming what is malformed."""
        if not isinstance(data, dict):
            raise ValueError("autoscaler history must be an object")
        try:
            recs = {
                str(r): [(float(t), int(n)) for t, n in v]
                for r, v in (data.get("recommendations") or {}).items()
            }
            panic = {str(k): float(v) for k, v in (data.get("panic_until") or {}).items()}
            idle = {str(k): float(v) for k, v in (data.get("idle_since") or {}).items()}
            cap = data.get("prefill_tokens_per_s")
            ups = {str(k): float(v) for k, v in (data.get("last_scale_up") or {}).items()}
            downs = {str(k): float(v) for k, v in (data.get("last_scale_down") or {}).items()}
            decisions = list(data.get("decisions") or [])
            forecast = ForecastState.from_dict(data.get("forecast"))
            learned = {str(k): float(v) for k, v in (data.get("learned_since") or {}).items()}
            observed = {
                str(r): [_observed_entry(p) for p in v]
                for r, v in (data.get("observed_latency") or {}).items()
            }
            return cls(
                recs, panic, idle, None if cap is None else float(cap), ups, downs, decisions,
                forecast, learned, observed,
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed autoscaler history: {exc}") from None


def _observed_entry(p: Sequence[Any]) -> tuple[float, int, float]:
    """One `History.observed_latency` entry from JSON: [t, n, rate], or [t, n] as written
    before the rate was kept (rate 0: held whole)."""
    if len(p) not in (2, 3):
        raise ValueError(f"observed-latency entry {list(p)!r} is not [t, n, rate]")
    return float(p[0]), int(p[1]), float(p[2]) if len(p) == 3 else 0.0


@dataclass(slots=True)
class Decision:
    desired: dict[str, int]
    reasons: dict[str, str]
    limited: dict[str, str | None]  # ScalingLimited reason per role, None when within range
    history: History
    kinds: dict[str, str] = field(default_factory=dict)  # DecisionReason per role, "" = steady
    details: dict[str, str] = field(default_factory=dict)  # the ScalingLimited message, if any

    @property
    def reason(self) -> str:
        return "; ".join(f"{role}: {text}" for role, text in self.reasons.items())

    @property
    def is_changed(self) -> bool:
        return any(self.reasons[r].startswith(("scale up", "scale down")) for r in self.reasons)


def demand(
    rs: RoleSignals,
    targets: RoleTargets,
    current: int,
    prefill_capacity: float,
    backlog_clear_s: float,
) -> tuple[float, str]:
    """(replicas wanted, which signal) for one role; the largest demand wins."""
    n = max(current, 1)
    # Totals from known replicas, extrapolated to all of them (unknown ones look alike).
    scale = rs.num_replicas / rs.num_known if rs.num_known else 0.0
    candidates: list[tuple[float, str]] = [(0.0, "no demand")]
    # Requests the router holds (no replica, or all saturated) are queued demand too.
    held = rs.num_held_requests
    if targets.num_waiting is not None:
        w = rs.num_waiting * scale + held
        candidates.append((w / targets.num_waiting, f"waiting {w:.1f} / {targets.num_waiting:g}"))
    if targets.num_running is not None:
        r = (rs.num_running + rs.num_waiting) * scale + held
        candidates.append((r / targets.num_running, f"running {r:.1f} / {targets.num_running:g}"))
    if targets.kv_usage is not None:
        kv = rs.kv_usage_mean * rs.num_known * scale
        candidates.append(
            (kv / targets.kv_usage, f"kv {rs.kv_usage_mean:.2f} x{n} / {targets.kv_usage:g}")
        )
    if targets.prefill_utilization is not None:
        backlog = rs.num_waiting_prompt_tokens
        tps = rs.uncached_prompt_tokens_per_s * scale
        if backlog is not None:
            tps += backlog * scale / backlog_clear_s
        per_replica = prefill_capacity * targets.prefill_utilization
        note = " (backlog unknown)" if backlog is None and rs.num_known else ""
        candidates.append(
            (tps / per_replica, f"prefill {tps:.0f} tok/s / {per_replica:.0f}{note}")
        )
    for name, observed, target in latency_over(rs, targets):
        # Latency is not linear in replicas: push up by the ratio, at most 2x per look,
        # from the replicas it was observed on: those still starting are already asked
        # for, and doubling them at every look while a burst waits out a long start-up
        # took a unified pool from 4 to 16 in 15 s (Azure code, start-up 120 s). This
        # asks for no fewer than what is asked for (`_decide_role` holds the count while
        # latency is over target), but records only what it measured: held for a whole
        # scale-down window, "what is asked for" kept 14 unified replicas for 300 s after a
        # burst that 4 served (Azure code, start-up 120 s).
        measured = rs.num_known or current
        candidates.append((measured * min(observed / target, 2.0),
                           f"{name} {observed * 1000:.0f}ms > {target * 1000:.0f}ms"))
    return max(candidates, key=lambda c: c[0])


def latency_over(rs: RoleSignals, targets: RoleTargets) -> list[tuple[str, float, float]]:
    """(name, observed p90, target) of each latency target `rs` is over. More replicas
    shorten the wait for a slot, not a prefill: TTFT above target with requests scheduled
    at once is the prompts' own length (`is_queueing`), and does not count."""
    ttft_target = targets.ttft_p90_s
    if ttft_target is not None and not is_queueing(rs, ttft_target):
        ttft_target = None
    return [(name, observed, target) for name, observed, target in (
        (LATENCY_CAPS[0], rs.ttft_p90_s, ttft_target),
        (LATENCY_CAPS[1], rs.itl_p90_s, targets.itl_p90_s),
    ) if target is not None and observed is not None and observed > target]


def is_queueing(rs: RoleSignals, ttft_target_s: float) -> bool:
    """Whether requests wait to be scheduled long enough to matter: TTFT above target says
    "too few replicas" only while the queue-time p90 (vllm:request_queue_time_seconds) is
    at least QUEUEING_SHARE of the target, the share the SLO sizing leaves the queue where
    prompts alone miss the target. Unknown (an engine without the queue-time histogram, or
    no request finished) counts as queueing, the rule before this signal."""
    q = rs.queue_time_p90_s
    return q is None or q >= QUEUEING_SHARE * ttft_target_s


def latency_now(stable: RoleSignals, panic: RoleSignals) -> RoleSignals:
    """`stable` with each latency p90 no higher than the short window's, where that has
    one: the observed-latency cap acts on latency above target now. The long window still
    holds a burst's first seconds after the short one shows it served, and pushing on it
    added prefill replicas that the scale-down window then held (Azure code, P/D; commit
    1d05a4f). The queue time takes the higher of the two: a queue of the last seconds,
    diluted in the long window's p90, still says the fleet is short now (read from the
    long window alone, a unified pool on long-prompt traffic shrank further and met the
    SLO for 0.8 point fewer requests: Mooncake, start-up 10 s)."""
    def now(pick: Callable[[float, float], float], long_p90: float | None,
            short_p90: float | None) -> float | None:
        return pick(long_p90, short_p90) if long_p90 is not None and short_p90 is not None \
            else long_p90

    # a short window with no request finished has only the per-gap ITL: not comparable
    panic_itl = panic.itl_p90_s if panic.is_itl_per_request == stable.is_itl_per_request \
        else None  # fmt: skip
    ttft, itl, queue = (now(min, stable.ttft_p90_s, panic.ttft_p90_s),
                        now(min, stable.itl_p90_s, panic_itl),
                        now(max, stable.queue_time_p90_s, panic.queue_time_p90_s))
    if (ttft, itl, queue) == (stable.ttft_p90_s, stable.itl_p90_s, stable.queue_time_p90_s):
        return stable
    return dataclasses.replace(stable, ttft_p90_s=ttft, itl_p90_s=itl, queue_time_p90_s=queue)


SLO_CAPS_NOTE = "caps: kv usage, running per replica, observed latency"


def slo_caps(targets: RoleTargets) -> RoleTargets:
    """What still bounds an SLO-driven role: memory (KV usage) and concurrency the perf
    model does not see, and observed latency above target (a model that under-predicts)."""
    return RoleTargets(num_running=targets.num_running, kv_usage=targets.kv_usage,
                       ttft_p90_s=targets.ttft_p90_s, itl_p90_s=targets.itl_p90_s)


def slo_demand(
    role: str,
    rs: RoleSignals,
    slo: SloTargets,
    max_replicas: int,
    config: AutoscalerConfig,
    forecast: ForecastState | None,
    now: float,
) -> tuple[float, str]:
    """(replicas, reason) that meet `slo` for the role's load: the TTFT target at the load
    of now, the ITL target at the load forecast one start-up time ahead when `forecast` is
    given (and this window's rate recorded in it).

    Why only ITL looks ahead: a burst that outruns the replicas still starting waits in
    the prefill queue, which the TTFT budget absorbs and `role_load` already sizes for (the
    backlog term); a decode step that carries a burst's prompt stalls every stream on the
    replica at once, and no ITL budget absorbs that. Sized ahead, a P/D prefill role held
    a forecast's doubled burst for the whole scale-down window (Azure code; commit
    7bf4951 gives the commands and figures)."""
    seed = config.perf_seed.get(role) or seed_coefficients()
    weights, source = choose_coefficients(rs.perf, seed)
    load = role_load(rs, config.backlog_clear_s, role)
    ahead, ahead_load = "", load
    if forecast is not None:
        record_rate(forecast, role, now, load.request_rate, config.stable_window_s)
        horizon = startup_of(forecast, role, config.startup_s_initial)
        rate = forecast_rate(forecast, role, now, load.request_rate, horizon)
        if rate > load.request_rate:
            ahead = f", forecast {horizon:.0f}s ahead from {load.request_rate:.2f} req/s"
            ahead_load = dataclasses.replace(load, request_rate=rate)
    checks: list[tuple[int, str]] = []
    if slo.ttft_p90_s is not None:
        checks.append(size(weights, load, dataclasses.replace(slo, itl_p90_s=None),
                           max_replicas, role))
    if slo.itl_p90_s is not None:
        n_itl, why_itl = size(weights, ahead_load, dataclasses.replace(slo, ttft_p90_s=None),
                              max_replicas, role)
        checks.append((n_itl, why_itl + ahead))
    if not checks:  # an SLO without targets: nothing to size for
        return 0.0, f"slo: no target ({source})"
    n, why = max(checks, key=lambda c: c[0])  # the first (TTFT) on a tie
    return float(n), f"slo: {why} ({source})"


def scaled_on(rs: RoleSignals, targets: RoleTargets) -> list[str]:
    """The series a role's targets read (vLLM v1 names; kvfleet engines export the same),
    with the prefill backlog's source."""
    out: list[str] = []
    if targets.slo is not None:
        out.append("kvfleet_router_perf_model_coefficient")
        out.append("vllm:time_to_first_token_seconds count, vllm:prompt_tokens_total - "
                   "vllm:prefix_cache_hits_total, vllm:generation_tokens_total (rates)")
        targets = slo_caps(targets)
    if targets.num_waiting is not None:
        out.append("vllm:num_requests_waiting")
    if targets.num_running is not None:
        out.append("vllm:num_requests_running")
    if targets.kv_usage is not None:
        out.append("vllm:kv_cache_usage_perc")
    if targets.prefill_utilization is not None:
        out.append("vllm:prompt_tokens_total - vllm:prefix_cache_hits_total (rate)")
        if rs.backlog_from == BACKLOG_EXPORTED:
            out.append(BACKLOG_EXPORTED)
        elif rs.backlog_from == BACKLOG_UNKNOWN:
            out.append("backlog " + BACKLOG_UNKNOWN)
        elif rs.backlog_from:
            out.append("backlog " + rs.backlog_from)
    if targets.ttft_p90_s is not None:
        out.append("vllm:time_to_first_token_seconds p90")
    if targets.itl_p90_s is not None:
        out.append("vllm:request_time_per_output_token_seconds p90" if rs.is_itl_per_request
                   else "vllm:inter_token_latency_seconds p90")
    return out


def learn_prefill_capacity(
    rs: RoleSignals, previous: float | None, config: AutoscalerConfig
) -> float:
    """EWMA of observed per-replica uncached prefill tokens/s, learned only while saturated
    (a queue exists) or when a replica is seen doing more than believed."""
    cap = previous if previous is not None else config.prefill_tokens_per_s_initial
    if rs.num_known == 0 or rs.uncached_prompt_tokens_per_s <= 0:
        return cap
    observed = rs.uncached_prompt_tokens_per_s / rs.num_known
    is_saturated = rs.num_waiting / rs.num_known >= 1.0
    if is_saturated or observed > cap:
        a = config.prefill_capacity_alpha
        cap = a * observed + (1 - a) * cap
    return cap


# On a role that promises no ITL (a P/D pool's prefill role), a burst that recurs while
# replicas start waits in the queue, within the TTFT budget (the reason `slo_demand` sizes
# TTFT at the load of now): there the queue absorbs, and what a latency-set count holds in
# proportion is what it stands for in the window's p90 too, against the peak rate of the
# window its latency was measured over (`recent_peak_rate`). A burst's TTFT p90 lags it,
# so the cap fires after the rate has fallen: held whole in the p90, and recorded at the
# rate after the burst, those counts kept the prefill role at 4 replicas for most of a
# window where 2 served it (Azure code from 900 s, P/D, start-up 10 s: 3,188 replica-s,
# 2,642 since, 100% met both ways; bench/sim_policies.md). Where a role promises ITL, a
# recurrence stalls every running stream at once while replicas start: its counts hold
# whole as before. Shed there too (an uncommitted experiment), `examples/local-sim.yaml`
# (unified) dropped to 2 replicas in a lull of Azure code before the next burst, and more
# requests missed the SLO.
def promises_itl(targets: RoleTargets) -> bool:
    """Whether the role is held to an ITL target (an SLO's or a per-replica cap's)."""
    return targets.itl_p90_s is not None or (
        targets.slo is not None and targets.slo.itl_p90_s is not None)


def held_for_load(count: int, rate_then: float, rate_now: float) -> int:
    """What a count that latency over target asked for at `rate_then` req/s holds at
    `rate_now`: whole while the rate is within BURST_RATIO of it, then in proportion (the
    same replicas per request, at BURST_RATIO x the rate now); never more than it asked
    for. Unknown `rate_then` (<= 0) holds it whole."""
    if rate_then <= 0:
        return count
    return math.ceil(count * min(1.0, BURST_RATIO * max(0.0, rate_now) / rate_then) - 1e-9)


def _stabilize(
    raw: int,
    current: int,
    recs: list[tuple[float, int]],
    observed: list[tuple[float, int, float]],
    rate_now: float,
    now: float,
    config: AutoscalerConfig,
    is_panic: bool,
    queue_absorbs: bool = False,
) -> int:
    """Up takes the scale-up window's minimum (as the HPA); down holds the scale-down
    window's HOLD_QUANTILE, and the highest count set by latency observed above target
    (`observed`, a subset of `recs`), shed in proportion after a burst (`held_for_load`).
    Where the queue absorbs a recurrence (`queue_absorbs`), those counts stand in the
    window at what they hold for the load now, not whole."""
    if raw > current:
        if is_panic or config.scale_up_window_s == 0:
            return raw
        window = [n for t, n in recs if t >= now - config.scale_up_window_s]
        return max(current, min(window, default=raw))
    if raw < current:
        start = now - config.scale_down_window_s
        shed = {t: held_for_load(n, rate, rate_now) for t, n, rate in observed if t >= start}
        window = [shed.get(t, n) if queue_absorbs else n for t, n in recs if t >= start]
        seen = max(shed.values(), default=0)
        return min(current, max(raw, held(window, config.hold_quantile), seen))
    return current


def held(recommendations: Sequence[int], quantile: float = HOLD_QUANTILE) -> int:
    """The nearest-rank `quantile` of `recommendations` (0 when there are none): the
    smallest count that at least that share of them are at or below."""
    if not recommendations:
        return 0
    ranked = sorted(recommendations)
    return ranked[max(0, math.ceil(quantile * len(ranked) - 1e-9) - 1)]


def _decide_role(
    role: str,
    stable: RoleSignals,
    panic: RoleSignals,
    current: int,
    config: AutoscalerConfig,
    hist: History,
    now: float,
) -> tuple[int, str, str | None, str]:
    """(target, message, ScalingLimited reason or None, decision reason or "")."""
    limits = config.roles[role]
    targets = config.targets.get(role, RoleTargets())
    cap = hist.prefill_tokens_per_s or config.prefill_tokens_per_s_initial
    # What the signals are read against (with an SLO, only the caps) and the latency now.
    signal_targets = targets if targets.slo is None else slo_caps(targets)
    stable_now = latency_now(stable, panic)
    if targets.slo is None:
        want, why = demand(stable_now, targets, current, cap, config.backlog_clear_s)
        want_panic, why_panic = demand(panic, targets, current, cap, config.backlog_clear_s)
    else:  # the SLO drives; the caps (signal_targets) push up only when they ask for more
        want, why = max(
            slo_demand(role, stable, targets.slo, limits.max_replicas, config,
                       hist.forecast, now),
            demand(stable_now, signal_targets, current, cap, config.backlog_clear_s),
            key=lambda c: c[0])
        panic_perf = panic if panic.perf is not None else dataclasses.replace(
            panic, perf=stable.perf)
        want_panic, why_panic = max(
            slo_demand(role, panic_perf, targets.slo, limits.max_replicas, config, None, now),
            demand(panic, signal_targets, current, cap, config.backlog_clear_s),
            key=lambda c: c[0])
    raw = math.ceil(want - 1e-9)
    # Panic: the short window says demand is well above what we run now.
    if current > 0 and want_panic > config.panic_threshold * current:
        hist.panic_until[role] = now + config.stable_window_s
    is_panic = hist.panic_until.get(role, -math.inf) > now
    is_panic_demand = is_panic and want_panic > want
    if is_panic_demand:
        raw, why = math.ceil(want_panic - 1e-9), f"panic: {why_panic}"
    held = max(stable.num_held_requests, panic.num_held_requests)
    # Idle timer for scale to zero: any unknown replica or any work resets it.
    if stable.is_idle and panic.is_idle and current > 0:
        hist.idle_since.setdefault(role, now)
    else:
        hist.idle_since.pop(role, None)
    if targets.slo is not None and role not in hist.learned_since and is_learned(
            stable.perf, targets.slo):
        hist.learned_since[role] = now
    since = max(now - max(config.scale_up_window_s, config.scale_down_window_s),
                hist.learned_since.get(role, -math.inf))
    recs = [(t, n) for t, n in hist.recommendations.get(role, []) if t >= since]
    floor = 1 if limits.min_replicas == 0 else limits.min_replicas
    rec = max(raw, floor)  # below `floor` only through the idle timer
    recs.append((now, rec))
    hist.recommendations[role] = recs
    rate_now = role_load(stable, config.backlog_clear_s, role).request_rate
    observed = [o for o in hist.observed_latency.get(role, []) if o[0] >= since]
    queue_absorbs = not promises_itl(targets)
    if why.removeprefix("panic: ").startswith(LATENCY_CAPS):
        # The latency was measured over the stable window: on a role whose queue absorbs a
        # recurrence, the load it was served at is that window's peak, not the rate after
        # the burst has left it (`promises_itl` says why).
        rate_then = rate_now if not queue_absorbs else max(
            rate_now, recent_peak_rate(hist.forecast, role, now, config.stable_window_s))
        observed.append((now, rec, rate_then))
    hist.observed_latency[role] = observed
    target = _stabilize(rec, current, recs, observed, rate_now, now, config, is_panic,
                        queue_absorbs)
    short = math.ceil(want_panic - 1e-9)
    if config.holds_short_window and short > target < current:
        # A scale-down never goes below what the short window asks for: it is the
        # freshest evidence, and a replica shed against it comes back a start-up later.
        # Against the stable window's mean alone, the local example pool stepped from 2
        # replicas to 1 while its short window asked for 2, and 76 of the 187 requests of
        # the next 10 s missed the TTFT target before a new replica was up (Azure
        # conversation from 3,000 s: 96.3% met at 380 replica-s, 100% at 348 since;
        # docs/operator.md gives the commands).
        target = min(current, short)
        said = f"the last {config.panic_window_s:.0f}s ask for {short}"
        why = f"hold: {said} ({why})" if target == current else f"{said} ({why})"
    is_stabilizing = target == current != rec
    unknown = stable.num_unknown + panic.num_unknown
    over = latency_over(stable_now, signal_targets)
    if target < current and over and not (unknown or is_panic):
        # Latency over target is no reason to shed replicas: measured x ratio alone, with
        # 1 of 12 prefill replicas up, cancelled the 11 still starting one by one while
        # TTFT p90 rose to 76 s (Mooncake, P/D, start-up 120 s).
        name, seen_s, limit_s = over[0]
        said = f"{name} {seen_s * 1000:.0f}ms > {limit_s * 1000:.0f}ms"
        target, why = current, f"hold: {why}" if why.startswith(said) else f"hold: {said} ({why})"
    if target < current and (unknown or is_panic):
        target, why = (
            current,
            ("hold: replica signals unknown" if unknown else f"hold: panic ({why_panic})"),
        )
    idle_for = now - hist.idle_since.get(role, now)
    is_idle_long = role in hist.idle_since and idle_for >= config.scale_to_zero_after_s
    if limits.min_replicas == 0 and current > 0 and is_idle_long:
        target, why = 0, f"idle {idle_for:.0f}s (to zero)"
    if current == 0:
        if not (held or raw > 0 or limits.min_replicas > 0):
            return 0, "idle at zero", None, ""
        target = max(1, rec)
        why = f"activate: {held} held request(s)" if held else why
    target, limited = _limit(target, current, raw, limits, config)
    if limited is None and is_stabilizing and current > 0:
        limited = Reason.STABILIZING  # the window holds back a change the signals ask for
    if target > current > 0 and stable.num_pending_overdue:
        # Replicas asked for earlier never came up: more of them would wait the same way.
        target, why, limited = current, f"hold: {pending_detail(role, stable)} ({why})", (
            Reason.REPLICAS_PENDING
        )
    # Cooldowns: activation from zero never waits.
    if (
        target > current > 0
        and now - hist.last_scale_up.get(role, -math.inf) < config.scale_up_cooldown_s
    ):
        target, why, limited = current, f"hold: scale-up cooldown ({why})", Reason.COOLDOWN
    last_event = max(
        hist.last_scale_up.get(role, -math.inf), hist.last_scale_down.get(role, -math.inf)
    )
    if target < current and now - last_event < config.scale_down_cooldown_s:
        target, why, limited = current, f"hold: scale-down cooldown ({why})", Reason.COOLDOWN
    if target > current:
        hist.last_scale_up[role] = now
    elif target < current:
        hist.last_scale_down[role] = now
    verb = "scale up" if target > current else "scale down" if target < current else "steady"
    on = scaled_on(stable, targets)
    suffix = f" [on: {'; '.join(on)}]" if on else ""
    return target, f"{verb} {current}->{target}: {why}{suffix}", limited, decision_reason(
        current, target, is_panic_demand
    )


def pending_detail(role: str, rs: RoleSignals) -> str:
    """The ScalingLimited message of the pending guard, e.g. '2 prefill replicas not ready
    for 300s (start-up allowance 240s)'."""
    n = rs.num_pending_overdue
    return (
        f"{n} {role} replica{'s' if n != 1 else ''} not ready for {rs.pending_for_s:.0f}s"
        f" (start-up allowance {rs.pending_after_s:.0f}s)"
    )


def decision_reason(current: int, target: int, is_panic: bool) -> str:
    """The named reason of a scale decision (status and events), "" when nothing moves."""
    if target == current:
        return ""
    if target == 0:
        return DecisionReason.SCALED_TO_ZERO
    if current == 0:
        return DecisionReason.ACTIVATED_FROM_ZERO
    if target < current:
        return DecisionReason.SCALING_DOWN
    return DecisionReason.PANIC_SCALE_UP if is_panic else DecisionReason.SCALING_UP


def scale_down_step(current: int, target: int, config: AutoscalerConfig) -> int:
    """The most replicas one scale-down may remove: half the gap to its target (at least
    one), within `max_step_down` (`halves_scale_down`; off: max_step_down). Far above its
    target a pool comes down in a few decisions; near it, one replica at a time, since a
    gap of one or two is within what the next burst asks for. With one replica per
    decision and cooldown the pool spent most of a window coming down from a burst; with
    the whole gap per decision it met the next burst a replica short (docs/operator.md
    gives both)."""
    if not config.halves_scale_down:
        return config.max_step_down
    return min(config.max_step_down, max(1, (current - target) // 2))


def _limit(
    target: int, current: int, raw: int, limits: RoleLimits, config: AutoscalerConfig
) -> tuple[int, str | None]:
    """Step limits, then min/max clamps; the reason when one of them bites."""
    limited: str | None = None
    if target > current + config.max_step_up:
        target, limited = current + config.max_step_up, LIMIT_STEP_UP
    elif target < current - (step := scale_down_step(current, target, config)):
        target, limited = current - step, LIMIT_STEP_DOWN
    if target > limits.max_replicas:
        target, limited = limits.max_replicas, LIMIT_MAX
    elif target < limits.min_replicas:
        target, limited = limits.min_replicas, LIMIT_MIN
    if raw > limits.max_replicas and target == limits.max_replicas:
        limited = LIMIT_MAX
    elif raw < limits.min_replicas and target == limits.min_replicas:
        limited = LIMIT_MIN
    return target, limited


def decide(
    stable: Signals,
    panic: Signals,
    current: dict[str, int],
    config: AutoscalerConfig,
    history: History,
    now: float,
) -> Decision:
    """One autoscaling decision for every role in `config.roles`. Pure: returns a new History."""
    hist = copy.deepcopy(history)
    desired: dict[str, int] = {}
    reasons: dict[str, str] = {}
    limited: dict[str, str | None] = {}
    kinds: dict[str, str] = {}
    details: dict[str, str] = {}
    for role in config.roles:
        s = stable.roles.get(role, RoleSignals())
        p = panic.roles.get(role, RoleSignals())
        n = current.get(role, 0)
        if role == "prefill" or (
            role == "unified" and config.targets.get(role, RoleTargets()).prefill_utilization
        ):
            hist.prefill_tokens_per_s = learn_prefill_capacity(s, hist.prefill_tokens_per_s, config)
        if not config.is_enabled:
            lim = config.roles[role]
            desired[role] = min(max(n, lim.min_replicas), lim.max_replicas)
            reasons[role], limited[role] = "autoscaling disabled", None
            kinds[role] = decision_reason(n, desired[role], is_panic=False)
            continue
        desired[role], reasons[role], limited[role], kinds[role] = _decide_role(
            role, s, p, n, config, hist, now
        )
        track_startup(hist.forecast, role, now, n, desired[role], s.num_replicas)
        if limited[role] == Reason.REPLICAS_PENDING:
            details[role] = pending_detail(role, s)
    hist.decisions.append({"t": now, "desired": dict(desired), "reasons": dict(reasons)})
    del hist.decisions[: -config.num_history_decisions]
    return Decision(desired, reasons, limited, hist, kinds, details)
