"""A spec change rolls the engine Deployment and loses nothing: every pod being replaced is
pushed as draining to every router, and drains there, before the Deployment may remove it.

The test plays the Deployment controller and kubelet with maxSurge 1 / maxUnavailable 0 and
the pods' readiness gate, as Kubernetes does: it adds one new pod (its containers ready) at a
time, and removes an old pod (the lowest deletion cost) only once a new one is `Ready`, which
with kvfleet's `kvfleet.io/routed` gate means: once the operator opened it. The routers are
the loop tests' fakes; one log records, in order, what kvfleet pushed and what it opened.
"""

from __future__ import annotations

import json

from kmock_shim import api
from kvfleet_operator.api import parse_pool
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.ports.pods import (
    DELETION_COST,
    REPLACED_ANNOTATION,
    ROUTED_GATE,
    TEMPLATE_HASH,
)
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from test_k8s_loop_ports import (
    DEPLOYMENT,
    PODS,
    FakeClock,
    FakeRouters,
    SteeredScaler,
    make_loop,
)
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, pool_manifest


def _annotations(pod: dict) -> dict:
    return pod["metadata"].get("annotations") or {}


def _routed(pod: dict) -> bool:
    return any(c.get("type") == ROUTED_GATE and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


class RollingCluster:
    """The Deployment controller (maxSurge 1, maxUnavailable 0) and the kubelet."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.num_created = 0
        self.removed: list[str] = []

    def pods(self) -> list[dict]:
        return self.cluster.objs(PODS, NS)

    async def _write_status(self, pod: dict) -> None:
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        routed = _routed(pod)
        ready = routed or ROUTED_GATE not in gates
        conditions = [{"type": "ContainersReady", "status": "True"},
                      {"type": "Ready", "status": "True" if ready else "False"}]
        if routed:
            conditions.append({"type": ROUTED_GATE, "status": "True"})
        path = f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status"
        await api(self.cluster, "PATCH", path, {"status": {"conditions": conditions}})

    async def _create(self, template: dict) -> None:
        self.num_created += 1
        name = f"{DEPLOYMENT}-p{self.num_created}"
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NS,
                            "labels": dict(template["metadata"]["labels"]),
                            "annotations": dict(template["metadata"]["annotations"])},
               "spec": {"readinessGates": template["spec"]["readinessGates"]},
               "status": {"phase": "Running", "podIP": f"10.0.1.{self.num_created}",
                          "startTime": f"2026-01-01T00:00:{self.num_created:02d}Z",
                          "containerStatuses": [{"name": "engine", "restartCount": 0,
                                                 "state": {"running": {}}}]}}
        await api(self.cluster, "POST", f"/api/v1/namespaces/{NS}/pods", pod)
        await self._write_status(pod)

    async def sync(self) -> None:
        deployment = self.cluster.obj("apps/v1/deployments", NS, DEPLOYMENT)
        want = deployment["spec"]["replicas"]
        template = deployment["spec"]["template"]
        current = template["metadata"]["annotations"][TEMPLATE_HASH]
        for pod in self.pods():  # the kubelet reports the gate's condition in Ready
            await self._write_status(pod)
        pods = self.pods()
        old = [p for p in pods if _annotations(p).get(TEMPLATE_HASH) != current]
        new = [p for p in pods if _annotations(p).get(TEMPLATE_HASH) == current]
        ready_new = [p for p in new if _routed(p)]
        # Scale the old ReplicaSet down as far as Ready new pods allow (maxUnavailable 0).
        while old and len(old) + len(ready_new) > want:
            victim = min(old, key=lambda p: int(_annotations(p).get(DELETION_COST, "0")))
            name = victim["metadata"]["name"]
            await api(self.cluster, "DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
            self.removed.append(name)
            old.remove(victim)
        if len(old) + len(new) < want + (1 if old else 0):  # surge one while rolling
            await self._create(template)


async def test_a_rollout_drains_each_replaced_pod_in_every_router_first(cluster, client):
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    clock, routers, scaler = FakeClock(), FakeRouters(3), SteeredScaler({"unified": 2})
    log: list[tuple[str, object]] = []
    push, patch = routers.push, client.strategic_patch

    async def logged_push(config):
        log.append(("push", config))
        await push(config)

    async def logged_patch(path, body):
        log.append(("open", path.split("/")[-2]))
        return await patch(path, body)

    routers.push, client.strategic_patch = logged_push, logged_patch
    kube = RollingCluster(cluster)
    loop, _ = await make_loop(cluster, client, clock, routers, scaler)
    for _ in range(3):
        await kube.sync()
        await loop.tick()
        clock.t += 1
    first = sorted(p["metadata"]["name"] for p in kube.pods())
    assert len(first) == 2 and all(_routed(p) for p in kube.pods())  # a plain start: gates open

    # A spec change: the reconcile handler applies a new pod template.
    body = cluster.obj(POOLS, NS, NAME)
    body["spec"]["engine"]["args"] = ["--max-num-seqs", "64"]
    await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}", {"spec": body["spec"]})
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    loop, _ = await make_loop(cluster, client, clock, routers, scaler)  # as run_pool does

    busy_ticks = 0
    for _ in range(30):
        await kube.sync()
        for name in first:  # a replaced pod stays busy a while in the routers
            if "draining" in [e["state"] for c in routers.configs if c
                              for e in c["endpoints"] if e["name"] == name]:
                left = routers.in_flight.get(name, 3)
                routers.in_flight[name] = max(0, left - 1)
                busy_ticks += left > 0
        await loop.tick()
        clock.t += 1
        pods = kube.pods()
        if not set(first) & {p["metadata"]["name"] for p in pods} and all(map(_routed, pods)):
            break
    assert sorted(kube.removed) == first  # both old pods went, each only as a drained victim
    assert busy_ticks >= 4  # and their drains really waited on the routers' in-flight
    assert len(kube.pods()) == 2 and all(_routed(p) for p in kube.pods())

    # The order: before a replaced pod may go (its replacement's gate opens), the config that
    # marks it draining reached every router, and a later view found nothing in flight.
    pushes_before: list[dict] = []
    replaced_by_gate: dict[str, str] = {}
    for what, item in log:
        if what == "push":
            pushes_before.append(item)  # type: ignore[arg-type]
            continue
        pod = str(item)
        if pod in first:
            continue
        draining = [e["name"] for c in pushes_before for e in c["endpoints"]
                    if e["state"] == "draining" and e["name"] in first
                    and e["name"] not in replaced_by_gate.values()]
        assert draining, f"gate of {pod} opened before any replaced pod was drained"
        replaced_by_gate[pod] = draining[0]
    assert sorted(replaced_by_gate.values()) == first
    assert all(c == routers.configs[0] for c in routers.configs)  # one config, every router
    for name in first:
        victim_pushes = [c for c in pushes_before if any(
            e["name"] == name and e["state"] == "draining" for e in c["endpoints"])]
        assert victim_pushes, f"{name} was never pushed as draining"
    sent = [json.loads(r.body) for r in cluster.sent("PATCH", "/pods/")
            if REPLACED_ANNOTATION in r.body.decode()]
    assert len(sent) == 2  # one victim mark per replaced pod, no more
    gate_patches = [r for r in cluster.sent("PATCH", "/status") if "/pods/" in str(r.url)]
    assert gate_patches and all(
        r.headers["Content-Type"].startswith("application/strategic-merge-patch+json")
        for r in gate_patches if ROUTED_GATE in r.body.decode()
        and "ContainersReady" not in r.body.decode())
