"""A policy = eligibility filters -> saturation filter -> weighted scorers -> picker.

    policy = build_policy("cache-aware", cfg)
    decision = policy.choose(endpoints, ctx)      # pure: no I/O, no clocks (ctx.now)
    decision.endpoint  # None with decision.reason "no-endpoint" or "saturated"

Named policies (POLICIES) are fixed mixes; only `cache-aware` reads `policy.weights`:
* round-robin:   no scorers, round-robin picker.
* random:        no scorers, weighted-random picker (uniform).
* least-request: queue.
* least-kv:      kv + 4 queue (the kv score is one scrape old; the live queue keeps it
                 current), inside bounded-load.
* prefix-cache:  prefix + 0.01 queue (tie-break), inside bounded-load and behind the guard.
* session:       session + 0.01 queue (the session scorer bounds its own load).
* latency:       latency + queue, inside bounded-load.
* ucb:           ucb + queue, exploring inside bounded-load.
* slo:           slo with the slo-tiered picker, inside bounded-load.
* cache-aware:   sum(weights[s] * s) over prefix/queue/kv (config weights); when the
                 imbalance guard trips it scores by queue only and reports
                 is_balanced_by_load (the router still records the prompt's prefix).
No learned or affinity scorer runs without a load term or bound (filters.bounded_load: at
most load_factor x an endpoint's capacity-relative fair share, + 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.policies.context import RouteContext, load_snapshot
from kvfleet_router.policies.filters import ELIGIBILITY, FILTERS, Filter
from kvfleet_router.policies.guard import is_imbalanced
from kvfleet_router.policies.pickers import PICKERS, Picker
from kvfleet_router.policies.scorers import SCORERS, Scorer


@dataclass(slots=True)
class Decision:
    endpoint: EndpointState | None
    reason: str  # "picked" | "balanced" | "no-endpoint" | "saturated"
    score: float = 0.0

    @property
    def is_balanced_by_load(self) -> bool:
        return self.reason == "balanced"


class Policy:
    def __init__(self, name: str, cfg: RouterConfig, weights: dict[str, float],
                 picker: str, use_guard: bool = False, is_bounded: bool = False) -> None:
        self.name = name
        self.eligibility: list[Filter] = [FILTERS[f](cfg) for f in ELIGIBILITY]
        self.saturation: Filter = FILTERS["saturation"](cfg)
        self.bound: Filter | None = FILTERS["bounded-load"](cfg) if is_bounded else None
        self.scorers: list[tuple[float, Scorer]] = [
            (w, SCORERS[s](cfg)) for s, w in weights.items() if w > 0]
        self.scores_prefix = weights.get("prefix", 0) > 0  # reads ctx.peer_credit
        self.picker: Picker = PICKERS[picker]()
        self.guard = cfg.policy.imbalance if use_guard else None
        self.balance_scorer: Scorer = SCORERS["queue"](cfg)

    def eligible(self, endpoints: list[EndpointState], ctx: RouteContext) -> list[EndpointState]:
        for f in self.eligibility:
            endpoints = f(endpoints, ctx)
        return endpoints

    def choose(self, endpoints: list[EndpointState], ctx: RouteContext) -> Decision:
        candidates = self.eligible(endpoints, ctx)
        if not candidates:
            return Decision(None, "no-endpoint")
        candidates = self.saturation(candidates, ctx)
        if not candidates:
            return Decision(None, "saturated")
        if self.bound is not None:
            candidates = self.bound(candidates, ctx)
        reason = "picked"
        if self.guard is not None and is_imbalanced(
                [e.queue_depth() for e in candidates], self.guard.abs_threshold,
                self.guard.rel_threshold):
            totals = self.balance_scorer(candidates, ctx)
            reason = "balanced"
        else:
            totals = self.combined_scores(candidates, ctx)
        i = self.picker(totals, ctx.rng)
        e = candidates[i]
        ctx.chosen_load = load_snapshot(e, ctx.uncached_tokens(e.name))
        if ctx.predictions:
            ctx.predicted_ttft_s, ctx.predicted_tpot_s = ctx.predictions.get(
                e.name, (None, None))
        return Decision(e, reason, totals[i])

    def combined_scores(self, candidates: list[EndpointState], ctx: RouteContext) -> list[float]:
        totals = [0.0] * len(candidates)
        for weight, scorer in self.scorers:
            totals = [t + weight * s for t, s in zip(totals, scorer(candidates, ctx), strict=True)]
        return totals


def _fixed(weights: dict[str, float], picker: str | None = None, use_guard: bool = False,
           is_bounded: bool = False) -> Callable[[str, RouterConfig], Policy]:
    return lambda name, cfg: Policy(name, cfg, weights, picker or cfg.policy.picker,
                                    use_guard=use_guard, is_bounded=is_bounded)


POLICIES: dict[str, Callable[[str, RouterConfig], Policy]] = {
    "round-robin": _fixed({}, "round-robin"),
    "random": _fixed({}, "weighted-random"),
    "least-request": _fixed({"queue": 1.0}),
    "least-kv": _fixed({"kv": 1.0, "queue": 4.0}, is_bounded=True),
    "prefix-cache": _fixed({"prefix": 1.0, "queue": 0.01}, use_guard=True, is_bounded=True),
    "session": _fixed({"session": 1.0, "queue": 0.01}),
    "latency": _fixed({"latency": 1.0, "queue": 1.0}, is_bounded=True),
    "ucb": _fixed({"ucb": 1.0, "queue": 1.0}, is_bounded=True),
    "slo": _fixed({"slo": 1.0}, "slo-tiered", is_bounded=True),
    "cache-aware": lambda name, cfg: Policy(name, cfg, cfg.policy.weights, cfg.policy.picker,
                                            use_guard=True),
}


def build_policy(name: str, cfg: RouterConfig) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](name, cfg)
