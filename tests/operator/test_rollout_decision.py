"""The rollout decision (decide/rollout.py), pure: revisions, the canary split, the analysis
and its limits, canary steps, blue-green, rolling, pause, promotion and rollback."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kvfleet_operator.api.pool import parse_spec
from kvfleet_operator.api.spec import AnalysisSpec, PoolSpec
from kvfleet_operator.api.status import RolloutPhase
from kvfleet_operator.decide.rollout import (
    Presence,
    RolloutDecision,
    RolloutState,
    analyze,
    canary_counts,
    revision_of,
    step_rollout,
)
from kvfleet_operator.loop.state import LoopState
from kvfleet_router.revision_stats import RevisionCounts, bucket_of

WALL = datetime(2026, 12, 3, tzinfo=UTC)


def pool_spec(profile: str = "cpu-tiny", replicas: int = 4, **rollout: Any) -> PoolSpec:
    return parse_spec({
        "model": {"name": "m", "source": "builtin://tiny-random"},
        "engine": {"kind": "builtin", "runner": "simulated", "profile": profile},
        "topology": {"unified": {"replicas": {"min": replicas, "max": replicas}}},
        "rollout": rollout,
    })


def counts(requests: int, errors: int = 0, ttft_s: float = 0.05) -> RevisionCounts:
    c = RevisionCounts(requests=requests, errors=errors)
    c.ttft[bucket_of(ttft_s)] = requests
    return c


def present(**by_revision: tuple[int, int]) -> dict[str, dict[str, Presence]]:
    return {rev: {"unified": Presence(*n)} for rev, n in by_revision.items()}


def step(spec: PoolSpec, state: RolloutState, presence: dict[str, dict[str, Presence]],
         seen: dict[str, RevisionCounts] | None, now: float, **kw: Any) -> RolloutDecision:
    return step_rollout(spec, state, presence, {"unified": 4}, seen, now=now, wall=WALL, **kw)


STABLE = pool_spec("cpu-tiny")
CANARY = pool_spec("h100-llama3-8b", strategy="canary",
                   steps=[{"weight": 5, "durationSeconds": 60},
                          {"weight": 50, "durationSeconds": 60}])


def started() -> RolloutState:
    """A pool that ran STABLE, whose spec now names CANARY's engine."""
    first = step(STABLE, RolloutState(), present(), None, 0.0)
    return first.state


# --- revisions and splits --------------------------------------------------------------


def test_a_revision_names_what_the_pods_run_and_nothing_else() -> None:
    base = pool_spec()
    assert revision_of(base) == revision_of(pool_spec(replicas=7))  # counts: no pod changes
    assert revision_of(base) == revision_of(pool_spec(strategy="canary"))
    assert revision_of(base) != revision_of(pool_spec("h100-llama3-8b"))
    assert len(revision_of(base)) == 10


@pytest.mark.parametrize(("total", "weight", "want"), [
    (4, 5, (3, 1)), (4, 25, (3, 1)), (4, 26, (2, 2)), (4, 50, (2, 2)), (4, 99, (1, 4)),
    (1, 5, (1, 1)), (10, 10, (9, 1)), (10, 11, (8, 2)),
])
def test_canary_counts_round_the_canary_up_and_never_starve_the_stable(
        total: int, weight: int, want: tuple[int, int]) -> None:
    assert canary_counts(total, weight) == want


# --- analysis ---------------------------------------------------------------------------


def test_the_error_rate_passes_at_its_limit_and_fails_just_above() -> None:
    rules = AnalysisSpec(max_error_rate=0.05, max_error_rate_increase=None)
    assert analyze(rules, counts(100, 5), None, WALL).passed
    failed = analyze(rules, counts(100, 6), None, WALL)
    assert not failed.passed
    assert failed.checks[0].name == "errorRate" and failed.checks[0].limit == 0.05
    assert "errorRate 0.06 > limit 0.05" in failed.message


