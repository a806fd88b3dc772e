"""Rollouts, pure: which engine template (revision) each replica should run, how many of each,
and what share of new requests each revision gets.

A revision names what the engine pods run: the model, the engine section (image, args, every
engine field) and each role's pod settings (GPUs, resources, placement). Replica counts,
routing and autoscaling are not part of it: changing them changes no pod.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kvfleet_router.revision_stats import RevisionCounts

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.spec import AnalysisSpec, PoolSpec
from kvfleet_operator.api.status import (
    Analysis,
    MetricCheck,
    RolloutPhase,
    RolloutStatus,
    parse_analysis,
    rfc3339,
)
from kvfleet_operator.api.validation import to_dict, validate

NORMAL, WARNING = "Normal", "Warning"


class RolloutReason:
    """The reasons of a rollout's events (Kubernetes Events, `kvfleet up`'s lines)."""

    STARTED = "RolloutStarted"
    STEP_PASSED = "RolloutStepPassed"
    SWITCHED = "RolloutSwitched"  # blue-green: traffic moved to the new revision
    PROMOTED = "RolloutPromoted"
    PROMOTED_BY_HAND = "RolloutPromotedByHand"
    ABORTED = "RolloutAborted"  # the spec moved on before the rollout finished
    NOT_POSSIBLE = "RolloutNotPossible"  # a change no split can roll out: replaced instead
    ROLLBACK_SLO = "RollbackSLO"


FAIL_FAST_CHECKS = ("errorRate", "query")  # judged mid-step; latency only on a whole step

REVISION_LENGTH = 10  # hex digits: short enough for a label and a Deployment name


def revision_of(spec: PoolSpec) -> str:
    """The revision of what `spec`'s engine pods run (a stable hash, 10 hex digits)."""
    data = to_dict(spec)
    pods: dict[str, Any] = {
        "model": data["model"],
        "engine": data.get("engine", {}),
        "roles": {
            name: {k: v for k, v in role.items() if k != "replicas"}
            for name, role in data["topology"].items()
        },
    }
    text = json.dumps(pods, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:REVISION_LENGTH]


# --- the rollout's memory ---------------------------------------------------------------


