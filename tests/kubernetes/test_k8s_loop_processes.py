"""The whole loop through kmock, with real processes: kvfleet's kopf operator (in-process)
reconciles a pool; `process_kubelet` runs the real `kvfleet router` and simulated
`kvfleet engine` processes the Deployments ask for, on loopback "pod IPs"; a bounded load
step scales the unified Deployment up, and removing the load scales it down through
drain; a spec change rolls the engines under load; no client request fails."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import pytest
from kmock_shim import api, eventually, operator_running
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from process_kubelet import ProcessKubelet

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e_local"))
from e2e_loadgen import run_load  # noqa: E402

NS, NAME, MODEL = "inference", "k8s-sim", "llama3-8b"
POOL = {
    "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
    "metadata": {"name": NAME, "namespace": NS},
    "spec": {
        "model": {"name": "llama3-8b-sim", "source": "builtin://llama3-8b-sim",
                  "servedModelName": MODEL},
        "engine": {"kind": "builtin", "runner": "simulated", "profile": "h100-llama3-8b",
                   "maxNumSeqs": 4, "maxNumBatchedTokens": 2048, "maxModelLen": 4096,
                   "blockSize": 16, "numBlocks": 2048},
        "topology": {"unified": {"replicas": {"min": 1, "max": 4}}},
        "routing": {"policy": "least-request", "replicas": 1},
        "autoscaling": {
            "intervalSeconds": 1, "windowSeconds": 4,
            "targets": {"waitingPerReplica": 2, "runningPerReplica": 4},
            "scaleUp": {"maxStep": 2, "cooldownSeconds": 2},
            "scaleDown": {"stabilizationWindowSeconds": 3, "maxStep": 2, "cooldownSeconds": 2},
            "panic": {"windowSeconds": 2}, "drainTimeoutSeconds": 10,
        },
    },
}  # fmt: skip
DEPLOYMENT = f"{NAME}-unified"


def ready(cluster) -> bool:
    pool = cluster.obj("kvfleet.io/v1alpha1/inferencepools", NS, NAME) or {}
    conditions = (pool.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def replicas(cluster) -> int:
    return cluster.obj("apps/v1/deployments", NS, DEPLOYMENT)["spec"]["replicas"]


@pytest.mark.timeout(240)
async def test_load_scales_up_and_down_through_drain_with_real_processes(cluster, tmp_path):
    config = OperatorConfig(max_tick_s=0.5, retry_delay_s=0.5)
    async with operator_running(str(cluster.url), config):
        async with ProcessKubelet(cluster, NS, tmp_path) as kubelet:
            await api(cluster, "POST", f"/apis/kvfleet.io/v1alpha1/namespaces/{NS}/inferencepools",
                      POOL)
            await eventually(lambda: ready(cluster), 90, "the pool Ready")
            router = next(p for p in kubelet.pods.values() if p.deployment == f"{NAME}-router")
            base = f"http://{router.ip}:8000/v1"
            burst = await run_load(base, MODEL, concurrency=24, duration_s=8, max_tokens=48)
            assert kubelet.max_replicas[DEPLOYMENT] > 1, "the load step did not scale up"
            status = cluster.obj("kvfleet.io/v1alpha1/inferencepools", NS, NAME)["status"]
            decision = status["roles"]["unified"]["lastScaleDecision"]
            assert decision["reason"] in ("ScalingUp", "PanicScaleUp") and decision["signals"]
            calm = await run_load(base, MODEL, concurrency=1, duration_s=2, max_tokens=16)
            await eventually(lambda: replicas(cluster) == 1 and len(
                [p for p in kubelet.pods.values() if p.deployment == DEPLOYMENT]) == 1,
                60, "the scale-down")  # fmt: skip
            for result in (burst, calm):
                assert result.num_failed == 0, result.errors
            assert burst.num_ok > 0 and calm.num_ok > 0
            reasons = {json.loads(r.body)["reason"] for r in cluster.sent("POST", "/events")}
            assert {"ReplicaDraining", "ReplicaStopping"} <= reasons, reasons
            assert reasons & {"ScalingUp", "PanicScaleUp"} and "ScalingDown" in reasons
            engines = [p for p in kubelet.removed
                       if p["metadata"]["labels"].get("kvfleet.io/role") == "unified"]
            assert engines, "no engine pod was removed"
            for pod in engines:  # each was drained in the router, then marked the victim
                annotations = pod["metadata"].get("annotations") or {}
                assert "kvfleet.io/draining" in annotations, annotations
                assert annotations["controller.kubernetes.io/pod-deletion-cost"] == "-2147483647"

            # The router pod dies; its replacement (a new pod IP) gets the config pushed again.
            router.proc.kill()

            def new_router():
                return next((p for p in kubelet.pods.values() if p.is_ready
                             and p.deployment == f"{NAME}-router" and p.ip != router.ip), None)

            replacement = await eventually(new_router, 60, "a new router pod")
            again = await run_load(f"http://{replacement.ip}:8000/v1", MODEL, concurrency=2,
                                   duration_s=2, max_tokens=8)
            assert again.num_failed == 0 and again.num_ok > 0, again.errors


def engine_pods(kubelet) -> list:
    return [p for p in kubelet.pods.values() if p.deployment == DEPLOYMENT]


@pytest.mark.timeout(240)
async def test_a_spec_change_rolls_the_engines_under_load_and_loses_nothing(cluster, tmp_path):
    pool = copy.deepcopy(POOL)
    pool["spec"]["topology"]["unified"]["replicas"] = {"min": 2, "max": 2}
    path = f"/apis/kvfleet.io/v1alpha1/namespaces/{NS}/inferencepools"
    config = OperatorConfig(max_tick_s=0.5, retry_delay_s=0.5)
    async with operator_running(str(cluster.url), config):
        async with ProcessKubelet(cluster, NS, tmp_path) as kubelet:
            await api(cluster, "POST", path, pool)
            await eventually(lambda: ready(cluster) and len(
                [p for p in engine_pods(kubelet) if p.is_ready]) == 2, 90, "two engines Ready")
            first = {p.name for p in engine_pods(kubelet)}
            (old_hash,) = {p.template_hash for p in engine_pods(kubelet)}
            router = next(p for p in kubelet.pods.values() if p.deployment == f"{NAME}-router")
            load = asyncio.create_task(run_load(f"http://{router.ip}:8000/v1", MODEL,
                                                concurrency=4, duration_s=30, max_tokens=32))
            await asyncio.sleep(3)
            # A spec change that reaches the engines' args: a new pod template.
            await api(cluster, "PATCH", f"{path}/{NAME}",
                      {"spec": {"engine": {"maxNumSeqs": 6}}}, "application/merge-patch+json")

            def rolled() -> bool:
                pods = engine_pods(kubelet)
                return (len(pods) == 2 and not first & {p.name for p in pods}
                        and all(p.is_ready and p.template_hash != old_hash for p in pods))

            await eventually(rolled, 120, "the rollout to replace both engines")
            result = await load
            assert result.num_failed == 0, result.errors
            assert result.num_ok > 0
            gone = {p["metadata"]["name"]: p for p in kubelet.removed
                    if p["metadata"]["labels"].get("kvfleet.io/role") == "unified"}
            assert set(gone) == first  # the old pods went, and only they
            for pod in gone.values():  # each was a rollout victim, drained before it went
                annotations = pod["metadata"].get("annotations") or {}
                assert "kvfleet.io/replaced" in annotations, annotations
                assert annotations["controller.kubernetes.io/pod-deletion-cost"] == "-2147483647"
            reasons = {json.loads(r.body)["reason"] for r in cluster.sent("POST", "/events")}
            assert "ReplicaDraining" in reasons, reasons
