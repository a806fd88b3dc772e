"""Rollouts in virtual time: the simulated router follows the pushed split (revisions and
weights), measures each revision as a live router does, and the control loop's canary and
blue-green rollouts run to promotion or roll back on the SLO analysis."""

import dataclasses
from pathlib import Path

import pytest
import yaml
from kvfleet_operator.api import load_pool, parse_pool
from kvfleet_operator.api.spec import ReplicasSpec, RolloutSpec
from kvfleet_operator.api.validation import validate
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.decide.rollout import revision_of
from kvfleet_router.revisions import MAX_DEPARTED_REVISIONS
from kvfleet_sim.fleet import FleetSim, SimError, SimSettings, engine_config
from kvfleet_sim.ports import SimClock, SimRouter, SimRuntime, drive
from kvfleet_sim.rollout import RolloutError, RolloutScenario
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "examples" / "local-sim.yaml"
PD_POOL = ROOT / "sim" / "pools" / "h100-llama3-8b-pd.yaml"
STEP_S = 5  # each canary step, and the blue-green hold: short, so a run takes a second
ROLLOUT = {"steps": [{"weight": 25, "durationSeconds": STEP_S},
                     {"weight": 50, "durationSeconds": STEP_S}],
           "blueGreen": {"holdSeconds": STEP_S}}


def pool_of(strategy, replicas=2, path=POOL):
    pool = load_pool(path)
    for role in pool.spec.topology.roles().values():
        role.replicas = ReplicasSpec(min=replicas, max=replicas)
    pool.spec.rollout = validate(RolloutSpec, {"strategy": strategy, **ROLLOUT}, "rollout")
    return pool


def steady(rate=20.0, end=50.0, prompt=600, output=40):
    return [TraceRequest(i / rate, prompt, output) for i in range(int(rate * end))]


def replay(pool, scenario, trace=None, **settings):
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec),
                   SimSettings(startup_s=2.0, rollout=scenario, **settings))
    return sim, sim.run(trace if trace is not None else steady())


def revision_by_replica(sim):
    replicas = [r for r, _ in sim.runtime.retired] + list(sim.runtime.by_name.values())
    return {r.name: r.revision for r in replicas}


def served_by(sim, result):
    """(arrival, revision) of each answered request."""
    rev = revision_by_replica(sim)
    return [(f.arrival, rev[f.replica]) for f in result.finished if not f.is_aborted]


def event_times(result):
    return [(e["reason"], e["t"]) for e in result.rollout["events"]]


def share(served, revision, start, end):
    inside = [r for t, r in served if start < t < end]
    assert len(inside) >= 40, "too few requests in the window to read a share"
    return sum(r == revision for r in inside) / len(inside)


def test_a_good_canary_goes_through_every_step_with_nothing_lost():
    pool = pool_of("canary")
    old = revision_of(pool.spec)
    sim, result = replay(pool, RolloutScenario(at_s=5.0))
    out = result.rollout
    new = out["to_revision"]
    assert out["from_revision"] == old and new != old
    events = event_times(result)
    assert [r for r, _ in events] == ["RolloutStarted", "RolloutStepPassed",
                                      "RolloutStepPassed", "RolloutPromoted"]
    assert "at 25%" in out["events"][1]["message"] and "at 50%" in out["events"][2]["message"]
    assert out["num_failed"] == 0 and not any(f.is_aborted for f in result.finished)
    assert len(result.finished) == len(steady())
    assert out["status"]["phase"] == "Stable" and out["status"]["stableRevision"] == new
    assert out["conditions"]["Degraded"]["status"] == "False"
    # The old revision's replicas are gone; the new one runs the pool's size.
    assert {r.revision for r in sim.runtime.by_name.values()} == {new}
    assert out["revisions"][old]["replicas_at_end"] == 0
    assert out["revisions"][new]["replicas_at_end"] == 2
    # Each step's weight is the new revision's share of arrivals (one replica of each
    # revision at both steps: without the split, the policy would share them evenly).
    served = served_by(sim, result)
    (_, passed1), (_, passed2) = events[1], events[2]
    assert share(served, new, passed1 - STEP_S + 1, passed1 - 0.5) == pytest.approx(0.25, abs=0.04)
    assert share(served, new, passed2 - STEP_S + 1, passed2 - 0.5) == pytest.approx(0.5, abs=0.04)
    assert share(served, new, events[3][1] + 0.5, 50.0) == 1.0
    # What the router measured per revision adds up to every request answered.
    assert sum(r["requests"] for r in out["revisions"].values()) == len(result.finished)
    assert all(r["errors"] == 0 for r in out["revisions"].values())