def test_the_error_rate_increase_is_relative_to_the_stable_revision() -> None:
    rules = AnalysisSpec(max_error_rate=None, max_error_rate_increase=0.02)
    assert analyze(rules, counts(100, 12), counts(100, 10), WALL).passed
    assert not analyze(rules, counts(100, 13), counts(100, 10), WALL).passed


def test_ttft_p90_is_compared_with_the_stable_revisions() -> None:
    rules = AnalysisSpec(max_ttft_p90_ratio=1.5, max_error_rate=None)
    same = analyze(rules, counts(50, ttft_s=0.05), counts(500, ttft_s=0.05), WALL)
    assert same.passed
    doubled = analyze(rules, counts(50, ttft_s=0.1), counts(500, ttft_s=0.05), WALL)
    assert not doubled.passed
    check = next(c for c in doubled.checks if c.name == "ttftP90Seconds")
    assert check.canary is not None and check.stable is not None
    assert check.canary > check.limit == pytest.approx(check.stable * 1.5, rel=1e-6)


def test_an_absolute_limit_holds_without_a_stable_figure_and_a_query_must_answer() -> None:
    rules = AnalysisSpec(max_ttft_p90_seconds=0.04, max_error_rate=None,
                         query={"promql": "x", "max": 1.0})  # type: ignore[arg-type]
    verdict = analyze(rules, counts(50, ttft_s=0.05), None, WALL, query_value=1.0)
    assert [c.name for c in verdict.checks if not c.passed] == ["ttftP90Seconds"]
    silent = analyze(AnalysisSpec(query={"promql": "x", "max": 1.0}),  # type: ignore[arg-type]
                     counts(50), None, WALL, query_value=None)
    assert not silent.passed and "query" in silent.message


# --- canary -----------------------------------------------------------------------------


def test_a_first_sight_makes_what_runs_stable_and_splits_nothing() -> None:
    d = step(STABLE, RolloutState(), present(), None, 0.0)
    assert d.state.stable == revision_of(STABLE) and d.state.canary == ""
    assert d.split == {revision_of(STABLE): {"unified": 4}} and d.weights is None
    assert d.status.phase == RolloutPhase.STABLE


def test_a_canary_walks_its_steps_and_is_promoted_once_it_has_the_pools_size() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    d = step(CANARY, started(), present(**{old: (4, 4)}), {}, 0.0)
    assert d.split == {old: {"unified": 4}, new: {"unified": 1}}  # the stable gives up none yet
    assert d.weights == {old: 100, new: 0}  # nothing for the canary until it is ready
    assert d.state.step_started is None and d.events[0][1] == "RolloutStarted"
    on = present(**{old: (4, 4), new: (1, 1)})
    d = step(CANARY, d.state, on, {old: counts(100)}, 1.0)
    assert d.weights == {old: 95, new: 5} and d.state.step_started == 1.0
    assert d.split == {old: {"unified": 3}, new: {"unified": 1}}  # one for one ready canary
    on = present(**{old: (3, 3), new: (1, 1)})
    seen = {old: counts(500), new: counts(30)}
    d = step(CANARY, d.state, on, seen, 60.9)  # passing, but the step is not over
    assert d.weights == {old: 95, new: 5} and d.state.step == 0
    d = step(CANARY, d.state, on, seen, 61.0)  # passed: 50% waits for its second replica
    assert d.state.step == 1 and d.weights == {old: 95, new: 5}
    assert d.split == {old: {"unified": 3}, new: {"unified": 2}}
    assert d.status.step == 2 and d.status.weight == 5
    d = step(CANARY, d.state, present(**{old: (3, 3), new: (2, 1)}), seen, 62.0)
    assert d.weights == {old: 95, new: 5} and d.state.step_started is None
    on = present(**{old: (3, 3), new: (2, 2)})
    d = step(CANARY, d.state, on, seen, 63.0)
    assert d.weights == {old: 50, new: 50} and d.state.step_started == 63.0
    assert d.split == {old: {"unified": 2}, new: {"unified": 2}} and d.status.weight == 50
    on = present(**{old: (2, 2), new: (2, 2)})
    seen = {old: counts(700), new: counts(230)}
    d = step(CANARY, d.state, on, seen, 123.0)  # the last step passed: grow, then switch
    assert d.split == {new: {"unified": 4}, old: {"unified": 2}}
    assert d.weights == {old: 50, new: 50} and d.status.phase == RolloutPhase.PROGRESSING
    d = step(CANARY, d.state, present(**{old: (2, 2), new: (4, 4)}), seen, 130.0)
    assert d.split == {new: {"unified": 4}} and d.weights is None
    assert d.state.stable == new and d.state.canary == ""
    assert d.status.phase == RolloutPhase.STABLE and d.events[-1][1] == "RolloutPromoted"


