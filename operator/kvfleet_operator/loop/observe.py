"""Pure rules between what the ports report and the reconcile core.

- `UNKNOWN_IN_FLIGHT` / `num_in_flight`: a draining replica whose in-flight count no router
  can vouch for is treated as busy, so only its drain timeout can stop it.
- `prefix_hit_tokens_per_s`: prefix-cache hit tokens/s over a replica's scrape log, what its
  warm cache is worth, so scale-down gives up the coldest caches first.
- `observe(...) -> Observed`: the reconcile core's input.
- `decision_roles(replicas)`: which replicas the autoscaler measures. Ready ones, and
  failed ones as unknown (never idle); starting and draining ones are not measured.
- `current_replicas(spec, replicas)`: per role, the replicas that count toward desired.
- `scale_decisions(...)`: the `ScaleDecision` status entries for roles whose count moved.
- `stale_after_s(interval, scrape_timeout)`: when a replica's signals count as unknown.
- `StartupLog`: since when each in-service replica has not been ready, and the start-ups
  measured from the fleet (starting -> ready). `pending_after_s()`: how long a replica may
  take before it is overdue: twice the slowest of the last `NUM_STARTUPS_KEPT` start-ups
  (at least `MIN_PENDING_AFTER_S`), or `DEFAULT_PENDING_AFTER_S` before any was measured.
- `fill_pending(signals, replicas, log, now)`: the pending guard's inputs per role
  (`RoleSignals.num_pending_overdue`, `pending_for_s`, `pending_after_s`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import ScaleDecision, rfc3339
from kvfleet_operator.decide.autoscaler import Decision, decision_reason
from kvfleet_operator.decide.reconcile import Observed, ObservedReplica
from kvfleet_operator.decide.role_signals import ScrapeLog, Signals
from kvfleet_operator.loop.ports import Replica, RouterView

UNKNOWN_IN_FLIGHT = 1 << 30
IN_SERVICE = ("starting", "ready", "failed")  # count toward the desired replicas
MEASURED = ("ready", "failed")
NOT_READY = ("starting", "failed")  # in service, serving nothing
DEFAULT_PENDING_AFTER_S = 300.0  # before the fleet has shown a start-up: 5 minutes
MIN_PENDING_AFTER_S = 60.0
PENDING_AFTER_FACTOR = 2.0  # x the slowest recent start-up
NUM_STARTUPS_KEPT = 8


@dataclass(slots=True)
class StartupLog:
    """Since when each in-service replica has not been ready, and measured start-ups (s).
    Plain data; the loop calls `update` every tick with its own clock."""

    not_ready_since: dict[str, float] = field(default_factory=dict)
    startups: deque[float] = field(default_factory=lambda: deque(maxlen=NUM_STARTUPS_KEPT))
    seen: set[str] = field(default_factory=set)

    def update(self, replicas: Sequence[Replica], now: float) -> None:
        names = {r.name for r in replicas}
        for r in replicas:
            since = self.not_ready_since.get(r.name)
            if r.state in NOT_READY:
                if since is None:
                    # A replica first seen before it ever ran counts from its own start
                    # time (a pod's creation: time spent Pending or pulling counts); one
                    # that was serving, or a Kubernetes placeholder (started_at is "now"),
                    # from when it was seen so.
                    is_fresh = (r.name not in self.seen and r.num_restarts == 0
                                and 0 < r.started_at <= now)  # fmt: skip
                    self.not_ready_since[r.name] = r.started_at if is_fresh else now
            elif since is not None:
                del self.not_ready_since[r.name]
                if r.state == "ready":
                    self.startups.append(now - since)
        for gone in set(self.not_ready_since) - names:
            del self.not_ready_since[gone]
        self.seen = names

    def pending_after_s(self) -> float:
        if not self.startups:
            return DEFAULT_PENDING_AFTER_S
        return max(MIN_PENDING_AFTER_S, PENDING_AFTER_FACTOR * max(self.startups))

    def overdue(self, now: float) -> dict[str, float]:
        """Replica name -> seconds not ready, for those past `pending_after_s()`."""
        limit = self.pending_after_s()
        return {name: now - since for name, since in self.not_ready_since.items()
                if now - since > limit}  # fmt: skip


def fill_pending(
    signals: Signals, replicas: Sequence[Replica], log: StartupLog, now: float
) -> None:
    """Set each role's pending-guard inputs on `signals` (in place: it is fresh from
    `aggregate`). Only in-service replicas count; a draining one is on its way out."""
    overdue = log.overdue(now)
    limit = log.pending_after_s()
    for r in replicas:
        if r.name in overdue and r.state in NOT_READY and r.role in signals.roles:
            rs = signals.roles[r.role]
            rs.num_pending_overdue += 1
            rs.pending_for_s = max(rs.pending_for_s, overdue[r.name])
    for rs in signals.roles.values():
        rs.pending_after_s = limit


def num_in_flight(view: RouterView | None, name: str, phase: str) -> int:
    if view is not None:
        endpoint = view.endpoints.get(name)
        return endpoint.num_in_flight if endpoint is not None else 0
    return UNKNOWN_IN_FLIGHT if phase == "draining" else 0


def prefix_hit_tokens_per_s(scrapes: ScrapeLog, name: str) -> float:
    good = [s for s in scrapes.scrapes.get(name, ()) if s.sample is not None]
    if len(good) < 2 or good[-1].t <= good[0].t:
        return 0.0
    first, last = good[0].sample, good[-1].sample
    assert first is not None and last is not None
    hits = last.num_prefix_hits - first.num_prefix_hits
    return max(0.0, hits) / (good[-1].t - good[0].t)  # a restart resets the counter: 0


def observe(
    replicas: Sequence[Replica],
    view: RouterView | None,
    scrapes: ScrapeLog,
    drain_started: Mapping[str, float],
    signals: Signals | None,
    overdue: Mapping[str, float] | None = None,
) -> Observed:
    observed = [
        ObservedReplica(
            name=r.name,
            role=r.role,
            phase=r.state,
            url=r.address,
            num_restarts=r.num_restarts,
            last_error=r.last_error,
            num_in_flight=num_in_flight(view, r.name, r.state),
            prefix_hit_tokens_per_s=prefix_hit_tokens_per_s(scrapes, r.name),
            started_at=r.started_at,
            drain_started_at=drain_started.get(r.name),
            is_overdue=r.name in (overdue or {}),
            revision=r.revision,
        )
        for r in replicas
    ]
    roles = signals.roles.values() if signals else []
    return Observed(observed, is_router_ready=view is not None,
                    num_unknown_signals=sum(rs.num_unknown for rs in roles))  # fmt: skip


def decision_roles(replicas: Sequence[Replica]) -> dict[str, str]:
    return {r.name: r.role for r in replicas if r.state in MEASURED}


def current_replicas(spec: PoolSpec, replicas: Sequence[Replica]) -> dict[str, int]:
    counts = {role: 0 for role in spec.topology.roles()}
    for r in replicas:
        if r.state in IN_SERVICE and r.role in counts:
            counts[r.role] += 1
    return counts


def scale_decisions(
    decision: Decision, current: Mapping[str, int], signals: Signals, wall: datetime
) -> dict[str, ScaleDecision]:
    out = {}
    for role, num in decision.desired.items():
        before = current.get(role, 0)
        if num == before:
            continue
        rs = signals.roles.get(role)
        out[role] = ScaleDecision(
            time=rfc3339(wall),
            from_replicas=before,
            to_replicas=num,
            reason=decision.kinds.get(role) or decision_reason(before, num, is_panic=False),
            message=decision.reasons[role],
            signals={
                k: float(v)
                for k, v in (rs.to_dict().items() if rs else [])
                if isinstance(v, int | float)
            },
        )
    return out


def stale_after_s(decision_interval_s: float, scrape_timeout_s: float) -> float:
    """A replica's newest scrape older than this is unknown: it missed two scrapes."""
    return 2 * decision_interval_s + scrape_timeout_s
