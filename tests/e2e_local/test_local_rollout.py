"""Rollouts on a real local fleet (`kvfleet up`, simulated engines, the real router) under
continuous streamed load: the pool file is edited while the fleet serves, and the loop rolls
the new engine template out by `spec.rollout`.

- a canary of a good revision walks every step to 100%, loses no request, and the stable
  revision's replicas are drained and gone at the end;
- a canary of a bad revision (engines that answer 500 to 30% of requests) is rolled back at
  its first step, `Degraded` with reason RollbackSLO naming the error rate; the only failed
  requests are the bad revision's own 500s, which the router counted;
- a blue-green switch loses no request.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_fleet import Fleet
from e2e_loadgen import LoadResult, run_load

pytestmark = pytest.mark.timeout(240)

POOL: dict[str, Any] = {
    "apiVersion": "kvfleet.io/v1alpha1",
    "kind": "InferencePool",
    "metadata": {"name": "e2e-rollout"},
    "spec": {
        "model": {"name": "llama3-8b-sim", "source": "builtin://llama3-8b-sim",
                  "servedModelName": "llama3-8b"},
        "engine": {"kind": "builtin", "runner": "simulated", "profile": "h100-llama3-8b",
                   "maxNumSeqs": 4, "maxNumBatchedTokens": 2048, "maxModelLen": 4096,
                   "numBlocks": 2048},
        "topology": {"unified": {"replicas": {"min": 3, "max": 3}}},
        "routing": {"policy": "least-request"},
        "autoscaling": {"enabled": False, "drainTimeoutSeconds": 10},
        "rollout": {
            "strategy": "canary",
            "steps": [{"weight": 20, "durationSeconds": 3}, {"weight": 50, "durationSeconds": 3}],
            "blueGreen": {"holdSeconds": 3},
            "analysis": {"minRequests": 10},
        },
    },
}


def write(path: Path, pool: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(pool))


class Load:
    """Streamed chat requests from a thread until stopped: 4 in flight at all times."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.stop_at: float | None = None
        self.result: LoadResult | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.is_done = threading.Event()
        self.thread.start()

    def _run(self) -> None:
        self.result = asyncio.run(run_load(self.endpoint, "llama3-8b", concurrency=4,
                                           duration_s=3600, until=self.is_done))

    def finish(self) -> LoadResult:
        self.is_done.set()
        self.thread.join(timeout=60)
        assert self.result is not None, "the load generator did not finish"
        return self.result


def rollout(state: dict[str, Any]) -> dict[str, Any]:
    return state.get("status", {}).get("rollout") or {}


def condition(state: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in state["status"]["conditions"] if c["type"] == kind)


def revisions(state: dict[str, Any]) -> set[str]:
    return {r.get("revision", "") for r in state.get("replicas", []) if r["role"] == "unified"}


def start(tmp_path: Path, pool: dict[str, Any]) -> tuple[Fleet, Path, str]:
    path = tmp_path / "pool.yaml"
    write(path, pool)
    fleet = Fleet(str(path), tmp_path)
    state = fleet.wait_for("3 ready replicas and a stable revision",
                           lambda s: fleet.num_ready(s, "unified") == 3
                           and bool(rollout(s).get("stableRevision")), 60)  # fmt: skip
    return fleet, path, rollout(state)["stableRevision"]


def edited(pool: dict[str, Any], args: list[str]) -> dict[str, Any]:
    new = copy.deepcopy(pool)
    new["spec"]["engine"]["args"] = args
    return new


def test_a_good_canary_reaches_100_percent_and_loses_nothing(tmp_path: Path) -> None:
    fleet, path, old = start(tmp_path, POOL)
    try:
        load = Load(fleet.endpoint)
        write(path, edited(POOL, ["--seed", "7"]))  # a new revision, as fast as the old
        weights_seen: set[int] = set()

        def promoted(s: dict[str, Any]) -> bool:
            weights_seen.add(int(rollout(s).get("weight", 0)))
            r = rollout(s)
            return (r.get("phase") == "Stable" and r.get("stableRevision") != old
                    and revisions(s) == {r["stableRevision"]}
                    and fleet.num_ready(s, "unified") == 3)

        state = fleet.wait_for("the canary promoted and the old revision gone", promoted, 120)
        result = load.finish()
        assert result.num_failed == 0, result.errors
        assert result.num_ok > 50
        assert {20, 50} <= weights_seen  # every step was taken
        assert len(fleet.replicas(state, "unified")) == 3
        events = "\n".join(fleet.events())
        assert "canary rollout of revision" in events  # the RolloutStarted event's line
        assert condition(state, "Degraded")["status"] == "False"
    finally:
        fleet.cleanup()


