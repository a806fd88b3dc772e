"""Canary and blue-green rollouts through the Kubernetes runtime, with real processes: kvfleet's
kopf operator (in-process) against kmock, `process_kubelet` running the real `kvfleet router`
and simulated `kvfleet engine` processes each Deployment asks for, streamed load throughout.
One pool, edited four times as a user would (`kubectl patch`):

1. a good revision (a new engine arg) under `strategy: canary`: every step taken, promoted,
   no request failed, and the old revision's Deployment is gone;
2. a bad revision (engines answering 500 to 30% of requests): rolled back at its first step,
   Degraded with reason RollbackSLO naming the error rate, the bad revision's Deployment
   gone; the only failed requests are its own 500s, which the router counted;
3. `strategy: blueGreen` with a good revision: the switch loses nothing, the old Deployment
   is gone;
4. a canary with a 10-minute step, promoted by hand (`kubectl annotate` the pool with
   `kvfleet.io/rollout-promote: <revision>`): it takes everything at once.

Throughout, `kubectl wait --for=condition=Ready` is satisfied (sampled every 0.1 s and run
as the real kubectl at each edit), except, as documented, while the stable revision grows
back after the rollback.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import shutil
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kmock_shim import eventually, operator_running
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from process_kubelet import ProcessKubelet
from test_k8s_kubectl_run import kubectl
from test_k8s_loop_processes import MODEL, NAME, NS, POOL

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e_local"))
from e2e_loadgen import LoadResult, run_load  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl")
POOLS = "kvfleet.io/v1alpha1/inferencepools"
RESOURCE = f"inferencepools.kvfleet.io/{NAME}"


def rollout_pool() -> dict[str, Any]:
    pool: dict[str, Any] = copy.deepcopy(POOL)
    spec: dict[str, Any] = pool["spec"]
    spec["topology"]["unified"]["replicas"] = {"min": 2, "max": 2}
    spec["autoscaling"] = {"enabled": False, "intervalSeconds": 1, "drainTimeoutSeconds": 10}
    spec["rollout"] = {"strategy": "canary",
                       "steps": [{"weight": 50, "durationSeconds": 3}],
                       "blueGreen": {"holdSeconds": 3},
                       "analysis": {"minRequests": 10}}  # fmt: skip
    return pool


class Load:
    """4 streams in flight at all times, from a thread (the in-process operator's kopf
    cancels tasks started after it), until `finish`."""

    def __init__(self, base: str) -> None:
        self.result: LoadResult | None = None
        self.is_done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(base,), daemon=True)
        self.thread.start()

    def _run(self, base: str) -> None:
        self.result = asyncio.run(run_load(base, MODEL, concurrency=4, duration_s=3600,
                                           max_tokens=16, until=self.is_done))  # fmt: skip

    def finish(self) -> LoadResult:
        self.is_done.set()
        self.thread.join(timeout=60)
        assert self.result is not None, "the load generator did not finish"
        return self.result


class ReadyWatch:
    """What `kubectl wait --for=condition=Ready` reads, sampled every 0.1 s."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.not_ready: list[dict[str, Any]] = []
        self.num_samples = 0
        self.phase = "start"
        self.kubectl_failures: list[str] = []

    async def run(self) -> None:
        while True:
            body = self.cluster.obj(POOLS, NS, NAME) or {}
            ready = next((c for c in (body.get("status") or {}).get("conditions") or []
                          if c["type"] == "Ready"), None)  # fmt: skip
            self.num_samples += 1
            if ready is None or ready["status"] != "True":
                self.not_ready.append({"ready": ready, "phase": self.phase,
                                       "rollout": (body.get("status") or {}).get("rollout"),
                                       "roles": (body.get("status") or {}).get("roles"),
                                       "deployments": engine_deployments(self.cluster)})
            await asyncio.sleep(0.1)


def status(cluster) -> dict[str, Any]:
    return (cluster.obj(POOLS, NS, NAME) or {}).get("status") or {}


def rollout(cluster) -> dict[str, Any]:
    return status(cluster).get("rollout") or {}


def condition(cluster, kind: str) -> dict[str, Any]:
    return next(c for c in status(cluster).get("conditions") or [] if c["type"] == kind)


def engine_deployments(cluster) -> dict[str, int]:
    return {d["metadata"]["name"]: d["spec"]["replicas"]
            for d in cluster.objs("apps/v1/deployments", NS)
            if d["metadata"]["labels"].get(meta.COMPONENT_LABEL) == meta.ENGINE}  # fmt: skip


def engines(kubelet) -> list:
    return [p for p in kubelet.pods.values() if p.deployment.startswith(f"{NAME}-unified")]