def test_a_window_short_of_min_requests_decides_nothing_and_then_fails_fast() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    on = present(**{old: (3, 3), new: (1, 1)})
    d = step(CANARY, started(), on, {}, 0.0)  # the canary was ready at once: window opens
    assert d.weights == {old: 95, new: 5}
    d = step(CANARY, d.state, on, {old: counts(100), new: counts(19, 19)}, 5.0)
    assert d.state.canary == new  # 19 < minRequests 20: no verdict yet
    d = step(CANARY, d.state, on, {old: counts(100), new: counts(20, 2)}, 6.0)
    assert d.state.canary == "" and d.state.rolled_back == new  # 10% errors, before it is due
    assert d.split == {old: {"unified": 4}} and d.weights is None
    assert d.status.phase == RolloutPhase.ROLLED_BACK
    assert "errorRate 0.1 > limit 0.02, stable 0" in d.status.message  # stable + 0.02
    assert [e[:2] for e in d.events] == [("Warning", "RollbackSLO")]
    again = step(CANARY, d.state, present(**{old: (4, 4)}), {}, 7.0)
    assert again.state.canary == "" and again.status.phase == RolloutPhase.ROLLED_BACK
    fixed = pool_spec("cpu-tiny", strategy="canary", replicas=4)
    fixed.engine.max_num_seqs = 128  # another revision: a new rollout starts
    d = step(fixed, again.state, present(**{old: (4, 4)}), {}, 8.0)
    assert d.state.canary == revision_of(fixed) and d.state.rolled_back == new


def test_the_window_counts_from_the_steps_start_not_from_the_routers_start() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    on = present(**{old: (3, 3), new: (1, 1)})
    d = step(CANARY, started(), on, {new: counts(50, 50)}, 0.0)  # errors before the step
    d = step(CANARY, d.state, on, {old: counts(10), new: counts(70, 50)}, 61.0)
    assert d.state.step == 1 and d.state.rolled_back == ""  # 20 clean requests since


def test_a_paused_rollout_holds_its_weight_past_the_step() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    paused = copy.deepcopy(CANARY)
    paused.rollout.paused = True
    on = present(**{old: (3, 3), new: (1, 1)})
    d = step(paused, started(), on, {}, 0.0)
    d = step(paused, d.state, on, {old: counts(100), new: counts(40)}, 500.0)
    assert d.state.step == 0 and d.weights == {old: 95, new: 5}
    assert d.status.phase == RolloutPhase.PAUSED
    d = step(CANARY, d.state, on, {old: counts(100), new: counts(40)}, 501.0)  # resumed
    assert d.state.step == 0 and d.state.step_started == 501.0  # a fresh window


def test_promotion_by_hand_skips_the_remaining_steps() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    on = present(**{old: (3, 3), new: (1, 1)})
    d = step(CANARY, started(), on, {}, 0.0, promote="not-this-one")
    assert d.state.step == 0
    d = step(CANARY, d.state, on, {}, 1.0, promote=new)
    assert d.split == {new: {"unified": 4}, old: {"unified": 3}}
    assert d.events[0][1] == "RolloutPromotedByHand"


