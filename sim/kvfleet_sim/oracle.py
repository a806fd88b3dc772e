"""The hindsight optimum: the fewest replica-seconds a scaler that knew the future could have
spent on a trace slice while meeting the SLO (issue 27, item 1). `kvfleet sim compare
--scaler oracle` replays it beside the other scalers, and every row's "× optimum" is its
replica-seconds over this one's.

How it is found (`solve`):

1. The measured window is cut into intervals of `interval_s` virtual seconds (coarse: 60 s
   by default). The plan is one replica count per role per interval: replicas *ready*
   through that interval. The warm-up (before the window, not measured, not paid for)
   holds the first interval's counts.
2. Intervals are settled in order. For interval k, with the counts of intervals 0..k-1
   already chosen, a count n is tried by replaying the arrivals from `history_s` before
   the interval (default: as long as the slice's warm-up, which the caller judged enough
   to warm a fleet; the fleet follows the plan through the quiet time before them) up to
   interval k's last arrival, with the plan 0..k-1 then n (held after the interval, so
   the interval's last requests finish under it): n passes when the requests that arrived in
   interval k meet the SLO by the report's rule (`report.summarize`: TTFT <= the TTFT SLO
   and mean ITL <= the ITL SLO; a failed request is a miss) for at least the target.
   The smallest passing n is found by a galloping search from the previous interval's
   count, then bisection (`smallest_passing`); replays are cached by (plan, cut).
   Prefill/decode pools settle roles in turn (the pool's role order), each with the roles
   not yet settled at their max.
3. The target is 99% per interval, or, where the fleet at its max (every role at max,
   after the chosen prefix) reaches less than 99% for that interval's arrivals (prompts
   that alone take longer than the TTFT SLO, say), that ceiling less 0.5 point.
4. Every replay runs the plan as the pool could run it (`schedule`): each interval's
   count is requested `lead_s` ahead (start-up + one decision interval + one loop tick:
   the worst delay from a decision to a ready replica in the router), scale-ups that
   exceed `scaleUp.maxStep` per decision start earlier, scale-downs go no faster than
   `scaleDown.maxStep` per decision, and every count stays in the role's [min, max]. The
   schedule's scaler (`ScheduleScaler`) also clamps each decision to those steps around
   the current count. The stabilization windows and cooldowns are kvfleet's policy, not
   limits of the pool, and are not applied.
5. The full replay of the final plan is checked interval by interval (requests of one
   interval can finish in the next, under its count): an interval that misses its target
   gets one more replica per role below max, and the plan is replayed again, at most
   `max_repairs` times; what still misses is reported (`OracleResult.misses`).

It is an upper bound on the true optimum at this granularity: greedy in time (a count
chosen for one interval is never revisited to help the next), one count per interval.
A scaler with finer moves can come in under it; × optimum below 1.0 means that.
Cost: about two to three replays per interval and role, each of history + one interval,
so linear in the window's length (with the whole prefix replayed each time, `history_s`
math.inf, it is quadratic), plus a full replay per check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.autoscaler import Decision, History, decision_reason
from kvfleet_operator.decide.role_signals import Signals

from kvfleet_sim.fleet import FleetSim, SimResult, SimSettings
from kvfleet_sim.report import summarize
from kvfleet_sim.scalers import SimScaler
from kvfleet_sim.trace import TraceRequest

ORACLE = "oracle"  # the scaler name run.py and cli.py special-case
TARGET = 0.99  # per-interval SLO attainment the plan must reach
CEILING_MARGIN = 0.005  # below the fleet-at-max ceiling where that is under TARGET
DEFAULT_INTERVAL_S = 60.0
MAX_REPAIRS = 3

Counts = dict[str, int]


@dataclass(slots=True, frozen=True)
class Limits:
    """What the pool lets any scaler do: per-role [min, max], steps per decision, and how
    long a requested replica takes to serve."""

    roles: dict[str, tuple[int, int]]  # role -> (min, max), in the pool's role order
    step_up: int
    step_down: int
    grid_s: float  # the loop's decision interval (autoscaling.intervalSeconds)
    lead_s: float  # request -> ready in the router, at worst

    def __post_init__(self) -> None:
        if not self.roles or any(not 0 <= lo <= hi for lo, hi in self.roles.values()):
            raise ValueError("need roles with 0 <= min <= max")
        if self.step_up < 1 or self.step_down < 1 or not self.grid_s > 0 or self.lead_s < 0:
            raise ValueError("need steps >= 1, grid_s > 0 and lead_s >= 0")

    @classmethod
    def of(cls, pool: InferencePool, settings: SimSettings) -> Limits:
        a = pool.spec.autoscaling
        grid = float(a.interval_seconds)
        return cls(
            roles={n: (r.replicas.min, r.replicas.max)
                   for n, r in pool.spec.topology.roles().items()},
            step_up=a.scale_up.max_step,
            step_down=a.scale_down.max_step,
            grid_s=grid,
            lead_s=settings.startup_s + grid + settings.tick_s,
        )  # fmt: skip

    def at_max(self) -> Counts:
        return {r: hi for r, (_, hi) in self.roles.items()}


@dataclass(slots=True, frozen=True)
class Plan:
    """Replicas ready per role in each interval of [start_s, start_s + len × interval_s);
    before it (the warm-up) the first interval's counts, after it the last's."""

    start_s: float
    interval_s: float
    counts: tuple[Counts, ...]

    def __post_init__(self) -> None:
        if not self.counts or not self.interval_s > 0 or self.start_s < 0:
            raise ValueError("a plan needs counts, interval_s > 0 and start_s >= 0")

    def needed(self, t: float) -> Counts:
        k = math.floor((t - self.start_s) / self.interval_s + 1e-9)
        return self.counts[max(0, min(len(self.counts) - 1, k))]

    def key(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(c[r] for r in sorted(c)) for c in self.counts)


@dataclass(slots=True, frozen=True)
class Schedule:
    """What to request at each decision: `requested[i]` from i × grid_s on (the last one
    after the end)."""

    grid_s: float
    requested: tuple[Counts, ...]

    def at(self, t: float) -> Counts:
        i = math.floor(t / self.grid_s + 1e-9)
        return self.requested[max(0, min(len(self.requested) - 1, i))]


def schedule(plan: Plan, limits: Limits, horizon_s: float) -> Schedule:
    """The plan made feasible for the pool (pure): requested `lead_s` ahead of need, ramps
    up started early enough for `step_up` per decision, downs at most `step_down` per
    decision, every count in [min, max]."""
    g = limits.grid_s
    n = max(1, math.ceil(horizon_s / g) + 1)
    bounds = [plan.start_s + j * plan.interval_s for j in range(1, len(plan.counts))]
    out: dict[str, list[int]] = {}
    for role, (lo, hi) in limits.roles.items():
        req = []
        for i in range(n):
            t = i * g
            points = [t] + [b for b in bounds if t < b <= t + limits.lead_s]
            req.append(min(hi, max(lo, *(plan.needed(p)[role] for p in points))))
        for i in range(n - 2, -1, -1):  # a ramp up starts where each step fits
            req[i] = max(req[i], req[i + 1] - limits.step_up)
        for i in range(1, n):  # a ramp down takes as many decisions as its steps
            req[i] = max(req[i], req[i - 1] - limits.step_down)
        out[role] = req
    return Schedule(g, tuple({r: out[r][i] for r in limits.roles} for i in range(n)))


class ScheduleScaler:
    """The control loop's Scaler replaying a Schedule, clamped to the pool's steps around
    the current count and to [min, max] (so a late decision cannot jump further)."""

    def __init__(self, sched: Schedule, limits: Limits) -> None:
        self.schedule = sched
        self.limits = limits

    def __call__(self, stable: Signals, panic: Signals, current: dict[str, int],
                 history: History, now: float) -> Decision:  # fmt: skip
        want = self.schedule.at(now)
        desired: dict[str, int] = {}
        reasons: dict[str, str] = {}
        kinds: dict[str, str] = {}
        for role, (lo, hi) in self.limits.roles.items():
            cur = current.get(role, 0)
            n = min(want[role], cur + self.limits.step_up)
            n = max(n, cur - self.limits.step_down)
            desired[role] = n = min(hi, max(lo, n))
            verb = "scale up" if n > cur else "scale down" if n < cur else "steady"
            reasons[role] = f"{verb} {cur}->{n}: hindsight schedule"
            kinds[role] = decision_reason(cur, n, False)
        return Decision(desired, reasons, {r: None for r in desired}, history, kinds)


def sim_scaler(plan: Plan, limits: Limits, horizon_s: float) -> SimScaler:
    """The fleet starts ready with the schedule's first request (as fixed-max starts at
    its max), then follows the schedule."""
    sched = schedule(plan, limits, horizon_s)
    return SimScaler(ScheduleScaler(sched, limits), initial=dict(sched.requested[0]))


def smallest_passing(passes: Callable[[int], bool], lo: int, hi: int, guess: int) -> int | None:
    """The smallest n in [lo, hi] with passes(n), assuming passes is monotone (more
    replicas never hurt); None when even hi fails. Gallops from `guess` (1, 2, 4, ... away)
    to a bracket, then bisects, so a count like the last one costs two probes."""
    if lo > hi:
        raise ValueError(f"empty range {lo}..{hi}")
    guess = min(hi, max(lo, guess))
    step = 1
    if passes(guess):
        good, bad = guess, lo - 1
        while good > lo:
            n = max(good - step, lo)
            if not passes(n):
                bad = n
                break
            good, step = n, step * 2
    else:
        bad = guess
        while True:
            if bad >= hi:
                return None
            n = min(bad + step, hi)
            if passes(n):
                good = n
                break
            bad, step = n, step * 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if passes(mid):
            good = mid
        else:
            bad = mid
    return good


@dataclass(slots=True)
class OracleResult:
    plan: Plan
    result: SimResult  # the final plan's full replay
    targets: list[float]  # per interval
    attainments: list[float]  # per interval, in the full replay (NaN: no arrivals)
    num_replays: int
    replay_s: float  # virtual seconds replayed in all (quiet time before a history too)
    num_requests: int  # arrivals replayed in all (the cost: the slice has len(trace))
    misses: list[int] = field(default_factory=list)  # intervals still under their target

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.plan.interval_s,
            "counts": [dict(c) for c in self.plan.counts],
            "targets": self.targets,
            "attainments": [None if math.isnan(a) else a for a in self.attainments],
            "misses": self.misses,
            "num_replays": self.num_replays,
            "replay_s": self.replay_s,
            "num_requests": self.num_requests,
        }


class _Replays:
    """Replays of partial plans over one trace, cached by (plan, cut)."""

    def __init__(self, load_pool: Callable[[], InferencePool], trace: Sequence[TraceRequest],
                 settings: SimSettings, limits: Limits, slo: tuple[float, float],
                 edges: list[float], interval_s: float, history_s: float) -> None:  # fmt: skip
        self.load_pool = load_pool
        self.trace = trace
        self.settings = settings
        # A partial replay is read for one interval's requests: it ends when they are
        # served, not at the window's end (run_until_s) as the full replay, which bills it.
        self.partial_settings = dataclasses.replace(settings, run_until_s=0.0)
        self.limits = limits
        self.slo = slo
        self.edges = edges
        self.interval_s = interval_s
        self.history_s = history_s
        self.horizon = edges[-1] + limits.lead_s  # the schedule holds its last request after
        self.cache: dict[tuple[Any, ...], SimResult] = {}
        self.seconds = 0.0  # virtual seconds replayed
        self.num_requests = 0  # arrivals replayed

    def run(self, counts: tuple[Counts, ...], cut: int | None) -> SimResult:
        """The plan `counts` over the arrivals in [edges[cut] - history_s, edges[cut + 1])
        (to the end at the last interval); cut None: the whole trace."""
        plan = Plan(self.edges[0], self.interval_s, counts)
        key = (plan.key(), cut)
        if key not in self.cache:
            begin, end = -math.inf, math.inf
            if cut is not None:
                begin = self.edges[cut] - self.history_s
                end = self.edges[cut + 1] if cut < len(self.edges) - 2 else math.inf
            part = [r for r in self.trace if begin <= r.t < end]
            sim = FleetSim(self.load_pool(), sim_scaler(plan, self.limits, self.horizon),
                           self.settings if cut is None else self.partial_settings)
            self.cache[key] = sim.run(part)
            self.seconds += self.cache[key].end_s
            self.num_requests += len(part)
        return self.cache[key]

    def attainment(self, result: SimResult, k: int) -> float:
        """SLO attainment of the requests that arrived in interval k (NaN: none did)."""
        ttft, itl = self.slo
        return summarize("", result, ttft, itl, self.edges[k], self.edges[k + 1]).slo_attainment

    def passes(self, counts: tuple[Counts, ...], k: int, target: float) -> bool:
        return _meets(self.attainment(self.run(counts, k), k), target)

    def smallest(self, chosen: list[Counts], counts: Counts, role: str, k: int, target: float,
                 search: tuple[int, int, int]) -> int | None:  # fmt: skip
        """The smallest count of `role` in interval k, the other roles as in `counts`;
        `search` is (lo, hi, guess)."""

        def passes(n: int) -> bool:
            return self.passes((*chosen, {**counts, role: n}), k, target)

        return smallest_passing(passes, *search)

    def settle(self, chosen: list[Counts], k: int) -> tuple[Counts, float]:
        """(counts, target) for interval k after the plan `chosen`: each role in turn the
        smallest count meeting the target, the roles after it at max; the target falls to
        the fleet-at-max ceiling less the margin where max cannot reach it."""
        limits = self.limits
        prev = chosen[-1] if chosen else limits.at_max()
        target = TARGET
        while True:
            counts: Counts | None = dict(limits.at_max())
            for role, (lo, hi) in limits.roles.items():
                assert counts is not None
                n = self.smallest(chosen, counts, role, k, target, (lo, hi, prev[role]))
                if n is None:
                    counts = None
                    break
                counts[role] = n
            if counts is not None:
                return counts, target
            ceiling = self.attainment(self.run((*chosen, limits.at_max()), k), k)
            # the fleet at max passes this, so the next round ends (and the target only falls)
            target = min(target, ceiling) - CEILING_MARGIN


def _meets(att: float, target: float) -> bool:
    return math.isnan(att) or att >= target - 1e-12


def solve(
    load_pool: Callable[[], InferencePool],
    trace: Sequence[TraceRequest],
    settings: SimSettings,
    ttft_slo_s: float,
    itl_slo_s: float,
    measure_from: float,
    measure_to: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    log: Callable[[str], None] | None = None,
    max_repairs: int = MAX_REPAIRS,
    history_s: float | None = None,
) -> OracleResult:
    """The hindsight plan for `trace` (module docstring). `load_pool()` gives a fresh pool
    per replay; `log` hears one line per settled interval and repair. A probe of interval
    k replays the arrivals of the `history_s` before it (default: as long as the warm-up,
    `measure_from`; math.inf: the whole prefix, exact and quadratic in the intervals)."""
    if not interval_s > 0:
        raise ValueError(f"oracle interval must be > 0 s, got {interval_s:g}")
    if not measure_to > measure_from >= 0:
        raise ValueError("need 0 <= measure_from < measure_to")
    history = measure_from if history_s is None else history_s
    if not history >= 0:
        raise ValueError(f"oracle history must be >= 0 s, got {history:g}")
    say = log or (lambda _: None)
    limits = Limits.of(load_pool(), settings)
    num = max(1, math.ceil((measure_to - measure_from) / interval_s - 1e-9))
    edges = [measure_from + k * interval_s for k in range(num)] + [measure_to]
    replays = _Replays(load_pool, trace, settings, limits, (ttft_slo_s, itl_slo_s), edges,
                       interval_s, history)  # fmt: skip
    chosen: list[Counts] = []
    targets: list[float] = []
    for k in range(num):
        counts, target = replays.settle(chosen, k)
        chosen.append(counts)
        targets.append(target)
        att = replays.attainment(replays.run(tuple(chosen), k), k)
        say(f"oracle: interval {k + 1}/{num} [{edges[k]:.0f}, {edges[k + 1]:.0f}) s: "
            f"{_counts(counts)}, SLO met {_pct(att)} (target {target:.1%}); "
            f"{len(replays.cache)} replays so far")  # fmt: skip

    def check() -> tuple[SimResult, list[float], list[int]]:
        final = replays.run(tuple(chosen), None)
        atts = [replays.attainment(final, k) for k in range(num)]
        return final, atts, [k for k in range(num) if not _meets(atts[k], targets[k])]

    final, atts, misses = check()
    for attempt in range(max_repairs):
        bumpable = [k for k in misses if chosen[k] != limits.at_max()]
        if not bumpable:
            break
        for k in bumpable:
            chosen[k] = {r: min(hi, chosen[k][r] + 1) for r, (_, hi) in limits.roles.items()}
        final, atts, misses = check()
        say(f"oracle: repair {attempt + 1}: intervals {[k + 1 for k in bumpable]} +1 replica; "
            f"{len(misses)} still under target")  # fmt: skip
    slices = replays.num_requests / len(trace) if trace else 0.0
    say(f"oracle: done, {len(replays.cache)} replays, {replays.num_requests} arrivals "
        f"replayed ({slices:.1f}x the slice's)")  # fmt: skip
    return OracleResult(Plan(measure_from, interval_s, tuple(chosen)), final, targets, atts,
                        len(replays.cache), replays.seconds, replays.num_requests,
                        misses)  # fmt: skip


def _counts(c: Counts) -> str:
    return ", ".join(f"{r} {n}" for r, n in c.items())


def _pct(att: float) -> str:
    return "n/a (no arrivals)" if math.isnan(att) else f"{att:.1%}"