def only(kubelet, cluster, revision: str) -> bool:
    """Only `revision` runs: its Deployment alone, 2 Ready pods of it and no other."""
    name = f"{NAME}-unified-{revision}"
    pods = engines(kubelet)
    return (engine_deployments(cluster) == {name: 2} and len(pods) == 2
            and all(p.deployment == name and p.is_ready for p in pods))  # fmt: skip


def is_observed(cluster) -> bool:
    """The operator has seen the pool's latest generation (kubectl wait reads a condition
    only for that generation; until then it watches, which kmock cannot serve it)."""
    body = cluster.obj(POOLS, NS, NAME) or {}
    generation = body["metadata"].get("generation")
    conditions = (body.get("status") or {}).get("conditions") or []
    return bool(conditions) and all(c.get("observedGeneration") == generation
                                    for c in conditions)  # fmt: skip


async def kubectl_wait_ready(env: dict[str, str]) -> str:
    """The real `kubectl wait --for=condition=Ready`: "" when satisfied, else its error."""
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "wait", "--for=condition=Ready", RESOURCE, "-n", NS, "--timeout=5s",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return "" if proc.returncode == 0 else err.decode().strip().splitlines()[-1]


async def edit(cluster, env: dict[str, str], patch: dict[str, Any], watch: ReadyWatch) -> None:
    """As a user would, then `kubectl wait` for Ready once the operator has seen the edit."""
    await kubectl(env, "patch", RESOURCE, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    await eventually(lambda: is_observed(cluster), 10, "the edit observed")
    failure = await kubectl_wait_ready(env)
    if failure:
        watch.kubectl_failures.append(f"{watch.phase}: {failure}")


async def revision_counts(base: str, token: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(
            f"{base}/admin/config", headers={"Authorization": f"Bearer {token}"}) as resp:
        return (await resp.json()).get("revisions") or {}


async def eventually_async(check: Callable[[], Awaitable[bool]], timeout_s: float,
                           what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.timeout(240)
async def test_canary_good_then_bad_then_blue_green_through_the_kubernetes_runtime(
        cluster, tmp_path, kubectl_env):  # fmt: skip
    env = kubectl_env
    config = OperatorConfig(max_tick_s=0.5, retry_delay_s=0.5)
    async with operator_running(str(cluster.url), config), \
            ProcessKubelet(cluster, NS, tmp_path) as kubelet:  # fmt: skip
        await kubectl(env, "apply", "--validate=false", "-f", "-",
                      stdin=yaml.safe_dump(rollout_pool()))
        await eventually(lambda: rollout(cluster).get("stableRevision")
                         and only(kubelet, cluster, rollout(cluster)["stableRevision"]), 90,
                         "2 engines of the first revision Ready")  # fmt: skip
        first = rollout(cluster)["stableRevision"]
        await kubectl(env, "wait", "--for=condition=Ready", RESOURCE, "-n", NS, "--timeout=5s")
        router = next(p for p in kubelet.pods.values() if p.deployment == f"{NAME}-router")
        base = f"http://{router.ip}:8000"
        secret = cluster.obj("v1/secrets", NS, f"{NAME}-router-admin-token")
        token = base64.b64decode(secret["data"]["token"]).decode()
        watch = ReadyWatch(cluster)
        watcher = asyncio.create_task(watch.run())
        try:
            # 1. A good canary: every step, then promoted; the first revision's Deployment goes.
            watch.phase = "good canary"
            load = Load(f"{base}/v1")
            await asyncio.sleep(1.0)
            await edit(cluster, env, {"spec": {"engine": {"args": ["--seed", "7"]}}}, watch)
            weights: set[int] = set()

            def promoted() -> bool:
                r = rollout(cluster)
                weights.add(int(r.get("weight") or 0))
                return (r.get("phase") == "Stable" and r.get("stableRevision") != first
                        and only(kubelet, cluster, r["stableRevision"]))  # fmt: skip

            await eventually(promoted, 90, "the canary promoted, the old revision gone")
            good = rollout(cluster)["stableRevision"]
            result = load.finish()
            assert result.num_failed == 0, result.errors
            assert result.num_ok > 20
            assert 50 in weights, weights  # the canary step was taken
            assert condition(cluster, "Degraded")["status"] == "False"
            removed = [p for p in kubelet.removed
                       if p["metadata"]["labels"].get(meta.ROLE_LABEL) == "unified"]
            assert {p["metadata"]["labels"][meta.REVISION_LABEL] for p in removed} == {first}
            for pod in removed:  # each was drained in the router first, then the victim
                annotations = pod["metadata"].get("annotations") or {}
                assert "kvfleet.io/draining" in annotations, annotations
                assert annotations["controller.kubernetes.io/pod-deletion-cost"] == \
                    "-2147483647"  # fmt: skip

            # 2. A bad canary: rolled back at its first step.
            watch.phase = "bad canary"
            load = Load(f"{base}/v1")
            await asyncio.sleep(1.0)
            await edit(cluster, env, {"spec": {"engine": {"args": [
                "--fault-error-rate", "0.3"]}}}, watch)  # fmt: skip
            seen: dict[str, Any] = {}  # the router forgets a revision it no longer routes to

            async def rolled_back() -> bool:
                for rev, counts in (await revision_counts(base, token)).items():
                    if rev not in (first, good):
                        seen[rev] = counts
                return rollout(cluster).get("phase") == "RolledBack"

            await eventually_async(rolled_back, 60, "the rollback")
            r = rollout(cluster)
            assert r["stableRevision"] == good and r["lastAnalysis"]["passed"] is False
            degraded = condition(cluster, "Degraded")
            assert degraded["status"] == "True" and degraded["reason"] == "RollbackSLO"
            assert "errorRate" in degraded["message"]


            async def stable_only() -> bool:
                await rolled_back()
                return only(kubelet, cluster, good)

            await eventually_async(stable_only, 60, "only the stable revision left")
            result = load.finish()
            assert len(seen) == 1, seen
            (bad_counts,) = seen.values()
            bad = set(seen)
            assert bad_counts["errors"] >= 1
            assert result.num_failed <= bad_counts["errors"], result.errors
            assert all("injected fault" in e for e in result.errors), result.errors
            assert int(r.get("step") or 0) <= 1

            # 3. Blue-green with a good revision: the switch loses nothing.
            watch.phase = "blue-green"
            load = Load(f"{base}/v1")
            await asyncio.sleep(1.0)
            await edit(cluster, env, {"spec": {"rollout": {"strategy": "blueGreen"},
                                      "engine": {"args": ["--seed", "8"]}}}, watch)

            def switched() -> bool:
                r = rollout(cluster)
                return (r.get("phase") == "Stable" and r.get("stableRevision") not in
                        (first, good, *bad) and only(kubelet, cluster, r["stableRevision"]))

            await eventually(switched, 90, "the switch, the old revision gone")
            result = load.finish()
            assert result.num_failed == 0, result.errors
            assert result.num_ok > 10
            blue = rollout(cluster)["stableRevision"]

            # 4. Promoted by hand: a canary whose step would last 10 minutes takes everything
            # once the pool is annotated with its revision (read before every tick).
            watch.phase = "promoted by hand"
            await edit(cluster, env, {"spec": {
                "rollout": {"strategy": "canary",
                            "steps": [{"weight": 50, "durationSeconds": 600}]},
                "engine": {"args": ["--seed", "9"]}}}, watch)  # fmt: skip
            await eventually(lambda: rollout(cluster).get("phase") == "Progressing"
                             and rollout(cluster).get("canaryRevision"), 30,
                             "the canary under way")  # fmt: skip
            canary = rollout(cluster)["canaryRevision"]
            await kubectl(env, "annotate", RESOURCE, "-n", NS,
                          f"kvfleet.io/rollout-promote={canary}")
            await eventually(lambda: rollout(cluster).get("stableRevision") == canary
                             and only(kubelet, cluster, canary), 60,
                             "the canary promoted by hand")  # fmt: skip
            assert canary not in (first, good, blue, *bad)
            assert await kubectl_wait_ready(env) == ""  # at the end, at least
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        reasons = {json.loads(r.body)["reason"] for r in cluster.sent("POST", "/events")}
        assert {"RolloutStarted", "RollbackSLO", "RolloutPromoted"} <= reasons, reasons
        assert watch.num_samples > 100
        drops = sorted({(n["phase"], (n["rollout"] or {}).get("message") or "",
                         (n["ready"] or {}).get("message") or "") for n in watch.not_ready})
        # Ready holds through every rollout: the stable revision gives up a replica only
        # for a ready canary one, and Ready counts ready replicas of any revision against
        # the pool's size. The one documented dip: after a rollback the stable revision
        # grows back the replicas the canary step took, and until then the pool is short.
        # (Told by the pool's own rollout phase: the loop's status can trail the kubelet by
        # a tick, so the test's next edit may begin inside that dip.)
        dips = [n for n in watch.not_ready
                if not ((n["rollout"] or {}).get("phase") == "RolledBack"
                        and (n["ready"] or {}).get("reason") == "ReplicasNotReady")]
        assert not dips and not watch.kubectl_failures, (
            f"Ready dropped in {len(dips)} of {watch.num_samples} samples: {drops}; "
            f"kubectl wait: {watch.kubectl_failures}")
