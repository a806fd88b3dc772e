"""A policy = eligibility filters -> saturation filter -> the pipeline's filters -> weighted
scorers (or, while the imbalance guard trips, the queue scorer alone) -> picker.

    policy = build_policy("cache-aware", cfg)     # a preset, or a key of policy.pipelines
    decision = policy.choose(endpoints, ctx)      # pure: no I/O, no clocks (ctx.now)
    decision.endpoint  # None with decision.reason "no-endpoint" or "saturated"

A pipeline (config.PipelineConfig) names its optional filters, its scorers with weights,
its picker and whether the guard applies, and optionally (`roles`) the stage of the same
kind that a P/D pool's prefill or decode legs (RouteContext.role) run instead; a user
composes one in `policy.pipelines`. The named policies (PRESETS) are pipelines too; only
`cache-aware` reads `policy.weights`:
* round-robin:   no scorers, round-robin picker.
* random:        no scorers, weighted-random picker (uniform).
* least-request: queue.
* least-kv:      kv + 4 queue (the kv score is one scrape old; the live queue keeps it
                 current), inside bounded-load.
* prefix-cache:  prefix + 0.01 queue (tie-break), behind the guard.
* session:       session + 0.01 queue (the session scorer bounds its own load).
* latency:       latency + queue + 4 pending (the slo preset's load terms), inside
                 bounded-load.
* ucb:           ucb + queue, exploring inside bounded-load.
* slo:           slo + queue + 4 pending, inside bounded-load (the config's picker). With the
                 slo-tiered picker (weighted random among the endpoints predicted to meet
                 the SLO) it spread prefixes and lost to least-request on the simulator's
                 Mooncake slices and its two-speed pool (bench/sim_policies.md).
* cache-aware:   sum(weights[s] * s) over prefix/queue/kv (config weights); when the
                 imbalance guard trips it scores by queue only and reports
                 is_balanced_by_load (the router still records the prompt's prefix).
                 Its prefill role's stage scores a P/D pool's prefill legs with
                 `policy.prefill_weights` instead, the backlog scorer among them: on a
                 prefill-only endpoint a prompt waits for the prompt tokens queued ahead.
No learned or affinity scorer runs without a load term or bound (filters.bounded_load: at
most load_factor x an endpoint's capacity-relative fair share, + 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvfleet_router.config import BACKLOG_WEIGHTS, PipelineConfig, RouterConfig, StageConfig
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
    def __init__(self, name: str, cfg: RouterConfig, pipeline: StageConfig) -> None:
        self.name = name
        self.pipeline = pipeline
        self.eligibility: list[Filter] = [FILTERS[f](cfg) for f in ELIGIBILITY]
        self.saturation: Filter = FILTERS["saturation"](cfg)
        self.filters: list[Filter] = [FILTERS[f](cfg) for f in pipeline.filters]
        self.scorers: list[tuple[float, Scorer]] = [
            (w, SCORERS[s](cfg)) for s, w in pipeline.scorers.items() if w > 0]
        self.scores_prefix = pipeline.scorers.get("prefix", 0) > 0  # reads ctx.peer_credit
        self.picker: Picker = PICKERS[pipeline.picker]()
        self.guard = cfg.policy.imbalance if pipeline.guard else None
        self.balance_scorer: Scorer = SCORERS["queue"](cfg)
        # the legs of these roles run their own stage (cache-aware's prefill weights)
        roles = pipeline.roles if isinstance(pipeline, PipelineConfig) else {}
        self.for_role = {role: Policy(name, cfg, stage) for role, stage in roles.items()}
        self.scores_prefix |= any(p.scores_prefix for p in self.for_role.values())

    def eligible(self, endpoints: list[EndpointState], ctx: RouteContext) -> list[EndpointState]:
        for f in self.eligibility:
            endpoints = f(endpoints, ctx)
        return endpoints

    def choose(self, endpoints: list[EndpointState], ctx: RouteContext) -> Decision:
        if ctx.role in self.for_role:
            return self.for_role[ctx.role].choose(endpoints, ctx)
        candidates = self.eligible(endpoints, ctx)
        if not candidates:
            return Decision(None, "no-endpoint")
        candidates = self.saturation(candidates, ctx)
        if not candidates:
            return Decision(None, "saturated")
        for f in self.filters:
            candidates = f(candidates, ctx)
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


def _preset(scorers: dict[str, float], picker: str | None = None, guard: bool = False,
            bounded: bool = False) -> Callable[[RouterConfig], PipelineConfig]:
    """A fixed mix; picker None: the config's policy.picker."""
    filters = ["bounded-load"] if bounded else []
    return lambda cfg: PipelineConfig(filters=filters, scorers=scorers,
                                      picker=picker or cfg.policy.picker, guard=guard)


# The named policies: each is a pipeline, written as a user would in policy.pipelines.
PRESETS: dict[str, Callable[[RouterConfig], PipelineConfig]] = {
    "round-robin": _preset({}, "round-robin"),
    "random": _preset({}, "weighted-random"),
    "least-request": _preset({"queue": 1.0}),
    "least-kv": _preset({"kv": 1.0, "queue": 4.0}, bounded=True),
    # Affinity first, load bounded by the guard alone (sglang's cache_aware shape): inside
    # bounded-load it could pick only near-idle endpoints and lost most hits
    # (bench/sim_policies.md).
    "prefix-cache": _preset({"prefix": 1.0, "queue": 0.01}, guard=True),
    "session": _preset({"session": 1.0, "queue": 0.01}),
    "latency": _preset({"latency": 1.0, "queue": 1.0, "pending": 4.0}, bounded=True),
    "ucb": _preset({"ucb": 1.0, "queue": 1.0}, bounded=True),
    "slo": _preset({"slo": 1.0, "queue": 1.0, "pending": 4.0}, bounded=True),
    # The default's weights plus the prefill work queued in tokens, at the queue's weight
    # (bench/sim_policies.md: higher SLO attainment on the Mooncake slices; live without
    # prefill contention it spreads prefixes a little more, bench/README.md).
    "backlog": _preset(dict(BACKLOG_WEIGHTS), guard=True),
    "cache-aware": lambda cfg: PipelineConfig(
        scorers=cfg.policy.weights, picker=cfg.policy.picker, guard=True,
        roles={"prefill": StageConfig(scorers=cfg.policy.prefill_weights,
                                      picker=cfg.policy.picker, guard=True)}),
}
POLICIES = PRESETS  # the name callers outside the package know


def pipeline_of(name: str, cfg: RouterConfig) -> PipelineConfig:
    """The pipeline a policy name stands for: the config's own, else a preset."""
    if name in cfg.policy.pipelines:
        return cfg.policy.pipelines[name]
    if name in PRESETS:
        return PRESETS[name](cfg)
    raise KeyError(f"unknown policy {name!r}; known: {', '.join(cfg.policy.policy_names())}")


def build_policy(name: str, cfg: RouterConfig) -> Policy:
    return Policy(name, cfg, pipeline_of(name, cfg))


def build_policies(cfg: RouterConfig) -> dict[str, Policy]:
    """Every policy the config can name: the presets and its pipelines."""
    return {name: build_policy(name, cfg) for name in cfg.policy.policy_names()}