# --- blue-green and rolling -------------------------------------------------------------


def test_blue_green_switches_when_full_and_rolls_back_to_the_old_revision() -> None:
    spec = pool_spec("h100-llama3-8b", strategy="blueGreen", blueGreen={"holdSeconds": 30})
    old, new = revision_of(STABLE), revision_of(spec)
    d = step(spec, started(), present(**{old: (4, 4), new: (4, 3)}), {}, 0.0)
    assert d.split == {old: {"unified": 4}, new: {"unified": 4}}
    assert d.weights == {old: 100, new: 0}
    full = present(**{old: (4, 4), new: (4, 4)})
    d = step(spec, d.state, full, {old: counts(100)}, 1.0)
    assert d.weights == {old: 0, new: 100} and d.events[-1][1] == "RolloutSwitched"
    good = step(spec, d.state, full, {old: counts(100), new: counts(100)}, 31.0)
    assert good.split == {new: {"unified": 4}} and good.state.stable == new
    slow = {old: counts(100), new: counts(40, ttft_s=0.5)}
    early = step(spec, d.state, full, slow, 30.9)  # latency waits for the whole hold
    assert early.state.canary == new and early.weights == {old: 0, new: 100}
    bad = step(spec, d.state, full, slow, 31.0)
    assert bad.split == {old: {"unified": 4}} and bad.state.rolled_back == new
    assert "ttftP90Seconds" in bad.status.message


def test_rolling_replaces_one_replica_at_a_time_without_going_short() -> None:
    spec = pool_spec("h100-llama3-8b")
    old, new = revision_of(STABLE), revision_of(spec)
    d = step(spec, started(), present(**{old: (4, 4)}), None, 0.0)
    assert d.split == {new: {"unified": 1}, old: {"unified": 4}} and d.weights is None
    assert d.state.stable == new and d.status.phase == RolloutPhase.PROGRESSING
    d = step(spec, d.state, present(**{old: (4, 4), new: (1, 1)}), None, 1.0)
    assert d.split == {new: {"unified": 2}, old: {"unified": 3}}
    d = step(spec, d.state, present(**{old: (1, 1), new: (4, 4)}), None, 2.0)
    assert d.split == {new: {"unified": 4}, old: {"unified": 0}}
    kube = step(spec, started(), present(**{old: (4, 4)}), None, 0.0, handles_rolling=True)
    assert kube.split is None  # a runtime that rolls its own Deployments


def test_the_rollout_state_survives_the_loop_state_round_trip() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    d = step(CANARY, started(), present(**{old: (3, 3), new: (1, 1)}), {new: counts(3)}, 0.0)
    state = LoopState(rollout=d.state)
    back = LoopState.from_dict(state.to_dict())
    assert back.rollout == d.state
    with pytest.raises(ValueError):
        LoopState.from_dict({**state.to_dict(), "rollout": {"stable": 3}})


def test_a_change_of_roles_is_replaced_not_split() -> None:
    split_pool = parse_spec({
        "model": {"name": "m", "source": "builtin://tiny-random"},
        "engine": {"kind": "builtin", "runner": "simulated", "profile": "cpu-tiny"},
        "topology": {"prefill": {"replicas": {"min": 1, "max": 1}},
                     "decode": {"replicas": {"min": 1, "max": 1}}},
        "rollout": {"strategy": "canary"},
    })
    old, new = revision_of(STABLE), revision_of(split_pool)
    d = step_rollout(split_pool, started(), present(**{old: (4, 4)}),
                     {"prefill": 1, "decode": 1}, {}, now=0.0, wall=WALL)
    assert d.state.stable == new and d.state.canary == "" and d.weights is None
    assert d.status.strategy == "rolling" and new in d.split
    assert [e[1] for e in d.events] == ["RolloutNotPossible"]
    kube = step_rollout(split_pool, started(), present(**{old: (4, 4)}),
                        {"prefill": 1, "decode": 1}, {}, now=0.0, wall=WALL,
                        handles_rolling=True)
    assert kube.split is not None  # a canary pool's Deployments are the loop's to replace


