"""A rollout in virtual time: at `at_s` the pool's spec changes what its engines run, and the
control loop rolls the new revision out by `spec.rollout` (rolling, canary, blue-green) while
the trace keeps arriving.

The new spec is the pool's with `engine.profile` replaced (`profile`, when given) and
`engine.image` set to a build tag naming the slowdown, so even a same-profile rollout is a
new revision (`revision_of` hashes the engine section): a new engine image, as in life. Its
replicas run the named profile with every step-time coefficient times `slowdown`
(`SimRuntime.slowdowns`): 2.0 is a build whose steps, hence TTFT and ITL, take twice as long.
`strategy` (when given) replaces `spec.rollout.strategy`; the steps, blue-green hold and
analysis limits stay the pool file's.

`outcome` is what the report shows: the rollout's events (RolloutStarted, RolloutStepPassed,
RolloutSwitched, RolloutPromoted, RollbackSLO, ...), the final `status.rollout` and the
Progressing/Degraded/Ready conditions, the failed requests of the whole run, and per
revision what the router measured (requests, errors, TTFT and ITL p90) and the replicas
left at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import PoolStatus
from kvfleet_operator.loop.events import Event
from kvfleet_router.revision_stats import RevisionCounts

CONDITIONS = ("Ready", "Progressing", "Degraded")
IMAGE = "kvfleet-sim-rollout"  # the new build's image name; its tag names the slowdown


class RolloutError(ValueError):
    """A rollout scenario the simulator cannot run; one line."""


@dataclass(slots=True, frozen=True)
class RolloutScenario:
    at_s: float  # virtual seconds from the replay's start (warm-up included)
    profile: str | None = None  # the new revision's engine.profile; None: the pool's
    slowdown: float = 1.0  # the new build's step times over the profile's
    strategy: str | None = None  # replaces spec.rollout.strategy; None: the pool's

    def __post_init__(self) -> None:
        if not self.at_s >= 0:
            raise RolloutError(f"the rollout's time must be >= 0 s, got {self.at_s}")
        if not 0 < self.slowdown <= 100:
            raise RolloutError(f"the rollout's slowdown must be in (0, 100], got {self.slowdown}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def is_rollout_event(reason: str) -> bool:
    return reason.startswith("Rollout") or reason == "RollbackSLO"


def rollout_spec(spec: PoolSpec, scenario: RolloutScenario) -> PoolSpec:
    """The pool's spec as the scenario changes it (validated as a pool file would be)."""
    engine = spec.engine
    try:
        new_engine = dataclasses.replace(
            engine, profile=scenario.profile or engine.profile,
            image=f"{IMAGE}:x{scenario.slowdown:g}")
        rollout = spec.rollout if scenario.strategy is None else \
            dataclasses.replace(spec.rollout, strategy=scenario.strategy)  # fmt: skip
        return dataclasses.replace(spec, engine=new_engine, rollout=rollout)
    except SpecError as exc:
        raise RolloutError(f"the rollout's spec: {exc}") from None


def outcome(
    scenario: RolloutScenario,
    started: tuple[float, str, str] | None,  # (when, from revision, to revision)
    status: PoolStatus,
    events: Iterable[tuple[float, Event]],
    revisions: dict[str, RevisionCounts],
    replicas_at_end: dict[str, int],
    served: dict[str, int],
    num_failed: int,
) -> dict[str, Any]:
    """The report's `rollout` section (module docstring)."""
    body = status.to_dict()
    return {
        "scenario": scenario.to_dict(),
        "started_at_s": started[0] if started else None,
        "from_revision": started[1] if started else "",
        "to_revision": started[2] if started else "",
        "events": [{"t": t, "type": e.type, "reason": e.reason, "message": e.message}
                   for t, e in events if is_rollout_event(e.reason)],
        "status": body.get("rollout"),
        "conditions": {c["type"]: {k: c[k] for k in ("status", "reason", "message")}
                       for c in body.get("conditions", []) if c["type"] in CONDITIONS},
        "num_failed": num_failed,
        "revisions": {
            rev: {"requests": c.requests, "errors": c.errors, "ttft_p90_s": c.ttft_p90(),
                  "itl_p90_s": c.itl_p90(), "served": served.get(rev, 0),
                  "replicas_at_end": replicas_at_end.get(rev, 0)}
            for rev, c in sorted(revisions.items())
        },
    }


def summary_line(result: dict[str, Any]) -> str:
    """One line for the CLI: where the rollout ended and why."""
    status = result.get("status") or {}
    if result["started_at_s"] is None:
        return "not started (the replay ended first)"
    last = next((e for e in reversed(result["events"])), None)
    phase = status.get("phase", "")
    why = f": {last['reason']}: {last['message']}" if last else ""
    return f"{phase}{why}"