@dataclass(slots=True)
class RolloutState:
    """What a rollout must remember across ticks and restarts (plain JSON in LoopState)."""

    stable: str = ""  # the revision that serves outside a rollout
    stable_spec: dict[str, Any] | None = None  # its spec (to_dict), to start more of it
    canary: str = ""  # the revision being rolled out; "" when none
    step: int = 0  # canary: index into spec.rollout.steps; blue-green: 0 before, 1 after switch
    step_started: float | None = None  # when this step's weight took effect (None: not yet)
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)  # counts at step start
    reference: dict[str, Any] | None = None  # blue-green: the stable's counts before the switch
    rolled_back: str = ""  # a revision whose analysis failed: not rolled out again
    failure: str = ""  # why it was rolled back (the RollbackSLO message)
    last_analysis: dict[str, Any] | None = None  # status.rollout.lastAnalysis
    was_paused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> RolloutState:
        if not isinstance(data, dict):
            raise ValueError("rollout state must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in data.items() if k in known})
        if not (isinstance(state.stable, str) and isinstance(state.canary, str)
                and isinstance(state.step, int) and isinstance(state.baseline, dict)):
            raise ValueError("malformed rollout state")
        return state


@dataclass(slots=True, frozen=True)
class Presence:
    """One revision's replicas of one role: in service (starting, ready or failed), ready."""

    in_service: int = 0
    ready: int = 0


@dataclass(slots=True)
class RolloutDecision:
    state: RolloutState
    split: dict[str, dict[str, int]] | None  # revision -> role -> replicas; None: no split
    weights: dict[str, int] | None  # revision -> percent of new requests; None: by endpoints
    specs: dict[str, PoolSpec]  # revision -> the spec its new replicas start from
    status: RolloutStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


# --- analysis -----------------------------------------------------------------------------


def analyze(
    spec: AnalysisSpec,
    canary: RevisionCounts,
    stable: RevisionCounts | None,
    wall: datetime,
    query_value: float | None = None,
) -> Analysis:
    """Compare the new revision's window with the stable one's. A check whose figure the
    window lacks (no streams: no ITL) is skipped; a limit left unset is not checked."""
    checks: list[MetricCheck] = []
    base = stable if stable is not None and stable.requests > 0 else None

    def check(name: str, mine: float | None, theirs: float | None,
              absolute: float | None, ratio: float | None, increase: float | None) -> None:
        limits = [x for x in (absolute,) if x is not None]
        if theirs is not None and ratio is not None and theirs > 0:
            limits.append(theirs * ratio)
        if theirs is not None and increase is not None:
            limits.append(theirs + increase)
        if mine is None or not limits:
            return
        limit = min(limits)
        checks.append(MetricCheck(name, mine, theirs, round(limit, 6), mine <= limit))

    check("errorRate", canary.error_rate, base.error_rate if base else None,
          spec.max_error_rate, None, spec.max_error_rate_increase)
    check("ttftP90Seconds", canary.ttft_p90(), base.ttft_p90() if base else None,
          spec.max_ttft_p90_seconds, spec.max_ttft_p90_ratio, None)
    check("itlP90Seconds", canary.itl_p90(), base.itl_p90() if base else None,
          spec.max_itl_p90_seconds, spec.max_itl_p90_ratio, None)
    if spec.query is not None:
        passed = query_value is not None and query_value <= spec.query.max
        checks.append(MetricCheck("query", query_value, None, spec.query.max, passed))
    failed = [c for c in checks if not c.passed]
    message = "; ".join(_describe(c) for c in failed) if failed else \
        f"passed {len(checks)} checks over {canary.requests} requests"
    return Analysis(time=rfc3339(wall), passed=not failed, message=message,
                    canary_requests=canary.requests,
                    stable_requests=base.requests if base else 0, checks=checks)


def _describe(c: MetricCheck) -> str:
    if c.canary is None:
        return f"{c.name}: no value (the query returned nothing), limit {c.limit:g}"
    stable = f", stable {c.stable:.4g}" if c.stable is not None else ""
    return f"{c.name} {c.canary:.4g} > limit {c.limit:.4g}{stable}"


# --- the step -----------------------------------------------------------------------------


def canary_counts(total: int, weight: int) -> tuple[int, int]:
    """(stable, canary) replicas for `total` at `weight` percent: the canary gets its share
    rounded up, at least one; the stable revision keeps at least one."""
    canary = min(total, max(1, math.ceil(total * weight / 100)))
    return max(1, total - canary), canary


def step_rollout(
    spec: PoolSpec,
    state: RolloutState,
    presence: dict[str, dict[str, Presence]],  # revision -> role -> Presence
    desired: dict[str, int],  # role -> replicas the autoscaler wants for the pool
    counts: dict[str, RevisionCounts] | None,  # the routers' counters; None: unreadable
    *,
    now: float,
    wall: datetime,
    handles_rolling: bool = False,
    promote: str | None = None,
    query_value: float | None = None,
) -> RolloutDecision:
    """One tick of the rollout. Pure: returns the next state, the replica split, the
    router's weights and the status to show."""
    target = revision_of(spec)
    state = dataclasses.replace(state, baseline=dict(state.baseline))
    events: list[tuple[str, str, str]] = []
    if not state.stable:  # a pool seen for the first time: what it runs now is stable
        state.stable, state.stable_spec = target, to_dict(spec)
    strategy = spec.rollout.strategy
    specs = {target: spec}
    if state.stable != target and state.stable_spec is not None:
        try:
            specs[state.stable] = validate(PoolSpec, state.stable_spec, "stable")
        except SpecError as exc:  # saved by another version of kvfleet: start it no more
            state.stable_spec = None
            events.append((WARNING, RolloutReason.NOT_POSSIBLE,
                           f"the stable revision's saved spec no longer parses ({exc}): "
                           f"revision {target} replaces it"))
    old_spec = specs.get(state.stable)
    if strategy != "rolling" and target != state.stable and (
            old_spec is None or set(old_spec.topology.roles()) != set(spec.topology.roles())):
        # Two revisions that do not serve the same roles cannot share traffic by weight,
        # and one without its spec cannot grow back: the new one replaces the old instead.
        if old_spec is not None:
            roles = ", ".join(spec.topology.roles())
            events.append((WARNING, RolloutReason.NOT_POSSIBLE,
                           f"revision {target} changes the roles ({roles}): replacing "
                           f"revision {state.stable} instead of a {strategy}"))
        strategy = "rolling"

    def finish(decision_split: dict[str, dict[str, int]] | None,
               weights: dict[str, int] | None, status: RolloutStatus) -> RolloutDecision:
        return RolloutDecision(state, decision_split, weights, specs, status, events)

    if strategy == "rolling" or target == state.stable:
        replacing = _others(presence, target)
        if state.canary and state.canary != target:
            events.append((WARNING, RolloutReason.ABORTED,
                           f"revision {state.canary} abandoned: the spec names {target}"))
        _become_stable(state, target, spec)
        state.rolled_back = "" if target != state.rolled_back else state.rolled_back
        status = RolloutStatus(strategy=strategy, stable_revision=target)
        if handles_rolling and spec.rollout.strategy == "rolling":
            return finish(None, None, status)
        split = _rolling_split(presence, target, desired)
        if replacing:
            status.phase, status.canary_revision = RolloutPhase.PROGRESSING, target
            status.message = f"replacing revision(s) {', '.join(sorted(replacing))}"
        return finish(split, None, status)

    if target == state.rolled_back:  # the spec still names a revision that failed
        status = RolloutStatus(strategy=strategy, phase=RolloutPhase.ROLLED_BACK,
                               stable_revision=state.stable, canary_revision="",
                               message=f"revision {target} was rolled back: {state.failure}",
                               last_analysis=parse_analysis(state.last_analysis))
        return finish(_only(state.stable, desired), None, status)

    if state.canary != target:  # a new rollout (or a newer revision replaces the canary)
        if state.canary:
            events.append((WARNING, RolloutReason.ABORTED,
                           f"revision {state.canary} abandoned: the spec names {target}"))
        state.canary, state.step, state.step_started = target, 0, None
        state.baseline, state.reference, state.last_analysis = _snapshot(counts), None, None
        events.append((NORMAL, RolloutReason.STARTED,
                       f"{strategy} rollout of revision {target} (stable {state.stable})"))

    if promote == target and state.step < _final_step(spec):
        events.append((NORMAL, RolloutReason.PROMOTED_BY_HAND,
                       f"revision {target} promoted by hand"))
        state.step = _final_step(spec)
    if state.step >= _final_step(spec):
        return _final(state, target, spec, presence, desired, strategy, finish, events)

    if strategy == "blueGreen":
        return _blue_green(spec, state, presence, desired, counts, now=now, wall=wall,
                           query_value=query_value, events=events, finish=finish)
    steps = spec.rollout.steps
    weight = steps[state.step].weight
    split = _canary_split(state.stable, target, desired, weight, presence)
    status = RolloutStatus(strategy=strategy, phase=RolloutPhase.PROGRESSING,
                           stable_revision=state.stable, canary_revision=target,
                           step=state.step + 1, num_steps=len(steps) + 1,
                           last_analysis=parse_analysis(state.last_analysis))
    paused = spec.rollout.paused
    if state.step_started is None or (state.was_paused and not paused):
        mine = presence.get(target, {})
        if any(mine.get(r, Presence()).ready < n for r, n in split[target].items()):
            # The step's weight waits for its replicas (the previous step's holds), so
            # the window never measures a canary swamped by a share meant for more.
            before = steps[state.step - 1].weight if state.step else 0
            status.weight = before
            status.message = f"step {state.step + 1}: waiting for the new revision's replicas"
            return finish(split, {state.stable: 100 - before, target: before}, status)
        _start_step(state, counts, now)  # the weight takes effect now: the window opens
    state.was_paused = paused
    weights = {state.stable: 100 - weight, target: weight}
    status.weight, status.step_started_at = weight, rfc3339_at(wall, now, state.step_started)
    if paused:
        status.phase, status.message = RolloutPhase.PAUSED, f"paused at {weight}%"
        return finish(split, weights, status)
    verdict = _judge(spec, state, counts, state.stable, target, wall, query_value,
                     is_due=_held_for(state, now) >= steps[state.step].duration_seconds)
    if verdict is None:
        status.message = f"step {state.step + 1} at {weight}%: analysing"
        return finish(split, weights, status)
    if not verdict.passed:
        return _roll_back(state, target, verdict, desired, strategy, events, finish)
    events.append((NORMAL, RolloutReason.STEP_PASSED, f"revision {target} at {weight}%: "
                                                      f"{verdict.message}"))
    state.step += 1
    if state.step >= len(steps):  # the last step passed: the new revision takes everything
        return _final(state, target, spec, presence, desired, strategy, finish, events)
    state.step_started = None  # the next weight waits for its replicas
    nxt = steps[state.step].weight
    status.step, status.weight, status.last_analysis = state.step + 1, weight, verdict
    status.message = f"step {state.step + 1} at {nxt}%: starting its replicas"
    return finish(_canary_split(state.stable, target, desired, nxt, presence), weights, status)


def _canary_split(stable: str, target: str, desired: dict[str, int], weight: int,
                  presence: dict[str, dict[str, Presence]]) -> dict[str, dict[str, int]]:
    """The canary's share of each role at `weight`; the stable revision gives up a replica
    only for a canary one that is ready, so the pool never runs short."""
    split: dict[str, dict[str, int]] = {stable: {}, target: {}}
    for role, total in desired.items():
        keep, canary = canary_counts(total, weight)
        ready = presence.get(target, {}).get(role, Presence()).ready
        split[stable][role] = max(keep, total - min(ready, canary))
        split[target][role] = canary
    return split


def _final_step(spec: PoolSpec) -> int:
    """The step index past the analysed ones: canary after its steps, blue-green after the
    switch's hold."""
    return len(spec.rollout.steps) if spec.rollout.strategy == "canary" else 2


def _final(state: RolloutState, target: str, spec: PoolSpec,
           presence: dict[str, dict[str, Presence]], desired: dict[str, int], strategy: str,
           finish: Any, events: list[tuple[str, str, str]]) -> RolloutDecision:
    """The new revision grows to the pool's size while the old one still serves; once it
    has every replica ready it takes every new request and the old one is drained."""
    mine = presence.get(target, {})
    if all(mine.get(r, Presence()).ready >= n for r, n in desired.items()):
        events.append((NORMAL, RolloutReason.PROMOTED, f"revision {target} serves everything; "
                                                  f"revision {state.stable} drains"))
        last = state.last_analysis
        _become_stable(state, target, spec)
        status = RolloutStatus(strategy=strategy, stable_revision=target, weight=100,
                               message=f"revision {target} promoted",
                               last_analysis=parse_analysis(last))
        state.last_analysis = last
        return finish({target: dict(desired)}, None, status)
    old = state.stable
    if strategy == "blueGreen":
        # Served from a whole revision only, as at its switch: until the new one is whole
        # (promoted by hand before the switch, or a replica lost since), the old one keeps
        # every request and every replica.
        split, weight = {target: dict(desired), old: dict(desired)}, 0
    else:  # the canary keeps its last step's weight; the stable gives up what is ready
        split = {target: dict(desired), old: {
            r: max(1, n - mine.get(r, Presence()).ready) for r, n in desired.items()}}
        weight = spec.rollout.steps[-1].weight
    status = RolloutStatus(strategy=strategy, phase=RolloutPhase.PROGRESSING,
                           stable_revision=old, canary_revision=target,
                           step=_final_step(spec) + 1, num_steps=_final_step(spec) + 1,
                           weight=weight, message="scaling the new revision to the pool's size",
                           last_analysis=parse_analysis(state.last_analysis))
    return finish(split, {old: 100 - weight, target: weight}, status)


def _blue_green(spec: PoolSpec, state: RolloutState,
                presence: dict[str, dict[str, Presence]], desired: dict[str, int],
                counts: dict[str, RevisionCounts] | None, *, now: float, wall: datetime,
                query_value: float | None, events: list[tuple[str, str, str]],
                finish: Any) -> RolloutDecision:
    """Step 0: the new revision starts at full size beside the old one, with no traffic.
    Once every replica is ready, traffic switches (step 1) and the old revision stays, the
    instant way back, for holdSeconds while the analysis watches the new one."""
    target, old = state.canary, state.stable
    split = {old: dict(desired), target: dict(desired)}
    status = RolloutStatus(strategy="blueGreen", phase=RolloutPhase.PROGRESSING,
                           stable_revision=old, canary_revision=target, step=state.step + 1,
                           num_steps=3, last_analysis=parse_analysis(state.last_analysis))
    paused = spec.rollout.paused
    if state.step == 0:
        mine = presence.get(target, {})
        if any(mine.get(r, Presence()).ready < n for r, n in desired.items()):
            status.message = "starting the new revision at full size"
            return finish(split, {old: 100, target: 0}, status)
        if paused:
            status.phase, status.message = RolloutPhase.PAUSED, "paused before the switch"
            return finish(split, {old: 100, target: 0}, status)
        window = _window(counts, state.baseline, old)
        state.reference = window.to_dict() if window is not None else None
        state.step = 1
        _start_step(state, counts, now)
        events.append((NORMAL, RolloutReason.SWITCHED, f"revision {target} takes the traffic; "
                                                  f"revision {old} held for the analysis"))
    if state.was_paused and not paused:
        _start_step(state, counts, now)
    state.was_paused = paused
    status.step, status.weight = 2, 100
    status.step_started_at = rfc3339_at(wall, now, state.step_started)
    if paused:
        status.phase, status.message = RolloutPhase.PAUSED, "paused after the switch"
        return finish(split, {old: 0, target: 100}, status)
    reference = RevisionCounts.from_dict(state.reference) if state.reference else None
    due = _held_for(state, now) >= spec.rollout.blue_green.hold_seconds
    verdict = _judge(spec, state, counts, old, target, wall, query_value, is_due=due,
                     stable_window=reference)
    if verdict is None:
        status.message = "switched: analysing the new revision"
        return finish(split, {old: 0, target: 100}, status)
    if not verdict.passed:
        return _roll_back(state, target, verdict, desired, "blueGreen", events, finish)
    events.append((NORMAL, RolloutReason.PROMOTED, f"revision {target} passed its hold: "
                                              f"{verdict.message}"))
    _become_stable(state, target, spec)
    state.last_analysis = to_dict(verdict)
    return finish({target: dict(desired)}, None,
                  RolloutStatus(strategy="blueGreen", stable_revision=target, weight=100,
                                message=f"revision {target} promoted", last_analysis=verdict))


def _judge(spec: PoolSpec, state: RolloutState, counts: dict[str, RevisionCounts] | None,
           stable: str, canary: str, wall: datetime, query_value: float | None, *,
           is_due: bool, stable_window: RevisionCounts | None = None) -> Analysis | None:
    """The verdict on this step's window, once the new revision has served `minRequests`:
    errors (and the user's query) fail it as soon as they break a limit; latency is judged
    only on the whole step, since a fresh replica's first answers are slower (cold) and a
    p90 over the first few requests would roll back a good revision. None: not yet."""
    mine = _window(counts, state.baseline, canary)
    rules = spec.rollout.analysis
    if mine is None or mine.requests < rules.min_requests:
        return None
    theirs = stable_window if stable_window is not None else _window(counts, state.baseline,
                                                                     stable)
    verdict = analyze(rules, mine, theirs, wall, query_value)
    is_broken = any(not c.passed and c.name in FAIL_FAST_CHECKS for c in verdict.checks)
    if not is_due and not is_broken:
        return None
    state.last_analysis = to_dict(verdict)
    return verdict


def _window(counts: dict[str, RevisionCounts] | None, baseline: dict[str, dict[str, Any]],
            revision: str) -> RevisionCounts | None:
    if counts is None:
        return None
    now = counts.get(revision, RevisionCounts())
    then = baseline.get(revision)
    return now.since(RevisionCounts.from_dict(then) if then else RevisionCounts())


def _snapshot(counts: dict[str, RevisionCounts] | None) -> dict[str, dict[str, Any]]:
    return {rev: c.to_dict() for rev, c in (counts or {}).items()}


def _held_for(state: RolloutState, now: float) -> float:
    return 0.0 if state.step_started is None else now - state.step_started


def _start_step(state: RolloutState, counts: dict[str, RevisionCounts] | None,
                now: float) -> None:
    state.step_started = now
    state.baseline = _snapshot(counts)


def _roll_back(state: RolloutState, target: str, verdict: Analysis, desired: dict[str, int],
               strategy: str, events: list[tuple[str, str, str]],
               finish: Any) -> RolloutDecision:
    message = f"revision {target} rolled back: {verdict.message}"
    events.append((WARNING, RolloutReason.ROLLBACK_SLO, message))
    state.rolled_back, state.failure = target, verdict.message
    state.canary, state.step, state.step_started = "", 0, None
    state.baseline, state.reference = {}, None
    state.last_analysis = to_dict(verdict)
    status = RolloutStatus(strategy=strategy, phase=RolloutPhase.ROLLED_BACK,
                           stable_revision=state.stable, message=message,
                           last_analysis=verdict)
    return finish(_only(state.stable, desired), None, status)


def _become_stable(state: RolloutState, revision: str, spec: PoolSpec) -> None:
    state.stable, state.stable_spec = revision, to_dict(spec)
    state.canary, state.step, state.step_started = "", 0, None
    state.baseline, state.reference, state.was_paused = {}, None, False


def _only(revision: str, desired: dict[str, int]) -> dict[str, dict[str, int]]:
    return {revision: dict(desired)}


def _others(presence: dict[str, dict[str, Presence]], target: str) -> set[str]:
    return {rev for rev, roles in presence.items()
            if rev != target and any(p.in_service for p in roles.values())}  # fmt: skip


def _rolling_split(presence: dict[str, dict[str, Presence]], target: str,
                   desired: dict[str, int]) -> dict[str, dict[str, int]]:
    """Replace other revisions one replica at a time: one new replica beyond those ready,
    and the old ones keep serving until enough new ones are ready (none lost, none short)."""
    split: dict[str, dict[str, int]] = {target: {}}
    for role, n in desired.items():
        new = presence.get(target, {}).get(role, Presence())
        olds = sorted((rev, roles.get(role, Presence()).in_service)
                      for rev, roles in presence.items() if rev != target)  # fmt: skip
        if not any(num for _, num in olds):
            split[target][role] = n
            continue
        split[target][role] = min(n, max(new.ready + 1, new.in_service))
        keep = max(0, n - new.ready)
        for rev, num in olds:
            split.setdefault(rev, {})[role] = min(num, keep)
            keep -= min(num, keep)
    return split


def rfc3339_at(wall: datetime, now: float, then: float | None) -> str:
    """The wall time of `then` on the loop's clock, whose `now` is `wall`."""
    if then is None:
        return ""
    return rfc3339(wall - timedelta(seconds=max(0.0, now - then)))
