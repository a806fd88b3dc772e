"""The one `ControlLoop` over the Kubernetes ports (replicas as Deployments and Pods, the
pool's status and loop-state annotation, core/v1 Events) against kmock.

The test plays the kubelet and the ReplicaSet: it writes a ready Pod for every replica a
Deployment asks for, and on a scale-down removes the pod with the lowest
`controller.kubernetes.io/pod-deletion-cost`, as the ReplicaSet controller does. Routers,
metrics and the scaler are the loop tests' in-memory fakes: this file is about what the
Kubernetes ports do with the loop's decisions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cluster_index import live
from k8s_pools import example
from kmock_shim import api
from kubernetes.aio import client as kclient
from kvfleet_operator.api import parse_pool
from kvfleet_operator.loop.control_loop import ControlLoop
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.ports.event_sink import KubeEventSink
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import KubeClient
from kvfleet_operator.runtimes.kubernetes.ports.pods import DELETION_COST
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from kvfleet_operator.runtimes.kubernetes.ports.replica_runtime import KubeReplicaRuntime
from kvfleet_operator.runtimes.kubernetes.ports.status_store import (
    LOOP_STATE_ANNOTATION,
    PoolStatusStore,
)
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, pool_manifest

sys.path.insert(0, str(Path(__file__).parents[1] / "loop"))
from fake_ports import FakeClock, FakeMetrics, FakeRouters, SteeredScaler  # noqa: E402

DEPLOYMENT = f"{NAME}-unified"
PODS = "v1/pods"


class Kubelet:
    """Pods for what each engine Deployment asks for; the lowest deletion cost goes first."""

    def __init__(self, cluster, clock: FakeClock) -> None:
        self.cluster = cluster
        self.clock = clock
        self.num_created = 0
        self.removed: list[str] = []

    async def sync(self) -> None:
        deployment = self.cluster.obj("apps/v1/deployments", NS, DEPLOYMENT)
        want = deployment["spec"]["replicas"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        pods = self.cluster.objs(PODS, NS)
        while len(pods) > want:
            victim = min(pods, key=lambda p: int(
                (p["metadata"].get("annotations") or {}).get(DELETION_COST, "0")))
            await api(self.cluster, "DELETE", f"/api/v1/namespaces/{NS}/pods/"
                      f"{victim['metadata']['name']}")
            self.removed.append(victim["metadata"]["name"])
            pods.remove(victim)
        while len(pods) < want:
            self.num_created += 1
            name = f"{DEPLOYMENT}-abc{self.num_created}"
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": NS, "labels": labels},
                   "status": {"phase": "Running", "podIP": f"10.0.0.{self.num_created}",
                              "startTime": "2026-01-01T00:00:00Z",
                              "conditions": [{"type": "Ready", "status": "True"}],
                              "containerStatuses": [{"name": "engine", "restartCount": 0,
                                                     "state": {"running": {}}}]}}
            await api(self.cluster, "POST", f"/api/v1/namespaces/{NS}/pods", pod)
            pods.append(pod)


async def make_loop(cluster, client, clock, routers, scaler, indexes=None):
    """`indexes`: kopf's (default: a watch that never lags, `cluster_index.live`)."""
    body = cluster.obj(POOLS, NS, NAME)
    pool = parse_pool(body)
    events = KubeEventSink(client, pool)
    runtime = KubeReplicaRuntime(client, pool, image="img", options=BuildOptions(),
                                 events=events, clock=clock,
                                 indexes=indexes if indexes is not None else live(cluster))
    store = PoolStatusStore(client, pool, body, events)
    loop = ControlLoop(pool, runtime=runtime, router=routers, metrics=FakeMetrics(),
                       store=store, events=events, clock=clock, scaler=scaler)
    return loop, events


def pod_annotations(cluster, name: str) -> dict:
    return cluster.obj(PODS, NS, name)["metadata"].get("annotations") or {}


def replicas(cluster) -> int:
    return cluster.obj("apps/v1/deployments", NS, DEPLOYMENT)["spec"]["replicas"]