def test_a_stable_spec_that_no_longer_parses_is_replaced() -> None:
    state = started()
    state.stable_spec = {"model": {"name": "m"}, "bogus": 1}
    d = step(CANARY, state, present(**{revision_of(STABLE): (4, 4)}), {}, 0.0)
    assert d.state.stable == revision_of(CANARY) and d.weights is None
    assert [e[1] for e in d.events] == ["RolloutNotPossible"]


# --- what status shows, step by step ----------------------------------------------------


def test_a_canarys_status_counts_its_steps_and_the_final_growth() -> None:
    """CANARY has two analysed steps and the growth to full size: 3 steps in all."""
    from kvfleet_operator.api.status import rfc3339

    old, new = revision_of(STABLE), revision_of(CANARY)
    d = step(CANARY, started(), present(**{old: (4, 4)}), {}, 0.0)
    s = d.status
    assert (s.step, s.num_steps, s.weight) == (1, 3, 0)
    assert s.message == "step 1: waiting for the new revision's replicas"
    on = present(**{old: (3, 3), new: (1, 1)})
    d = step(CANARY, d.state, on, {old: counts(100)}, 10.0)
    d = step(CANARY, d.state, on, {old: counts(100)}, 40.0)
    s = d.status
    assert (s.step, s.num_steps, s.weight) == (1, 3, 5)
    assert s.message == "step 1 at 5%: analysing"
    assert s.step_started_at == rfc3339(WALL - timedelta(seconds=30))  # 30 s ago
    d = step(CANARY, d.state, on, {old: counts(500), new: counts(30)}, 70.0)
    s = d.status
    assert (s.step, s.num_steps, s.weight) == (2, 3, 5)
    assert s.message == "step 2 at 50%: starting its replicas"
    d = step(CANARY, d.state, present(**{old: (2, 2), new: (2, 2)}), {}, 71.0)
    d = step(CANARY, d.state, present(**{old: (2, 2), new: (2, 2)}),
             {old: counts(700), new: counts(230)}, 131.0)
    s = d.status
    assert (s.step, s.num_steps, s.weight) == (3, 3, 50)
    assert s.message == "scaling the new revision to the pool's size"


def test_a_blue_green_status_is_three_steps_with_the_switch_in_the_middle() -> None:
    spec = pool_spec("h100-llama3-8b", strategy="blueGreen", blueGreen={"holdSeconds": 30})
    old, new = revision_of(STABLE), revision_of(spec)
    d = step(spec, started(), present(**{old: (4, 4), new: (4, 3)}), {}, 0.0)
    assert (d.status.step, d.status.num_steps, d.status.weight) == (1, 3, 0)
    full = present(**{old: (4, 4), new: (4, 4)})
    d = step(spec, d.state, full, {old: counts(100)}, 1.0)
    assert (d.status.step, d.status.num_steps, d.status.weight) == (2, 3, 100)
    # Promoted by hand before its replicas are up: the old revision keeps the traffic
    # until they are.
    d = step(spec, started(), present(**{old: (4, 4), new: (4, 3)}), {}, 0.0, promote=new)
    assert d.weights == {old: 100, new: 0}
    assert d.split == {new: {"unified": 4}, old: {"unified": 4}}  # and keeps all it has
    assert (d.status.step, d.status.num_steps, d.status.weight) == (3, 3, 0)


