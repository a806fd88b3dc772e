"""A killed operator mid-drain, through the Kubernetes ports against kmock (issue 31,
item 3): the pods and routers live on; the restarted loop reads its state back from the
pool's loop-state annotation, adopts the running Deployment and pods (no duplicate), keeps
the victim draining with its drain deadline counted from the drain's own start, and pushes
router configs whose version only grows. Time is the fake clock's; the kubelet and routers
are the loop-ports tests' fakes."""

from __future__ import annotations

import json

from kmock_shim import api
from kvfleet_operator.api import parse_pool
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.ports.pods import DELETION_COST
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from kvfleet_operator.runtimes.kubernetes.ports.status_store import LOOP_STATE_ANNOTATION
from test_k8s_loop_ports import (
    DEPLOYMENT,
    PODS,
    FakeClock,
    FakeRouters,
    Kubelet,
    SteeredScaler,
    make_loop,
    pod_annotations,
    replicas,
)
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, pool_manifest

DRAIN_TIMEOUT_S = 180.0  # examples/vllm-unified.yaml


def versions(routers: FakeRouters) -> list[int]:
    return [int(c["version"]) for c in routers.configs if c is not None]


async def test_a_restarted_operator_keeps_the_drain_deadline_and_makes_no_duplicate(
        cluster, client):  # fmt: skip
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    clock, routers, scaler = FakeClock(), FakeRouters(2), SteeredScaler({"unified": 3})
    kubelet = Kubelet(cluster, clock)
    loop, events = await make_loop(cluster, client, clock, routers, scaler)
    interval = pool.spec.autoscaling.interval_seconds
    await loop.tick()
    clock.t += interval
    await loop.tick()
    await kubelet.sync()
    await loop.tick()
    assert replicas(cluster) == 3 and len(routers.configs[0]["endpoints"]) == 3

    scaler.desired = {"unified": 2}  # a scale-down whose victim stays busy
    routers.in_flight = {f"{DEPLOYMENT}-abc{i}": 1 for i in (1, 2, 3)}
    clock.t += interval
    await loop.tick()
    (victim,) = [n for n in (f"{DEPLOYMENT}-abc{i}" for i in (1, 2, 3))
                 if "kvfleet.io/draining" in pod_annotations(cluster, n)]  # fmt: skip
    started = loop.state.drain_started[victim]
    before = max(versions(routers))
    saved = json.loads(cluster.obj(POOLS, NS, NAME)["metadata"]["annotations"][
        LOOP_STATE_ANNOTATION])
    assert saved["drain_started"] == {victim: started}
    await events.aclose()

    # The operator dies mid-drain (nothing of it survives: a new loop, runtime and store);
    # it is down for a minute, then a new one reads the pool back.
    clock.t = started + 60.0
    loop, events = await make_loop(cluster, client, clock, routers, scaler)
    assert loop.state.drain_started == {victim: started}
    pods_before = sorted(p["metadata"]["name"] for p in cluster.objs(PODS, NS))
    await loop.tick()
    await kubelet.sync()
    assert sorted(p["metadata"]["name"] for p in cluster.objs(PODS, NS)) == pods_before
    assert kubelet.num_created == 3 and replicas(cluster) == 3  # adopted, none added
    assert {e["name"]: e["state"] for e in routers.configs[0]["endpoints"]}[victim] == "draining"
    assert loop.state.drain_started == {victim: started}
    assert min(versions(routers)) >= before  # never backwards

    clock.t = started + DRAIN_TIMEOUT_S - 1.0  # a restarted timer would run to +60 + 180
    await loop.tick()
    assert replicas(cluster) == 3 and kubelet.removed == []
    clock.t = started + DRAIN_TIMEOUT_S
    await loop.tick()
    assert pod_annotations(cluster, victim)[DELETION_COST] == "-2147483647"
    assert replicas(cluster) == 2
    await kubelet.sync()
    assert kubelet.removed == [victim]
    assert min(versions(routers)) >= before
    await events.aclose()
    reasons = [json.loads(r.body)["reason"] for r in cluster.sent("POST", "/events")]
    assert "DrainTimedOut" in reasons or "ReplicaStopping" in reasons, reasons