def test_a_bad_canary_is_rolled_back_at_its_first_step(tmp_path: Path) -> None:
    fleet, path, old = start(tmp_path, POOL)
    try:
        load = Load(fleet.endpoint)
        write(path, edited(POOL, ["--fault-error-rate", "0.3"]))
        state = fleet.wait_for("the rollback",
                               lambda s: rollout(s).get("phase") == "RolledBack", 90)
        r = rollout(state)
        assert r["stableRevision"] == old and r["lastAnalysis"]["passed"] is False
        degraded = condition(state, "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "RollbackSLO"
        assert "errorRate" in degraded["message"]
        state = fleet.wait_for("only the stable revision left",
                               lambda s: revisions(s) == {old}
                               and fleet.num_ready(s, "unified") == 3, 60)  # fmt: skip
        view = fleet.router_view()
        result = load.finish()
        bad = {rev: c for rev, c in view.get("revisions", {}).items() if rev != old}
        assert len(bad) == 1, view.get("revisions")
        (counted,) = bad.values()
        assert counted["errors"] >= 1
        # Every failed request is one of the bad revision's own 500s, and no more of them
        # reached clients than the router counted for it.
        assert result.num_failed <= counted["errors"], result.errors
        assert all("HTTP 500" in e and "injected fault" in e for e in result.errors)
        assert int(r.get("step", 0)) <= 1 and r.get("weight", 0) in (0, 20)
    finally:
        fleet.cleanup()


def test_a_blue_green_switch_loses_nothing(tmp_path: Path) -> None:
    pool = copy.deepcopy(POOL)
    pool["spec"]["rollout"]["strategy"] = "blueGreen"
    fleet, path, old = start(tmp_path, pool)
    try:
        load = Load(fleet.endpoint)
        write(path, edited(pool, ["--seed", "7"]))
        state = fleet.wait_for(
            "the switch and the old revision gone",
            lambda s: rollout(s).get("phase") == "Stable"
            and rollout(s).get("stableRevision") != old
            and revisions(s) == {rollout(s)["stableRevision"]}, 120)  # fmt: skip
        result = load.finish()
        assert result.num_failed == 0, result.errors
        assert result.num_ok > 30
        assert len(fleet.replicas(state, "unified")) == 3
    finally:
        fleet.cleanup()


def test_a_paused_canary_holds_its_weight_until_promoted_by_hand(tmp_path: Path) -> None:
    pool = copy.deepcopy(POOL)
    pool["spec"]["rollout"]["steps"] = [{"weight": 20, "durationSeconds": 3600}]
    fleet, path, old = start(tmp_path, pool)
    try:
        load = Load(fleet.endpoint)
        new = edited(pool, ["--seed", "7"])
        new["spec"]["rollout"]["paused"] = True
        write(path, new)
        state = fleet.wait_for("the canary paused at 20%",
                               lambda s: rollout(s).get("phase") == "Paused", 60)
        r = rollout(state)
        assert r["weight"] == 20 and r["step"] == 1
        assert condition(state, "Progressing")["reason"] == "RolloutPaused"
        assert condition(state, "Ready")["status"] == "True"  # the stable revision serves
        shown = subprocess.run(
            [sys.executable, "-m", "kvfleet_operator.cli.main", "status", "--state-dir",
             str(fleet.state_dir)], capture_output=True, text=True, timeout=30).stdout
        assert (f"rollout   canary, revision {old} stable; paused: revision "
                f"{r['canaryRevision']} at 20% (step 1/2): paused at 20%") in shown, shown
        new["metadata"]["annotations"] = {"kvfleet.io/rollout-promote": r["canaryRevision"]}
        write(path, new)
        state = fleet.wait_for("the hand-promoted revision serving alone",
                               lambda s: rollout(s).get("phase") == "Stable"
                               and rollout(s).get("stableRevision") == r["canaryRevision"]
                               and revisions(s) == {r["canaryRevision"]}, 60)  # fmt: skip
        result = load.finish()
        assert result.num_failed == 0, result.errors
        assert any("promoted by hand" in line for line in fleet.events())
    finally:
        fleet.cleanup()