def test_a_blue_green_hold_restarts_when_a_pause_after_the_switch_ends() -> None:
    spec = pool_spec("h100-llama3-8b", strategy="blueGreen", blueGreen={"holdSeconds": 30})
    old, new = revision_of(STABLE), revision_of(spec)
    full = present(**{old: (4, 4), new: (4, 4)})
    d = step(spec, started(), full, {old: counts(100)}, 0.0)  # switched at t = 0
    paused = copy.deepcopy(spec)
    paused.rollout.paused = True
    d = step(paused, d.state, full, {old: counts(100), new: counts(50)}, 20.0)
    assert d.status.phase == RolloutPhase.PAUSED and d.weights == {old: 0, new: 100}
    d = step(spec, d.state, full, {old: counts(100), new: counts(50)}, 100.0)  # resumed
    assert d.state.step_started == 100.0 and d.state.canary == new  # a fresh hold
    d = step(spec, d.state, full, {old: counts(100), new: counts(100)}, 129.9)
    assert d.state.canary == new
    d = step(spec, d.state, full, {old: counts(100), new: counts(100)}, 130.0)
    assert d.state.stable == new


def test_going_back_to_the_stable_revision_abandons_the_canary_and_forgets_a_rollback() -> None:
    old, new = revision_of(STABLE), revision_of(CANARY)
    on = present(**{old: (3, 3), new: (1, 1)})
    d = step(CANARY, started(), on, {}, 0.0)
    back = step(STABLE, d.state, on, {}, 1.0)  # the spec names the stable revision again
    assert back.state.canary == "" and back.state.stable == old
    assert [e[:2] for e in back.events] == [("Warning", "RolloutAborted")]
    assert new in back.events[0][2]
    # A rollback is remembered while the spec names the failed revision...
    failed = step(CANARY, d.state, on, {old: counts(100), new: counts(20, 2)}, 2.0)
    assert failed.state.rolled_back == new
    # ... and forgotten once it names another: applied again, it is tried again.
    back = step(STABLE, failed.state, present(**{old: (4, 4)}), {}, 3.0)
    assert back.state.rolled_back == "" and back.events == []
    again = step(CANARY, back.state, present(**{old: (4, 4)}), {}, 4.0)
    assert again.state.canary == new and again.status.phase == RolloutPhase.PROGRESSING


def test_the_old_revision_shrinks_as_the_new_one_readies_and_two_old_ones_share_the_rest():
    old, new = revision_of(STABLE), revision_of(CANARY)
    d = step(CANARY, started(), present(**{old: (4, 4), new: (1, 1)}), {}, 0.0, promote=new)
    d = step(CANARY, d.state, present(**{old: (4, 4), new: (4, 3)}), {}, 1.0)
    assert d.split == {new: {"unified": 4}, old: {"unified": 1}}  # 3 of 4 new are ready
    # Rolling over two old revisions: those 3 seats left go to the first, then the next.
    spec = pool_spec("h100-llama3-8b")
    d = step(spec, started(), present(a=(1, 1), b=(3, 3), **{revision_of(spec): (1, 1)}),
             None, 2.0)
    assert d.split == {revision_of(spec): {"unified": 2}, "a": {"unified": 1},
                       "b": {"unified": 2}}
    assert d.status.message == "replacing revision(s) a, b"
    # A revision with nothing in service is not being replaced.
    d = step(spec, d.state, present(a=(0, 0), **{revision_of(spec): (4, 4)}), None, 3.0)
    assert d.status.message == "" and d.status.phase == RolloutPhase.STABLE


def test_a_blue_green_paused_before_its_switch_keeps_the_traffic_on_the_old_revision():
    spec = pool_spec("h100-llama3-8b", strategy="blueGreen", blueGreen={"holdSeconds": 30})
    spec.rollout.paused = True
    old, new = revision_of(STABLE), revision_of(spec)
    d = step(spec, started(), present(**{old: (4, 4), new: (4, 4)}), {}, 0.0)
    assert d.weights == {old: 100, new: 0} and d.status.phase == RolloutPhase.PAUSED