async def test_scale_up_and_a_drained_scale_down_through_the_kubernetes_ports(cluster, client):
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    clock, routers, scaler = FakeClock(), FakeRouters(2), SteeredScaler({"unified": 2})
    kubelet = Kubelet(cluster, clock)
    loop, events = await make_loop(cluster, client, clock, routers, scaler)
    interval = pool.spec.autoscaling.interval_seconds

    await loop.tick()  # the Deployment asks for 2, no pods yet: placeholders, nothing created
    assert replicas(cluster) == 2
    await kubelet.sync()
    await loop.tick()
    endpoints = {e["name"]: e for e in routers.configs[0]["endpoints"]}
    assert set(endpoints) == {f"{DEPLOYMENT}-abc1", f"{DEPLOYMENT}-abc2"}
    assert {e["url"] for e in endpoints.values()} == {"http://10.0.0.1:8000",
                                                      "http://10.0.0.2:8000"}

    scaler.desired = {"unified": 3}  # scale up: one more replica through the Deployment
    clock.t += interval
    await loop.tick()
    assert replicas(cluster) == 3
    apply = json.loads(cluster.sent("PATCH", f"/deployments/{DEPLOYMENT}")[-1].body)
    assert apply["spec"]["replicas"] == 3 and apply["kind"] == "Deployment"
    await kubelet.sync()
    await loop.tick()
    assert len(routers.configs[0]["endpoints"]) == 3

    scaler.desired = {"unified": 2}  # scale down: drain first, then the deletion cost
    clock.t += interval
    await loop.tick()
    draining = [n for n in (f"{DEPLOYMENT}-abc{i}" for i in (1, 2, 3))
                if "kvfleet.io/draining" in pod_annotations(cluster, n)]
    assert len(draining) == 1
    victim = draining[0]
    assert pod_annotations(cluster, victim)[DELETION_COST] == "-1000"
    assert replicas(cluster) == 3  # nothing removed while it drains
    assert {e["name"]: e["state"] for e in routers.configs[0]["endpoints"]}[victim] == "draining"
    routers.in_flight[victim] = 2
    clock.t += 1
    await loop.tick()
    assert replicas(cluster) == 3  # still busy in a router
    routers.in_flight[victim] = 0
    clock.t += 1
    await loop.tick()
    assert pod_annotations(cluster, victim)[DELETION_COST] == "-2147483647"
    assert replicas(cluster) == 2
    await kubelet.sync()
    assert kubelet.removed == [victim]  # the ReplicaSet took the victim, no other pod
    await loop.tick()
    status = cluster.obj(POOLS, NS, NAME)["status"]
    assert status["roles"]["unified"]["readyReplicas"] == 2
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"

    # Status: conditions always whole; events as core/v1 Events about the pool.
    patches = [json.loads(r.body)["status"] for r in cluster.sent("PATCH", "/status")]
    assert patches and all(
        sorted(c["type"] for c in p["conditions"]) ==
        ["Degraded", "Progressing", "Ready", "ScalingLimited"]
        for p in patches if "conditions" in p)
    await events.aclose()
    posted = [json.loads(r.body) for r in cluster.sent("POST", "/events")]
    reasons = {e["reason"] for e in posted}
    assert {"ScalingUp", "ScalingDown", "ReplicaDraining", "ReplicaStopping"} <= reasons
    for event in posted:
        assert event["involvedObject"]["kind"] == "InferencePool"
        assert event["involvedObject"]["uid"] == pool.uid
        assert event["type"] in ("Normal", "Warning")

    # A new loop (an operator restart) reads the history back from the pool.
    history = loop.state.history.to_dict()
    again, _ = await make_loop(cluster, client, clock, routers, scaler)
    assert again.state.history.to_dict() == history
    assert again.state.desired == {"unified": 2}
    annotation = cluster.obj(POOLS, NS, NAME)["metadata"]["annotations"][LOOP_STATE_ANNOTATION]
    assert json.loads(annotation)["history"] == history


async def test_a_deployment_deleted_by_hand_comes_back_with_its_replicas(cluster, client):
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    clock = FakeClock()
    kubelet = Kubelet(cluster, clock)
    loop, _ = await make_loop(cluster, client, clock, FakeRouters(2), SteeredScaler({}))
    await kubelet.sync()
    await loop.tick()
    await api(cluster, "DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/{DEPLOYMENT}")
    for pod in cluster.objs(PODS, NS):  # what garbage collection would do
        await api(cluster, "DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
    await loop.tick()
    assert replicas(cluster) == 2


async def test_a_topology_change_drains_the_old_role_away(cluster, client):
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    clock, routers = FakeClock(), FakeRouters(1)
    kubelet = Kubelet(cluster, clock)
    loop, _ = await make_loop(cluster, client, clock, routers, SteeredScaler({}))
    await kubelet.sync()
    await loop.tick()
    await loop.tick()
    # unified -> prefill/decode, as a user would edit the pool
    topology = example("vllm-disaggregated.yaml")["spec"]["topology"]
    await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}", {"spec": {"topology": {
        "unified": None, **topology}}}, "application/merge-patch+json")
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    loop, _ = await make_loop(cluster, client, clock, routers, SteeredScaler({}))
    for _ in range(4):
        clock.t += 1
        await loop.tick()
        await kubelet.sync()
    assert replicas(cluster) == 0
    assert len(kubelet.removed) == 2
    names = {e["name"] for e in routers.configs[0]["endpoints"]}
    assert not any(n.startswith(DEPLOYMENT) for n in names)
    for role in ("prefill", "decode"):
        assert cluster.obj("apps/v1/deployments", NS, f"{NAME}-{role}") is not None


async def test_an_api_server_that_does_not_answer_is_an_api_error():
    from kvfleet_operator.runtimes.kubernetes.ports.kube_client import ApiError

    dead = KubeClient(kclient.Configuration(host="http://127.0.0.1:9"))  # discard port
    try:
        with pytest.raises(ApiError) as caught:
            await dead.get("/api/v1/namespaces/x/secrets/y")
        assert caught.value.status == 0
    finally:
        await dead.close()