def test_a_slower_canary_is_rolled_back_at_its_first_step():
    pool = pool_of("canary")
    old = revision_of(pool.spec)
    sim, result = replay(pool, RolloutScenario(at_s=5.0, slowdown=2.0))
    out = result.rollout
    new = out["to_revision"]
    events = event_times(result)
    assert [r for r, _ in events] == ["RolloutStarted", "RollbackSLO"]
    assert out["status"]["phase"] == "RolledBack"
    assert out["status"]["stableRevision"] == old
    degraded = out["conditions"]["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "RollbackSLO"
    assert "ttftP90Seconds" in degraded["message"] and new in degraded["message"]
    assert out["conditions"]["Ready"]["status"] == "True"
    ttft = next(c for c in out["status"]["lastAnalysis"]["checks"]
                if c["name"] == "ttftP90Seconds")
    # The build's steps take twice as long: its TTFT p90 about doubles.
    assert not ttft["passed"] and ttft["canary"] > 1.7 * ttft["stable"]
    assert out["status"]["lastAnalysis"]["canaryRequests"] >= 20  # minRequests
    # Nothing lost; the canary's replica drained and left; after the rollback every
    # request goes to the stable revision.
    assert out["num_failed"] == 0 and len(result.finished) == len(steady())
    assert {r.revision for r in sim.runtime.by_name.values()} == {old}
    assert 0 < out["revisions"][new]["served"] < out["revisions"][old]["served"]
    assert share(served_by(sim, result), old, events[1][1] + 0.5, 50.0) == 1.0


def test_blue_green_switches_at_once_and_loses_nothing():
    pool = pool_of("blueGreen")
    old = revision_of(pool.spec)
    sim, result = replay(pool, RolloutScenario(at_s=5.0))
    out = result.rollout
    new = out["to_revision"]
    events = event_times(result)
    assert [r for r, _ in events] == ["RolloutStarted", "RolloutSwitched", "RolloutPromoted"]
    switched, promoted = events[1][1], events[2][1]
    assert promoted - switched >= STEP_S  # the old revision was held for the analysis
    assert out["num_failed"] == 0 and len(result.finished) == len(steady())
    assert out["status"]["phase"] == "Stable" and out["status"]["stableRevision"] == new
    # Before the switch the new revision stands at full size with no traffic (weight 0);
    # after it, the new one takes every new request.
    served = served_by(sim, result)
    assert all(r == old for t, r in served if t <= switched)
    assert all(r == new for t, r in served if t > switched)
    assert {r.revision for r in sim.runtime.by_name.values()} == {new}
    assert len(sim.runtime.by_name) == 2


def test_a_rolling_update_replaces_every_replica_with_nothing_lost():
    pool = pool_of("rolling", replicas=3)
    old = revision_of(pool.spec)
    sim, result = replay(pool, RolloutScenario(at_s=5.0))
    out = result.rollout
    new = out["to_revision"]
    assert out["events"] == []  # rolling has no steps to report
    assert out["num_failed"] == 0 and len(result.finished) == len(steady())
    assert out["status"]["stableRevision"] == new
    assert {r.revision for r in sim.runtime.by_name.values()} == {new}
    assert len(sim.runtime.by_name) == 3
    assert out["revisions"][old]["served"] > 0 and out["revisions"][new]["served"] > 0


def test_pd_legs_of_one_request_never_cross_revisions():
    m = yaml.safe_load(PD_POOL.read_text())
    for role in ("prefill", "decode"):
        m["spec"]["topology"][role]["replicas"] = {"min": 2, "max": 2}
    m["spec"]["engine"]["maxModelLen"] = 32768
    m["spec"]["rollout"] = {"strategy": "canary", **ROLLOUT}
    pool = parse_pool(m)
    legs: dict[str, set[str]] = {}

    class Recording(FleetSim):
        def send(self, name, request_id, h, t, **kwargs):
            legs.setdefault(h.request_id, set()).add(self.runtime.by_name[name].revision)
            return super().send(name, request_id, h, t, **kwargs)

    # distinct long prompts: each takes a prefill leg
    trace = [TraceRequest(i / 8, 2000 + i % 50, 4) for i in range(8 * 30)]
    sim = Recording(pool, SCALERS["fixed-max"](pool.spec),
                    SimSettings(startup_s=2.0, rollout=RolloutScenario(at_s=2.0)))
    result = sim.run(trace)
    assert result.num_prefill_legs > 100
    assert {len(revs) for revs in legs.values()} == {1}
    new = result.rollout["to_revision"]
    assert sum(new in revs for revs in legs.values()) > 20  # the canary served P/D pairs
    assert result.rollout["num_failed"] == 0


# --- the pieces -------------------------------------------------------------------------


def test_replicas_run_the_profile_of_their_spec_slowed_by_their_revision():
    pool = load_pool(POOL)
    clock = SimClock()
    runtime = SimRuntime(engine_config(pool), "h100-llama3-8b", 0.0, 0.0, clock,
                         lambda *_: None, profiles=("h100-llama3-8b", "cpu-tiny"))
    tiny = dataclasses.replace(pool.spec, engine=dataclasses.replace(pool.spec.engine,
                                                                     profile="cpu-tiny"))
    runtime.slowdowns["slow"] = 2.0
    for spec, revision in ((pool.spec, "a"), (pool.spec, "a"), (tiny, "b"), (pool.spec, "slow")):
        drive(runtime.create(spec, RolePlan("unified", 1, [], [], {}, revision=revision)))
    names = {n: r.engine.runner.profile for n, r in runtime.by_name.items()}
    # the pool's own profile: the mixed-speed profiles in turn; another spec's: its own
    assert [names[f"unified-{i}"].name for i in range(3)] == ["h100-llama3-8b", "cpu-tiny",
                                                                "cpu-tiny"]
    slow, base = names["unified-3"], names["unified-1"]  # replica 3 would take cpu-tiny
    assert slow.name == "cpu-tiny x2"
    assert slow.floor_s == 2 * base.floor_s and slow.decode_s_per_seq == 2 * base.decode_s_per_seq
    assert slow.num_gpu_blocks == base.num_gpu_blocks


def test_the_router_answers_what_it_measured_per_revision():
    router = SimRouter(seed=0)
    endpoints = [{"name": n, "url": f"http://sim.{n}:8000", "revision": rev}
                 for n, rev in (("a", "r1"), ("b", "r2"))]
    drive(router.push({"version": 1, "endpoints": endpoints,
                       "revisions": {"weights": {"r1": 75, "r2": 25}}}))
    assert [router.split.assign() for _ in range(8)].count("r2") == 2
    router.count(router.endpoints["a"], is_error=False, ttft_s=0.04)
    router.count(router.endpoints["b"], is_error=True)
    router.observe_itl("r1", 0.01)
    view = drive(router.view())
    assert view is not None
    assert (view.revisions["r1"].requests, view.revisions["r1"].errors) == (1, 0)
    assert view.revisions["r1"].ttft_p90() is not None and sum(view.revisions["r1"].itl) == 1
    assert (view.revisions["r2"].requests, view.revisions["r2"].errors) == (1, 1)
    # r2 leaves the config: the router keeps it as one of the last departed (as GET
    # /admin/config does), until enough others departed after it; the report keeps it
    drive(router.push({"version": 2, "endpoints": endpoints[:1]}))
    assert not router.split.is_active
    assert set(drive(router.view()).revisions) == {"r1", "r2"}
    for n in range(MAX_DEPARTED_REVISIONS):  # departures push r2 out of the router
        router.meter.of(f"gone-{n}")
        drive(router.push({"version": 3 + n, "endpoints": endpoints[:1]}))
    assert "r2" not in drive(router.view()).revisions
    assert router.measured()["r2"].errors == 1
    assert sum(c.requests for c in router.measured().values()) == 2  # nothing counted twice


@pytest.mark.parametrize("kwargs,match", [
    ({"at_s": -1.0}, ">= 0"),
    ({"at_s": 1.0, "slowdown": 0.0}, "slowdown"),
    ({"at_s": 1.0, "profile": "h200-nonesuch"}, "unknown profile"),
    ({"at_s": 1.0, "strategy": "yolo"}, "strategy"),
    ({"at_s": 1.0, "strategy": "canary"}, "no Prometheus"),
])
def test_bad_scenarios_are_refused_before_the_replay(kwargs, match):
    with pytest.raises((RolloutError, SimError), match=match):
        pool = load_pool(POOL)
        pool.spec.rollout = validate(RolloutSpec, {"analysis": {"query": {
            "promql": "sum(rate(x[1m]))", "max": 1}}}, "rollout")
        FleetSim(pool, SCALERS["fixed-max"](pool.spec),
                 SimSettings(rollout=RolloutScenario(**kwargs)))
